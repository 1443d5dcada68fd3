// Attention over the KV cache: dense query blocks (in one pass, online softmax), listed keys
// (sparse decode policies) and attention probes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine.h"

namespace ctx {

// Causal attention of every token in the micro-batch over its sequence's cache (which already
// holds this micro-batch's K/V). Query blocks run as attend_flash tasks (a probed token's
// probabilities come from probe_rows besides); decode steps under a sparse policy attend a key
// list per KV head at the layers where the policy lists one (attend_listed).
void Engine::attention(int layer, const std::vector<Slice>& slices) {
  const int hkv = config().n_head_kv;
  // Few query blocks (a single decoding sequence): split by head so every thread has work.
  bool probing = false;
  for (const Slice& s : slices) probing |= s.item->probe != nullptr;
  // Probes sum over every head of a token, so a probed token's heads stay in one task.
  const int head_tasks = probing || single_thread_ || static_cast<int>(qblocks_.size()) >= 2 * pool_.size() ? 1 : hkv;
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
    const Slice& s = slices[qb.slice];
    if (slice_keys_[qb.slice].listed()) {
      attend_listed(layer, s, slice_keys_[qb.slice], qb.t_begin, task.h0, attn_scratch_[thread]);
      return;
    }
    attend_flash(layer, s, qb, task.h0, task.n_heads, attn_scratch_[thread]);
    if (s.item->probe) probe_rows(layer, s, qb.t_begin, attn_scratch_[thread]);
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

// The first key a token at position p sees at `layer`: on a sliding-window layer the first of its
// last sliding_window positions.
int Engine::first_key(int layer, int p) const {
  const int window = config().layer_slides(layer) ? config().sliding_window : 0;
  return window ? std::max(0, p - window + 1) : 0;
}

// A block of consecutive tokens of one sequence against its cache, for KV heads
// [h0, h0 + n_heads), in one pass: online softmax (flash_block) over blocks of kKeyBlock keys
// that start at multiples of kKeyBlock, so a token meets the same blocks however its prompt was
// chunked (and decodes bit for bit as its prefill would). Each block of keys is read once, its
// rows in order (a token's heads are contiguous, so the read streams), for all the task's query
// heads; no score row outlives its block. A token at position p sees the keys up to p, on a
// sliding-window layer only those from first_key.
void Engine::attend_flash(int layer, const Slice& s, const QueryBlock& qb, int h0, int n_heads, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, Q = c.q_dim();
  KvCache& kv = s.item->seq->kv;
  const int n_tok = qb.t_end - qb.t_begin, nq = n_tok * group;  // query rows per KV head
  const size_t head_rows = static_cast<size_t>(nq) * d;
  for (int gl = 0; gl < n_heads; ++gl)
    for (int t = 0; t < n_tok; ++t)
      std::memcpy(&sc.q[gl * head_rows + static_cast<size_t>(t) * group * d],
                  &q_[static_cast<size_t>(qb.t_begin + t) * Q + static_cast<size_t>(h0 + gl) * group * d], sizeof(float) * group * d);
  std::fill(sc.m.begin(), sc.m.begin() + n_heads * nq, -INFINITY);
  std::fill(sc.l.begin(), sc.l.begin() + n_heads * nq, 0.f);
  std::fill(sc.acc.begin(), sc.acc.begin() + n_heads * head_rows, 0.f);
  const int k_end = pos_[qb.t_end - 1] + 1;
  // A policy ranking keys by this decode token's scores (prepare_sparse): rows [n_head][k_end].
  float* raw = slice_keys_[qb.slice].wants_scores ? slice_raw_[qb.slice].data() : nullptr;
  for (int k0 = first_key(layer, pos_[qb.t_begin]) / kKeyBlock * kKeyBlock; k0 < k_end; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, k_end - k0);
    for (int r = 0; r < nq; ++r) {
      const int p = pos_[qb.t_begin + r / group];
      sc.lo[r] = std::clamp(first_key(layer, p) - k0, 0, nk);
      sc.hi[r] = std::clamp(p + 1 - k0, 0, nk);
    }
    const bool more = k0 + kKeyBlock < k_end;
    for (int gl = 0; gl < n_heads; ++gl) {
      const size_t col = static_cast<size_t>(h0 + gl) * d;
      k_.flash_block(&sc.q[gl * head_rows], nq, kv.k(layer, k0) + col, kv.v(layer, k0) + col, kv.ld(layer), nk, d, c.attn_scale,
                     sc.lo.data(), sc.hi.data(), &sc.m[gl * nq], &sc.l[gl * nq], &sc.acc[gl * head_rows], sc.work.data(),
                     more ? kv.k(layer, k0 + kKeyBlock) + col : nullptr, more ? kv.v(layer, k0 + kKeyBlock) + col : nullptr,
                     raw ? raw + static_cast<size_t>(h0 + gl) * group * k_end + k0 : nullptr, static_cast<size_t>(k_end));
    }
  }
  for (int gl = 0; gl < n_heads; ++gl)
    for (int r = 0; r < nq; ++r) {
      const float inv = 1.0f / sc.l[gl * nq + r];
      const float* a = &sc.acc[gl * head_rows + static_cast<size_t>(r) * d];
      float* out = &attn_[static_cast<size_t>(qb.t_begin + r / group) * Q + static_cast<size_t>((h0 + gl) * group + r % group) * d];
      for (int i = 0; i < d; ++i) out[i] = a[i] * inv;
    }
}

// An attention probe (ubatch row t, one token under full attention, every head in this task):
// its probabilities over the keys it sees, per head an exact softmax over the whole score row
// (sums in double), averaged over the heads, into the item's probe row of this layer.
void Engine::probe_rows(int layer, const Slice& s, int t, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, Q = c.q_dim();
  KvCache& kv = s.item->seq->kv;
  const int n_keys = pos_[t] + 1, k_lo = first_key(layer, pos_[t]), n = n_keys - k_lo;
  float* out = s.item->probe + static_cast<size_t>(layer) * n_keys;
  std::fill(out, out + n_keys, 0.f);
  float* rows = sc.scores.data();  // [group][n]
  for (int g = 0; g < c.n_head_kv; ++g) {
    // Blocks end at multiples of kKeyBlock, so none wraps around a sliding layer's ring.
    for (int k0 = k_lo, k1; k0 < n_keys; k0 = k1) {
      k1 = std::min(n_keys, (k0 / kKeyBlock + 1) * kKeyBlock);
      k_.attn_scores_f16(&q_[static_cast<size_t>(t) * Q + static_cast<size_t>(g) * group * d], group, kv.k(layer, k0) + g * d, kv.ld(layer),
                         k1 - k0, d, c.attn_scale, rows + (k0 - k_lo), n, nullptr);
    }
    softmax_rows(rows, n, group, n, [&](int) { return KeyRange{0, n}; });
    for (int r = 0; r < group; ++r)
      for (int j = 0; j < n; ++j) out[k_lo + j] += rows[static_cast<size_t>(r) * n + j] / static_cast<float>(c.n_head);
  }
}

// One decode token (ubatch row t) of a sparse-policy sequence, KV head g, over that head's key
// list (all listed keys precede the token, so no causal mask; lists come only at global layers,
// Engine::prepare_sparse): in one pass (flash_block) over the
// list in blocks of kKeyBlock entries, so that a list of every key is dense attention, bit for
// bit. A policy that reads the step's probabilities (SCOPE and H2O decide from them which tokens
// later steps keep) gets them from whole score rows besides, as a probe does.
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
  // The first `packed.n` keys are rows 0.. of the packed buffer (offload), K then V in each; the
  // rest are read from the cache where they live. Key blocks never straddle the two.
  const size_t ld = seq.kv.ld(layer);
  const uint16_t* packed_k = packed.k + g * d;
  const uint16_t* cache_k = seq.kv.k(layer) + g * d;
  const uint16_t* cache_v = seq.kv.v(layer) + g * d;
  auto block_end = [&](int k0) { return std::min({k0 + kKeyBlock, n_keys, k0 < packed.n ? packed.n : n_keys}); };
  std::fill(sc.m.begin(), sc.m.begin() + group, -INFINITY);
  std::fill(sc.l.begin(), sc.l.begin() + group, 0.f);
  std::fill(sc.acc.begin(), sc.acc.begin() + static_cast<size_t>(group) * d, 0.f);
  uint16_t* gk = sc.gathered.data();  // a block's cached rows, K then V, d elements each
  uint16_t* gv = gk + static_cast<size_t>(kKeyBlock) * d;
  for (int k0 = 0, k1; k0 < n_keys; k0 = k1) {
    k1 = block_end(k0);
    const int nk = k1 - k0;
    std::fill(sc.lo.begin(), sc.lo.begin() + group, 0);
    std::fill(sc.hi.begin(), sc.hi.begin() + group, nk);
    const uint16_t *k = gk, *v = gv;
    size_t ldk = d;
    if (k0 < packed.n) {
      k = packed_k + k0 * packed.ld;
      v = k + kv_dim;
      ldk = packed.ld;
    } else {
      for (int j = 0; j < nk; ++j) {
        std::memcpy(gk + static_cast<size_t>(j) * d, cache_k + static_cast<size_t>(rows[k0 + j]) * ld, sizeof(uint16_t) * d);
        std::memcpy(gv + static_cast<size_t>(j) * d, cache_v + static_cast<size_t>(rows[k0 + j]) * ld, sizeof(uint16_t) * d);
      }
    }
    // The packed rows are one stream, fetched a block ahead; the gathered ones are copied above.
    const uint16_t* next_k = k1 < packed.n ? packed_k + k1 * packed.ld : nullptr;
    k_.flash_block(q, group, k, v, ldk, nk, d, scale, sc.lo.data(), sc.hi.data(), sc.m.data(), sc.l.data(), sc.acc.data(), sc.work.data(),
                   next_k, next_k ? next_k + kv_dim : nullptr, nullptr, 0);
  }
  float* out = &attn_[static_cast<size_t>(t) * Q + static_cast<size_t>(g) * group * d];
  for (int r = 0; r < group; ++r) {
    const float inv = 1.0f / sc.l[r];
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(r) * d + i] = sc.acc[static_cast<size_t>(r) * d + i] * inv;
  }
  const float* probs = nullptr;
  if (seq.policy->reads_probabilities()) {
    for (int k0 = 0, k1; k0 < n_keys; k0 = k1) {
      k1 = block_end(k0);
      if (k0 < packed.n) {
        k_.attn_scores_f16(q, group, packed_k + k0 * packed.ld, packed.ld, k1 - k0, d, scale, &sc.scores[k0], n_keys, nullptr);
        continue;
      }
      k_.kv_gather_f32(cache_k, ld, rows + k0, k1 - k0, d, sc.kv.data());
      k_.attn_scores(q, group, sc.kv.data(), d, k1 - k0, d, scale, &sc.scores[k0], n_keys);
    }
    softmax_rows(sc.scores.data(), n_keys, group, n_keys, [&](int) { return KeyRange{0, n_keys}; });
    probs = sc.scores.data();
  }
  if (KvSlots* slots = seq.slots.get()) {  // free the rows no later step of (layer, g) attends
    sc.evicted.clear();
    seq.policy->update(layer, g, probs, n_keys, &sc.evicted);
    for (int32_t p : sc.evicted) slots->free(layer, g, p);
  } else {
    seq.policy->update(layer, g, probs, n_keys, nullptr);
  }
}

}  // namespace ctx
