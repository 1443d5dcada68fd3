// OmniKV (Hao et al., ICLR 2025; follows antgroup/OmniKV's code): at each decode step the
// filter layers rank the prompt with the current query (or a window of recent queries) and keep
// the top `budget`; the sparse layers after a filter layer attend only to that set plus the
// generated tokens. Under offload the set's rows of the sparse group come from the host bank as
// one packed gather per selection.
#include "policies/omnikv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "policies/policies.h"

namespace ctx {

std::vector<std::vector<int>> OmniKvPolicy::sparse_groups() const {
  std::vector<std::vector<int>> groups(cfg_.filter_layers.size());
  for (size_t l = 0; l < spec().group.size(); ++l)
    if (spec().group[l] >= 0) groups[spec().group[l]].push_back(static_cast<int>(l));
  std::vector<std::vector<int>> nonempty;
  for (auto& g : groups)
    if (!g.empty()) nonempty.push_back(std::move(g));
  return nonempty;
}

// Under offload the host bank holds the sparse groups.
std::vector<std::vector<int>> OmniKvPolicy::host_groups() const { return cfg_.offload ? sparse_groups() : std::vector<std::vector<int>>{}; }

// The packed buffers at most: budget rows of every sparse layer, per K/V row pair.
size_t OmniKvPolicy::packed_rows() const {
  if (!cfg_.offload) return 0;
  size_t layers = 0;
  for (const auto& g : sparse_groups()) layers += g.size();
  return layers * static_cast<size_t>(cfg_.budget);
}

void OmniKvPolicy::reset() {
  prompt_len_ = -1;
  selected_.clear();
  windows_.clear();
  packed_.clear();
}

void OmniKvPolicy::begin(const PolicyStep& step) {
  if (step.prompt) {  // new prompt tokens: re-pick candidates at the next decode step
    prompt_len_ = -1;
    return;
  }
  if (prompt_len_ >= 0) return;
  prompt_len_ = step.pos0;
  selected_.assign(cfg_.filter_layers.size(), {});
  keys_.resize(step.backend.config().n_head_kv);
  start_decode(step);
}

// Prompt chunks: filter layers keep the prompt's last queries where the selection needs them.
void OmniKvPolicy::observe_prompt(int layer, const PolicyStep& step) {
  if (!remembers_queries() || spec().roles[layer] != LayerRole::Filter) return;
  for (int j = std::max(0, step.count - (cfg_.window - 1)); j < step.count; ++j)
    window_of(layer).push(step.backend, step.t + j, cfg_.window - 1);
}

// A filter layer runs its selection (and refreshes the packed rows under offload); a sparse layer
// attends to its filter layer's selection plus the generated tokens. A selection holding every
// candidate is the dense case: the backend's faster whole-cache path.
LayerKeys OmniKvPolicy::keys(int layer, const PolicyStep& step) {
  const std::vector<int32_t>* subset = nullptr;
  PackedRows packed;
  const LayerRole role = spec().roles[layer];
  if (role == LayerRole::Filter) {
    // The layer attends densely; it ranks by the scores that attention computes (scored()).
    if (ranks_own_scores(step)) return LayerKeys{nullptr, PackedRows{}, true};
    const int idx = filter_index(layer);
    selected(idx, step.kv, select(layer, step, selected_[idx]));
  } else if (role == LayerRole::Sparse) {
    subset = &selected_[spec().group[layer]];
    packed = packed_for(layer, step.kv);
  }
  if (subset && static_cast<int>(subset->size()) == candidate_end()) {
    subset = nullptr;
    packed = PackedRows{};
  }
  if (!subset && !lists_every_layer()) return LayerKeys{};
  for (int g = 0; g < static_cast<int>(keys_.size()); ++g) {
    std::vector<int32_t>& keys = keys_[g];
    keys.clear();
    if (subset)
      keys.assign(subset->begin(), subset->end());
    else
      append_range(keys, 0, prompt_len_);
    append_generated(layer, g, step.pos0, keys);
  }
  return LayerKeys{&keys_, packed};
}

// Plain OmniKV ranks by the current query alone: the scores the filter layer's own dense attention
// computes, so its selection waits for them instead of reading the layer's keys a second time.
bool OmniKvPolicy::ranks_own_scores(const PolicyStep& step) const {
  return step.count == 1 && !remembers_queries() && !lists_every_layer() && cfg_.budget < candidate_end();
}

void OmniKvPolicy::scored(int layer, const PolicyStep& step, const float* raw, int n_keys) {
  const int idx = filter_index(layer);
  ++selections_;
  rank_.resize(candidate_end());
  rank_candidates(cfg_.selector, raw, step.backend.config().n_head, n_keys, candidate_end(), rank_.data());
  selected(idx, step.kv, take_top(selected_[idx]));
}

void OmniKvPolicy::selected(int idx, const KvCache& kv, bool changed) {
  if (cfg_.offload && (changed || packed_.empty() || packed_[idx].empty())) refresh_packed(kv, idx);
}

// Rank the prompt's tokens by the current query (every query head, max over heads), or by a
// window of remembered queries, and keep the top `budget`, ascending.
bool OmniKvPolicy::select(int layer, const PolicyStep& step, std::vector<int32_t>& out) {
  PolicyBackend& be = step.backend;
  const ModelConfig& c = be.config();
  const int n_cand = candidate_end();
  ++selections_;
  if (cfg_.budget >= n_cand) {  // the whole prompt fits the budget: nothing to rank
    const bool changed = static_cast<int>(out.size()) != n_cand;
    out.resize(n_cand);
    std::iota(out.begin(), out.end(), 0);
    return changed;
  }
  const int t = step.t, pos = be.position(t);
  rank_.resize(n_cand);
  if (!is_window_selector(cfg_.selector)) {
    const int n_all = cfg_.selector == Selector::Last ? n_cand : pos + 1;  // softmax needs every key
    const float* raw = be.score_keys(step.kv, layer, be.query(t), n_all);
    rank_candidates(cfg_.selector, raw, c.n_head, n_all, n_cand, rank_.data());
  } else {
    // The window: the remembered queries (oldest first), then the current one; each sees the keys
    // up to its own position (causal) and adds its weighted probabilities of the candidates.
    QueryWindow& w = window_of(layer);
    const int n_win = static_cast<int>(w.q.size()) + 1;
    std::fill(rank_.begin(), rank_.end(), 0.f);
    for (int j = 0; j < n_win; ++j) {
      const bool now = j == n_win - 1;
      const int n_all = (now ? pos : w.pos[j]) + 1;
      const float* raw = be.score_keys(step.kv, layer, now ? be.query(t) : w.q[j].data(), n_all);
      accumulate_window_scores(raw, c.n_head, n_all, std::min(n_cand, n_all), window_weight(cfg_.selector, j, n_win), rank_.data(),
                               window_scratch_);
    }
    // Prompt tokens still inside the window are always kept (the official code forces them in).
    for (int p = std::max(0, pos - (cfg_.window - 1)); p < n_cand; ++p) rank_[p] = INFINITY;
    w.push(be, t, cfg_.window - 1);
  }
  return take_top(out);
}

bool OmniKvPolicy::take_top(std::vector<int32_t>& out) {
  top_k_sorted(rank_.data(), static_cast<int>(rank_.size()), cfg_.budget, new_);
  if (cfg_.lazy_iou > 0.f && !out.empty() && iou(new_, out) > cfg_.lazy_iou) {
    ++lazy_reuses_;  // close enough to the last set: keep it, skip the reload
    return false;
  }
  out.swap(new_);
  return true;
}

int OmniKvPolicy::filter_index(int layer) const {
  const auto& f = cfg_.filter_layers;
  return static_cast<int>(std::find(f.begin(), f.end(), layer) - f.begin());
}

PromptStateHolder::Windows OmniKvPolicy::prompt_windows(const ModelConfig&) {
  if (!remembers_queries() || cfg_.window <= 1) return {};
  windows_.resize(cfg_.filter_layers.size());
  Windows w;
  w.keep = cfg_.window - 1;
  for (size_t i = 0; i < windows_.size(); ++i) {
    w.layers.push_back(cfg_.filter_layers[i]);
    w.windows.push_back(&windows_[i]);
  }
  return w;
}

QueryWindow& OmniKvPolicy::window_of(int layer) {
  windows_.resize(cfg_.filter_layers.size());
  return windows_[filter_index(layer)];
}

// One gather from the host bank of the selected tokens' rows of every sparse layer that uses
// filter layer `idx`'s selection.
void OmniKvPolicy::refresh_packed(const KvCache& kv, int idx) {
  packed_.resize(cfg_.filter_layers.size());
  int bank = -1;
  for (int l = 0; l < static_cast<int>(spec().group.size()) && bank < 0; ++l)
    if (spec().group[l] == idx) bank = kv.bank_of(l);
  const std::vector<int32_t>& sel = selected_[idx];
  if (bank < 0 || static_cast<int>(sel.size()) == candidate_end()) {  // no sparse layers, or the dense case
    packed_[idx].clear();
    return;
  }
  packed_[idx].resize(sel.size() * kv.bank_layers(bank) * 2 * kv.row_elems());
  kv.gather_bank(bank, sel.data(), static_cast<int>(sel.size()), packed_[idx].data());
}

PackedRows OmniKvPolicy::packed_for(int layer, const KvCache& kv) const {
  const int bank = kv.bank_of(layer), idx = spec().group[layer];
  if (bank < 0 || idx >= static_cast<int>(packed_.size()) || packed_[idx].empty()) return PackedRows{};
  const size_t ld = static_cast<size_t>(kv.bank_layers(bank)) * 2 * kv.row_elems();
  return {packed_[idx].data() + kv.slot_in_bank(layer) * 2 * kv.row_elems(), ld, static_cast<int>(selected_[idx].size())};
}

PolicyStats OmniKvPolicy::stats() const {
  PolicyStats s;
  s.prompt_len = prompt_len_;
  s.selections = selections_;
  s.lazy_reuses = lazy_reuses_;
  s.selected = selected_;
  return s;
}

size_t OmniKvPolicy::state_bytes() const {
  size_t n = vector_bytes(selected_) + vector_bytes(keys_) + vector_bytes(packed_) + vector_bytes(rank_) + vector_bytes(window_scratch_) +
             vector_bytes(new_);
  for (const QueryWindow& w : windows_) n += w.bytes();
  return n;
}

std::unique_ptr<DecodePolicy> make_omnikv_policy(const AttentionPolicy& spec) { return std::make_unique<OmniKvPolicy>(spec); }

}  // namespace ctx
