// The f16 KV cache of one sequence. Each layer holds K and V as [token][kv_head][head_dim], so
// the rows of layer l at token t are addressable for export and sparse attention. The whole
// capacity is reserved up front as one anonymous mapping: the address never moves (JS views
// stay valid) and the kernel commits pages only as tokens are written (huge pages where the
// kernel allows: kv_cache.cc). A new cache takes recycled memory from the KV pool when it has
// some (zeroed, already resident: kv_pool.h); release() and the destructor give it back.
//
// Two memory tiers (OmniKV's context bank, docs/architecture.md): offload() moves groups of layers out of
// the "device" arena into a host bank, one mapping per group laid out token-major
// ([token][layer of the group][K|V][kv_dim], the chunk payload's layout), so the rows of every
// layer of a group for one token are one contiguous run and a gather over selected tokens reads
// each token once. k()/v() and ld() address either tier, so readers and writers need not care.
//
// Sliding-window layers (Gemma 3) keep a ring: a token at position p of such a layer lives in row
// p % ring_rows, so the layer costs its window, not the context. The ring holds the window plus a
// micro-batch (the keys the micro-batch's first query still needs, and the rows the micro-batch
// writes before its attention), rounded up to whole key blocks, so a key block never wraps.
// Each ring row remembers the position it holds: an import writes a row only over an older
// position (chunks may come in any order), an export or a rollback that needs a position the ring
// no longer holds is refused, and a declared length must find its window whole.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace ctx {

// Rows a key block of the attention reads at once (Engine::kKeyBlock); a ring is a multiple.
constexpr int kKvBlockRows = 64;

// Which layers keep a ring of rows, and its size. rows >= capacity (or no layer): no ring.
struct KvRing {
  std::vector<bool> layers;  // per layer, or empty
  int window = 0;            // the keys a query of such a layer sees, itself included
  int rows = 0;              // a multiple of kKvBlockRows, >= window
  // The rows for sliding window `window` and micro-batches of at most `ubatch` tokens: the first
  // query of a micro-batch needs window - 1 older keys while the micro-batch writes ubatch rows.
  static int rows_for(int window, int ubatch) { return (window + ubatch - 1 + kKvBlockRows - 1) / kKvBlockRows * kKvBlockRows; }
};

class KvCache {
 public:
  KvCache(int n_layer, int kv_dim, int capacity, const KvRing& ring = {});
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_layer() const { return n_layer_; }
  int kv_dim() const { return kv_dim_; }
  int capacity() const { return capacity_; }
  int size() const { return size_; }  // tokens whose KV is stored
  // After a forward pass, an import or to roll back; <= capacity. With rings: std::invalid_argument
  // unless every ring holds the positions the next token's window needs (the last window - 1).
  void set_size(int n);
  // A forward pass wrote positions [from, to) of every layer: the rings' rows now hold them and
  // the size is `to` (their windows are whole by construction: no check, unlike set_size).
  void wrote(int from, int to);
  // Rows a layer keeps: capacity, or its ring's.
  int rows(int layer) const { return rows_[layer]; }
  bool in_ring(int layer) const { return ring_of_[layer] >= 0; }
  int ring_rows() const { return ring_.rows; }  // 0: no ring
  // The most positions of this cache one micro-batch may write: a ring's rows less the window's
  // older keys the micro-batch's first query still reads; no ring: no limit.
  int max_run() const { return ring_.rows > 0 ? ring_.rows - ring_.window + 1 : std::numeric_limits<int>::max(); }
  // Whether `layer` holds position t now (always, below capacity, for a layer without a ring).
  bool holds(int layer, int t) const { return ring_of_[layer] < 0 || tags_[ring_of_[layer]][row_of(layer, t)] == t; }
  // An import may write position t of `layer`: no ring, or its ring row holds no newer position.
  bool may_write(int layer, int t) const { return ring_of_[layer] < 0 || tags_[ring_of_[layer]][row_of(layer, t)] <= t; }
  void imported(int layer, int t) {
    if (ring_of_[layer] >= 0) tags_[ring_of_[layer]][row_of(layer, t)] = t;
  }
  // Gives the physical memory up now (to the KV pool, else to the OS); the mapping stays valid
  // (reads see zeros), so views held elsewhere cannot fault. The cache is empty afterwards.
  void release();
  size_t row_elems() const { return static_cast<size_t>(kv_dim_); }

  uint16_t* k(int layer, int token = 0) {
    const int b = bank_of_[layer];
    if (b >= 0) return banks_[b].base + (static_cast<size_t>(token) * banks_[b].n_layers + slot_[layer]) * 2 * kv_dim_;
    return base_ + offset_[layer] + static_cast<size_t>(row_of(layer, token)) * kv_dim_;
  }
  uint16_t* v(int layer, int token = 0) {
    return k(layer, token) + (bank_of_[layer] >= 0 ? static_cast<size_t>(kv_dim_) : static_cast<size_t>(rows_[layer]) * kv_dim_);
  }
  // Elements between the rows of consecutive tokens of a layer (K or V).
  size_t ld(int layer) const {
    return bank_of_[layer] >= 0 ? static_cast<size_t>(banks_[bank_of_[layer]].n_layers) * 2 * kv_dim_ : kv_dim_;
  }
  const uint16_t* k(int layer, int token = 0) const { return const_cast<KvCache*>(this)->k(layer, token); }
  const uint16_t* v(int layer, int token = 0) const { return const_cast<KvCache*>(this)->v(layer, token); }

  // K and V rows of a layer in the device arena.
  size_t layer_bytes(int layer) const { return 2 * static_cast<size_t>(rows_[layer]) * kv_dim_ * sizeof(uint16_t); }
  size_t bytes_used() const { return device_bytes_used() + host_bytes_used(); }
  size_t bytes_reserved() const { return bytes_; }
  // Bytes of stored tokens in each tier (a ring's rows count once written).
  size_t device_bytes_used() const { return device_bytes_at(size_); }
  size_t host_bytes_used() const { return row_pair_bytes() * size_ * banked_layers_; }
  // Device bytes with n tokens stored.
  size_t device_bytes_at(int n) const;
  size_t row_pair_bytes() const { return 2 * static_cast<size_t>(kv_dim_) * sizeof(uint16_t); }  // one token, one layer

  // Where rows of every layer live, for prefault() on another thread: each span's token t rows
  // start at base + t * token_bytes. Taken on the owning thread; valid until offload/restore.
  struct RowSpan {
    uint8_t* base;
    size_t token_bytes;
    size_t row_bytes;  // bytes of one token's rows at that address
    int rows;          // tokens the span holds (a ring's rows, else the capacity)
  };
  std::vector<RowSpan> row_spans() const;
  // release() bumps it, so a prefault() running elsewhere can tell the rows are no longer wanted.
  uint32_t generation() const { return generation_.load(std::memory_order_relaxed); }
  // Commits the pages that rows [from, to) of `spans` will occupy (MADV_POPULATE_WRITE: allocated
  // and mapped writable, contents untouched), a block of tokens at a time in the order an import
  // writes them, so a writer on another thread mostly finds them ready. Stops early when
  // generation() moves on from `gen` (a release() during a step may leave that step's pages
  // committed until the cache is destroyed or released again). False when the kernel cannot
  // (Linux before 5.14).
  bool prefault(const std::vector<RowSpan>& spans, int from, int to, uint32_t gen) const;

  // Moves each group's layers (distinct, each in at most one group, none with a ring) into a host
  // bank, rows of stored tokens included, and returns their device pages. Replaces any earlier offload.
  void offload(const std::vector<std::vector<int>>& groups);
  void restore();  // every banked layer back into the device arena
  int n_banks() const { return static_cast<int>(banks_.size()); }
  int banked_layers() const { return banked_layers_; }
  int bank_of(int layer) const { return bank_of_[layer]; }  // -1: on the device
  int slot_in_bank(int layer) const { return slot_[layer]; }
  int bank_layers(int bank) const { return banks_[bank].n_layers; }
  // OmniKV's packed load: for each of n tokens, the whole run of `bank`'s rows (every layer, K
  // and V) copied to out + j * bank_layers * 2 * kv_dim, in one sequential pass per token.
  void gather_bank(int bank, const int32_t* tokens, int n, uint16_t* out) const;

 private:
  int row_of(int layer, int token) const { return token < rows_[layer] ? token : token % rows_[layer]; }

  struct Bank {
    uint16_t* base = nullptr;
    size_t bytes = 0;
    int n_layers = 0;
  };
  void move_rows(int layer, bool to_bank);
  static void release_pages(void* p, size_t bytes);

  int n_layer_, kv_dim_, capacity_;
  int size_ = 0;
  KvRing ring_;
  std::vector<int> rows_;               // per layer: capacity, or the ring's rows
  std::vector<size_t> offset_;          // per layer: its K rows' first element in the device arena
  std::vector<int> ring_of_;            // per layer: index into tags_, or -1
  std::vector<std::vector<int>> tags_;  // per ring layer, per row: the position it holds, or -1
  uint16_t* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<Bank> banks_;
  std::vector<int> bank_of_, slot_;  // per layer: its bank and place in it, or -1
  int banked_layers_ = 0;
  std::atomic<uint32_t> generation_{0};
};

}  // namespace ctx
