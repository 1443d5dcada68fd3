#include "kv_slots.h"

#include <algorithm>
#include <numeric>

namespace ctx {

KvSlots::KvSlots(const std::vector<bool>& tracked, int n_head_kv, int capacity, int stored)
    : tracked_(tracked),
      n_head_kv_(n_head_kv),
      map_(tracked.size() * n_head_kv),
      free_(map_.size()),
      high_(map_.size(), stored),
      frees_(map_.size(), 0) {
  for (size_t l = 0; l < tracked.size(); ++l)
    if (tracked[l])
      for (int g = 0; g < n_head_kv; ++g) map_[at(static_cast<int>(l), g)].resize(capacity);
  reset(stored);
}

void KvSlots::place_prompt(int from, int to) {
  for (size_t i = 0; i < map_.size(); ++i) {
    if (map_[i].empty()) continue;  // an untracked layer
    std::iota(map_[i].begin() + from, map_[i].begin() + to, from);
    high_[i] = std::max(high_[i], to);
  }
}

void KvSlots::reset(int stored) {
  for (size_t i = 0; i < map_.size(); ++i) {
    if (map_[i].empty()) continue;  // an untracked layer
    std::iota(map_[i].begin(), map_[i].begin() + stored, 0);
    std::fill(map_[i].begin() + stored, map_[i].end(), -1);
    high_[i] = stored;
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

size_t KvSlots::rows_touched(int layer) const {
  return static_cast<size_t>(*std::max_element(high_.begin() + at(layer, 0), high_.begin() + at(layer, 0) + n_head_kv_));
}

}  // namespace ctx
