// SCOPE (Wu et al., 2024; follows Linking-ai/SCOPE's code): every layer and KV head attends to
// the prompt plus its pool of generated tokens (scope_pool.h). With alpha1 > 0 the prompt is
// compressed too, SnapKV-style, once per layer at the first decode step: the last alpha2 prompt
// tokens plus the alpha1 earlier ones their queries attend to most. A prefill that ships the
// kept lists to another process (prompt_state.h) has them computed as each prompt chunk is
// cached instead (the last chunk's stand).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "policies/common.h"
#include "policies/policies.h"
#include "policies/scope_pool.h"
#include "prompt_state.h"

namespace ctx {
namespace {

class ScopePolicy final : public DecodePolicy, public PromptStateHolder {
 public:
  explicit ScopePolicy(const AttentionPolicy& spec) : DecodePolicy(spec), cfg_(this->spec().scope), pool_(cfg_) {}

  void reset() override {
    prompt_len_ = -1;
    pool_.clear();
    observed_.clear();
    prompt_pool_.clear();
    pool_len_.clear();
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
    if (!compresses()) return;
    size_pools(c);
    prompt_dropped_.assign(prompt_pool_.size(), 0);
  }

  // Prompt compression: each layer keeps the prompt's last alpha2 queries (and, eagerly, the pool
  // they select from the prompt so far).
  void observe_prompt(int layer, const PolicyStep& step) override {
    if (!compresses()) return;
    const ModelConfig& c = step.backend.config();
    observed_.resize(c.n_layer);
    for (int j = std::max(0, step.count - cfg_.alpha2); j < step.count; ++j) observed_[layer].push(step.backend, step.t + j, cfg_.alpha2);
    if (!eager_) return;
    size_pools(c);
    compute_prompt_pool(layer, step, step.pos0 + step.count);
  }

  LayerKeys keys(int layer, const PolicyStep& step) override {
    const int hkv = static_cast<int>(keys_.size());
    if (compresses() && pool_len_[layer] != prompt_len_) {
      const bool observed = layer < static_cast<int>(observed_.size()) && !observed_[layer].q.empty();
      if (observed)
        compute_prompt_pool(layer, step, prompt_len_);
      else
        keep_whole_prompt(layer, hkv);  // KV imported without the prompt state
    }
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
      if (k < static_cast<int>(kept.size()) && kept[k] == p)
        ++k;
      else
        evicted->push_back(p);
    }
  }
  bool reclaims() const override { return true; }
  bool reads_probabilities() const override { return true; }

  void derive_eagerly() override { eager_ = true; }
  // Without the pool (not derived eagerly), the queries it is computed from.
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
  // The prompt pool as computed for this prompt at every layer (the prefill's export).
  Pools prompt_pools(const ModelConfig& c, int n_tokens) const override {
    if (!compresses() || static_cast<int>(pool_len_.size()) != c.n_layer) return {};
    for (int len : pool_len_)
      if (len != n_tokens) return {};
    return Pools{&prompt_pool_, cfg_.alpha1, cfg_.alpha2};
  }
  bool take_prompt_pools(const ModelConfig& c, int n_tokens, int alpha1, int alpha2, std::vector<std::vector<int32_t>>& lists) override {
    if (!compresses() || alpha1 != cfg_.alpha1 || alpha2 != cfg_.alpha2) return false;
    if (lists.size() != static_cast<size_t>(c.n_layer) * c.n_head_kv) return false;
    prompt_pool_.swap(lists);
    pool_len_.assign(c.n_layer, n_tokens);
    return true;
  }

  PolicyStats stats() const override {
    PolicyStats s;
    s.prompt_len = prompt_len_;
    s.decode_pool_tokens = pool_.tokens();
    s.prompt_pool_tokens = total_size(prompt_pool_);
    return s;
  }

  size_t state_bytes() const override {
    size_t n = pool_.bytes() + vector_bytes(keys_) + vector_bytes(prompt_pool_) + vector_bytes(pool_len_) + vector_bytes(importance_);
    for (const QueryWindow& w : observed_) n += w.bytes();
    return n;
  }

 private:
  bool compresses() const { return cfg_.alpha1 > 0; }

  void size_pools(const ModelConfig& c) {
    prompt_pool_.resize(static_cast<size_t>(c.n_layer) * c.n_head_kv);
    pool_len_.resize(c.n_layer, -1);
  }

  void keep_whole_prompt(int layer, int hkv) {
    for (int g = 0; g < hkv; ++g) {
      std::vector<int32_t>& kept = prompt_pool_[static_cast<size_t>(layer) * hkv + g];
      kept.resize(prompt_len_);
      std::iota(kept.begin(), kept.end(), 0);
    }
    pool_len_[layer] = prompt_len_;
  }

  // The importance of each earlier prompt token (of the P cached) is the attention the observed
  // queries pay it (softmax over the keys each query sees, mean over a KV head's query group,
  // summed over the queries); each KV head keeps its top alpha1 plus the last alpha2.
  void compute_prompt_pool(int layer, const PolicyStep& step, int P) {
    PolicyBackend& be = step.backend;
    const ModelConfig& c = be.config();
    const int hkv = c.n_head_kv, group = c.n_head / hkv;
    pool_len_[layer] = P;
    importance_.resize(hkv);
    for (int g = 0; g < hkv; ++g) importance_[g].assign(P, 0.f);
    if (P > cfg_.alpha1 + cfg_.alpha2) {
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
    for (int g = 0; g < hkv; ++g)
      snap_select(importance_[g].data(), P, cfg_.alpha1, cfg_.alpha2, prompt_pool_[static_cast<size_t>(layer) * hkv + g]);
  }

  const ScopeConfig& cfg_;
  ScopePool pool_;
  int prompt_len_ = -1;
  std::vector<std::vector<int32_t>> keys_;  // per KV head: the current layer's list
  // Prompt compression: per layer, the last alpha2 prompt queries (kept while this engine
  // prefills), and per (layer, KV head) the compressed prompt, with per layer the prompt length it
  // was computed for (-1: none; a mismatch at a decode step keeps the whole prompt).
  std::vector<QueryWindow> observed_;
  std::vector<std::vector<int32_t>> prompt_pool_;
  std::vector<int> pool_len_;
  bool eager_ = false;                          // derive_eagerly()
  std::vector<uint8_t> prompt_dropped_;         // per (layer, KV head): dropped prompt reported as evicted
  std::vector<std::vector<float>> importance_;  // per KV head, scratch
};

}  // namespace

std::unique_ptr<DecodePolicy> make_scope_policy(const AttentionPolicy& spec) { return std::make_unique<ScopePolicy>(spec); }

}  // namespace ctx
