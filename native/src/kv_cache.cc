#include "kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kv_pool.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // Linux 5.7
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

namespace ctx {

namespace {
// Anonymous memory the kernel may back with transparent huge pages (2 MiB on x86-64) where whole
// ones fit. A long import or prefill writes hundreds of MiB of KV in one go; with 4 KiB pages
// that is one fault and one page-table entry per 4 KiB, measured at ~60% of the wall time of
// loading 8K tokens of KV into a new sequence here (bench/handoff/shm-load.ts). Memory is still
// committed lazily, in steps of up to 2 MiB instead of 4 KiB: the rows past a sequence's written
// ones belong to its own capacity, which the services admit in full (decode: prompt + max tokens).
// Ignored where THP is off or not built in.
void* map_kv(size_t bytes) {
  void* at = reserve_huge_aligned(bytes);
  if (at == MAP_FAILED) return MAP_FAILED;
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p != MAP_FAILED) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}
}  // namespace

KvCache::KvCache(int n_layer, int kv_dim, int capacity, const KvRing& ring)
    : n_layer_(n_layer), kv_dim_(kv_dim), capacity_(capacity), ring_(ring) {
  if (n_layer <= 0 || kv_dim <= 0 || capacity <= 0) throw std::invalid_argument("kv cache: dimensions must be positive");
  if (!ring_.layers.empty() && ring_.layers.size() != static_cast<size_t>(n_layer))
    throw std::invalid_argument("kv cache: the ring names " + std::to_string(ring_.layers.size()) + " layers, the cache has " +
                                std::to_string(n_layer));
  const bool any_ring = std::find(ring_.layers.begin(), ring_.layers.end(), true) != ring_.layers.end();
  if (!any_ring || ring_.rows >= capacity) {
    ring_ = KvRing{};  // every row fits: no ring
  } else if (ring_.window < 1 || ring_.rows < ring_.window || ring_.rows % kKvBlockRows != 0) {
    throw std::invalid_argument("kv cache: a ring of " + std::to_string(ring_.rows) + " rows for a window of " +
                                std::to_string(ring_.window) + " (it must hold the window, in whole blocks of " +
                                std::to_string(kKvBlockRows) + ")");
  }
  rows_.assign(n_layer, capacity);
  ring_of_.assign(n_layer, -1);
  offset_.resize(n_layer);
  bytes_ = 0;
  for (int l = 0; l < n_layer; ++l) {
    if (ring_.rows > 0 && ring_.layers[l]) {
      rows_[l] = ring_.rows;
      ring_of_[l] = static_cast<int>(tags_.size());
      tags_.emplace_back(ring_.rows, -1);
    }
    offset_[l] = bytes_ / sizeof(uint16_t);
    bytes_ += layer_bytes(l);
  }
  void* p = KvPool::instance().take(bytes_);  // zeroed, its pages mostly resident
  if (p == nullptr) p = map_kv(bytes_);
  if (p == MAP_FAILED)
    throw std::runtime_error("kv cache: cannot reserve " + std::to_string(bytes_ >> 20) + " MiB: " + std::strerror(errno));
  base_ = static_cast<uint16_t*>(p);
  bank_of_.assign(n_layer, -1);
  slot_.assign(n_layer, -1);
}

KvCache::~KvCache() {
  for (const Bank& b : banks_) munmap(b.base, b.bytes);
  KvPool::instance().give(base_, bytes_);
}

void KvCache::release() {
  generation_.fetch_add(1, std::memory_order_relaxed);
  // The pages move to the pool (MREMAP_DONTUNMAP leaves this range mapped and empty: reads see
  // zeros, as after MADV_DONTNEED); without a pool, or on a kernel before 5.7, they go back to the OS.
  // They move to a 2 MiB-aligned address, so their huge pages stay whole (kv_pool.h).
  void* moved = KvPool::instance().limit() > 0 ? move_huge_aligned(base_, bytes_, bytes_, MREMAP_DONTUNMAP) : MAP_FAILED;
  if (moved != MAP_FAILED)
    KvPool::instance().give(moved, bytes_);
  else
    madvise(base_, bytes_, MADV_DONTNEED);
  for (const Bank& b : banks_) madvise(b.base, b.bytes, MADV_DONTNEED);
  for (auto& tags : tags_) std::fill(tags.begin(), tags.end(), -1);
  size_ = 0;
}

size_t KvCache::device_bytes_at(int n) const {
  size_t rows = 0;
  for (int l = 0; l < n_layer_; ++l)
    if (bank_of_[l] < 0) rows += static_cast<size_t>(std::min(n, rows_[l]));
  return rows * row_pair_bytes();
}

void KvCache::wrote(int from, int to) {
  if (from < 0 || to > capacity_ || from > to)
    throw std::out_of_range("kv cache: wrote " + std::to_string(from) + ".." + std::to_string(to) + " outside capacity " +
                            std::to_string(capacity_));
  for (auto& tags : tags_)
    for (int t = std::max(from, to - ring_.rows); t < to; ++t) tags[t % ring_.rows] = t;
  size_ = to;
}

void KvCache::move_rows(int layer, bool to_bank) {
  uint16_t* dev_k = base_ + offset_[layer];
  uint16_t* dev_v = dev_k + static_cast<size_t>(capacity_) * kv_dim_;  // (no ring: rows_ = capacity)
  const size_t row = static_cast<size_t>(kv_dim_) * sizeof(uint16_t);
  for (int t = 0; t < size_; ++t) {
    uint16_t* dk = dev_k + static_cast<size_t>(t) * kv_dim_;
    uint16_t* dv = dev_v + static_cast<size_t>(t) * kv_dim_;
    if (to_bank) {
      std::memcpy(k(layer, t), dk, row);
      std::memcpy(v(layer, t), dv, row);
    } else {
      std::memcpy(dk, k(layer, t), row);
      std::memcpy(dv, v(layer, t), row);
    }
  }
}

void KvCache::offload(const std::vector<std::vector<int>>& groups) {
  std::vector<bool> seen(n_layer_, false);
  for (const auto& g : groups) {
    if (g.empty()) throw std::invalid_argument("kv cache: an offload group is empty");
    for (int l : g) {
      if (l < 0 || l >= n_layer_ || seen[l]) throw std::invalid_argument("kv cache: offload groups must hold distinct layers of the model");
      if (in_ring(l)) throw std::invalid_argument("kv cache: layer " + std::to_string(l) + " keeps a ring of rows; it cannot be offloaded");
      seen[l] = true;
    }
  }
  restore();
  for (const auto& g : groups) {
    Bank b;
    b.n_layers = static_cast<int>(g.size());
    b.bytes = static_cast<size_t>(capacity_) * b.n_layers * row_pair_bytes();
    void* p = map_kv(b.bytes);
    if (p == MAP_FAILED) {
      restore();
      throw std::runtime_error("kv cache: cannot reserve a host bank of " + std::to_string(b.bytes >> 20) +
                               " MiB: " + std::strerror(errno));
    }
    b.base = static_cast<uint16_t*>(p);
    banks_.push_back(b);
  }
  for (size_t bi = 0; bi < groups.size(); ++bi)
    for (size_t j = 0; j < groups[bi].size(); ++j) {
      const int l = groups[bi][j];
      bank_of_[l] = static_cast<int>(bi);  // from here k()/v() address the bank
      slot_[l] = static_cast<int>(j);
      ++banked_layers_;
    }
  // Copy the stored rows over, then give the device pages back (K and V of a layer are adjacent).
  for (int l = 0; l < n_layer_; ++l)
    if (bank_of_[l] >= 0) {
      move_rows(l, true);
      release_pages(base_ + offset_[l], layer_bytes(l));
    }
}

// MADV_DONTNEED on the whole pages inside [p, p + bytes) only: a layer's range need not start or
// end on a page boundary, and the neighbouring layers' rows on a shared page must survive.
void KvCache::release_pages(void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void KvCache::restore() {
  if (banks_.empty()) return;
  for (int l = 0; l < n_layer_; ++l)
    if (bank_of_[l] >= 0) move_rows(l, false);
  for (const Bank& b : banks_) munmap(b.base, b.bytes);
  banks_.clear();
  bank_of_.assign(n_layer_, -1);
  slot_.assign(n_layer_, -1);
  banked_layers_ = 0;
}

void KvCache::gather_bank(int bank, const int32_t* tokens, int n, uint16_t* out) const {
  const Bank& b = banks_[bank];
  const size_t run = static_cast<size_t>(b.n_layers) * 2 * kv_dim_;
  for (int j = 0; j < n; ++j) std::memcpy(out + j * run, b.base + static_cast<size_t>(tokens[j]) * run, run * sizeof(uint16_t));
}

std::vector<KvCache::RowSpan> KvCache::row_spans() const {
  std::vector<RowSpan> spans;
  const size_t row = static_cast<size_t>(kv_dim_) * sizeof(uint16_t);
  for (int l = 0; l < n_layer_; ++l)
    if (bank_of_[l] < 0) {
      spans.push_back({reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(k(l))), row, row, rows_[l]});
      spans.push_back({reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(v(l))), row, row, rows_[l]});
    }
  for (const Bank& b : banks_) {
    const size_t run = static_cast<size_t>(b.n_layers) * row_pair_bytes();
    spans.push_back({reinterpret_cast<uint8_t*>(b.base), run, run, capacity_});
  }
  return spans;
}

bool KvCache::prefault(const std::vector<RowSpan>& spans, int from, int to, uint32_t gen) const {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  // Rows [t0, t1) of a span. EINVAL: no MADV_POPULATE_WRITE here. ENOMEM/EFAULT: the span went
  // away meanwhile (the JS thread offloaded or restored; were its addresses mapped again, their
  // pages would be committed early, nothing worse); a later span still may be valid.
  auto populate = [&](const RowSpan& s, int t0, int t1) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(s.base + t0 * s.token_bytes) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(s.base + (t1 - 1) * s.token_bytes + s.row_bytes);
    return !(madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) != 0 && errno == EINVAL);
  };
  if (std::max(from, 0) >= std::min(to, capacity_)) return true;
  for (const RowSpan& s : spans)  // a ring is small: all of it at once
    if (s.rows < capacity_ && !populate(s, 0, s.rows)) return false;
  constexpr int kBlock = 256;  // tokens per step: fine enough to stay just ahead of an import
  for (int t0 = std::max(from, 0); t0 < std::min(to, capacity_); t0 += kBlock) {
    if (generation() != gen) return true;
    const int t1 = std::min({t0 + kBlock, to, capacity_});
    for (const RowSpan& s : spans)
      if (s.rows == capacity_ && !populate(s, t0, t1)) return false;
  }
  return true;
}

void KvCache::set_size(int n) {
  if (n < 0 || n > capacity_)
    throw std::out_of_range("kv cache: size " + std::to_string(n) + " outside capacity " + std::to_string(capacity_));
  // The next token, at position n, attends the window - 1 positions before it on a ring layer.
  for (int l = 0; l < n_layer_; ++l) {
    if (!in_ring(l)) continue;
    for (int t = std::max(0, n - ring_.window + 1); t < n; ++t)
      if (!holds(l, t))
        throw std::invalid_argument("kv cache: sliding-window layer " + std::to_string(l) + " no longer holds position " +
                                    std::to_string(t) + " (its ring keeps " + std::to_string(ring_.rows) +
                                    " rows), which the window of position " + std::to_string(n) + " needs");
  }
  // Rows past the new end are stale: forget them, so an import may write older positions there.
  if (n < size_)
    for (auto& tags : tags_)
      for (int& tag : tags)
        if (tag >= n) tag = -1;
  size_ = n;
}

}  // namespace ctx
