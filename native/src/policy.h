// Attention policies, chosen per sequence. `full` attends to every cached token. `omnikv`
// (Hao et al., ICLR 2025; follows antgroup/OmniKV's code): at each decode step a few filter
// layers score the prompt's tokens with the current query and keep the top `budget`; the sparse
// layers after a filter layer attend only to that set plus every generated token. Layers before
// the first filter layer, the filter layers and (optionally) one guard layer after each stay
// dense. Prefill is always full attention.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace ctx {

enum class Selector {
  Last,         // raw logits of the current query, max over heads (OmniKV's default)
  LastSoftmax,  // softmax probabilities of the current query, max over heads
};

struct OmniKvConfig {
  std::vector<int> filter_layers;  // strictly increasing, in [0, n_layer)
  int budget = 1024;               // prompt tokens kept per filter layer
  Selector selector = Selector::Last;
  bool guard = true;               // the layer after each filter layer stays dense
  float lazy_iou = 0.f;            // reuse the previous set when the new one overlaps it more (0 = off)
};

enum class LayerRole : uint8_t { Dense, Filter, Guard, Sparse };

struct AttentionPolicy {
  enum class Kind { Full, OmniKv };
  Kind kind = Kind::Full;
  OmniKvConfig omnikv;
  std::vector<LayerRole> roles;  // per layer (omnikv)
  std::vector<int> group;        // per layer: index into filter_layers of the set it uses, or -1

  // Validates against the model; throws std::invalid_argument with a clear message.
  static AttentionPolicy make_omnikv(const OmniKvConfig& cfg, const ModelConfig& model);
  bool sparse_decode() const { return kind != Kind::Full; }
};

// Per-sequence decode state of a policy.
struct PolicyState {
  int prompt_len = -1;                          // candidates are positions < prompt_len
  std::vector<std::vector<int32_t>> selected;   // per filter layer, ascending
  std::vector<int32_t> keys;                    // the current sparse layer's keys
  uint64_t selections = 0, lazy_reuses = 0;
  void reset() { prompt_len = -1; selected.clear(); keys.clear(); }
};

const char* selector_name(Selector s);
bool parse_selector(const std::string& name, Selector* out);

// Selection primitives (pure functions, unit-tested against straightforward references).
// raw: [n_heads][n_all] pre-softmax scores of the current query over keys 0..n_all-1; writes
// the candidates' (first n_cand keys) ranking scores to out[n_cand].
void rank_candidates(Selector sel, const float* raw, int n_heads, int n_all, int n_cand, float* out);
// The k best of n scores (ties to the lower index), ascending by index; all n when k >= n.
void top_k_sorted(const float* scores, int n, int k, std::vector<int32_t>& out);
// |a & b| / |a | b| of two ascending index lists.
float iou(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace ctx
