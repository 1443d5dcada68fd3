// Sparse decode policies in the forward pass: per-layer key lists (OmniKV's and Round
// Attention's selections from selection.cc, SCOPE pools, streaming and H2O baselines), the
// updates that follow a step's attention, SCOPE's prompt pool and OmniKV's packed load.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "engine.h"

namespace ctx {

// Baselines: StreamingLLM's sinks + recent window (the same for every head), or H2O's kept set
// per (layer, head) plus the current token.
void Engine::baseline_keys(int layer, Sequence& seq, int pos) {
  PolicyState& st = seq.state;
  const int hkv = config().n_head_kv;
  for (int g = 0; g < hkv; ++g) {
    std::vector<int32_t>& keys = st.heads[g].keys;
    keys.clear();
    if (seq.policy.kind == AttentionPolicy::Kind::Streaming) {
      const StreamingConfig& c = seq.policy.streaming;
      const int sinks = std::min(c.sinks, pos + 1), from = std::max(sinks, pos - c.window + 1);
      for (int p = 0; p < sinks; ++p) keys.push_back(p);
      for (int p = from; p <= pos; ++p) keys.push_back(p);
    } else {
      const auto& kept = st.pool[static_cast<size_t>(layer) * hkv + g];
      keys.assign(kept.begin(), kept.end());
      keys.push_back(pos);
    }
  }
}

// H2O after a step's attention at (layer, head g): add this step's attention (mean over the
// head's query group) to every kept token's score, then evict the lowest-scoring tokens outside
// the recent window down to the budget.
void Engine::h2o_update(int layer, Sequence& seq, int g, const float* probs, int n_keys) {
  const ModelConfig& c = config();
  const int group = c.n_head / c.n_head_kv;
  PolicyState& st = seq.state;
  const size_t slot = static_cast<size_t>(layer) * c.n_head_kv + g;
  std::vector<int32_t>& kept = st.pool[slot];
  std::vector<float>& acc = st.acc[slot];
  PolicyState::Head& head = st.heads[g];
  kept.push_back(head.keys.back());
  acc.push_back(0.f);
  for (int j = 0; j < n_keys; ++j) {
    float sum = 0;
    for (int h = 0; h < group; ++h) sum += probs[static_cast<size_t>(h) * n_keys + j];
    acc[j] += sum / static_cast<float>(group);
  }
  const H2oConfig& cfg = seq.policy.h2o;
  if (n_keys <= cfg.budget) return;
  const int older = n_keys - cfg.recent;
  top_k_sorted(acc.data(), older, cfg.budget - cfg.recent, head.scratch);
  size_t w = 0;
  for (int32_t i : head.scratch) { kept[w] = kept[i]; acc[w] = acc[i]; ++w; }  // ascending: in place
  for (int j = older; j < n_keys; ++j) { kept[w] = kept[j]; acc[w] = acc[j]; ++w; }
  kept.resize(w);
  acc.resize(w);
}

// Sets slice_keys_ for `layer`: for each decode step of a sequence with a sparse policy, the keys
// each KV head attends to = a prompt part (everything, or OmniKV's selection on sparse layers)
// plus a generated part (everything, or SCOPE's pool plus the current token). Filter layers run
// OmniKV's selection first. nullptr = the whole cache (the faster dense path).
void Engine::prepare_sparse(int layer, const std::vector<Slice>& slices) {
  const int hkv = config().n_head_kv;
  slice_keys_.assign(slices.size(), nullptr);
  slice_packed_.assign(slices.size(), Packed{});
  int t = 0;
  for (size_t i = 0; i < slices.size(); t += slices[i].count, ++i) {
    const Slice& s = slices[i];
    Sequence& seq = *s.item->seq;
    const AttentionPolicy& pol = seq.policy;
    if (s.item->n_tokens != 1) {  // prefill: keep the prompt's last queries where a policy needs them
      const bool windowed = is_window_selector(pol.omnikv.selector) || pol.kind == AttentionPolicy::Kind::Rounds;
      if (pol.uses_omnikv() && windowed && pol.roles[layer] == LayerRole::Filter)
        for (int j = std::max(0, s.count - (pol.omnikv.window - 1)); j < s.count; ++j) remember_query(layer, seq, t + j);
      if (pol.compresses_prompt()) {
        seq.state.observed.resize(config().n_layer);
        for (int j = std::max(0, s.count - pol.scope.alpha2); j < s.count; ++j)
          push_query(seq.state.observed[layer], pol.scope.alpha2, t + j);
      }
      continue;
    }
    if (!pol.sparse_decode()) continue;
    PolicyState& st = seq.state;
    if (st.prompt_len < 0) {  // first decode step after a prompt
      st.prompt_len = s.pos0;
      st.selected.assign(pol.uses_omnikv() ? pol.omnikv.filter_layers.size() : 0, {});
      const bool pooled = pol.uses_scope() || pol.kind == AttentionPolicy::Kind::H2o;
      st.pool.assign(pooled ? static_cast<size_t>(config().n_layer) * hkv : 0, {});
      if (pol.kind == AttentionPolicy::Kind::H2o) {  // every prompt token starts as a candidate
        for (auto& p : st.pool)
          for (int j = 0; j < s.pos0; ++j) p.push_back(j);
        st.acc.assign(st.pool.size(), std::vector<float>(s.pos0, 0.f));
      }
      st.heads.resize(hkv);
      st.prompt_pool.assign(pol.compresses_prompt() ? static_cast<size_t>(config().n_layer) * hkv : 0, {});
      st.prompt_pool_done.assign(pol.compresses_prompt() ? config().n_layer : 0, false);
    }
    if (pol.compresses_prompt() && !st.prompt_pool_done[layer]) compute_prompt_pool(layer, seq);
    const std::vector<int32_t>* prompt_subset = nullptr;
    if (pol.uses_omnikv()) {
      const LayerRole role = pol.roles[layer];
      if (role == LayerRole::Filter) {
        const auto& f = pol.omnikv.filter_layers;
        const int idx = static_cast<int>(std::find(f.begin(), f.end(), layer) - f.begin());
        const bool changed = select_tokens(layer, seq, t, st.selected[idx]);
        if (pol.offloads() && (changed || st.packed.empty() || st.packed[idx].empty())) refresh_packed(seq, idx);
      } else if (role == LayerRole::Sparse) {
        prompt_subset = &st.selected[pol.group[layer]];
        slice_packed_[i] = packed_for(layer, seq);
      }
    }
    if (pol.kind == AttentionPolicy::Kind::Streaming || pol.kind == AttentionPolicy::Kind::H2o) {
      baseline_keys(layer, seq, s.pos0);
      slice_keys_[i] = &st.heads;
      continue;
    }
    // A selection holding the whole prompt is the dense case: take the faster row-streaming path.
    if (prompt_subset && static_cast<int>(prompt_subset->size()) == seq.candidate_end()) {
      prompt_subset = nullptr;
      slice_packed_[i] = Packed{};
    }
    if (!prompt_subset && !pol.uses_scope()) continue;  // this layer attends everything
    for (int g = 0; g < hkv; ++g) {
      std::vector<int32_t>& keys = st.heads[g].keys;
      keys.clear();
      if (prompt_subset) keys.assign(prompt_subset->begin(), prompt_subset->end());
      else if (pol.compresses_prompt()) keys.assign(st.prompt_pool[static_cast<size_t>(layer) * hkv + g].begin(), st.prompt_pool[static_cast<size_t>(layer) * hkv + g].end());
      else for (int p = 0; p < st.prompt_len; ++p) keys.push_back(p);
      if (pol.uses_scope()) {
        const auto& pool = st.pool[static_cast<size_t>(layer) * hkv + g];
        keys.insert(keys.end(), pool.begin(), pool.end());
        keys.push_back(s.pos0);
      } else {
        for (int p = seq.candidate_end(); p <= s.pos0; ++p) keys.push_back(p);  // generated (and the current round): always attended
      }
    }
    slice_keys_[i] = &st.heads;
  }
}

// SCOPE's prompt pool at `layer` (SnapKV-style): the importance of each earlier prompt token is
// the attention the last alpha2 prompt tokens' queries pay it (softmax over the keys each query
// sees, mean over a KV head's query group, summed over the queries); each KV head keeps its top
// alpha1 plus the last alpha2. Without those queries (KV imported) the prompt is kept whole.
void Engine::compute_prompt_pool(int layer, Sequence& seq) {
  const ModelConfig& c = config();
  PolicyState& st = seq.state;
  const ScopeConfig& cfg = seq.policy.scope;
  const int P = st.prompt_len, hkv = c.n_head_kv, group = c.n_head / hkv, d = c.head_dim, kv_dim = c.kv_dim();
  st.prompt_pool_done[layer] = true;
  const bool observed = layer < static_cast<int>(st.observed.size()) && !st.observed[layer].q.empty();
  for (int g = 0; g < hkv; ++g) st.heads[g].importance.assign(P, 0.f);
  if (observed && P > cfg.alpha1 + cfg.alpha2) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    float* kbuf = attn_scratch_[0].kv.data();
    const PolicyState::Window& w = st.observed[layer];
    for (size_t j = 0; j < w.q.size(); ++j) {
      const int n_all = std::min(w.pos[j], P - 1) + 1;
      for (int k0 = 0; k0 < n_all; k0 += kKeyBlock) {
        const int nk = std::min(kKeyBlock, n_all - k0);
        k_.kv_to_f32(seq.kv.k(layer, k0), seq.kv.ld(layer), nk, kv_dim, kbuf);
        for (int g = 0; g < hkv; ++g)
          k_.attn_scores(w.q[j].data() + static_cast<size_t>(g) * group * d, group, kbuf + g * d, kv_dim, nk, d, scale,
                         &sel_raw_[static_cast<size_t>(g) * group * n_all + k0], n_all);
      }
      softmax_rows(sel_raw_.data(), n_all, c.n_head, n_all, [&](int) { return n_all; });
      for (int g = 0; g < hkv; ++g)
        for (int h = 0; h < group; ++h) {
          const float* row = &sel_raw_[static_cast<size_t>(g * group + h) * n_all];
          for (int k = 0; k < n_all; ++k) st.heads[g].importance[k] += row[k] / static_cast<float>(group);
        }
    }
  }
  for (int g = 0; g < hkv; ++g) {
    std::vector<int32_t>& pool = st.prompt_pool[static_cast<size_t>(layer) * hkv + g];
    if (observed) snap_select(st.heads[g].importance.data(), P, cfg.alpha1, cfg.alpha2, pool);
    else {
      pool.resize(P);
      std::iota(pool.begin(), pool.end(), 0);
    }
  }
}

// OmniKV's packed load under offload: one gather from the host bank of the selected tokens'
// rows of every sparse layer that uses filter layer `idx`'s selection.
void Engine::refresh_packed(Sequence& seq, int idx) {
  const AttentionPolicy& pol = seq.policy;
  PolicyState& st = seq.state;
  st.packed.resize(pol.omnikv.filter_layers.size());
  int bank = -1;
  for (int l = 0; l < config().n_layer && bank < 0; ++l)
    if (pol.group[l] == idx) bank = seq.kv.bank_of(l);
  const std::vector<int32_t>& sel = st.selected[idx];
  if (bank < 0 || static_cast<int>(sel.size()) == seq.candidate_end()) {  // no sparse layers, or the dense case
    st.packed[idx].clear();
    return;
  }
  st.packed[idx].resize(sel.size() * seq.kv.bank_layers(bank) * 2 * seq.kv.row_elems());
  seq.kv.gather_bank(bank, sel.data(), static_cast<int>(sel.size()), st.packed[idx].data());
}

Engine::Packed Engine::packed_for(int layer, const Sequence& seq) const {
  const int bank = seq.kv.bank_of(layer), idx = seq.policy.group[layer];
  if (bank < 0 || idx >= static_cast<int>(seq.state.packed.size()) || seq.state.packed[idx].empty()) return Packed{};
  const size_t ld = static_cast<size_t>(seq.kv.bank_layers(bank)) * 2 * seq.kv.row_elems();
  return {seq.state.packed[idx].data() + seq.kv.slot_in_bank(layer) * 2 * seq.kv.row_elems(), ld,
          static_cast<int>(seq.state.selected[idx].size())};
}

}  // namespace ctx
