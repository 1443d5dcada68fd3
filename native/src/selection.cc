// Selections on a filter layer at a decode step: OmniKV's top-k prompt tokens by the current
// query (last, last_softmax) or a window of remembered queries (uniform, exp), and Round
// Attention's choice of whole earlier rounds at the watershed layer.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine.h"

namespace ctx {

// OmniKV selection on a filter layer: rank the prompt's tokens by the current query (every query
// head, max over heads) and keep the top `budget`, ascending.
bool Engine::select_tokens(int layer, Sequence& seq, int t, std::vector<int32_t>& out) {
  const ModelConfig& c = config();
  const OmniKvConfig& cfg = seq.policy.omnikv;
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, kv_dim = c.kv_dim();
  const int n_cand = seq.candidate_end();
  ++seq.state.selections;
  const bool rounds = seq.policy.kind == AttentionPolicy::Kind::Rounds;
  if (!rounds && cfg.budget >= n_cand) {  // the whole prompt fits the budget: nothing to rank
    const bool changed = static_cast<int>(out.size()) != n_cand;
    out.resize(n_cand);
    std::iota(out.begin(), out.end(), 0);
    return changed;
  }
  // Raw scores [n_head][n_all] of query q over keys [0, n_all) of this layer.
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* kbuf = attn_scratch_[0].kv.data();
  auto score = [&](const float* q, int n_all) {
    for (int k0 = 0; k0 < n_all; k0 += kKeyBlock) {
      const int nk = std::min(kKeyBlock, n_all - k0);
      k_.kv_to_f32(seq.kv.k(layer, k0), seq.kv.ld(layer), nk, kv_dim, kbuf);
      for (int g = 0; g < c.n_head_kv; ++g)
        k_.attn_scores(q + static_cast<size_t>(g) * group * d, group, kbuf + g * d, kv_dim, nk, d, scale,
                       &sel_raw_[static_cast<size_t>(g) * group * n_all + k0], n_all);
    }
  };
  const float* q_now = &q_[static_cast<size_t>(t) * c.n_embd];
  if (rounds) {
    if (!out.empty()) return false;  // chosen once per round, at its first decode step
    select_rounds(layer, seq, q_now, pos_[t], score, out);
    return true;
  }
  if (!is_window_selector(cfg.selector)) {
    const int n_all = cfg.selector == Selector::Last ? n_cand : pos_[t] + 1;  // softmax needs every key
    score(q_now, n_all);
    rank_candidates(cfg.selector, sel_raw_.data(), c.n_head, n_all, n_cand, sel_rank_.data());
  } else {
    // The window: the remembered queries (oldest first), then the current one; each sees the keys
    // up to its own position (causal) and adds its weighted probabilities of the candidates.
    const PolicyState::Window& w = window_of(layer, seq);
    const int n_win = static_cast<int>(w.q.size()) + 1;
    std::fill(sel_rank_.begin(), sel_rank_.begin() + n_cand, 0.f);
    for (int j = 0; j < n_win; ++j) {
      const bool now = j == n_win - 1;
      const int n_all = (now ? pos_[t] : w.pos[j]) + 1;
      score(now ? q_now : w.q[j].data(), n_all);
      accumulate_window_scores(sel_raw_.data(), c.n_head, n_all, std::min(n_cand, n_all),
                               window_weight(cfg.selector, j, n_win), sel_rank_.data(), sel_scratch_);
    }
    // Prompt tokens still inside the window are always kept (the official code forces them in).
    for (int p = std::max(0, pos_[t] - (cfg.window - 1)); p < n_cand; ++p) sel_rank_[p] = INFINITY;
    remember_query(layer, seq, t);
  }
  top_k_sorted(sel_rank_.data(), n_cand, cfg.budget, sel_new_);
  if (cfg.lazy_iou > 0.f && !out.empty() && iou(sel_new_, out) > cfg.lazy_iou) {
    ++seq.state.lazy_reuses;  // close enough to the last set: keep it, skip the reload
    return false;
  }
  out.swap(sel_new_);
  return true;
}

// Round Attention's choice at the watershed layer: the attention mass the current round's queries
// (its question, remembered at prefill, and the current token) pay each earlier round, summed
// over heads and queries; the chosen rounds (top_k, or mean + std) are attended whole above it.
void Engine::select_rounds(int layer, Sequence& seq, const float* q_now, int pos_now,
                           FunctionRef<void(const float*, int)> score, std::vector<int32_t>& out) {
  const ModelConfig& c = config();
  const int cand = seq.candidate_end();
  std::vector<int> bounds;  // earlier round r is [bounds[r], bounds[r + 1])
  for (int start : seq.policy.rounds.starts)
    if (start < cand) bounds.push_back(start);
  bounds.push_back(cand);
  std::vector<double> mass(bounds.size() - 1, 0.0);
  auto add = [&](const float* q, int pos) {
    const int n_all = pos + 1;
    score(q, n_all);
    softmax_rows(sel_raw_.data(), n_all, c.n_head, n_all, [&](int) { return n_all; });
    for (int h = 0; h < c.n_head; ++h) {
      const float* row = &sel_raw_[static_cast<size_t>(h) * n_all];
      for (size_t r = 0; r + 1 < bounds.size(); ++r)
        for (int j = bounds[r]; j < bounds[r + 1]; ++j) mass[r] += row[j];
    }
  };
  const PolicyState::Window& w = window_of(layer, seq);
  for (size_t j = 0; j < w.q.size(); ++j)
    if (w.pos[j] >= cand) add(w.q[j].data(), w.pos[j]);
  add(q_now, pos_now);
  out.clear();
  for (int r : choose_rounds(mass, seq.policy.rounds.top_k))
    for (int p = bounds[r]; p < bounds[r + 1]; ++p) out.push_back(p);
}

PolicyState::Window& Engine::window_of(int layer, Sequence& seq) {
  const auto& f = seq.policy.omnikv.filter_layers;
  seq.state.windows.resize(f.size());
  return seq.state.windows[std::find(f.begin(), f.end(), layer) - f.begin()];
}

// Appends ubatch row t's query at filter `layer` to the sequence's window, keeping window - 1.
void Engine::remember_query(int layer, Sequence& seq, int t) {
  push_query(window_of(layer, seq), seq.policy.omnikv.window - 1, t);
}

// Appends ubatch row t's query (post-RoPE, every head) and position to `w`, keeping the last `keep`.
void Engine::push_query(PolicyState::Window& w, int keep_count, int t) {
  const size_t keep = static_cast<size_t>(keep_count);
  if (keep == 0) return;
  const float* q = &q_[static_cast<size_t>(t) * config().n_embd];
  if (w.q.size() == keep) {  // full: recycle the oldest row
    std::rotate(w.q.begin(), w.q.begin() + 1, w.q.end());
    w.pos.erase(w.pos.begin());
    w.q.back().assign(q, q + config().n_embd);
  } else {
    w.q.emplace_back(q, q + config().n_embd);
  }
  w.pos.push_back(pos_[t]);
}

}  // namespace ctx
