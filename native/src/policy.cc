#include "policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ctx {

namespace {
// "the global layers are 5, 11, 17", for messages.
std::string global_layers(const ModelConfig& model) {
  std::string out;
  for (int l = 0; l < model.n_layer; ++l)
    if (!model.layer_slides(l)) out += (out.empty() ? "" : ", ") + std::to_string(l);
  return "the global layers are " + (out.empty() ? std::string("none") : out);
}
}  // namespace

const char* AttentionPolicy::name() const {
  switch (kind) {
    case Kind::Full:
      return "full";
    case Kind::OmniKv:
      return "omnikv";
    case Kind::Scope:
      return "scope";
    case Kind::OmniKvScope:
      return "omnikv+scope";
    case Kind::Streaming:
      return "streaming";
    case Kind::H2o:
      return "h2o";
    case Kind::Rounds:
      return "rounds";
  }
  return "?";
}

const char* selector_name(Selector s) {
  switch (s) {
    case Selector::Last:
      return "last";
    case Selector::LastSoftmax:
      return "last_softmax";
    case Selector::Uniform:
      return "uniform";
    case Selector::Exp:
      return "exp";
  }
  return "?";
}

bool parse_selector(const std::string& name, Selector* out) {
  for (Selector s : {Selector::Last, Selector::LastSoftmax, Selector::Uniform, Selector::Exp})
    if (name == selector_name(s)) {
      *out = s;
      return true;
    }
  return false;
}

AttentionPolicy AttentionPolicy::make_omnikv(const OmniKvConfig& cfg, const ModelConfig& model) {
  const int L = model.n_layer;
  if (cfg.filter_layers.empty() || cfg.filter_layers.size() > 8) throw std::invalid_argument("omnikv: give 1 to 8 filter layers");
  for (size_t i = 0; i < cfg.filter_layers.size(); ++i) {
    const int f = cfg.filter_layers[i];
    if (f < 0 || f >= L)
      throw std::invalid_argument("omnikv: filter layer " + std::to_string(f) + " is out of range [0, " + std::to_string(L) + ")");
    if (i > 0 && f <= cfg.filter_layers[i - 1]) throw std::invalid_argument("omnikv: filter layers must be strictly increasing");
    if (model.layer_slides(f))
      throw std::invalid_argument("omnikv: filter layer " + std::to_string(f) +
                                  " is a sliding-window layer; filter layers must be global layers (" + global_layers(model) + ")");
  }
  if (cfg.budget <= 0) throw std::invalid_argument("omnikv: budget must be a positive number of tokens");
  if (!(cfg.lazy_iou >= 0.f && cfg.lazy_iou < 1.f)) throw std::invalid_argument("omnikv: lazy_iou must be in [0, 1)");
  if (cfg.window < 1 || cfg.window > 64) throw std::invalid_argument("omnikv: window must be in [1, 64] queries");

  AttentionPolicy p;
  p.kind = Kind::OmniKv;
  p.omnikv = cfg;
  p.roles.assign(L, LayerRole::Sparse);
  p.group.assign(L, -1);
  for (int l = 0; l < cfg.filter_layers[0]; ++l) p.roles[l] = LayerRole::Dense;
  // A sliding-window layer stays dense (its window is its budget): the selection acts on the
  // global layers, and the guard is the first global layer after a filter layer.
  for (size_t i = 0; i < cfg.filter_layers.size(); ++i) {
    const int f = cfg.filter_layers[i];
    const int next = i + 1 < cfg.filter_layers.size() ? cfg.filter_layers[i + 1] : L;
    p.roles[f] = LayerRole::Filter;
    bool guarded = !cfg.guard;
    for (int l = f + 1; l < next; ++l) {
      if (model.layer_slides(l)) {
        p.roles[l] = LayerRole::Dense;
      } else if (!guarded) {
        p.roles[l] = LayerRole::Guard;
        guarded = true;
      } else {
        p.roles[l] = LayerRole::Sparse;
        p.group[l] = static_cast<int>(i);
      }
    }
  }
  return p;
}

AttentionPolicy AttentionPolicy::make_scope(const ScopeConfig& cfg, const ModelConfig& model) {
  if (cfg.beta2 < 1) throw std::invalid_argument("scope: beta2 (recent generated tokens kept) must be >= 1");
  if (cfg.beta1 < 0) throw std::invalid_argument("scope: beta2 must not exceed beta1 + beta2 (beta1 must be >= 0)");
  if (cfg.mode != ScopeMode::Slide && cfg.max_output <= cfg.beta2)
    throw std::invalid_argument("scope: max_output (T) must exceed beta2 for adaptive and discontinuous modes");
  if (cfg.alpha1 < 0) throw std::invalid_argument("scope: alpha1 (prompt tokens selected) must be >= 0 (0 keeps the whole prompt)");
  if (cfg.alpha1 > 0 && (cfg.alpha2 < 1 || cfg.alpha2 > 64))
    throw std::invalid_argument("scope: alpha2 (the observation window of prompt tokens) must be in [1, 64]");
  // SnapKV's pool scores a layer's whole prompt; a sliding layer's ring holds only its window.
  if (cfg.alpha1 > 0 && model.any_layer_slides())
    throw std::invalid_argument("scope: prompt compression (alpha1) is not supported on a model with sliding-window layers yet");
  AttentionPolicy p;
  p.kind = Kind::Scope;
  p.scope = cfg;
  return p;
}

AttentionPolicy AttentionPolicy::make_omnikv_scope(const OmniKvConfig& o, const ScopeConfig& s, const ModelConfig& model) {
  if (s.alpha1 > 0) throw std::invalid_argument("omnikv+scope: OmniKV selects from the whole prompt; scope.alpha1 is for kind scope");
  if (s.reclaim)
    throw std::invalid_argument(
        "omnikv+scope: its selectors score evicted generated tokens too, so their rows stay; scope.reclaim is for kind scope");
  AttentionPolicy p = make_omnikv(o, model);
  p.scope = make_scope(s, model).scope;
  p.kind = Kind::OmniKvScope;
  return p;
}

AttentionPolicy AttentionPolicy::make_rounds(const RoundsConfig& cfg, const ModelConfig& model) {
  // Above the watershed a sliding layer would still attend its window, which reaches into rounds
  // a handoff leaves unread (services/handoff/round-chunks.ts reads only the picked rounds).
  if (model.any_layer_slides())
    throw std::invalid_argument(
        "rounds: not on a model with sliding-window layers yet (its sliding layers above the watershed need "
        "the rows of rounds the pick leaves out)");
  if (cfg.watershed_layer < 0 || cfg.watershed_layer >= model.n_layer - 1)
    throw std::invalid_argument("rounds: watershed layer " + std::to_string(cfg.watershed_layer) + " must be in [0, " +
                                std::to_string(model.n_layer - 1) + ") (a layer must follow it)");
  if (cfg.starts.empty() || cfg.starts[0] != 0) throw std::invalid_argument("rounds: starts must begin with 0 (the first round)");
  for (size_t i = 1; i < cfg.starts.size(); ++i)
    if (cfg.starts[i] <= cfg.starts[i - 1]) throw std::invalid_argument("rounds: starts must be strictly increasing");
  if (cfg.top_k < 0) throw std::invalid_argument("rounds: top_k must be >= 0 (0 = adaptive)");
  // The watershed as OmniKV's one filter layer, no guard layer; rounds are kept whole (the round
  // selection decides the size, not a budget); the window holds the current round's question
  // queries remembered at the watershed; no lazy reuse, no offload.
  const OmniKvConfig o{{cfg.watershed_layer}, 1 << 30, Selector::Last, 64, false, 0.f, false};
  AttentionPolicy p = make_omnikv(o, model);
  p.kind = Kind::Rounds;
  p.rounds = cfg;
  return p;
}

std::vector<int> choose_rounds(const std::vector<double>& mass, int top_k) {
  const int n = static_cast<int>(mass.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (top_k > 0) {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return mass[a] > mass[b]; });
    order.resize(std::min(top_k, n));
  } else {
    double mean = 0, var = 0;
    for (double m : mass) mean += m / n;
    for (double m : mass) var += (m - mean) * (m - mean) / n;
    const double cut = mean + std::sqrt(var);
    order.erase(std::remove_if(order.begin(), order.end(), [&](int r) { return !(mass[r] > cut); }), order.end());
  }
  std::sort(order.begin(), order.end());
  return order;
}

AttentionPolicy AttentionPolicy::make_streaming(const StreamingConfig& cfg) {
  if (cfg.sinks < 0 || cfg.window < 1) throw std::invalid_argument("streaming: sinks must be >= 0 and window >= 1");
  AttentionPolicy p;
  p.kind = Kind::Streaming;
  p.streaming = cfg;
  return p;
}

AttentionPolicy AttentionPolicy::make_h2o(const H2oConfig& cfg) {
  if (cfg.recent < 1 || cfg.budget <= cfg.recent) throw std::invalid_argument("h2o: recent must be >= 1 and budget larger than recent");
  AttentionPolicy p;
  p.kind = Kind::H2o;
  p.h2o = cfg;
  return p;
}

bool AttentionPolicy::reclaim() const {
  switch (kind) {
    case Kind::Scope:
      return scope.reclaim;
    case Kind::Streaming:
      return streaming.reclaim;
    case Kind::H2o:
      return h2o.reclaim;
    default:
      return false;
  }
}

int scope_budget(const ScopeConfig& cfg, int t) {
  const int full = cfg.beta1 + cfg.beta2;
  if (cfg.mode == ScopeMode::Slide || cfg.beta1 == 0) return full;
  const int delta = std::max(1, (cfg.max_output - cfg.beta2) / cfg.beta1);
  return std::min(full, cfg.beta2 + t / delta);
}

bool scope_reselects(const ScopeConfig& cfg, int t) {
  if (cfg.mode != ScopeMode::Discontinuous || cfg.beta1 == 0) return true;
  const int delta = std::max(1, (cfg.max_output - cfg.beta2) / cfg.beta1);
  return t % (delta + 1) == 0;
}

void scope_select(const float* importance, const int32_t* positions, int n, int budget, int recent, std::vector<int32_t>& out,
                  std::vector<int32_t>& scratch) {
  out.clear();
  if (n <= budget) {
    out.assign(positions, positions + n);
    return;
  }
  recent = std::min(recent, budget);
  const int older = n - recent;
  top_k_sorted(importance, older, budget - recent, scratch);  // k clamped to the candidates
  for (int32_t i : scratch) out.push_back(positions[i]);
  out.insert(out.end(), positions + older, positions + n);
}

void rank_candidates(Selector sel, const float* raw, int n_heads, int n_all, int n_cand, float* out) {
  std::fill(out, out + n_cand, -INFINITY);
  for (int h = 0; h < n_heads; ++h) {
    const float* row = raw + static_cast<size_t>(h) * n_all;
    if (sel == Selector::Last) {
      for (int j = 0; j < n_cand; ++j) out[j] = std::max(out[j], row[j]);
      continue;
    }
    // Softmax over every key the query sees (generated ones included), ranked on candidates.
    const float mx = *std::max_element(row, row + n_all);
    double sum = 0;
    for (int j = 0; j < n_all; ++j) sum += std::exp(row[j] - mx);
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < n_cand; ++j) out[j] = std::max(out[j], std::exp(row[j] - mx) * inv);
  }
}

void accumulate_window_scores(const float* raw, int n_heads, int n_all, int n_cand, float weight, float* out, std::vector<float>& scratch) {
  scratch.resize(n_cand);
  rank_candidates(Selector::LastSoftmax, raw, n_heads, n_all, n_cand, scratch.data());
  for (int j = 0; j < n_cand; ++j) out[j] += weight * scratch[j];
}

float window_weight(Selector sel, int j, int n) { return sel == Selector::Exp ? std::ldexp(1.0f, j - (n - 1)) : 1.0f; }

void snap_select(const float* importance, int n, int alpha1, int alpha2, std::vector<int32_t>& out) {
  if (n <= alpha1 + alpha2) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
    return;
  }
  top_k_sorted(importance, n - alpha2, alpha1, out);
  for (int p = n - alpha2; p < n; ++p) out.push_back(p);
}

void top_k_sorted(const float* scores, int n, int k, std::vector<int32_t>& out) {
  out.resize(n);
  std::iota(out.begin(), out.end(), 0);
  if (k < n) {
    std::nth_element(out.begin(), out.begin() + k, out.end(),
                     [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
    out.resize(k);
    std::sort(out.begin(), out.end());
  }
}

float iou(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0, j = 0, both = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      ++both;
      ++i;
      ++j;
    } else if (a[i] < b[j])
      ++i;
    else
      ++j;
  }
  const size_t uni = a.size() + b.size() - both;
  return uni == 0 ? 1.f : static_cast<float>(both) / static_cast<float>(uni);
}

}  // namespace ctx
