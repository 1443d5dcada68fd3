// Pieces several policies share: remembered queries, per-head key lists, byte counts.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode_policy.h"

namespace ctx {

// The queries (post-RoPE, [n_head * head_dim]) of the last few tokens, oldest first, and their
// positions: OmniKV's window selectors, Round Attention's question, SCOPE's observation window.
struct QueryWindow {
  std::vector<std::vector<float>> q;
  std::vector<int> pos;
  // Appends micro-batch row t's query and position, keeping the last `keep`.
  void push(const PolicyBackend& backend, int t, int keep);
  size_t bytes() const;
};

// Capacity bytes of nested vectors (state_bytes()).
template <typename T>
size_t vector_bytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}
template <typename T>
size_t vector_bytes(const std::vector<std::vector<T>>& v) {
  size_t n = v.capacity() * sizeof(std::vector<T>);
  for (const auto& x : v) n += x.capacity() * sizeof(T);
  return n;
}
template <typename T>
double total_size(const std::vector<std::vector<T>>& v) {
  double n = 0;
  for (const auto& x : v) n += static_cast<double>(x.size());
  return n;
}

// Appends positions [from, to) to `keys`.
inline void append_range(std::vector<int32_t>& keys, int from, int to) {
  for (int p = from; p < to; ++p) keys.push_back(p);
}

}  // namespace ctx
