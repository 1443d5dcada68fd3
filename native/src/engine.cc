#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "dequant.h"
#include "packed.h"
#include "policy.h"

namespace ctx {

namespace {
constexpr int kLogitRows = 32;  // next-token logits computed per output matmul

bool is_quantized(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0; }
}  // namespace

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& opts)
    : model_(std::move(model)), opts_(opts), k_(select_kernels()), pool_(opts.n_threads) {
  const ModelConfig& c = model_->config();
  if (opts_.n_threads < 1 || opts_.n_threads > 256) throw std::invalid_argument("engine: threads must be 1..256");
  if (opts_.n_threads_decode != 1 && opts_.n_threads_decode != opts_.n_threads)
    throw std::invalid_argument("engine: decode threads must be 1 or equal to threads");
  if (opts_.ubatch < 1 || opts_.ubatch > 8192) throw std::invalid_argument("engine: ubatch must be 1..8192");
  max_ctx_ = opts_.max_context > 0 ? opts_.max_context : c.n_ctx_train;
  if (max_ctx_ > (1 << 22)) throw std::invalid_argument("engine: max_context too large");

  const size_t U = opts_.ubatch, E = c.n_embd, F = c.n_ff, KV = c.kv_dim(), wide = std::max(E, F);
  x_.resize(U * E);
  xn_.resize(U * wide);
  q_.resize(U * E);
  kc_.resize(U * KV);
  vc_.resize(U * KV);
  attn_.resize(U * E);
  gate_.resize(U * F);
  up_.resize(U * F);
  act_qs_.resize(U * wide);
  act_d_.resize(U * wide / 32);
  act_s_.resize(U * wide / 32);
  act_isum_.resize(U * wide / 32);
  act_ = {act_qs_.data(), act_d_.data(), act_s_.data(), act_isum_.data(), 0};
  pos_.resize(U);
  token_seq_.resize(U);
  logits_x_.resize(kLogitRows * E);
  logits_buf_.resize(static_cast<size_t>(kLogitRows) * c.n_vocab);
  attn_scratch_.resize(pool_.size());
  for (auto& sc : attn_scratch_) {
    sc.q.resize(static_cast<size_t>(kQueryBlock) * c.n_head * c.head_dim);
    sc.out.resize(sc.q.size());
    sc.kv.resize(static_cast<size_t>(kKeyBlock) * c.kv_dim());
    sc.scores.resize(static_cast<size_t>(kQueryBlock) * c.n_head * max_ctx_);
  }
  qblocks_.reserve(opts_.ubatch);
  slice_keys_.reserve(opts_.ubatch);
  attn_tasks_.reserve(static_cast<size_t>(opts_.ubatch) * c.n_head_kv);
  sel_raw_.resize(static_cast<size_t>(c.n_head) * max_ctx_);
  sel_rank_.resize(max_ctx_);
  sel_new_.reserve(max_ctx_);
  slices_.reserve(opts_.ubatch);
  wanted_.reserve(opts_.ubatch);

  // RoPE table computed the way ggml does (theta multiplied by base^(-2/d) per pair, in float)
  // so positions match llama.cpp bit for bit.
  const int half = c.head_dim / 2;
  rope_cos_.resize(static_cast<size_t>(max_ctx_) * half);
  rope_sin_.resize(static_cast<size_t>(max_ctx_) * half);
  const float theta_scale = std::pow(c.rope_base, -2.0f / static_cast<float>(c.head_dim));
  for (int p = 0; p < max_ctx_; ++p) {
    float theta = static_cast<float>(p);
    for (int i = 0; i < half; ++i) {
      rope_cos_[static_cast<size_t>(p) * half + i] = std::cos(theta);
      rope_sin_[static_cast<size_t>(p) * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

Engine::~Engine() = default;

void Engine::validate(const std::vector<BatchItem>& items) const {
  const ModelConfig& c = config();
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (!it.seq) throw std::invalid_argument("forward: batch item without a sequence");
    if (it.n_tokens < 1) throw std::invalid_argument("forward: empty token list (a prompt needs at least one token)");
    const int limit = std::min(it.seq->kv.capacity(), max_ctx_);
    if (it.probe && (it.n_tokens != 1 || it.seq->policy.sparse_decode()))
      throw std::invalid_argument("forward: an attention probe needs a one-token item under full attention");
    if (it.seq->n_past() + it.n_tokens > limit)
      throw std::invalid_argument("forward: " + std::to_string(it.seq->n_past() + it.n_tokens) +
                                  " tokens exceed the context limit of " + std::to_string(limit) +
                                  (limit == max_ctx_ ? " (model context)" : " (sequence capacity)"));
    for (int t = 0; t < it.n_tokens; ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= c.n_vocab)
        throw std::invalid_argument("forward: token id " + std::to_string(it.tokens[t]) + " is outside the vocabulary");
    for (size_t j = 0; j < i; ++j)
      if (items[j].seq == it.seq) throw std::invalid_argument("forward: a sequence appears twice in one batch");
  }
}

void Engine::forward(const std::vector<BatchItem>& items) {
  validate(items);
  // Cut the batch into micro-batches of at most `ubatch` tokens; a long prompt spans several.
  std::vector<Slice>& slices = slices_;
  slices.clear();
  int filled = 0;
  for (const BatchItem& it : items) {
    const int base = it.seq->n_past();  // read before this item's first micro-batch runs
    int offset = 0;
    while (offset < it.n_tokens) {
      const int count = std::min(it.n_tokens - offset, opts_.ubatch - filled);
      slices.push_back({&it, offset, count, base + offset});
      offset += count;
      filled += count;
      if (filled == opts_.ubatch) {
        forward_ubatch(slices);
        slices.clear();
        filled = 0;
      }
    }
  }
  if (!slices.empty()) forward_ubatch(slices);
}

void Engine::for_tokens(int n, FunctionRef<void(int)> fn) {
  if (n < 8 || pool_.size() == 1 || single_thread_) {
    for (int t = 0; t < n; ++t) fn(t);
    return;
  }
  const int chunk = (n + pool_.size() * 4 - 1) / (pool_.size() * 4);
  parallel((n + chunk - 1) / chunk, [&](int task, int) {
    for (int t = task * chunk; t < std::min(n, (task + 1) * chunk); ++t) fn(t);
  });
}

void Engine::embed(const std::vector<Slice>& slices, int n) {
  const int E = config().n_embd;
  int t = 0;
  for (const Slice& s : slices)
    for (int i = 0; i < s.count; ++i, ++t) {
      pos_[t] = s.pos0 + i;
      dequantize_row(model_->token_embd(), s.item->tokens[s.offset + i], &x_[static_cast<size_t>(t) * E]);
    }
  (void)n;
}

// ggml's rms_norm (double accumulation) followed by the elementwise weight.
void Engine::rms_norm(const float* x, const float* weight, float* out, int n) {
  const int E = config().n_embd;
  const float eps = config().rms_eps;
  for_tokens(n, [&](int t) {
    const float* xr = x + static_cast<size_t>(t) * E;
    float* o = out + static_cast<size_t>(t) * E;
    double sum = 0;
    for (int i = 0; i < E; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / E);
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int i = 0; i < E; ++i) o[i] = xr[i] * scale * weight[i];
  });
}

void Engine::quantize(const float* x, int n, int k) {
  act_.k = k;
  const int nb = k / 32;
  for_tokens(n, [&](int t) {
    k_.quantize_q8(x + static_cast<size_t>(t) * k, k, act_.qs + static_cast<size_t>(t) * k, act_.d + t * nb,
                   act_.s + t * nb, act_.isum + t * nb);
  });
}

// Runs several matrix products that share the input x ([n][k]) as one parallel region.
void Engine::matmuls(std::initializer_list<MatJob> jobs, const float* x, int n, int k) {
  bool any_quant = false;
  for (const auto& j : jobs) any_quant |= is_quantized(j.w->type);
  if (any_quant) quantize(x, n, k);

  // Tasks are runs of whole 8-row groups; a few per thread so uneven progress evens out.
  constexpr int kMaxTasks = 256;
  struct Task { const MatJob* job; int r0, rows; };
  Task tasks[kMaxTasks];
  int n_tasks = 0;
  const int threads = pool_.size();
  const int per_job = std::max(1, std::min(threads == 1 ? 1 : threads * 4, kMaxTasks / static_cast<int>(jobs.size())));
  for (const auto& j : jobs) {
    const int rows = j.w->rows;
    const int groups = (rows + kRowGroup - 1) / kRowGroup;
    const int chunk = (groups + per_job - 1) / per_job * kRowGroup;
    for (int r = 0; r < rows; r += chunk) tasks[n_tasks++] = {&j, r, std::min(chunk, rows - r)};
  }
  parallel(n_tasks, [&](int ti, int) {
    const Task& t = tasks[ti];
    const Weight& w = *t.job->w;
    float* y = t.job->y + t.r0;
    if (is_quantized(w.type)) {
      const uint8_t* wp = w.packed + static_cast<size_t>(t.r0 / kRowGroup) * w.group_bytes;
      const GemmQ8Args a{wp, w.group_bytes, t.rows, &act_, 0, n, y, t.job->ldy};
      (w.type == GgmlType::Q4_0 ? k_.gemm_q4_0 : w.type == GgmlType::Q4_1 ? k_.gemm_q4_1 : k_.gemm_q8_0)(a);
    } else {
      const uint8_t* wp = w.data + static_cast<size_t>(t.r0) * w.row_bytes;
      const GemmF32Args a{wp, w.row_bytes, t.rows, x, k, n, y, t.job->ldy};
      (w.type == GgmlType::F32 ? k_.gemm_f32 : w.type == GgmlType::F16 ? k_.gemm_f16 : k_.gemm_bf16)(a);
    }
  });
}

// "Normal" RoPE on adjacent pairs: GGUF llama weights had Q/K permuted by the converter.
void Engine::rope(float* x, int n_heads, const int* pos, int n) {
  const int d = config().head_dim, half = d / 2;
  for_tokens(n, [&](int t) {
    const float* cs = &rope_cos_[static_cast<size_t>(pos[t]) * half];
    const float* sn = &rope_sin_[static_cast<size_t>(pos[t]) * half];
    float* row = x + static_cast<size_t>(t) * n_heads * d;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + h * d;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * cs[i] - x1 * sn[i];
        v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
      }
    }
  });
}

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
    if (slice_keys_[qblocks_[b].slice])
      for (int g = 0; g < hkv; ++g) attn_tasks_.push_back({b, g, 1});
    else
      for (int h = 0; h < head_tasks; ++h) attn_tasks_.push_back({b, h * (hkv / head_tasks), hkv / head_tasks});
  }
  parallel(static_cast<int>(attn_tasks_.size()), [&](int i, int thread) {
    const AttnTask& task = attn_tasks_[i];
    const QueryBlock& qb = qblocks_[task.block];
    if (slice_keys_[qb.slice]) attend_listed(layer, slices[qb.slice], qb.t_begin, task.h0, attn_scratch_[thread]);
    else attend_rows(layer, slices[qb.slice], qb, task.h0, task.n_heads, attn_scratch_[thread]);
  });
}

// Softmax of each score row over its first valid[r] entries (in place); the rest become 0.
void Engine::softmax_rows(float* s, size_t lds, int rows, int n_keys, FunctionRef<int(int)> valid) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    const int v = valid(r);
    float mx = row[0];
    for (int j = 1; j < v; ++j) mx = std::max(mx, row[j]);
    const float inv = 1.0f / k_.exp_sum(row, v, mx);
    for (int j = 0; j < v; ++j) row[j] *= inv;
    std::fill(row + v, row + n_keys, 0.f);
  }
}

// A block of consecutive tokens of one sequence against its whole cache, for KV heads
// [h0, h0 + n_heads). Each block of keys is read once as whole rows (a token's heads are
// contiguous, so the read streams), widened to f32 once and shared by all the task's query
// heads. Scores are kept whole per row, so the softmax is exact.
void Engine::attend_rows(int layer, const Slice& s, const QueryBlock& qb, int h0, int n_heads, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, kv_dim = c.kv_dim(), width = n_heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  KvCache& kv = s.item->seq->kv;
  const int n_tok = qb.t_end - qb.t_begin, nq = n_tok * group;  // query rows per KV head
  const int n_keys = pos_[qb.t_end - 1] + 1;
  const size_t lds = static_cast<size_t>(n_keys);
  auto q_rows = [&](int gl) { return &sc.q[static_cast<size_t>(gl) * nq * d]; };
  auto s_rows = [&](int gl) { return &sc.scores[static_cast<size_t>(gl) * nq * lds]; };
  auto o_rows = [&](int gl) { return &sc.out[static_cast<size_t>(gl) * nq * d]; };
  for (int gl = 0; gl < n_heads; ++gl)
    for (int t = 0; t < n_tok; ++t)
      std::memcpy(q_rows(gl) + static_cast<size_t>(t) * group * d,
                  &q_[static_cast<size_t>(qb.t_begin + t) * c.n_embd + static_cast<size_t>(h0 + gl) * group * d],
                  sizeof(float) * group * d);
  for (int k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_to_f32(kv.k(layer, k0) + h0 * d, kv_dim, nk, width, sc.kv.data());
    for (int gl = 0; gl < n_heads; ++gl)
      k_.attn_scores(q_rows(gl), nq, sc.kv.data() + gl * d, width, nk, d, scale, s_rows(gl) + k0, lds);
  }
  for (int gl = 0; gl < n_heads; ++gl)  // causal: each token sees keys up to itself
    softmax_rows(s_rows(gl), lds, nq, n_keys, [&](int r) { return pos_[qb.t_begin + r / group] + 1; });
  if (float* probe = s.item->probe) {  // one token, all heads in this task (see attention())
    float* out = probe + static_cast<size_t>(layer) * n_keys;
    std::fill(out, out + n_keys, 0.f);
    for (int gl = 0; gl < n_heads; ++gl)
      for (int r = 0; r < nq; ++r)
        for (int j = 0; j < n_keys; ++j) out[j] += s_rows(gl)[r * lds + j] / static_cast<float>(c.n_head);
  }
  std::fill(sc.out.begin(), sc.out.begin() + static_cast<size_t>(n_heads) * nq * d, 0.f);
  for (int k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_to_f32(kv.v(layer, k0) + h0 * d, kv_dim, nk, width, sc.kv.data());
    for (int gl = 0; gl < n_heads; ++gl)
      k_.attn_values(s_rows(gl) + k0, lds, nq, sc.kv.data() + gl * d, width, nk, d, o_rows(gl));
  }
  for (int gl = 0; gl < n_heads; ++gl)
    for (int t = 0; t < n_tok; ++t)
      std::memcpy(&attn_[static_cast<size_t>(qb.t_begin + t) * c.n_embd + static_cast<size_t>(h0 + gl) * group * d],
                  o_rows(gl) + static_cast<size_t>(t) * group * d, sizeof(float) * group * d);
}

// One decode token (ubatch row t) of a sparse-policy sequence, KV head g, over that head's key
// list (all listed keys precede the token, so no causal mask). Under SCOPE this step's attention
// then decides which generated tokens the next step keeps.
void Engine::attend_listed(int layer, const Slice& s, int t, int g, AttnScratch& sc) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, kv_dim = c.kv_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Sequence& seq = *s.item->seq;
  const std::vector<int32_t>& keys = seq.state.heads[g].keys;
  const int n_keys = static_cast<int>(keys.size());
  const float* q = &q_[static_cast<size_t>(t) * c.n_embd + static_cast<size_t>(g) * group * d];
  for (int k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_gather_f32(seq.kv.k(layer) + g * d, kv_dim, keys.data() + k0, nk, d, sc.kv.data());
    k_.attn_scores(q, group, sc.kv.data(), d, nk, d, scale, &sc.scores[k0], n_keys);
  }
  softmax_rows(sc.scores.data(), n_keys, group, n_keys, [&](int) { return n_keys; });
  std::fill(sc.out.begin(), sc.out.begin() + static_cast<size_t>(group) * d, 0.f);
  for (int k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    k_.kv_gather_f32(seq.kv.v(layer) + g * d, kv_dim, keys.data() + k0, nk, d, sc.kv.data());
    k_.attn_values(&sc.scores[k0], n_keys, group, sc.kv.data(), d, nk, d, sc.out.data());
  }
  std::memcpy(&attn_[static_cast<size_t>(t) * c.n_embd + static_cast<size_t>(g) * group * d], sc.out.data(),
              sizeof(float) * group * d);
  if (seq.policy.uses_scope()) scope_update(layer, seq, g, sc.scores.data(), n_keys);
  if (seq.policy.kind == AttentionPolicy::Kind::H2o) h2o_update(layer, seq, g, sc.scores.data(), n_keys);
}

// SCOPE after a step's attention at (layer, head g): the generated keys are the tail of the key
// list; their importance is the mean probability over the head's query group.
void Engine::scope_update(int layer, Sequence& seq, int g, const float* probs, int n_keys) {
  const ModelConfig& c = config();
  const int group = c.n_head / c.n_head_kv;
  PolicyState& st = seq.state;
  std::vector<int32_t>& pool = st.pool[static_cast<size_t>(layer) * c.n_head_kv + g];
  PolicyState::Head& head = st.heads[g];
  const int n_dec = static_cast<int>(pool.size()) + 1, first = n_keys - n_dec;
  const int t = head.keys.back() - st.prompt_len;  // index of the current generated token
  const ScopeConfig& cfg = seq.policy.scope;
  if (!scope_reselects(cfg, t) || n_dec <= scope_budget(cfg, t)) {
    pool.push_back(head.keys.back());  // keep everything this step
    return;
  }
  // (layer, head) pairs are disjoint across attention tasks, so the head's scratch is safe here.
  head.importance.resize(n_dec);
  for (int j = 0; j < n_dec; ++j) {
    float sum = 0;
    for (int h = 0; h < group; ++h) sum += probs[static_cast<size_t>(h) * n_keys + first + j];
    head.importance[j] = sum / static_cast<float>(group);
  }
  scope_select(head.importance.data(), head.keys.data() + first, n_dec, scope_budget(cfg, t), cfg.beta2, head.out,
               head.scratch);
  std::vector<int32_t>& out = head.out;
  pool.swap(out);
}

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
  int t = 0;
  for (size_t i = 0; i < slices.size(); t += slices[i].count, ++i) {
    const Slice& s = slices[i];
    Sequence& seq = *s.item->seq;
    const AttentionPolicy& pol = seq.policy;
    if (!pol.sparse_decode() || s.item->n_tokens != 1) continue;
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
    }
    const std::vector<int32_t>* prompt_subset = nullptr;
    if (pol.uses_omnikv()) {
      const LayerRole role = pol.roles[layer];
      if (role == LayerRole::Filter) {
        const auto& f = pol.omnikv.filter_layers;
        select_tokens(layer, seq, t, st.selected[std::find(f.begin(), f.end(), layer) - f.begin()]);
      } else if (role == LayerRole::Sparse) {
        prompt_subset = &st.selected[pol.group[layer]];
      }
    }
    if (pol.kind == AttentionPolicy::Kind::Streaming || pol.kind == AttentionPolicy::Kind::H2o) {
      baseline_keys(layer, seq, s.pos0);
      slice_keys_[i] = &st.heads;
      continue;
    }
    // A selection holding the whole prompt is the dense case: take the faster row-streaming path.
    if (prompt_subset && static_cast<int>(prompt_subset->size()) == st.prompt_len) prompt_subset = nullptr;
    if (!prompt_subset && !pol.uses_scope()) continue;  // this layer attends everything
    for (int g = 0; g < hkv; ++g) {
      std::vector<int32_t>& keys = st.heads[g].keys;
      keys.clear();
      if (prompt_subset) keys.assign(prompt_subset->begin(), prompt_subset->end());
      else for (int p = 0; p < st.prompt_len; ++p) keys.push_back(p);
      if (pol.uses_scope()) {
        const auto& pool = st.pool[static_cast<size_t>(layer) * hkv + g];
        keys.insert(keys.end(), pool.begin(), pool.end());
        keys.push_back(s.pos0);
      } else {
        for (int p = st.prompt_len; p <= s.pos0; ++p) keys.push_back(p);  // generated: always attended
      }
    }
    slice_keys_[i] = &st.heads;
  }
}

// OmniKV selection on a filter layer: rank the prompt's tokens by the current query (every query
// head, max over heads) and keep the top `budget`, ascending.
void Engine::select_tokens(int layer, Sequence& seq, int t, std::vector<int32_t>& out) {
  const ModelConfig& c = config();
  const OmniKvConfig& cfg = seq.policy.omnikv;
  const int d = c.head_dim, group = c.n_head / c.n_head_kv, kv_dim = c.kv_dim();
  const int n_cand = seq.state.prompt_len;
  ++seq.state.selections;
  if (cfg.budget >= n_cand) {  // the whole prompt fits the budget: nothing to rank
    out.resize(n_cand);
    std::iota(out.begin(), out.end(), 0);
    return;
  }
  const int n_all = cfg.selector == Selector::Last ? n_cand : pos_[t] + 1;  // softmax needs every key
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* kbuf = attn_scratch_[0].kv.data();
  for (int k0 = 0; k0 < n_all; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_all - k0);
    k_.kv_to_f32(seq.kv.k(layer, k0), kv_dim, nk, kv_dim, kbuf);
    for (int g = 0; g < c.n_head_kv; ++g)
      k_.attn_scores(&q_[static_cast<size_t>(t) * c.n_embd + static_cast<size_t>(g) * group * d], group, kbuf + g * d,
                     kv_dim, nk, d, scale, &sel_raw_[static_cast<size_t>(g) * group * n_all + k0], n_all);
  }
  rank_candidates(cfg.selector, sel_raw_.data(), c.n_head, n_all, n_cand, sel_rank_.data());
  top_k_sorted(sel_rank_.data(), n_cand, cfg.budget, sel_new_);
  if (cfg.lazy_iou > 0.f && !out.empty() && iou(sel_new_, out) > cfg.lazy_iou) {
    ++seq.state.lazy_reuses;  // close enough to the last set: keep it, skip the reload
    return;
  }
  out.swap(sel_new_);
}

void Engine::forward_ubatch(const std::vector<Slice>& slices) {
  const ModelConfig& c = config();
  const int E = c.n_embd, F = c.n_ff, KV = c.kv_dim();
  int n = 0;
  for (const Slice& s : slices) {
    n += s.count;
    if (s.item->n_tokens > 1) s.item->seq->state.prompt_len = -1;  // new prompt tokens: re-pick candidates
  }
  single_thread_ = n <= kSmallBatch && opts_.n_threads_decode == 1;
  n = 0;
  qblocks_.clear();
  for (size_t s = 0; s < slices.size(); ++s) {
    for (int i = 0; i < slices[s].count; i += kQueryBlock)
      qblocks_.push_back({static_cast<int>(s), n + i, n + std::min(slices[s].count, i + kQueryBlock)});
    for (int i = 0; i < slices[s].count; ++i) token_seq_[n++] = static_cast<int>(s);
  }
  embed(slices, n);

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = model_->layers()[l];
    rms_norm(x_.data(), lw.attn_norm, xn_.data(), n);
    matmuls({{&lw.wq, q_.data(), E}, {&lw.wk, kc_.data(), KV}, {&lw.wv, vc_.data(), KV}}, xn_.data(), n, E);
    rope(q_.data(), c.n_head, pos_.data(), n);
    rope(kc_.data(), c.n_head_kv, pos_.data(), n);
    for_tokens(n, [&](int t) {
      KvCache& kv = slices[token_seq_[t]].item->seq->kv;
      k_.f32_to_f16(&kc_[static_cast<size_t>(t) * KV], kv.k(l, pos_[t]), KV);
      k_.f32_to_f16(&vc_[static_cast<size_t>(t) * KV], kv.v(l, pos_[t]), KV);
    });
    prepare_sparse(l, slices);
    attention(l, slices);
    matmuls({{&lw.wo, xn_.data(), E}}, attn_.data(), n, E);
    for (size_t i = 0; i < static_cast<size_t>(n) * E; ++i) x_[i] += xn_[i];

    rms_norm(x_.data(), lw.ffn_norm, xn_.data(), n);
    matmuls({{&lw.w_gate, gate_.data(), F}, {&lw.w_up, up_.data(), F}}, xn_.data(), n, E);
    for_tokens(n, [&](int t) {
      float* g = &gate_[static_cast<size_t>(t) * F];
      const float* u = &up_[static_cast<size_t>(t) * F];
      for (int i = 0; i < F; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
    matmuls({{&lw.w_down, xn_.data(), E}}, gate_.data(), n, F);
    for (size_t i = 0; i < static_cast<size_t>(n) * E; ++i) x_[i] += xn_[i];
  }

  for (const Slice& s : slices) s.item->seq->kv.set_size(s.pos0 + s.count);

  // Logits for the items whose last token is in this micro-batch, kLogitRows at a time so the
  // output matrix is read once per group.
  wanted_.clear();
  int t0 = 0;
  for (const Slice& s : slices) {
    if (s.item->logits && s.offset + s.count == s.item->n_tokens) wanted_.push_back({t0 + s.count - 1, s.item->logits});
    t0 += s.count;
  }
  for (size_t g = 0; g < wanted_.size(); g += kLogitRows) {
    const int rows = static_cast<int>(std::min<size_t>(kLogitRows, wanted_.size() - g));
    for (int r = 0; r < rows; ++r)
      std::memcpy(&xn_[static_cast<size_t>(r) * E], &x_[static_cast<size_t>(wanted_[g + r].first) * E], E * sizeof(float));
    rms_norm(xn_.data(), model_->output_norm(), logits_x_.data(), rows);
    matmuls({{&model_->output(), logits_buf_.data(), c.n_vocab}}, logits_x_.data(), rows, E);
    for (int r = 0; r < rows; ++r)
      std::memcpy(wanted_[g + r].second, &logits_buf_[static_cast<size_t>(r) * c.n_vocab], c.n_vocab * sizeof(float));
  }
}

}  // namespace ctx
