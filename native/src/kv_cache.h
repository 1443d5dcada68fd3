// The f16 KV cache of one sequence. Each layer holds K and V as [token][kv_head][head_dim], so
// the rows of layer l at token t are addressable for export and sparse attention. The whole
// capacity is reserved up front as one anonymous mapping: the address never moves (JS views
// stay valid) and the kernel commits pages only as tokens are written.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ctx {

class KvCache {
 public:
  KvCache(int n_layer, int kv_dim, int capacity);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_layer() const { return n_layer_; }
  int kv_dim() const { return kv_dim_; }
  int capacity() const { return capacity_; }
  int size() const { return size_; }           // tokens whose KV is stored
  void set_size(int n);                        // after a forward pass or an import; <= capacity
  // Returns the physical memory to the OS now; the mapping stays valid (reads see zeros), so
  // views held elsewhere cannot fault. The cache is empty afterwards.
  void release();
  size_t row_elems() const { return static_cast<size_t>(kv_dim_); }

  uint16_t* k(int layer, int token = 0) { return base_ + layer_offset(layer) + static_cast<size_t>(token) * kv_dim_; }
  uint16_t* v(int layer, int token = 0) { return k(layer, token) + static_cast<size_t>(capacity_) * kv_dim_; }
  const uint16_t* k(int layer, int token = 0) const { return const_cast<KvCache*>(this)->k(layer, token); }
  const uint16_t* v(int layer, int token = 0) const { return const_cast<KvCache*>(this)->v(layer, token); }

  size_t layer_bytes() const { return static_cast<size_t>(capacity_) * kv_dim_ * sizeof(uint16_t); }  // K or V
  size_t bytes_used() const { return static_cast<size_t>(size_) * kv_dim_ * sizeof(uint16_t) * 2 * n_layer_; }
  size_t bytes_reserved() const { return bytes_; }

 private:
  size_t layer_offset(int layer) const { return static_cast<size_t>(layer) * 2 * capacity_ * kv_dim_; }

  int n_layer_, kv_dim_, capacity_;
  int size_ = 0;
  uint16_t* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ctx
