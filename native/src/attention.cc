// Attention over the KV cache: dense query blocks and listed keys (sparse decode policies).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine.h"

namespace ctx {

// Causal attention of every token in the micro-batch over its sequence's cache (which already
// holds this micro-batch's K/V). Query blocks of sequences that attend the whole cache run as
// attend_rows tasks; decode steps under a sparse policy attend a key list per KV head
// (attend_listed).
void Engine::attention(int layer, const std::vector<Slice>& slices) {
  const int hkv = config().n_head_kv;
  // Few query blocks (a single decoding sequence): split by head so every thread has work.
  bool probing = false;
  for (const Slice& s : slices) probing |= s.item->probe != nullptr;
  // Probes sum over every head of a token, so a probed token's heads stay in one task.
  const int head_tasks =
      probing || single_thread_ || static_cast<int>(qblocks_.size()) >= 2 * pool_.size() ? 1 : hkv;
  attn_tasks_.clear();
  for (int b = 0; b < static_cast<int>(qblocks_.size()); ++b) {
    if (slice_keys_[qblocks_[b].slice].listed())
      for (int g = 0; g < hkv; ++g) attn_tasks_.push_back({b, g, 1});
    else
      for (int h = 0; h < head_tasks; ++h) attn_tasks_.push_back({b, h * (hkv / head_tasks), hkv / head_tasks});
  }
  parallel(static_cast<int>(attn_tasks_.size()), [&](int i, int thread) {
    const AttnTask& task = attn_tasks_[i];
    const QueryBlock& qb = qblocks_[task.block];
    if (slice_keys_[qb.slice].listed())
      attend_listed(layer, slices[qb.slice], slice_keys_[qb.slice], qb.t_begin, task.h0, attn_scratch_[thread]);
    else attend_rows(layer, slices[qb.slice], qb, task.h0, task.n_heads, attn_scratch_[thread]);
  });
}

// Softmax of each score row over its entries range(r) (in place); the rest of its n_keys become 0.
void Engine::softmax_rows(float* s, size_t lds, int rows, int n_keys, FunctionRef<KeyRange(int)> range) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    const KeyRange k = range(r);
    float mx = row[k.begin];
    for (int j = k.begin + 1; j < k.end; ++j) mx = std::max(mx, row[j]);
    const float inv = 1.0f / k_.exp_sum(row + k.begin, k.end - k.begin, mx);
    for (int j = k.begin; j < k.end; ++j) row[j] *= inv;
    std::fill(row, row + k.begin, 0.f);
    std::fill(row + k.end, row + n_keys, 0.f);
  }
}

// A block of consecutive tokens of one sequence against its cache, for KV heads
// [h0, h0 + n_heads). Each block of keys is read once as whole rows (a token's heads are
// contiguous, so the read streams), widened to f32 once and shared by all the task's query
// heads. Scores are kept whole per row, so the softmax is exact. A token at position p sees the
// keys up to p; on a sliding-window layer only those after p - window.
void Engine::attend_rows(int layer, const Slice& s, const QueryBlock& qb, int h0, int n_heads, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, width = n_heads * d, Q = c.q_dim();
  const float scale = c.attn_scale;
  KvCache& kv = s.item->seq->kv;
  const int n_tok = qb.t_end - qb.t_begin, nq = n_tok * group;  // query rows per KV head
  const int window = c.layer_slides(layer) ? c.sliding_window : 0;
  auto first_key = [&](int p) { return window ? std::max(0, p - window + 1) : 0; };
  // Scores cover keys [k_lo, n_keys): from the block's first token's first key to its last token.
  const int k_lo = first_key(pos_[qb.t_begin]), n_keys = pos_[qb.t_end - 1] + 1;
  const size_t lds = static_cast<size_t>(n_keys - k_lo);
  auto q_rows = [&](int gl) { return &sc.q[static_cast<size_t>(gl) * nq * d]; };
  auto s_rows = [&](int gl) { return &sc.scores[static_cast<size_t>(gl) * nq * lds]; };
  auto o_rows = [&](int gl) { return &sc.out[static_cast<size_t>(gl) * nq * d]; };
  for (int gl = 0; gl < n_heads; ++gl)
    for (int t = 0; t < n_tok; ++t)
      std::memcpy(q_rows(gl) + static_cast<size_t>(t) * group * d,
                  &q_[static_cast<size_t>(qb.t_begin + t) * Q + static_cast<size_t>(h0 + gl) * group * d],
                  sizeof(float) * group * d);
  for (int k0 = k_lo; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_to_f32(kv.k(layer, k0) + h0 * d, kv.ld(layer), nk, width, sc.kv.data());
    for (int gl = 0; gl < n_heads; ++gl)
      k_.attn_scores(q_rows(gl), nq, sc.kv.data() + gl * d, width, nk, d, scale, s_rows(gl) + (k0 - k_lo), lds);
  }
  for (int gl = 0; gl < n_heads; ++gl)
    softmax_rows(s_rows(gl), lds, nq, static_cast<int>(lds), [&](int r) {
      const int p = pos_[qb.t_begin + r / group];
      return KeyRange{first_key(p) - k_lo, p + 1 - k_lo};
    });
  if (float* probe = s.item->probe) {  // one token, all heads in this task (see attention())
    float* out = probe + static_cast<size_t>(layer) * n_keys;
    std::fill(out, out + n_keys, 0.f);
    for (int gl = 0; gl < n_heads; ++gl)
      for (int r = 0; r < nq; ++r)
        for (size_t j = 0; j < lds; ++j) out[k_lo + j] += s_rows(gl)[r * lds + j] / static_cast<float>(c.n_head);
  }
  std::fill(sc.out.begin(), sc.out.begin() + static_cast<size_t>(n_heads) * nq * d, 0.f);
  for (int k0 = k_lo; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_to_f32(kv.v(layer, k0) + h0 * d, kv.ld(layer), nk, width, sc.kv.data());
    for (int gl = 0; gl < n_heads; ++gl)
      k_.attn_values(s_rows(gl) + (k0 - k_lo), lds, nq, sc.kv.data() + gl * d, width, nk, d, o_rows(gl));
  }
  for (int gl = 0; gl < n_heads; ++gl)
    for (int t = 0; t < n_tok; ++t)
      std::memcpy(&attn_[static_cast<size_t>(qb.t_begin + t) * Q + static_cast<size_t>(h0 + gl) * group * d],
                  o_rows(gl) + static_cast<size_t>(t) * group * d, sizeof(float) * group * d);
}

// One decode token (ubatch row t) of a sparse-policy sequence, KV head g, over that head's key
// list (all listed keys precede the token, so no causal mask; sparse policies never run on a
// model with sliding-window layers, Sequence::set_policy). The policy then sees this step's
// probabilities (SCOPE and H2O decide from them which tokens later steps keep).
void Engine::attend_listed(int layer, const Slice& s, const LayerKeys& listed, int t, int g, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, kv_dim = c.kv_dim(), Q = c.q_dim();
  const float scale = c.attn_scale;
  Sequence& seq = *s.item->seq;
  const std::vector<int32_t>& keys = (*listed.heads)[g];
  // Reclaiming: the positions' rows for this (layer, head).
  const int32_t* rows = keys.data();
  if (KvSlots* slots = seq.slots.get()) {
    sc.rows.resize(keys.size());
    for (size_t j = 0; j < keys.size(); ++j) sc.rows[j] = slots->row(layer, g, keys[j]);
    rows = sc.rows.data();
  }
  const PackedRows& packed = listed.packed;
  const int n_keys = static_cast<int>(keys.size());
  const float* q = &q_[static_cast<size_t>(t) * Q + static_cast<size_t>(g) * group * d];
  // The first `packed.n` keys are rows 0.. of the packed buffer (offload); the rest are read from
  // the cache where they live. Key blocks never straddle the two.
  const size_t ld = seq.kv.ld(layer);
  auto widen = [&](bool values, int k0, int nk) {
    if (k0 < packed.n) k_.kv_to_f32(packed.k + (values ? kv_dim : 0) + g * d + k0 * packed.ld, packed.ld, nk, d, sc.kv.data());
    else k_.kv_gather_f32((values ? seq.kv.v(layer) : seq.kv.k(layer)) + g * d, ld, rows + k0, nk, d, sc.kv.data());
  };
  auto block_end = [&](int k0) { return std::min({k0 + kKeyBlock, n_keys, k0 < packed.n ? packed.n : n_keys}); };
  for (int k0 = 0, k1; k0 < n_keys; k0 = k1) {
    k1 = block_end(k0);
    widen(false, k0, k1 - k0);
    k_.attn_scores(q, group, sc.kv.data(), d, k1 - k0, d, scale, &sc.scores[k0], n_keys);
  }
  softmax_rows(sc.scores.data(), n_keys, group, n_keys, [&](int) { return KeyRange{0, n_keys}; });
  std::fill(sc.out.begin(), sc.out.begin() + static_cast<size_t>(group) * d, 0.f);
  for (int k0 = 0, k1; k0 < n_keys; k0 = k1) {
    k1 = block_end(k0);
    widen(true, k0, k1 - k0);
    k_.attn_values(&sc.scores[k0], n_keys, group, sc.kv.data(), d, k1 - k0, d, sc.out.data());
  }
  std::memcpy(&attn_[static_cast<size_t>(t) * Q + static_cast<size_t>(g) * group * d], sc.out.data(),
              sizeof(float) * group * d);
  if (KvSlots* slots = seq.slots.get()) {  // free the rows no later step of (layer, g) attends
    sc.evicted.clear();
    seq.policy->update(layer, g, sc.scores.data(), n_keys, &sc.evicted);
    for (int32_t p : sc.evicted) slots->free(layer, g, p);
  } else {
    seq.policy->update(layer, g, sc.scores.data(), n_keys, nullptr);
  }
}

}  // namespace ctx
