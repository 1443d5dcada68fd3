// SCOPE's pool of generated tokens (scope.cc, omnikv_scope.cc): per layer and KV head, the last
// beta2 generated tokens plus the beta1 earlier ones the current step attends to most.
#pragma once
#include <cstdint>
#include <vector>

#include "decode_policy.h"

namespace ctx {

class ScopePool {
 public:
  explicit ScopePool(const ScopeConfig& cfg) : cfg_(cfg) {}
  // The first decode step after a prompt: every pool empty.
  void start(const ModelConfig& c);
  void clear() { pool_.clear(); }
  // Appends (layer, head g)'s pool and the current token at `pos` to `keys`.
  void append(int layer, int g, int pos, std::vector<int32_t>& keys) const;
  // After the step's attention at (layer, head g) over `keys` (the pool is their tail, then the
  // current token): keep the current token, and past the budget re-select by importance (the
  // mean probability over the head's query group).
  // The generated tokens dropped from the pool are appended to `evicted` when given.
  void update(int layer, int g, const std::vector<int32_t>& keys, int prompt_len, const float* probs, int n_keys,
              std::vector<int32_t>* evicted);
  double tokens() const;
  size_t bytes() const;

 private:
  const ScopeConfig& cfg_;
  int n_head_kv_ = 0, group_ = 1;
  std::vector<std::vector<int32_t>> pool_;  // per (layer, KV head), ascending positions
  struct Scratch {
    std::vector<float> importance;
    std::vector<int32_t> top, out;
  };
  std::vector<Scratch> scratch_;  // per KV head: heads of one layer update concurrently
};

}  // namespace ctx
