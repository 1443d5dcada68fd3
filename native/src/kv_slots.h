// Physical reclamation of evicted KV (opt-in per policy, AttentionPolicy::reclaim): each tracked
// layer and KV head maps positions to rows of the KV cache. Prompt tokens sit at row = position; a decode
// token takes a row its (layer, head) freed earlier, else a new one; a policy's evictions
// (DecodePolicy::update) free rows. So a sequence under SCOPE touches at most prompt + beta1 +
// beta2 + 1 rows per layer however long it generates; the cache's pages beyond them are never
// committed. Listed attention reads through the map; the dense path needs row = position, so a
// sequence that freed rows takes no more prompt tokens (Engine::validate refuses them), and its
// rows can no longer be copied or truncated by position (Sequence::rows_moved). Sliding-window
// layers are not tracked: their ring already bounds them, and their decode steps read by position.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ctx {

class KvSlots {
 public:
  // `stored` tokens already in the cache keep row = position; `tracked[l]`: layer l is mapped
  // (the others keep row = position and are never placed or freed).
  KvSlots(const std::vector<bool>& tracked, int n_head_kv, int capacity, int stored);
  bool tracks(int layer) const { return tracked_[layer]; }
  int32_t row(int layer, int g, int pos) const { return map_[at(layer, g)][pos]; }
  // Prompt positions [from, to) at row = position, every layer and head (only before any free).
  void place_prompt(int from, int to);
  // The cache's length was set from outside (an import, a rollback): positions [0, stored) at row
  // = position, nothing beyond (only before any free).
  void reset(int stored);
  // A decode token at `pos` for (layer, head g): a freed row, else the next new one. Calls for
  // different (layer, head) pairs touch disjoint state.
  int32_t place(int layer, int g, int pos);
  void free(int layer, int g, int pos);
  bool any_freed() const;
  // Rows a tracked layer has touched: the most any of its heads used.
  size_t rows_touched(int layer) const;

 private:
  size_t at(int layer, int g) const { return static_cast<size_t>(layer) * n_head_kv_ + g; }
  std::vector<bool> tracked_;
  int n_head_kv_;
  std::vector<std::vector<int32_t>> map_;   // per (layer, head): position -> row, -1 = none (empty: untracked)
  std::vector<std::vector<int32_t>> free_;  // per (layer, head): freed rows
  std::vector<int32_t> high_;               // per (layer, head): rows used so far
  std::vector<uint32_t> frees_;             // per (layer, head): rows ever freed
};

}  // namespace ctx
