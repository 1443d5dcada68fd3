// H2O (Heavy-Hitter Oracle, a baseline over the whole context): per layer and KV head, the
// `recent` newest tokens plus the heavy hitters by attention accumulated over decode steps,
// `budget` in all; evicted tokens never return. Accumulation starts at the first decode step.
#include <numeric>

#include "policies/common.h"
#include "policies/policies.h"

namespace ctx {
namespace {

class H2oPolicy final : public DecodePolicy {
 public:
  using DecodePolicy::DecodePolicy;

  void reset() override {
    prompt_len_ = -1;
    kept_.clear();
    acc_.clear();
  }

  void begin(const PolicyStep& step) override {
    if (step.prompt) {
      prompt_len_ = -1;
      return;
    }
    if (prompt_len_ >= 0) return;
    const ModelConfig& c = step.backend.config();
    prompt_len_ = step.pos0;
    n_head_kv_ = c.n_head_kv;
    group_ = c.n_head / c.n_head_kv;
    // Every prompt token starts as a candidate.
    kept_.assign(static_cast<size_t>(c.n_layer) * n_head_kv_, std::vector<int32_t>(prompt_len_));
    for (auto& k : kept_) std::iota(k.begin(), k.end(), 0);
    acc_.assign(kept_.size(), std::vector<float>(prompt_len_, 0.f));
    keys_.resize(n_head_kv_);
    top_.resize(n_head_kv_);
  }

  // The kept set of (layer, head) plus the current token.
  LayerKeys keys(int layer, const PolicyStep& step) override {
    for (int g = 0; g < n_head_kv_; ++g) {
      const auto& kept = kept_[slot(layer, g)];
      keys_[g].assign(kept.begin(), kept.end());
      keys_[g].push_back(step.pos0);
    }
    return LayerKeys{&keys_, PackedRows{}};
  }

  // Add this step's attention (mean over the head's query group) to every kept token's score,
  // then evict the lowest-scoring tokens outside the recent window down to the budget.
  bool reclaims() const override { return true; }
  bool reads_probabilities() const override { return true; }

  void update(int layer, int g, const float* probs, int n_keys, std::vector<int32_t>* evicted) override {
    std::vector<int32_t>& kept = kept_[slot(layer, g)];
    std::vector<float>& acc = acc_[slot(layer, g)];
    kept.push_back(keys_[g].back());
    acc.push_back(0.f);
    for (int j = 0; j < n_keys; ++j) {
      float sum = 0;
      for (int h = 0; h < group_; ++h) sum += probs[static_cast<size_t>(h) * n_keys + j];
      acc[j] += sum / static_cast<float>(group_);
    }
    const H2oConfig& cfg = spec().h2o;
    if (n_keys <= cfg.budget) return;
    const int older = n_keys - cfg.recent;
    std::vector<int32_t>& top = top_[g];
    top_k_sorted(acc.data(), older, cfg.budget - cfg.recent, top);
    if (evicted)  // the older tokens not among the heavy hitters
      for (int i = 0, k = 0; i < older; ++i) {
        if (k < static_cast<int>(top.size()) && top[k] == i)
          ++k;
        else
          evicted->push_back(kept[i]);
      }
    size_t w = 0;
    for (int32_t i : top) {
      kept[w] = kept[i];
      acc[w] = acc[i];
      ++w;
    }  // ascending: in place
    for (int j = older; j < n_keys; ++j) {
      kept[w] = kept[j];
      acc[w] = acc[j];
      ++w;
    }
    kept.resize(w);
    acc.resize(w);
  }

  PolicyStats stats() const override {
    PolicyStats s;
    s.prompt_len = prompt_len_;
    s.decode_pool_tokens = total_size(kept_);
    return s;
  }

  size_t state_bytes() const override { return vector_bytes(kept_) + vector_bytes(acc_) + vector_bytes(keys_) + vector_bytes(top_); }

 private:
  size_t slot(int layer, int g) const { return static_cast<size_t>(layer) * n_head_kv_ + g; }

  int prompt_len_ = -1, n_head_kv_ = 0, group_ = 1;
  std::vector<std::vector<int32_t>> kept_;        // per (layer, KV head), ascending positions
  std::vector<std::vector<float>> acc_;           // accumulated attention, aligned with kept_
  std::vector<std::vector<int32_t>> keys_, top_;  // per KV head: the current list, scratch
};

}  // namespace

std::unique_ptr<DecodePolicy> make_h2o_policy(const AttentionPolicy& spec) { return std::make_unique<H2oPolicy>(spec); }

}  // namespace ctx
