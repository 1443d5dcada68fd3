#include "kv_slots.h"

#include <algorithm>
#include <numeric>

namespace ctx {

KvSlots::KvSlots(int n_layer, int n_head_kv, int capacity, int stored)
    : n_layer_(n_layer),
      n_head_kv_(n_head_kv),
      map_(static_cast<size_t>(n_layer) * n_head_kv, std::vector<int32_t>(capacity, -1)),
      free_(map_.size()),
      high_(map_.size(), stored),
      frees_(map_.size(), 0) {
  for (auto& m : map_) std::iota(m.begin(), m.begin() + stored, 0);
}

void KvSlots::place_prompt(int from, int to) {
  for (size_t i = 0; i < map_.size(); ++i) {
    std::iota(map_[i].begin() + from, map_[i].begin() + to, from);
    high_[i] = std::max(high_[i], to);
  }
}

int32_t KvSlots::place(int layer, int g, int pos) {
  const size_t i = at(layer, g);
  int32_t r;
  if (!free_[i].empty()) {
    r = free_[i].back();
    free_[i].pop_back();
  } else {
    r = high_[i]++;
  }
  map_[i][pos] = r;
  return r;
}

void KvSlots::free(int layer, int g, int pos) {
  const size_t i = at(layer, g);
  const int32_t r = map_[i][pos];
  if (r < 0) return;
  map_[i][pos] = -1;
  free_[i].push_back(r);
  ++frees_[i];
}

bool KvSlots::any_freed() const {
  return std::any_of(frees_.begin(), frees_.end(), [](uint32_t n) { return n > 0; });
}

size_t KvSlots::rows_touched() const {
  size_t sum = 0;
  for (int l = 0; l < n_layer_; ++l)
    sum += static_cast<size_t>(*std::max_element(high_.begin() + at(l, 0), high_.begin() + at(l, 0) + n_head_kv_));
  return sum;
}

}  // namespace ctx
