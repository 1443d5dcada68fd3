// SCOPE (Wu et al., 2024; follows Linking-ai/SCOPE's code): every layer and KV head attends to
// the prompt plus its pool of generated tokens (scope_pool.h). With alpha1 > 0 the prompt is
// compressed too, SnapKV-style, once per layer at the first decode step: the last alpha2
// prompt tokens plus the alpha1 earlier ones their queries attend to most.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "policies/common.h"
#include "policies/policies.h"
#include "policies/scope_pool.h"
#include "prompt_state.h"

namespace ctx {
namespace {

class ScopePolicy final : public DecodePolicy, public PromptQueries {
 public:
  explicit ScopePolicy(const AttentionPolicy& spec) : DecodePolicy(spec), cfg_(this->spec().scope), pool_(cfg_) {}

  void reset() override {
    prompt_len_ = -1;
    pool_.clear();
    observed_.clear();
    prompt_pool_.clear();
    prompt_pool_done_.clear();
    prompt_dropped_.clear();
  }

  void begin(const PolicyStep& step) override {
    if (step.prompt) {
      prompt_len_ = -1;
      return;
    }
    if (prompt_len_ >= 0) return;
    const ModelConfig& c = step.backend.config();
    prompt_len_ = step.pos0;
    pool_.start(c);
    keys_.resize(c.n_head_kv);
    prompt_pool_.assign(compresses() ? static_cast<size_t>(c.n_layer) * c.n_head_kv : 0, {});
    prompt_pool_done_.assign(compresses() ? c.n_layer : 0, false);
    prompt_dropped_.assign(prompt_pool_.size(), 0);
  }

  // Prompt compression: each layer keeps the prompt's last alpha2 queries.
  void observe_prompt(int layer, const PolicyStep& step) override {
    if (!compresses()) return;
    observed_.resize(step.backend.config().n_layer);
    for (int j = std::max(0, step.count - cfg_.alpha2); j < step.count; ++j)
      observed_[layer].push(step.backend, step.t + j, cfg_.alpha2);
  }

  LayerKeys keys(int layer, const PolicyStep& step) override {
    const int hkv = static_cast<int>(keys_.size());
    if (compresses() && !prompt_pool_done_[layer]) compute_prompt_pool(layer, step);
    for (int g = 0; g < hkv; ++g) {
      std::vector<int32_t>& keys = keys_[g];
      keys.clear();
      if (compresses()) {
        const auto& kept = prompt_pool_[static_cast<size_t>(layer) * hkv + g];
        keys.assign(kept.begin(), kept.end());
      } else {
        append_range(keys, 0, prompt_len_);
      }
      pool_.append(layer, g, step.pos0, keys);
    }
    return LayerKeys{&keys_, PackedRows{}};
  }

  void update(int layer, int g, const float* probs, int n_keys, std::vector<int32_t>* evicted) override {
    pool_.update(layer, g, keys_[g], prompt_len_, probs, n_keys, evicted);
    if (!evicted || !compresses()) return;
    // The prompt tokens the compressed pool dropped, once: no later step reads them (the pool is
    // computed from this layer's rows before its first update).
    const size_t i = static_cast<size_t>(layer) * keys_.size() + g;
    if (prompt_dropped_[i]) return;
    prompt_dropped_[i] = 1;
    const std::vector<int32_t>& kept = prompt_pool_[i];
    for (int p = 0, k = 0; p < prompt_len_; ++p) {
      if (k < static_cast<int>(kept.size()) && kept[k] == p) ++k;
      else evicted->push_back(p);
    }
  }
  bool reclaims() const override { return true; }

  // Prompt compression reads every layer's last alpha2 prompt queries.
  Windows prompt_windows(const ModelConfig& c) override {
    if (!compresses()) return {};
    observed_.resize(c.n_layer);
    Windows w;
    w.keep = cfg_.alpha2;
    for (int l = 0; l < c.n_layer; ++l) {
      w.layers.push_back(l);
      w.windows.push_back(&observed_[l]);
    }
    return w;
  }

  PolicyStats stats() const override {
    PolicyStats s;
    s.prompt_len = prompt_len_;
    s.decode_pool_tokens = pool_.tokens();
    s.prompt_pool_tokens = total_size(prompt_pool_);
    return s;
  }

  size_t state_bytes() const override {
    size_t n = pool_.bytes() + vector_bytes(keys_) + vector_bytes(prompt_pool_) + vector_bytes(importance_);
    for (const QueryWindow& w : observed_) n += w.bytes();
    return n;
  }

 private:
  bool compresses() const { return cfg_.alpha1 > 0; }

  // The importance of each earlier prompt token is the attention the observed queries pay it
  // (softmax over the keys each query sees, mean over a KV head's query group, summed over the
  // queries); each KV head keeps its top alpha1 plus the last alpha2. Without those queries (KV
  // imported) the prompt is kept whole.
  void compute_prompt_pool(int layer, const PolicyStep& step) {
    PolicyBackend& be = step.backend;
    const ModelConfig& c = be.config();
    const int P = prompt_len_, hkv = c.n_head_kv, group = c.n_head / hkv;
    prompt_pool_done_[layer] = true;
    const bool observed = layer < static_cast<int>(observed_.size()) && !observed_[layer].q.empty();
    importance_.resize(hkv);
    for (int g = 0; g < hkv; ++g) importance_[g].assign(P, 0.f);
    if (observed && P > cfg_.alpha1 + cfg_.alpha2) {
      const QueryWindow& w = observed_[layer];
      for (size_t j = 0; j < w.q.size(); ++j) {
        const int n_all = std::min(w.pos[j], P - 1) + 1;
        float* raw = be.score_keys(step.kv, layer, w.q[j].data(), n_all);
        be.softmax(raw, c.n_head, n_all);
        for (int g = 0; g < hkv; ++g)
          for (int h = 0; h < group; ++h) {
            const float* row = raw + static_cast<size_t>(g * group + h) * n_all;
            for (int k = 0; k < n_all; ++k) importance_[g][k] += row[k] / static_cast<float>(group);
          }
      }
    }
    for (int g = 0; g < hkv; ++g) {
      std::vector<int32_t>& kept = prompt_pool_[static_cast<size_t>(layer) * hkv + g];
      if (observed) snap_select(importance_[g].data(), P, cfg_.alpha1, cfg_.alpha2, kept);
      else {
        kept.resize(P);
        std::iota(kept.begin(), kept.end(), 0);
      }
    }
  }

  const ScopeConfig& cfg_;
  ScopePool pool_;
  int prompt_len_ = -1;
  std::vector<std::vector<int32_t>> keys_;  // per KV head: the current layer's list
  // Prompt compression: per layer, the last alpha2 prompt queries (kept while this engine
  // prefills), and per (layer, KV head) the compressed prompt, computed at the first decode step.
  std::vector<QueryWindow> observed_;
  std::vector<std::vector<int32_t>> prompt_pool_;
  std::vector<bool> prompt_pool_done_;
  std::vector<uint8_t> prompt_dropped_;  // per (layer, KV head): dropped prompt reported as evicted
  std::vector<std::vector<float>> importance_;  // per KV head, scratch
};

}  // namespace

std::unique_ptr<DecodePolicy> make_scope_policy(const AttentionPolicy& spec) { return std::make_unique<ScopePolicy>(spec); }

}  // namespace ctx
