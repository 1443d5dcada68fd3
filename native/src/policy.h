// Attention policies, chosen per sequence; prefill is always full attention. This file holds their
// validated configurations and the pure selection functions; the per-sequence objects the engine
// calls are in decode_policy.h and policies/ (one file per kind).
// - `full` attends to every cached token.
// - `omnikv` (Hao et al., ICLR 2025; follows antgroup/OmniKV's code) picks prompt tokens: at each
//   decode step a few filter layers score the prompt with the current query and keep the top
//   `budget`; the sparse layers after a filter layer attend only to that set. Layers before the
//   first filter layer, the filter layers and (optionally) one guard layer after each stay dense.
// - `scope` (Wu et al., 2024; follows Linking-ai/SCOPE's code) budgets generated tokens: each
//   layer and KV head keeps its last beta2 generated tokens plus the beta1 earlier ones the
//   current step attends to most; the prompt is kept whole.
// - `omnikv+scope`: OmniKV over the prompt, SCOPE over the generated tokens.
// Baselines over the whole context (prompt and generated), for comparisons in one engine:
// - `streaming` (StreamingLLM): the first `sinks` tokens plus the most recent `window`.
// - `h2o` (Heavy-Hitter Oracle): per layer and KV head, the `recent` newest tokens plus the
//   heavy hitters by attention accumulated over decode steps, `budget` in all; evicted tokens
//   never return. (Accumulation starts at the first decode step: prefill attention is not kept.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace ctx {

enum class Selector {
  Last,         // raw logits of the current query, max over heads (OmniKV's default)
  LastSoftmax,  // softmax probabilities of the current query, max over heads
  Uniform,      // sum over the last `window` queries of their softmax probabilities (max over heads)
  Exp,          // the same sum, query j of the window (0 = oldest) weighted 2^(j - (window - 1))
};
inline bool is_window_selector(Selector s) { return s == Selector::Uniform || s == Selector::Exp; }

// The configurations hold no defaults: the caller sets every field (the addon takes complete
// objects, with the defaults of shared/inference/defaults.ts written in by the binding; the
// tests build them with native/tests/policy_configs.h).
struct OmniKvConfig {
  std::vector<int> filter_layers;  // strictly increasing, in [0, n_layer)
  int budget;                      // prompt tokens kept per filter layer
  Selector selector;
  int window;      // queries the uniform and exp selectors combine (the current one included)
  bool guard;      // the layer after each filter layer stays dense
  float lazy_iou;  // reuse the previous set when the new one overlaps it more (0 = off)
  // Memory tiers: keep the sparse layers' KV in the host bank (KvCache::offload), and at each
  // selection gather the selected tokens' rows of a filter layer's sparse group into one packed
  // device buffer that those layers attend over.
  bool offload;
};

enum class ScopeMode {
  Slide,          // budget beta1+beta2 from the start, one eviction per step
  Adaptive,       // budget grows from beta2 to beta1+beta2 over max_output steps
  Discontinuous,  // as adaptive, re-selecting only every delta+1 steps
};

struct ScopeConfig {
  ScopeMode mode;
  int beta1;       // selected earlier generated tokens
  int beta2;       // most recent generated tokens, always kept
  int max_output;  // T: the planned output length (adaptive, discontinuous)
  // Prompt pool (SnapKV-style, kind `scope` only): 0 = keep the whole prompt; else, per layer and
  // KV head, the last alpha2 prompt tokens plus the alpha1 earlier ones those alpha2 tokens'
  // queries attend to most (GQA: mean over the head's query group, summed over the window).
  int alpha1;
  int alpha2;
  // Free the KV rows of evicted generated tokens for reuse (kv_slots.h); kind scope only.
  bool reclaim;
};

// SCOPE's rules (kv_utils.py), with t the index of the current generated token (0-based):
// the pool budget W_t, and whether step t re-selects (otherwise the pool keeps everything).
int scope_budget(const ScopeConfig& cfg, int t);
bool scope_reselects(const ScopeConfig& cfg, int t);
// SnapKV-style prompt pool: the last `alpha2` of n prompt positions plus the alpha1 earlier ones
// with the highest importance (importance[0, n - alpha2)), ascending; all n when n <= alpha1 + alpha2.
void snap_select(const float* importance, int n, int alpha1, int alpha2, std::vector<int32_t>& out);
// Keeps the last `recent` of n generated positions plus the (budget - recent) earlier ones with
// the highest importance, ascending; all n when n <= budget.
void scope_select(const float* importance, const int32_t* positions, int n, int budget, int recent, std::vector<int32_t>& out,
                  std::vector<int32_t>& scratch);

// Round Attention (docs/algorithms.md): a multi-turn context is a list of rounds; at the watershed layer the
// question's attention mass per earlier round picks the rounds that matter, once per round (where the
// prompt ends), and the layers above it attend only to those rounds, round 0 (a chat's system part)
// and the current one.
struct RoundsConfig {
  int watershed_layer;      // L_w: layers <= L_w attend everything
  std::vector<int> starts;  // first token of each round, strictly increasing from 0; the last is the current round
  int top_k;                // earlier rounds kept besides round 0; 0 = adaptive (mass > mean + std)
};
// Which earlier rounds to keep from their attention mass: the top_k largest (ties to the earlier
// round), or with top_k = 0 those above mean + std (population std); ascending round indices.
std::vector<int> choose_rounds(const std::vector<double>& mass, int top_k);

struct StreamingConfig {
  int sinks;
  int window;
  bool reclaim;  // free evicted tokens' KV rows for reuse (kv_slots.h)
};
struct H2oConfig {
  int budget;
  int recent;
  bool reclaim;  // free evicted tokens' KV rows for reuse (kv_slots.h)
};

enum class LayerRole : uint8_t { Dense, Filter, Guard, Sparse };

// A validated policy configuration (what setPolicy parses); make_decode_policy
// (decode_policy.h) turns it into the per-sequence object the engine calls.
struct AttentionPolicy {
  enum class Kind { Full, OmniKv, Scope, OmniKvScope, Streaming, H2o, Rounds };
  Kind kind = Kind::Full;
  // Only the kind's own configurations are set (the others stay zero).
  OmniKvConfig omnikv{};  // Rounds: filter layer = the watershed, no guard, selection by round
  RoundsConfig rounds{};
  ScopeConfig scope{};
  StreamingConfig streaming{};
  H2oConfig h2o{};
  std::vector<LayerRole> roles;  // per layer (omnikv)
  std::vector<int> group;        // per layer: index into filter_layers of the set it uses, or -1

  // Validates against the model; throws std::invalid_argument with a clear message.
  static AttentionPolicy make_omnikv(const OmniKvConfig& cfg, const ModelConfig& model);
  static AttentionPolicy make_scope(const ScopeConfig& cfg, const ModelConfig& model);
  static AttentionPolicy make_omnikv_scope(const OmniKvConfig& o, const ScopeConfig& s, const ModelConfig& model);
  static AttentionPolicy make_streaming(const StreamingConfig& cfg);
  static AttentionPolicy make_h2o(const H2oConfig& cfg);
  static AttentionPolicy make_rounds(const RoundsConfig& cfg, const ModelConfig& model);
  const char* name() const;
  // Whether the configuration asks for physical reclamation of evicted rows (scope, streaming,
  // h2o: their evictions are final, so no later step reads an evicted row).
  bool reclaim() const;
};

const char* selector_name(Selector s);
bool parse_selector(const std::string& name, Selector* out);

// Selection primitives (pure functions, unit-tested against straightforward references).
// raw: [n_heads][n_all] pre-softmax scores of the current query over keys 0..n_all-1; writes
// the candidates' (first n_cand keys) ranking scores to out[n_cand].
void rank_candidates(Selector sel, const float* raw, int n_heads, int n_all, int n_cand, float* out);
// Window selectors: adds weight * (max over heads of each query's softmax probability) of each
// candidate to out[n_cand] (rank_candidates with LastSoftmax, weighted and summed over queries).
void accumulate_window_scores(const float* raw, int n_heads, int n_all, int n_cand, float weight, float* out, std::vector<float>& scratch);
// The weight of query j (0 = oldest) of a window of n under `sel`: 1 (uniform), 2^(j - (n - 1)) (exp).
float window_weight(Selector sel, int j, int n);
// The k best of n scores (ties to the lower index), ascending by index; all n when k >= n.
void top_k_sorted(const float* scores, int n, int k, std::vector<int32_t>& out);
// |a & b| / |a | b| of two ascending index lists.
float iou(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace ctx
