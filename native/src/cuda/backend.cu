// The CUDA backend: device probing, the weights in GPU memory, a sequence's GPU KV cache, and the
// forward pass. forward()/forward_ubatch() follow engine.cc step for step (same micro-batching,
// same order of operations per layer), so a reader finds each CPU step's GPU counterpart here.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/attention_fast.cuh"
#include "cuda/common.cuh"
#include "cuda/fused.cuh"
#include "cuda/gemm_fast.cuh"
#include "cuda/kernels.cuh"
#include "cuda/matvec_fast.cuh"
#include "cuda/repack.h"
#include "engine.h"
#include "model.h"

namespace ctx {

bool cuda_compiled() { return true; }

std::unique_ptr<DeviceError> cuda_unusable(int index) {
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed (libcuda is loaded lazily)
  if (driver == 0) return std::make_unique<DeviceError>("no_gpu", "cuda: no CUDA driver on this machine (no GPU to run on)");
  if (driver < CUDART_VERSION)
    return std::make_unique<DeviceError>(
        "cuda_driver_too_old", "cuda: the driver supports CUDA " + std::to_string(driver / 1000) + "." +
                                   std::to_string(driver % 1000 / 10) + ", this build needs " + std::to_string(CUDART_VERSION / 1000) +
                                   "." + std::to_string(CUDART_VERSION % 1000 / 10) + " (update the NVIDIA driver)");
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver)
    return std::make_unique<DeviceError>("cuda_driver_too_old", std::string("cuda: ") + cudaGetErrorString(e));
  if (e != cudaSuccess || count == 0)
    return std::make_unique<DeviceError>(
        "no_gpu", std::string("cuda: no usable GPU (") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  if (index >= count)
    return std::make_unique<DeviceError>("no_gpu",
                                         "cuda: no GPU " + std::to_string(index) + " (this machine has " + std::to_string(count) + ")");
  return nullptr;
}

namespace cuda {
namespace {

// The types with 8-bit-activation kernels here. The others the CPU engine supports (F32, F16,
// BF16, Q5_0, Q5_1 and the K-quants) go through the float paths, which read any of them (load_weight).
bool is_quantized(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0; }
constexpr int kLogitRows = 32;  // as engine.cc

// One allocation of device memory, freed with its owner.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { free(); }
  void free() {
    if (p) cudaFree(p);
    p = nullptr;
  }
  void alloc(size_t count, const char* what) {
    n = count;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      if (e == cudaErrorMemoryAllocation)
        throw DeviceError("cuda_out_of_memory", std::string("cuda: out of GPU memory allocating ") + what + " (" +
                                                    std::to_string((count * sizeof(T)) >> 20) + " MiB)");
      throw_cuda(e, what);
    }
  }
};

// Pinned host memory (fast, asynchronous copies).
template <typename T>
struct PinnedBuf {
  T* p = nullptr;
  ~PinnedBuf() {
    if (p) cudaFreeHost(p);
  }
  void alloc(size_t count) { CTX_CUDA(cudaMallocHost(&p, std::max<size_t>(count, 1) * sizeof(T))); }
};

// Every operation on a cache goes on the backend's stream (non-blocking: it does not wait for the
// legacy default stream, so work queued there could still be running when a forward pass reads).
class CudaKv : public DeviceKv {
 public:
  CudaKv(int device, cudaStream_t stream, int n_layer, int kv_dim, int capacity)
      : device_(device), stream_(stream), n_layer_(n_layer), kv_dim_(kv_dim), cap_(capacity) {
    ensure();
    CTX_CUDA(cudaStreamSynchronize(stream_));
  }
  size_t bytes_reserved() const override { return buf_.p ? buf_.n * sizeof(__half) : 0; }
  void release() override { buf_.free(); }
  // (Re)allocates after a release(), zeroed like the CPU cache's fresh pages (rows declared by
  // setLength without an import then read as zeros, not as leftover bytes).
  void ensure() {
    if (buf_.p) return;
    CTX_CUDA(cudaSetDevice(device_));
    buf_.alloc(static_cast<size_t>(n_layer_) * 2 * cap_ * kv_dim_, "the KV cache of a sequence");
    CTX_CUDA(cudaMemsetAsync(buf_.p, 0, buf_.n * sizeof(__half), stream_));
  }
  __half* base() const { return buf_.p; }
  int capacity() const { return cap_; }
  void download(KvCache& host, int layer, int t0, int n) const override { copy(host, layer, t0, n, false); }
  void upload(const KvCache& host, int layer, int t0, int n) override { copy(const_cast<KvCache&>(host), layer, t0, n, true); }

 private:
  // Host rows of a device-tier layer are contiguous ([token][kv_dim], stride ld = kv_dim); a
  // GPU sequence never offloads (full attention only), so no bank addressing is needed here.
  void copy(KvCache& host, int layer, int t0, int n, bool to_device) const {
    if (n <= 0) return;
    const_cast<CudaKv*>(this)->ensure();
    CTX_CUDA(cudaSetDevice(device_));
    const size_t row = static_cast<size_t>(kv_dim_) * sizeof(__half);
    __half* k = buf_.p + static_cast<size_t>(layer) * 2 * cap_ * kv_dim_ + static_cast<size_t>(t0) * kv_dim_;
    __half* v = k + static_cast<size_t>(cap_) * kv_dim_;
    // Pageable host memory: the copies are staged by the driver; the sync makes them complete
    // (and ordered after the stream's kernels) before the call returns.
    if (to_device) {
      CTX_CUDA(cudaMemcpyAsync(k, host.k(layer, t0), n * row, cudaMemcpyHostToDevice, stream_));
      CTX_CUDA(cudaMemcpyAsync(v, host.v(layer, t0), n * row, cudaMemcpyHostToDevice, stream_));
    } else {
      CTX_CUDA(cudaMemcpyAsync(host.k(layer, t0), k, n * row, cudaMemcpyDeviceToHost, stream_));
      CTX_CUDA(cudaMemcpyAsync(host.v(layer, t0), v, n * row, cudaMemcpyDeviceToHost, stream_));
    }
    CTX_CUDA(cudaStreamSynchronize(stream_));
  }
  int device_;
  cudaStream_t stream_;
  int n_layer_, kv_dim_, cap_;
  DevBuf<__half> buf_;
};

class CudaBackend : public DeviceBackend {
 public:
  CudaBackend(std::shared_ptr<const Model> model, const EngineOptions& opts, int index);
  ~CudaBackend() override {
    clear_graphs();
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda:" + std::to_string(index_); }
  std::string description() const override { return description_; }
  size_t weight_bytes() const override { return weights_.n; }
  std::unique_ptr<DeviceKv> create_kv(int capacity) override {
    const ModelConfig& c = model_->config();
    return std::make_unique<CudaKv>(index_, stream_, c.n_layer, c.kv_dim(), capacity);
  }
  void forward(const std::vector<BatchItem>& items) override;

 private:
  using Slice = UbatchSlice;
  // A weight matrix: its file-layout copy (the simple kernels), and the repacked copy the fast
  // kernels read when a variant that uses one is on and the type has one.
  struct Mat {
    DevWeight w;
    DevQWeight q;
    bool repacked = false;
  };
  struct Layer {
    const float* attn_norm;
    Mat wq, wk, wv, wo;
    const float* ffn_norm;
    Mat w_gate, w_up, w_down;
  };
  void upload_weights();
  void upload_repacked();
  void forward_ubatch(const std::vector<Slice>& slices);
  void run_layers(int n);
  void run_layers_graph(int n);
  // The steps of a layer in run_layers (each picks the kernels of the variants that are on).
  void attention_inputs(int layer, int n);
  void feed_forward_inputs(int layer, int n);
  void norm(const float* weight, const Mat& next, int n);
  void add_product(const Mat& m, const float* x, int n);
  void clear_graphs();
  void plan_attention(const std::vector<Slice>& slices);
  // y = x W^T for n tokens (y += x W^T when `accumulate`). Quantized weights at n <= kMatvecTokens
  // read act_, quantized from x here unless it already holds x (quantized_).
  void matmul(const Mat& m, const float* x, int n, float* y, int ldy, bool accumulate = false);
  void quantize(const float* x, int n, int k);
  bool fast_matvec(const Mat& m, int n) const { return kernels_.matvec && m.repacked && n <= kMatvecTokens; }
  // Whether m's product with `in` runs as a fused matvec (matvec_fast.cuh F32Act): the variant is on,
  // the fast matvec takes m, and the activations fit a block's shared memory.
  bool fused_matvec(const Mat& m, const F32Act& in, int n) const {
    return kernels_.fused_decode && fast_matvec(m, n) && fused_act_fits(in, n);
  }
  void attention(int layer, int n);

  std::shared_ptr<const Model> model_;
  EngineOptions opts_;
  int index_;
  std::string description_;
  int max_ctx_;
  cudaStream_t stream_ = nullptr;

  DevBuf<uint8_t> weights_;  // every weight and norm, file layout, one allocation
  std::vector<Layer> layers_;
  DevWeight token_embd_;
  Mat output_;
  DevBuf<uint8_t> repacked_;  // the repacked copies (upload_repacked), one allocation
  CudaKernelSet kernels_;
  const float* output_norm_ = nullptr;
  DevBuf<float> rope_cos_, rope_sin_;

  // Scratch for one micro-batch (as engine.h).
  DevBuf<float> x_, xn_, q_, kc_, vc_, attn_, gate_, up_, part_o_, part_ml_, logits_x_, logits_;
  DevBuf<int8_t> act_qs_;
  DevBuf<float> act_d_, act_s_;
  DevBuf<int32_t> act_isum_;
  DevActQ8 act_;
  const float* quantized_ = nullptr;  // the x act_ holds, for this many tokens
  int quantized_n_ = 0;
  // Per micro-batch metadata, built on the host (pinned) and copied once.
  DevBuf<int32_t> tokens_, pos_, rows_, argmax_;
  DevBuf<ArgmaxPartial> argmax_part_;
  DevBuf<TokenKv> token_kv_;
  DevBuf<AttnWork> works_;
  DevBuf<AttnCombine> combine_;
  PinnedBuf<int32_t> h_tokens_, h_pos_, h_rows_, h_argmax_;
  PinnedBuf<TokenKv> h_token_kv_;
  PinnedBuf<AttnWork> h_works_;
  PinnedBuf<AttnCombine> h_combine_;
  PinnedBuf<float> h_logits_;
  int n_works_ = 0;
  int n_decode_works_ = 0;                  // with a fast attention variant, the works of at most kSplitTokens queries come first
  bool attention_direct_ = false;           // the step's attention writes attn_ without partials (fused-decode, one split)
  static constexpr size_t kMaxGraphs = 64;  // all are dropped when full (contexts grow by splits)
  // (tokens, work items, decode work items, attention_direct_) -> layers
  std::map<std::tuple<int, int, int, bool>, cudaGraphExec_t> graphs_;
  size_t max_works_ = 0, max_parts_ = 0;
  std::vector<Slice> slices_;
  std::vector<AttnSlice> attn_slices_;
  std::vector<std::pair<int, const BatchItem*>> wanted_;
};

CudaBackend::CudaBackend(std::shared_ptr<const Model> model, const EngineOptions& opts, int index)
    : model_(std::move(model)), opts_(opts), index_(index), kernels_(parse_cuda_kernels(opts.cuda_kernels)) {
  const ModelConfig& c = model_->config();
  // The kernels compute the Llama forward pass only: a model that needs more is refused (on any
  // machine, before the GPU is looked at) rather than computed wrong.
  if (const std::vector<std::string> needs = c.beyond_llama(); !needs.empty()) {
    std::string list;
    for (const std::string& n : needs) list += (list.empty() ? "" : ", ") + n;
    throw DeviceError("cuda_unsupported_model", "cuda: the GPU backend runs the Llama forward pass only, and this " + c.architecture +
                                                    " model needs " + list + " (run it with --device cpu)");
  }
  if (auto why = cuda_unusable(index)) throw *why;
  if (c.head_dim % 32 != 0 || c.head_dim > kMaxHeadDimGpu || c.n_embd % 32 != 0 || c.n_ff % 32 != 0)
    throw DeviceError("cuda_unsupported_model", "cuda: the GPU kernels need head_dim a multiple of 32 up to " +
                                                    std::to_string(kMaxHeadDimGpu) + " and n_embd, n_ff multiples of 32");
  CTX_CUDA(cudaSetDevice(index_));
  cudaDeviceProp prop{};
  CTX_CUDA(cudaGetDeviceProperties(&prop, index_));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %.1f GiB, sm_%d%d", prop.name, prop.totalGlobalMem / double(1 << 30), prop.major, prop.minor);
  description_ = buf;
  kernels_.pdl &= prop.major >= 9;  // programmatic dependent launch is Hopper's: before it, the same kernels launch plainly
  CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  max_ctx_ = opts_.max_context > 0 ? opts_.max_context : c.n_ctx_train;
  upload_weights();
  if (kernels_.matvec || kernels_.gemm) upload_repacked();

  // RoPE tables computed exactly as engine.cc does, on the host, then uploaded.
  const int half = c.head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(max_ctx_) * half), sn(cs.size());
  const float theta_scale = std::pow(c.rope.base, -2.0f / static_cast<float>(c.head_dim));
  for (int p = 0; p < max_ctx_; ++p) {
    float theta = static_cast<float>(p);
    for (int i = 0; i < half; ++i) {
      cs[static_cast<size_t>(p) * half + i] = std::cos(theta);
      sn[static_cast<size_t>(p) * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
  rope_cos_.alloc(cs.size(), "RoPE table");
  rope_sin_.alloc(sn.size(), "RoPE table");
  CTX_CUDA(cudaMemcpyAsync(rope_cos_.p, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaMemcpyAsync(rope_sin_.p, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaStreamSynchronize(stream_));  // cs and sn go out of scope

  const size_t U = opts_.ubatch, E = c.n_embd, F = c.n_ff, KV = c.kv_dim(), wide = std::max(E, F);
  x_.alloc(U * E, "activations");
  xn_.alloc(U * wide, "activations");
  q_.alloc(U * E, "activations");
  kc_.alloc(U * KV, "activations");
  vc_.alloc(U * KV, "activations");
  attn_.alloc(U * E, "activations");
  gate_.alloc(U * F, "activations");
  up_.alloc(U * F, "activations");
  // Quantized activations are used by micro-batches of at most kMatvecTokens tokens.
  act_qs_.alloc(kMatvecTokens * wide, "activations");
  act_d_.alloc(kMatvecTokens * wide / 32, "activations");
  act_s_.alloc(kMatvecTokens * wide / 32, "activations");
  act_isum_.alloc(kMatvecTokens * wide / 32, "activations");
  act_ = {act_qs_.p, act_d_.p, act_s_.p, act_isum_.p, 0};
  // Attention partials: one row per query and split (plan_attention keeps within the budget);
  // every work item has at least one query, so works never outnumber partial rows.
  max_parts_ = U * kPartsPerToken;
  max_works_ = max_parts_;
  part_o_.alloc(max_parts_ * c.n_head * c.head_dim, "attention partials");
  part_ml_.alloc(max_parts_ * c.n_head * 2, "attention partials");
  logits_x_.alloc(kLogitRows * E, "logits input");
  logits_.alloc(static_cast<size_t>(kLogitRows) * c.n_vocab, "logits");
  tokens_.alloc(U, "batch");
  pos_.alloc(U, "batch");
  rows_.alloc(U, "batch");
  argmax_.alloc(kLogitRows, "batch");
  argmax_part_.alloc(static_cast<size_t>(kLogitRows) * argmax_chunks(c.n_vocab), "batch");
  token_kv_.alloc(U, "batch");
  works_.alloc(max_works_, "batch");
  combine_.alloc(U, "batch");
  h_tokens_.alloc(U);
  h_pos_.alloc(U);
  h_rows_.alloc(U);
  h_argmax_.alloc(kLogitRows);
  h_token_kv_.alloc(U);
  h_works_.alloc(max_works_);
  h_combine_.alloc(U);
  h_logits_.alloc(static_cast<size_t>(kLogitRows) * c.n_vocab);
  slices_.reserve(U);
  attn_slices_.reserve(U);
  wanted_.reserve(U);
}

// Weights: every tensor copied once in its file layout (quantized blocks stay quantized: the
// matvecs read them directly, the GEMM dequantizes tiles to f16 in shared memory). A tied output
// matrix shares the embedding's copy.
void CudaBackend::upload_weights() {
  const ModelConfig& c = model_->config();
  std::vector<std::pair<const void*, size_t>> parts;  // host source, bytes
  std::vector<size_t> offsets;
  size_t total = 0;
  auto add = [&](const void* src, size_t bytes) {
    total = (total + 255) / 256 * 256;
    offsets.push_back(total);
    parts.push_back({src, bytes});
    total += bytes;
    return parts.size() - 1;
  };
  auto add_weight = [&](const Weight& w) {
    if (!is_supported_weight_type(w.type))
      throw DeviceError("cuda_unsupported_model",
                        "cuda: weight type " + ggml_type_name(static_cast<uint32_t>(w.type)) + " has no GPU kernel");
    return add(w.data, w.row_bytes * w.rows);
  };
  std::vector<size_t> ids;
  const size_t embd_id = add_weight(model_->token_embd());
  const bool tied = model_->output().data == model_->token_embd().data;
  const size_t out_id = tied ? embd_id : add_weight(model_->output());
  const size_t out_norm_id = add(model_->output_norm(), c.n_embd * sizeof(float));
  for (const LayerWeights& lw : model_->layers()) {
    ids.push_back(add(lw.attn_norm, c.n_embd * sizeof(float)));
    for (const Weight* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo}) ids.push_back(add_weight(*w));
    ids.push_back(add(lw.ffn_norm, c.n_embd * sizeof(float)));
    for (const Weight* w : {&lw.w_gate, &lw.w_up, &lw.w_down}) ids.push_back(add_weight(*w));
  }
  weights_.alloc(total, "the model's weights");
  for (size_t i = 0; i < parts.size(); ++i)
    CTX_CUDA(cudaMemcpyAsync(weights_.p + offsets[i], parts[i].first, parts[i].second, cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaStreamSynchronize(stream_));  // the sources are pageable (the file's mapping)
  auto dev = [&](const Weight& w, size_t id) { return DevWeight{w.type, weights_.p + offsets[id], w.rows, w.cols, w.row_bytes}; };
  auto mat = [&](const Weight& w, size_t id) {
    Mat m;
    m.w = dev(w, id);
    return m;
  };
  auto norm = [&](size_t id) { return reinterpret_cast<const float*>(weights_.p + offsets[id]); };
  token_embd_ = dev(model_->token_embd(), embd_id);
  output_ = mat(model_->output(), out_id);
  output_norm_ = norm(out_norm_id);
  size_t k = 0;
  for (const LayerWeights& lw : model_->layers()) {
    Layer L;
    L.attn_norm = norm(ids[k++]);
    L.wq = mat(lw.wq, ids[k++]);
    L.wk = mat(lw.wk, ids[k++]);
    L.wv = mat(lw.wv, ids[k++]);
    L.wo = mat(lw.wo, ids[k++]);
    L.ffn_norm = norm(ids[k++]);
    L.w_gate = mat(lw.w_gate, ids[k++]);
    L.w_up = mat(lw.w_up, ids[k++]);
    L.w_down = mat(lw.w_down, ids[k++]);
    layers_.push_back(L);
  }
}

// The repacked copies (repack.h) of every Q4_0/Q4_1/Q8_0 matrix, made on the host and copied once.
// They sit beside the file-layout copies (the embedding rows and the simple kernels read those):
// the weights then take up to twice their size in GPU memory while a fast variant is on.
void CudaBackend::upload_repacked() {
  std::vector<std::pair<Mat*, const Weight*>> mats;
  if (repackable(output_.w.type)) mats.push_back({&output_, &model_->output()});
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    const LayerWeights& lw = model_->layers()[l];
    const std::pair<Mat*, const Weight*> all[] = {{&L.wq, &lw.wq},         {&L.wk, &lw.wk},     {&L.wv, &lw.wv},        {&L.wo, &lw.wo},
                                                  {&L.w_gate, &lw.w_gate}, {&L.w_up, &lw.w_up}, {&L.w_down, &lw.w_down}};
    for (const auto& m : all)
      if (repackable(m.second->type)) mats.push_back(m);
  }
  auto round_up = [](size_t x) { return (x + 255) / 256 * 256; };
  size_t total = 0;
  for (const auto& [m, w] : mats)
    total += round_up(repacked_qs_bytes(w->type, w->rows, w->cols)) + round_up(repacked_blocks(w->rows, w->cols) * 4);
  if (total == 0) return;
  repacked_.alloc(total, "the repacked weights");
  std::vector<uint8_t> qs;
  std::vector<uint16_t> dm;
  size_t off = 0;
  for (const auto& [m, w] : mats) {
    const size_t qs_bytes = repacked_qs_bytes(w->type, w->rows, w->cols), blocks = repacked_blocks(w->rows, w->cols);
    qs.resize(qs_bytes);
    dm.resize(2 * blocks);
    repack_weight(*w, qs.data(), dm.data());
    uint8_t* dq = repacked_.p + off;
    uint8_t* ddm = dq + round_up(qs_bytes);
    CTX_CUDA(cudaMemcpyAsync(dq, qs.data(), qs_bytes, cudaMemcpyHostToDevice, stream_));
    CTX_CUDA(cudaMemcpyAsync(ddm, dm.data(), blocks * 4, cudaMemcpyHostToDevice, stream_));
    CTX_CUDA(cudaStreamSynchronize(stream_));  // qs and dm are reused for the next matrix
    m->q = DevQWeight{w->type, w->rows, w->cols, dq, reinterpret_cast<const __half2*>(ddm)};
    m->repacked = true;
    off += round_up(qs_bytes) + round_up(blocks * 4);
  }
}

void CudaBackend::forward(const std::vector<BatchItem>& items) {
  CTX_CUDA(cudaSetDevice(index_));  // this runs on the engine's worker thread
  // The same micro-batches as Engine::forward.
  for_each_ubatch(items, opts_.ubatch, slices_, [this](const std::vector<Slice>& slices) { forward_ubatch(slices); });
}

void CudaBackend::quantize(const float* x, int n, int k) {
  if (quantized_ == x && quantized_n_ == n && act_.k == k) return;
  act_.k = k;
  quantize_q8(x, n, k, act_, stream_);
  quantized_ = x;
  quantized_n_ = n;
}

void CudaBackend::matmul(const Mat& m, const float* x, int n, float* y, int ldy, bool accumulate) {
  if (accumulate && !fast_matvec(m, n)) throw std::logic_error("cuda: only the fast matvec adds into its output");
  if (n > kMatvecTokens) {
    if (kernels_.gemm && m.repacked)
      gemm_fast(m.q, x, n, y, ldy, stream_);
    else
      gemm(m.w, x, n, y, ldy, stream_);
    return;
  }
  if (is_quantized(m.w.type)) quantize(x, n, m.w.cols);
  if (fast_matvec(m, n))
    matvec_fast(m.q, act_, n, y, ldy, accumulate, stream_);
  else
    matvec(m.w, x, &act_, n, y, ldy, stream_);
}

void CudaBackend::plan_attention(const std::vector<Slice>& slices) {
  attn_slices_.clear();
  int t = 0;
  for (const Slice& s : slices) {
    const CudaKv* kv = static_cast<const CudaKv*>(s.item->seq->device_kv.get());
    attn_slices_.push_back({kv->base(), kv->capacity(), t, s.count, s.pos0});
    t += s.count;
  }
  // A step of single-token decodes is planned in buckets: with graphs, one captured graph per
  // (batch size, bucket) instead of a new one whenever a context crosses 256 more keys. Without
  // graphs too, so that a step computes the same sums in the same order either way (GPU run-2:
  // with the plans differing, the logits with and without graphs differed in the last bits).
  const bool decode_only = std::all_of(slices.begin(), slices.end(), [](const Slice& s) { return s.count == 1; });
  attention_direct_ = false;
  if (decode_only) {
    int bucket = 0;
    n_works_ = cuda::plan_decode_bucketed(attn_slices_.data(), static_cast<int>(attn_slices_.size()), h_works_.p, h_combine_.p,
                                          static_cast<int>(max_parts_), &bucket);
    // One split per token, its partial row its own: the decode attention writes the output itself.
    attention_direct_ = kernels_.fused_decode && kernels_.attention && bucket == 1;
    for (int t = 0; t < n_works_ && attention_direct_; ++t) attention_direct_ = h_works_.p[t].part0 == t && h_works_.p[t].q0 == t;
  } else {
    n_works_ = cuda::plan_attention(attn_slices_.data(), static_cast<int>(attn_slices_.size()), h_works_.p, h_combine_.p,
                                    static_cast<int>(max_parts_));
  }
  n_decode_works_ = 0;
  if (kernels_.attention || kernels_.prefill_attention) {
    // Decode-shaped works (a few queries, a key range) and prefill tiles go to different kernels:
    // decode-shaped first. Each work writes its own partial rows, so their order is free.
    AttnWork* mid = std::stable_partition(h_works_.p, h_works_.p + n_works_, [](const AttnWork& w) { return w.nq <= kSplitTokens; });
    n_decode_works_ = static_cast<int>(mid - h_works_.p);
  }
}

// The layer's attention over the planned works, then the merge of split partials.
void CudaBackend::attention(int layer, int n) {
  const ModelConfig& c = model_->config();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (attention_direct_) {  // no partials, no merge (plan_attention)
    attention_gqa(q_.p, works_.p, n_works_, c.n_head, c.n_head_kv, c.head_dim, layer, scale, attn_.p, nullptr, stream_);
    return;
  }
  auto run = [&](decltype(&cuda::attention) kernel, const AttnWork* works, int count) {
    if (count > 0) kernel(q_.p, works, count, c.n_head, c.n_head_kv, c.head_dim, layer, scale, part_o_.p, part_ml_.p, stream_);
  };
  if (kernels_.attention || kernels_.prefill_attention) {
    run(kernels_.attention ? &attention_gqa : &cuda::attention, works_.p, n_decode_works_);
    run(kernels_.prefill_attention ? &attention_prefill_tc : &cuda::attention, works_.p + n_decode_works_, n_works_ - n_decode_works_);
  } else {
    run(&cuda::attention, works_.p, n_works_);
  }
  (kernels_.attention ? attention_combine_wide : attention_combine)(part_o_.p, part_ml_.p, combine_.p, n, c.n_head, c.head_dim, attn_.p,
                                                                    stream_);
}

void CudaBackend::forward_ubatch(const std::vector<Slice>& slices) {
  const ModelConfig& c = model_->config();
  const int E = c.n_embd;
  int n = 0;
  for (const Slice& s : slices) {
    CudaKv* kv = static_cast<CudaKv*>(s.item->seq->device_kv.get());
    kv->ensure();
    for (int i = 0; i < s.count; ++i, ++n) {
      h_tokens_.p[n] = s.item->tokens[s.offset + i];
      h_pos_.p[n] = s.pos0 + i;
      h_token_kv_.p[n] = {kv->base(), kv->capacity(), s.pos0 + i};
    }
  }
  plan_attention(slices);
  CTX_CUDA(cudaMemcpyAsync(tokens_.p, h_tokens_.p, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaMemcpyAsync(pos_.p, h_pos_.p, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaMemcpyAsync(token_kv_.p, h_token_kv_.p, n * sizeof(TokenKv), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaMemcpyAsync(works_.p, h_works_.p, n_works_ * sizeof(AttnWork), cudaMemcpyHostToDevice, stream_));
  CTX_CUDA(cudaMemcpyAsync(combine_.p, h_combine_.p, n * sizeof(AttnCombine), cudaMemcpyHostToDevice, stream_));
  if (opts_.cuda_graphs)
    run_layers_graph(n);
  else
    run_layers(n);

  // Logits (and the greedy token) for the items whose last token is in this micro-batch,
  // kLogitRows at a time, as engine.cc.
  logit_rows(slices, wanted_);
  for (size_t g = 0; g < wanted_.size(); g += kLogitRows) {
    const int rows = static_cast<int>(std::min<size_t>(kLogitRows, wanted_.size() - g));
    for (int r = 0; r < rows; ++r) h_rows_.p[r] = wanted_[g + r].first;
    CTX_CUDA(cudaMemcpyAsync(rows_.p, h_rows_.p, rows * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    gather_rows(x_.p, rows_.p, rows, E, xn_.p, stream_);
    rms_norm(xn_.p, output_norm_, logits_x_.p, rows, E, c.rms_eps, stream_);
    quantized_ = nullptr;
    matmul(output_, logits_x_.p, rows, logits_.p, c.n_vocab);
    argmax(logits_.p, rows, c.n_vocab, argmax_part_.p, argmax_.p, stream_);
    CTX_CUDA(cudaMemcpyAsync(h_argmax_.p, argmax_.p, rows * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    bool any_logits = false;
    for (int r = 0; r < rows; ++r) any_logits |= wanted_[g + r].second->logits != nullptr;
    if (any_logits)  // only when asked: a greedy decode step copies one int per sequence
      CTX_CUDA(
          cudaMemcpyAsync(h_logits_.p, logits_.p, static_cast<size_t>(rows) * c.n_vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CTX_CUDA(cudaStreamSynchronize(stream_));
    for (int r = 0; r < rows; ++r) {
      const BatchItem* it = wanted_[g + r].second;
      if (it->logits) std::memcpy(it->logits, h_logits_.p + static_cast<size_t>(r) * c.n_vocab, c.n_vocab * sizeof(float));
      if (it->argmax) *it->argmax = h_argmax_.p[r];
    }
  }
  CTX_CUDA(cudaStreamSynchronize(stream_));  // the KV is written before the sequences grow
  for (const Slice& s : slices) s.item->seq->kv.set_size(s.pos0 + s.count);
}

// Embedding and every layer, as kernels on the stream only (no copies, no host reads), so the
// whole sequence can be captured into a CUDA graph; the launches depend on n and the attention
// plan's size alone (the per-step metadata lives in device buffers copied before). Each step has
// its simple form and, when its variant is on (kernels_), a faster one that computes the same.
void CudaBackend::run_layers(int n) {
  const ModelConfig& c = model_->config();
  quantized_ = nullptr;
  embed(token_embd_, tokens_.p, n, x_.p, stream_);
  for (int l = 0; l < c.n_layer; ++l) {
    const Layer& L = layers_[l];
    attention_inputs(l, n);  // RMSNorm, Q/K/V, RoPE, the KV store
    attention(l, n);
    add_product(L.wo, attn_.p, n);
    feed_forward_inputs(l, n);  // RMSNorm, gate/up, SwiGLU
    add_product(L.w_down, gate_.p, n);
    quantized_ = nullptr;  // gate_, attn_ and xn_ are rewritten by the next layer
  }
}

// RMSNorm of x_ into xn_; with the fused variant, together with the quantization the next
// (quantized, matvec) product needs.
void CudaBackend::norm(const float* weight, const Mat& next, int n) {
  const ModelConfig& c = model_->config();
  const int E = c.n_embd;
  if (kernels_.fused && n <= kMatvecTokens && is_quantized(next.w.type) && E * sizeof(float) <= 48 * 1024) {
    act_.k = E;
    rms_norm_quantize(x_.p, weight, xn_.p, n, E, c.rms_eps, act_, stream_);
    quantized_ = xn_.p;
    quantized_n_ = n;
  } else {
    rms_norm(x_.p, weight, xn_.p, n, E, c.rms_eps, stream_);
    quantized_ = nullptr;
  }
}

// x_ += x W^T: inside the fast matvec (fused: from x's f32 rows), else a product into xn_ and an add.
void CudaBackend::add_product(const Mat& m, const float* x, int n) {
  const int E = model_->config().n_embd;
  const F32Act in{x, m.w.cols};
  if (fused_matvec(m, in, n)) {
    matvec_fast(m.q, in, n, x_.p, E, /*accumulate=*/true, stream_, kernels_.pdl);
  } else if (fast_matvec(m, n)) {
    matmul(m, x, n, x_.p, E, /*accumulate=*/true);
  } else {
    matmul(m, x, n, xn_.p, E);
    quantized_ = nullptr;  // xn_ was rewritten
    add(x_.p, xn_.p, static_cast<size_t>(n) * E, stream_);
  }
}

// Layer l's attention inputs from x_: q_ rotated, the token's K and V in the cache.
void CudaBackend::attention_inputs(int l, int n) {
  const ModelConfig& c = model_->config();
  const int E = c.n_embd, KV = c.kv_dim();
  const Layer& L = layers_[l];
  const F32Act in{x_.p, E, L.attn_norm, c.rms_eps};
  if (fused_matvec(L.wq, in, n) && fused_matvec(L.wk, in, n) && fused_matvec(L.wv, in, n) && L.wk.q.type == L.wq.q.type &&
      L.wv.q.type == L.wq.q.type) {
    const RopeStore out{q_.p, E, c.head_dim, pos_.p, rope_cos_.p, rope_sin_.p, token_kv_.p, l};
    matvec_qkv_rope(L.wq.q, L.wk.q, L.wv.q, in, n, out, stream_, kernels_.pdl);  // all of it in one launch
    return;
  }
  norm(L.attn_norm, L.wq, n);
  if (fast_matvec(L.wq, n) && fast_matvec(L.wk, n) && fast_matvec(L.wv, n)) {
    quantize(xn_.p, n, E);
    const DevQWeight* w[3] = {&L.wq.q, &L.wk.q, &L.wv.q};
    float* const y[3] = {q_.p, kc_.p, vc_.p};
    const int ldy[3] = {E, KV, KV};
    matvec_fast_multi(w, y, ldy, 3, act_, n, stream_);
  } else {
    matmul(L.wq, xn_.p, n, q_.p, E);
    matmul(L.wk, xn_.p, n, kc_.p, KV);
    matmul(L.wv, xn_.p, n, vc_.p, KV);
  }
  if (kernels_.fused) {
    rope_store_kv(q_.p, kc_.p, vc_.p, n, c.n_head, c.n_head_kv, c.head_dim, pos_.p, rope_cos_.p, rope_sin_.p, token_kv_.p, l, stream_);
  } else {
    rope(q_.p, n, c.n_head, c.head_dim, pos_.p, rope_cos_.p, rope_sin_.p, stream_);
    rope(kc_.p, n, c.n_head_kv, c.head_dim, pos_.p, rope_cos_.p, rope_sin_.p, stream_);
    store_kv(kc_.p, vc_.p, token_kv_.p, n, KV, l, stream_);
  }
}

// Layer l's feed-forward input from x_: silu(gate) * up into gate_.
void CudaBackend::feed_forward_inputs(int l, int n) {
  const ModelConfig& c = model_->config();
  const int E = c.n_embd, F = c.n_ff;
  const Layer& L = layers_[l];
  const F32Act in{x_.p, E, L.ffn_norm, c.rms_eps};
  if (fused_matvec(L.w_gate, in, n) && fused_matvec(L.w_up, in, n)) {
    matvec_fast_swiglu(L.w_gate.q, L.w_up.q, in, n, gate_.p, F, stream_, kernels_.pdl);  // all of it in one launch
    return;
  }
  norm(L.ffn_norm, L.w_gate, n);
  if (fast_matvec(L.w_gate, n) && fast_matvec(L.w_up, n)) {
    quantize(xn_.p, n, E);
    matvec_fast_swiglu(L.w_gate.q, L.w_up.q, act_, n, gate_.p, F, stream_);
  } else {
    matmul(L.w_gate, xn_.p, n, gate_.p, F);
    matmul(L.w_up, xn_.p, n, up_.p, F);
    swiglu(gate_.p, up_.p, static_cast<size_t>(n) * F, stream_);
  }
}

// The layers as one CUDA graph per (tokens, attention work items): captured the first time,
// replayed after (a decode step is ~20 launches per layer, launch-bound without a graph).
void CudaBackend::run_layers_graph(int n) {
  const std::tuple<int, int, int, bool> key{n, n_works_, n_decode_works_, attention_direct_};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) clear_graphs();
    cudaGraph_t graph = nullptr;
    CTX_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      run_layers(n);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    CTX_CUDA(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CTX_CUDA(e);
    it = graphs_.emplace(key, exec).first;
  }
  CTX_CUDA(cudaGraphLaunch(it->second, stream_));
}

void CudaBackend::clear_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace
}  // namespace cuda

std::unique_ptr<DeviceBackend> make_cuda_backend(std::shared_ptr<const Model> model, const EngineOptions& opts, int index) {
  return std::make_unique<cuda::CudaBackend>(std::move(model), opts, index);
}

}  // namespace ctx
