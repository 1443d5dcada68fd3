#include "policies/scope_pool.h"

#include "policies/common.h"

namespace ctx {

void ScopePool::start(const ModelConfig& c) {
  n_head_kv_ = c.n_head_kv;
  group_ = c.n_head / c.n_head_kv;
  pool_.assign(static_cast<size_t>(c.n_layer) * n_head_kv_, {});
  scratch_.resize(n_head_kv_);
}

void ScopePool::append(int layer, int g, int pos, std::vector<int32_t>& keys) const {
  const auto& pool = pool_[static_cast<size_t>(layer) * n_head_kv_ + g];
  keys.insert(keys.end(), pool.begin(), pool.end());
  keys.push_back(pos);
}

void ScopePool::update(int layer, int g, const std::vector<int32_t>& keys, int prompt_len, const float* probs, int n_keys,
                       std::vector<int32_t>* evicted) {
  std::vector<int32_t>& pool = pool_[static_cast<size_t>(layer) * n_head_kv_ + g];
  Scratch& sc = scratch_[g];
  const int n_dec = static_cast<int>(pool.size()) + 1, first = n_keys - n_dec;
  const int t = keys.back() - prompt_len;  // index of the current generated token
  if (!scope_reselects(cfg_, t) || n_dec <= scope_budget(cfg_, t)) {
    pool.push_back(keys.back());  // keep everything this step
    return;
  }
  sc.importance.resize(n_dec);
  for (int j = 0; j < n_dec; ++j) {
    float sum = 0;
    for (int h = 0; h < group_; ++h) sum += probs[static_cast<size_t>(h) * n_keys + first + j];
    sc.importance[j] = sum / static_cast<float>(group_);
  }
  scope_select(sc.importance.data(), keys.data() + first, n_dec, scope_budget(cfg_, t), cfg_.beta2, sc.out, sc.top);
  if (evicted)  // the candidates (ascending) not kept (an ascending subset of them)
    for (int j = 0, k = 0; j < n_dec; ++j) {
      const int32_t p = keys[first + j];
      if (k < static_cast<int>(sc.out.size()) && sc.out[k] == p)
        ++k;
      else
        evicted->push_back(p);
    }
  pool.swap(sc.out);
}

double ScopePool::tokens() const { return total_size(pool_); }

size_t ScopePool::bytes() const {
  size_t n = vector_bytes(pool_);
  for (const Scratch& s : scratch_) n += vector_bytes(s.importance) + vector_bytes(s.top) + vector_bytes(s.out);
  return n;
}

}  // namespace ctx
