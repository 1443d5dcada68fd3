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

// Quantized weights are packed at load (packed.h) and multiplied with 8-bit activations.
bool is_quantized(GgmlType t) { return is_packable(t); }
}  // namespace

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& opts)
    : model_(std::move(model)), opts_(opts), k_(opts.kernels ? *opts.kernels : select_kernels()), pool_(opts.n_threads) {
  const ModelConfig& c = model_->config();
  if (opts_.n_threads < 1 || opts_.n_threads > 256) throw std::invalid_argument("engine: threads must be 1..256");
  if (opts_.n_threads_decode != 1 && opts_.n_threads_decode != opts_.n_threads)
    throw std::invalid_argument("engine: decode threads must be 1 or equal to threads");
  if (opts_.ubatch < 1 || opts_.ubatch > 8192) throw std::invalid_argument("engine: ubatch must be 1..8192");
  max_ctx_ = opts_.max_context > 0 ? opts_.max_context : c.n_ctx_train;
  if (max_ctx_ > (1 << 22)) throw std::invalid_argument("engine: max_context too large");
  const DeviceSpec spec = parse_device(opts_.device);
  parse_cuda_kernels(opts_.cuda_kernels);  // refused on any device, like a bad device string
  if (spec.kind == DeviceSpec::Kind::Cuda) {
    device_ = make_cuda_backend(model_, opts_, spec.index);
  } else if (spec.kind == DeviceSpec::Kind::Auto && !cuda_unusable(0) && c.beyond_llama().empty()) {
    device_ = make_cuda_backend(model_, opts_, 0);  // (the GPU backend runs Llama's forward pass only)
  }
  if (device_) return;  // the CPU scratch below is not needed

  const size_t U = opts_.ubatch, E = c.n_embd, F = c.n_ff, Q = c.q_dim(), KV = c.kv_dim(), wide = std::max({E, F, Q});
  x_.resize(U * E);
  xn_.resize(U * wide);
  q_.resize(U * Q);
  kc_.resize(U * KV);
  vc_.resize(U * KV);
  attn_.resize(U * Q);
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
  greedy_scratch_.assign(pool_.size(), std::vector<float>(static_cast<size_t>(kLogitRows) * kGreedyRows));
  greedy_best_.resize(static_cast<size_t>((c.n_vocab + kGreedyRows - 1) / kGreedyRows) * kLogitRows);
  attn_scratch_.resize(pool_.size());
  const int group = c.n_head / c.n_head_kv, block_rows = kQueryBlock * group;  // query rows per KV head
  for (auto& sc : attn_scratch_) {
    sc.q.resize(static_cast<size_t>(kQueryBlock) * Q);
    sc.acc.resize(sc.q.size());
    sc.m.resize(static_cast<size_t>(kQueryBlock) * c.n_head);
    sc.l.resize(sc.m.size());
    sc.lo.resize(block_rows);
    sc.hi.resize(block_rows);
    sc.work.resize(flash_work_floats(block_rows, kKeyBlock, c.head_dim));
    sc.kv.resize(static_cast<size_t>(kKeyBlock) * c.kv_dim());
    sc.scores.resize(static_cast<size_t>(group) * max_ctx_);
    sc.gathered.resize(static_cast<size_t>(2) * kKeyBlock * c.head_dim);
    sc.rows.reserve(max_ctx_);
    sc.evicted.reserve(max_ctx_);
  }
  qblocks_.reserve(opts_.ubatch);
  slice_keys_.reserve(opts_.ubatch);
  attn_tasks_.reserve(static_cast<size_t>(opts_.ubatch) * c.n_head_kv);
  sel_raw_.resize(static_cast<size_t>(c.n_head) * max_ctx_);
  slices_.reserve(opts_.ubatch);
  wanted_.reserve(opts_.ubatch);
  const size_t rope_kinds = c.any_layer_slides() ? 2 : 1;
  rope_cos_.resize(rope_kinds * U * (c.head_dim / 2));
  rope_sin_.resize(rope_cos_.size());
}

Engine::~Engine() = default;

std::string Engine::device_description() const { return device_ ? device_->description() : std::string("CPU, ") + k_.name + " kernels"; }

std::shared_ptr<Sequence> Engine::create_sequence(int capacity, int ring_batch) const {
  if (ring_batch < 0 || ring_batch > 8192) throw std::invalid_argument("create_sequence: ring batch must be 0..8192");
  auto seq = std::make_shared<Sequence>(config(), capacity, ring_batch > 0 ? ring_batch : opts_.ubatch);
  seq->device_budget = opts_.device_budget_bytes;
  if (device_) seq->device_kv = device_->create_kv(capacity);
  return seq;
}

int Engine::ring_rows(int ring_batch) const {
  const ModelConfig& c = config();
  return c.any_layer_slides() ? KvRing::rows_for(c.sliding_window, ring_batch > 0 ? ring_batch : opts_.ubatch) : 0;
}

size_t Engine::kv_bytes(int n_tokens, int ring_batch, int global_rows) const {
  const ModelConfig& c = config();
  const int ring = ring_rows(ring_batch);
  const int global = global_rows < 0 ? n_tokens : std::min(n_tokens, global_rows);
  size_t rows = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.layer_slides(l))
      rows += static_cast<size_t>(ring > 0 ? std::min(n_tokens, ring) : n_tokens);
    else
      rows += static_cast<size_t>(global);
  }
  return rows * 2 * c.kv_dim() * sizeof(uint16_t);
}

size_t Engine::weight_bytes_per_token() const {
  auto bytes = [](const Weight& w) {
    return is_quantized(w.type) ? w.group_bytes * ((w.rows + kRowGroup - 1) / kRowGroup) : w.row_bytes * w.rows;
  };
  size_t total = bytes(model_->output());
  for (const LayerWeights& lw : model_->layers())
    for (const Weight* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) total += bytes(*w);
  return total;
}

bool Sequence::rows_moved() const { return slots && slots->any_freed(); }

void Sequence::set_size(int n) {
  if (rows_moved()) throw std::invalid_argument("this sequence reclaimed evicted KV rows, so its tokens no longer sit by position");
  kv.set_size(n);
  if (slots) slots->reset(n);
}

void Sequence::set_policy(const AttentionPolicy& p) {
  if (rows_moved())
    throw std::invalid_argument("this sequence reclaimed evicted KV rows, so its tokens no longer sit by position; its policy stays");
  std::unique_ptr<DecodePolicy> next = make_decode_policy(p);
  if (device_kv && !next->attends_everything())
    throw std::invalid_argument("the GPU backend runs full attention only for now (sparse decode policies run on the CPU engine)");
  const size_t packed = next->packed_rows() * kv.row_pair_bytes();
  if (device_budget > 0 && packed > device_budget)
    throw std::invalid_argument("omnikv: a budget of " + std::to_string(p.omnikv.budget) + " tokens needs " + std::to_string(packed >> 20) +
                                " MiB of packed rows, more than the device arena's " + std::to_string(device_budget >> 20) + " MiB");
  kv.offload(next->host_groups());  // none: every layer back on the device
  policy = std::move(next);
  decode_keys_read = 0;
  slots.reset();
  // The global layers only: a sliding layer's ring bounds it already, and its decode steps attend
  // by position (sparse.cc).
  if (p.reclaim() && policy->reclaims()) {
    std::vector<bool> tracked(kv.n_layer());
    for (int l = 0; l < kv.n_layer(); ++l) tracked[l] = slides_.empty() || !slides_[l];
    slots = std::make_unique<KvSlots>(tracked, n_head_kv_, kv.capacity(), kv.size());
  }
}

size_t Sequence::device_bytes(int n_tokens) const {
  if (slots) {  // tracked layers: the rows touched and a new one for each token to come (at most)
    size_t rows = 0;
    for (int l = 0; l < kv.n_layer(); ++l)
      rows += slots->tracks(l) ? slots->rows_touched(l) + static_cast<size_t>(std::max(0, n_tokens - n_past()))
                               : static_cast<size_t>(std::min(n_tokens, kv.rows(l)));
    return rows * kv.row_pair_bytes();
  }
  return kv.device_bytes_at(n_tokens) + kv.row_pair_bytes() * policy->packed_rows();
}

void Engine::validate(const std::vector<BatchItem>& items) const {
  const ModelConfig& c = config();
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (!it.seq) throw std::invalid_argument("forward: batch item without a sequence");
    if (it.n_tokens < 1) throw std::invalid_argument("forward: empty token list (a prompt needs at least one token)");
    const int limit = std::min(it.seq->kv.capacity(), max_ctx_);
    if (it.probe && (it.n_tokens != 1 || !it.seq->policy->attends_everything()))
      throw std::invalid_argument("forward: an attention probe needs a one-token item under full attention");
    if (device_ && (it.probe || !it.seq->device_kv))
      throw std::invalid_argument(it.probe ? "forward: attention probes run on the CPU engine only"
                                           : "forward: the sequence was not created by this GPU engine");
    if (!device_ && it.seq->device_kv) throw std::invalid_argument("forward: a GPU sequence on a CPU engine");
    if (it.seq->n_past() + it.n_tokens > limit)
      throw std::invalid_argument("forward: " + std::to_string(it.seq->n_past() + it.n_tokens) + " tokens exceed the context limit of " +
                                  std::to_string(limit) + (limit == max_ctx_ ? " (model context)" : " (sequence capacity)"));
    const Sequence& seq = *it.seq;
    if (seq.device_budget > 0 && seq.device_bytes(seq.n_past() + it.n_tokens) > seq.device_budget)
      throw std::invalid_argument("forward: " + std::to_string(seq.n_past() + it.n_tokens) + " tokens need " +
                                  std::to_string(seq.device_bytes(seq.n_past() + it.n_tokens) >> 20) +
                                  " MiB of the device arena, which holds " + std::to_string(seq.device_budget >> 20) + " MiB");
    if (it.n_tokens > 1 && seq.slots && seq.slots->any_freed())
      throw std::invalid_argument("forward: this sequence reclaimed evicted KV rows, so it takes no more prompt tokens");
    for (int t = 0; t < it.n_tokens; ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= c.n_vocab)
        throw std::invalid_argument("forward: token id " + std::to_string(it.tokens[t]) + " is outside the vocabulary");
    for (size_t j = 0; j < i; ++j)
      if (items[j].seq == it.seq) throw std::invalid_argument("forward: a sequence appears twice in one batch");
  }
}

void Engine::forward(const std::vector<BatchItem>& items) {
  validate(items);
  if (device_) {
    device_->forward(items);
    return;
  }
  for_each_ubatch(items, opts_.ubatch, slices_, [this](const std::vector<Slice>& slices) { forward_ubatch(slices); });
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
  const float scale = config().embd_scale;
  int t = 0;
  for (const Slice& s : slices)
    for (int i = 0; i < s.count; ++i, ++t) {
      pos_[t] = s.pos0 + i;
      float* row = &x_[static_cast<size_t>(t) * E];
      dequantize_row(model_->token_embd(), s.item->tokens[s.offset + i], row);
      if (scale != 1.f)
        for (int j = 0; j < E; ++j) row[j] *= scale;
    }
  (void)n;
}

// ggml's rms_norm (double accumulation) followed by the elementwise weight, over `rows` rows of
// `width` (tokens of n_embd, or heads of head_dim for the Q/K norms); out may be x.
void Engine::rms_norm(const float* x, const float* weight, float* out, int rows, int width) {
  const float eps = config().rms_eps;
  for_tokens(rows, [&](int t) {
    const float* xr = x + static_cast<size_t>(t) * width;
    float* o = out + static_cast<size_t>(t) * width;
    double sum = 0;
    for (int i = 0; i < width; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / width);
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int i = 0; i < width; ++i) o[i] = xr[i] * scale * weight[i];
  });
}

void Engine::add_bias(float* x, const float* bias, int n, int width) {
  for_tokens(n, [&](int t) {
    float* row = x + static_cast<size_t>(t) * width;
    for (int i = 0; i < width; ++i) row[i] += bias[i];
  });
}

void Engine::quantize(const float* x, int n, int k) {
  act_.k = k;
  const int nb = k / 32;
  for_tokens(n, [&](int t) {
    k_.quantize_q8(x + static_cast<size_t>(t) * k, k, act_.qs + static_cast<size_t>(t) * k, act_.d + t * nb, act_.s + t * nb,
                   act_.isum + t * nb);
  });
}

// Runs several matrix products that share the input x ([n][k]) as one parallel region.
void Engine::matmuls(std::initializer_list<MatJob> jobs, const float* x, int n, int k) {
  bool any_quant = false;
  for (const auto& j : jobs) any_quant |= is_quantized(j.w->type);
  if (any_quant) quantize(x, n, k);

  // Tasks are runs of whole 8-row groups; a few per thread so uneven progress evens out.
  constexpr int kMaxTasks = 256;
  struct Task {
    const MatJob* job;
    int r0, rows;
  };
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
    matmul_rows(*t.job->w, t.r0, t.rows, x, n, k, t.job->y + t.r0, t.job->ldy);
  });
}

// Rows [r0, r0 + rows) of w (r0 a multiple of kRowGroup) times the n inputs x ([n][k], already
// quantized into act_ if w is): y[t * ldy + r - r0].
void Engine::matmul_rows(const Weight& w, int r0, int rows, const float* x, int n, int k, float* y, int ldy) {
  if (is_quantized(w.type)) {
    const uint8_t* wp = w.packed + static_cast<size_t>(r0 / kRowGroup) * w.group_bytes;
    gemm_q8_for(k_, w.type)({wp, w.group_bytes, rows, &act_, 0, n, y, ldy});
  } else {
    const uint8_t* wp = w.data + static_cast<size_t>(r0) * w.row_bytes;
    (w.type == GgmlType::F32   ? k_.gemm_f32
     : w.type == GgmlType::F16 ? k_.gemm_f16
                               : k_.gemm_bf16)({wp, w.row_bytes, rows, x, k, n, y, ldy});
  }
}

// As llama.cpp: scale by 1/cap, tanh, scale by cap.
void Engine::soft_cap(float* logits, int n) const {
  if (const float cap = config().final_logit_softcap; cap > 0.f)
    for (int i = 0; i < n; ++i) logits[i] = cap * std::tanh(logits[i] * (1.0f / cap));
}

// The greedy next token of each of the `rows` rows of logits_x_ (normed), for items that want no
// logits: the output matrix in slices of kGreedyRows rows, each slice's logits computed into the
// thread's scratch and reduced at once to its largest (the lowest index of it) per row, then the
// slices' in order. The slices' logits are the same numbers the full rows would hold (each is one
// GEMM row), so this is the token the logits path picks, without writing or re-reading n_vocab
// floats per row.
void Engine::greedy_tokens(int rows, const std::pair<int, const BatchItem*>* wanted) {
  const ModelConfig& c = config();
  const Weight& w = model_->output();
  if (is_quantized(w.type)) quantize(logits_x_.data(), rows, c.n_embd);
  const int n_slices = (c.n_vocab + kGreedyRows - 1) / kGreedyRows;
  parallel(n_slices, [&](int sl, int thread) {
    const int r0 = sl * kGreedyRows, nr = std::min(kGreedyRows, c.n_vocab - r0);
    float* y = greedy_scratch_[thread].data();
    matmul_rows(w, r0, nr, logits_x_.data(), rows, c.n_embd, y, kGreedyRows);
    for (int r = 0; r < rows; ++r) {
      float* row = y + static_cast<size_t>(r) * kGreedyRows;
      soft_cap(row, nr);
      int best = 0;
      for (int i = 1; i < nr; ++i)
        if (row[i] > row[best]) best = i;
      greedy_best_[static_cast<size_t>(sl) * kLogitRows + r] = {row[best], r0 + best};
    }
  });
  for (int r = 0; r < rows; ++r) {
    std::pair<float, int> best = greedy_best_[r];
    for (int sl = 1; sl < n_slices; ++sl)
      if (const auto& b = greedy_best_[static_cast<size_t>(sl) * kLogitRows + r]; b.first > best.first) best = b;
    *wanted[r].second->argmax = best.second;
  }
}

// The RoPE angles of this micro-batch's tokens for each kind of layer (RopeParams), computed as
// ggml computes them so that they match llama.cpp's bit for bit: theta starts at the position and
// is multiplied by base^(-2/d) once per pair, in float; the angle is theta over the pair's
// frequency factor, times the linear scale.
void Engine::rope_tables(int n) {
  const ModelConfig& c = config();
  const int half = c.head_dim / 2;
  const float* factors = model_->rope_freq_factors();
  for (int kind = 0; kind < (c.any_layer_slides() ? 2 : 1); ++kind) {
    const RopeParams& rp = kind == 1 ? c.rope_swa : c.rope;
    const float theta_scale = std::pow(rp.base, -2.0f / static_cast<float>(c.head_dim));
    for_tokens(n, [&](int t) {
      const size_t at = (static_cast<size_t>(kind) * opts_.ubatch + t) * half;
      float theta = static_cast<float>(pos_[t]);
      for (int i = 0; i < half; ++i) {
        const float angle = rp.scale * (factors ? theta / factors[i] : theta);
        rope_cos_[at + i] = std::cos(angle);
        rope_sin_[at + i] = std::sin(angle);
        theta *= theta_scale;
      }
    });
  }
}

// Rotates each head's pairs (RopePairs: adjacent elements, or the two halves) by the angles of
// the layer kind's table.
void Engine::rope(float* x, int n_heads, int kind, int n) {
  const int d = config().head_dim, half = d / 2;
  const bool halves = config().rope_pairs == RopePairs::Halves;
  const int step = halves ? 1 : 2, other = halves ? half : 1;  // pair i: elements i*step and i*step + other
  for_tokens(n, [&](int t) {
    const size_t at = (static_cast<size_t>(kind) * opts_.ubatch + t) * half;
    const float* cs = &rope_cos_[at];
    const float* sn = &rope_sin_[at];
    float* row = x + static_cast<size_t>(t) * n_heads * d;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + h * d;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i * step], x1 = v[i * step + other];
        v[i * step] = x0 * cs[i] - x1 * sn[i];
        v[i * step + other] = x0 * sn[i] + x1 * cs[i];
      }
    }
  });
}

// gate = act(gate) * up: SwiGLU, or GeGLU with GELU's tanh approximation (ggml's function, in
// float, kernels.h geglu; ggml's CPU build reads it from a table at the input rounded to f16).
void Engine::gated_activation(int n) {
  const int F = config().n_ff;
  const auto activate = config().ffn_activation == FfnActivation::Silu ? k_.swiglu : k_.geglu;
  for_tokens(n, [&](int t) { activate(&gate_[static_cast<size_t>(t) * F], &up_[static_cast<size_t>(t) * F], F); });
}

// One pass for every architecture: each `if (c.…)` on the way is one of ModelConfig's switches,
// how that architecture differs from Llama.
void Engine::forward_ubatch(const std::vector<Slice>& slices) {
  const ModelConfig& c = config();
  const int E = c.n_embd, F = c.n_ff, Q = c.q_dim(), KV = c.kv_dim();
  int n = 0;
  for (const Slice& s : slices) {
    s.item->seq->policy->begin(policy_step(s, n));
    if (s.item->seq->slots && s.item->n_tokens > 1) s.item->seq->slots->place_prompt(s.pos0, s.pos0 + s.count);
    n += s.count;
  }
  single_thread_ = n <= kSmallBatch && opts_.n_threads_decode == 1;
  n = 0;
  qblocks_.clear();
  for (size_t s = 0; s < slices.size(); ++s) {
    for (int i = 0; i < slices[s].count; i += kQueryBlock)
      qblocks_.push_back({static_cast<int>(s), n + i, n + std::min(slices[s].count, i + kQueryBlock)});
    for (int i = 0; i < slices[s].count; ++i) token_seq_[n++] = static_cast<int>(s);
  }
  embed(slices, n);  // scaled by embd_scale
  rope_tables(n);

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = model_->layers()[l];
    rms_norm(x_.data(), lw.attn_norm, xn_.data(), n, E);
    matmuls({{&lw.wq, q_.data(), Q}, {&lw.wk, kc_.data(), KV}, {&lw.wv, vc_.data(), KV}}, xn_.data(), n, E);
    if (c.qkv_bias) {
      add_bias(q_.data(), lw.bq, n, Q);
      add_bias(kc_.data(), lw.bk, n, KV);
      add_bias(vc_.data(), lw.bv, n, KV);
    }
    if (c.qk_norm) {
      rms_norm(q_.data(), lw.q_norm, q_.data(), n * c.n_head, c.head_dim);
      rms_norm(kc_.data(), lw.k_norm, kc_.data(), n * c.n_head_kv, c.head_dim);
    }
    const int rope_kind = c.layer_slides(l) ? 1 : 0;  // rope_tables
    rope(q_.data(), c.n_head, rope_kind, n);
    rope(kc_.data(), c.n_head_kv, rope_kind, n);
    for_tokens(n, [&](int t) {
      const Slice& s = slices[token_seq_[t]];
      KvCache& kv = s.item->seq->kv;
      KvSlots* slots = s.item->seq->slots.get();
      if (!slots || s.item->n_tokens > 1 || !slots->tracks(l)) {  // row = position
        k_.f32_to_f16(&kc_[static_cast<size_t>(t) * KV], kv.k(l, pos_[t]), KV);
        k_.f32_to_f16(&vc_[static_cast<size_t>(t) * KV], kv.v(l, pos_[t]), KV);
        return;
      }
      const int d = c.head_dim;  // reclaiming decode step: each KV head to its own row
      for (int g = 0; g < c.n_head_kv; ++g) {
        const int32_t row = slots->place(l, g, pos_[t]);
        k_.f32_to_f16(&kc_[static_cast<size_t>(t) * KV + g * d], kv.k(l, row) + g * d, d);
        k_.f32_to_f16(&vc_[static_cast<size_t>(t) * KV + g * d], kv.v(l, row) + g * d, d);
      }
    });
    prepare_sparse(l, slices);
    attention(l, slices);  // a sliding layer's queries see their last sliding_window keys
    finish_sparse(l, slices);
    matmuls({{&lw.wo, xn_.data(), E}}, attn_.data(), n, Q);
    if (c.post_norms) rms_norm(xn_.data(), lw.post_attn_norm, xn_.data(), n, E);
    for (size_t i = 0; i < static_cast<size_t>(n) * E; ++i) x_[i] += xn_[i];

    rms_norm(x_.data(), lw.ffn_norm, xn_.data(), n, E);
    matmuls({{&lw.w_gate, gate_.data(), F}, {&lw.w_up, up_.data(), F}}, xn_.data(), n, E);
    gated_activation(n);  // ffn_activation
    matmuls({{&lw.w_down, xn_.data(), E}}, gate_.data(), n, F);
    if (c.post_norms) rms_norm(xn_.data(), lw.post_ffn_norm, xn_.data(), n, E);
    for (size_t i = 0; i < static_cast<size_t>(n) * E; ++i) x_[i] += xn_[i];
  }

  for (const Slice& s : slices) s.item->seq->kv.wrote(s.pos0, s.pos0 + s.count);

  // Logits (or only the greedy token) for the items whose last token is in this micro-batch,
  // kLogitRows at a time so the output matrix is read once per group.
  logit_rows(slices, wanted_);
  for (size_t g = 0; g < wanted_.size(); g += kLogitRows) {
    const int rows = static_cast<int>(std::min<size_t>(kLogitRows, wanted_.size() - g));
    for (int r = 0; r < rows; ++r)
      std::memcpy(&xn_[static_cast<size_t>(r) * E], &x_[static_cast<size_t>(wanted_[g + r].first) * E], E * sizeof(float));
    rms_norm(xn_.data(), model_->output_norm(), logits_x_.data(), rows, E);
    if (std::none_of(wanted_.begin() + g, wanted_.begin() + g + rows, [](const auto& w) { return w.second->logits; })) {
      greedy_tokens(rows, &wanted_[g]);
      continue;
    }
    matmuls({{&model_->output(), logits_buf_.data(), c.n_vocab}}, logits_x_.data(), rows, E);
    for (int r = 0; r < rows; ++r) {
      float* row = &logits_buf_[static_cast<size_t>(r) * c.n_vocab];
      soft_cap(row, c.n_vocab);
      const BatchItem& it = *wanted_[g + r].second;
      if (it.logits) std::memcpy(it.logits, row, c.n_vocab * sizeof(float));
      if (it.argmax) *it.argmax = static_cast<int32_t>(std::max_element(row, row + c.n_vocab) - row);
    }
  }
}

}  // namespace ctx
