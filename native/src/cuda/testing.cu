// Host wrappers for the kernel tests (testing.h).
#include <cmath>
#include <cstring>

#include "cuda/common.cuh"
#include "cuda/kernels.cuh"
#include "cuda/testing.h"

namespace ctx::cuda::testing {
namespace {

// A device copy of a host vector (or `count` uninitialised elements), freed at scope exit.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CTX_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { CTX_CUDA(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  Dev(const void* h, size_t count) : Dev(count) { CTX_CUDA(cudaMemcpy(p, h, count * sizeof(T), cudaMemcpyHostToDevice)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    CTX_CUDA(cudaDeviceSynchronize());
    std::vector<T> h(n);
    CTX_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct DevW {
  Dev<uint8_t> bytes;
  DevWeight w;
  explicit DevW(const Weight& h) : bytes(h.data, h.row_bytes * h.rows), w{h.type, bytes.p, h.rows, h.cols, h.row_bytes} {}
};

}  // namespace

std::vector<float> embed(const Weight& w, const std::vector<int32_t>& tokens) {
  DevW dw(w);
  Dev<int32_t> t(tokens);
  Dev<float> x(tokens.size() * w.cols);
  cuda::embed(dw.w, t.p, static_cast<int>(tokens.size()), x.p, nullptr);
  return x.get();
}

std::vector<float> rms_norm(const std::vector<float>& x, const std::vector<float>& weight, int n, int e, float eps) {
  Dev<float> dx(x), dw(weight), out(x.size());
  cuda::rms_norm(dx.p, dw.p, out.p, n, e, eps, nullptr);
  return out.get();
}

std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int head_dim, const std::vector<int>& pos,
                        const std::vector<float>& cos_t, const std::vector<float>& sin_t) {
  Dev<float> dx(x), dc(cos_t), ds(sin_t);
  Dev<int> dp(pos);
  cuda::rope(dx.p, n, n_heads, head_dim, dp.p, dc.p, ds.p, nullptr);
  return dx.get();
}

Q8 quantize_q8(const std::vector<float>& x, int n, int k) {
  Dev<float> dx(x);
  Dev<int8_t> qs(static_cast<size_t>(n) * k);
  Dev<float> d(static_cast<size_t>(n) * k / 32), s(d.n);
  Dev<int32_t> isum(d.n);
  cuda::quantize_q8(dx.p, n, k, DevActQ8{qs.p, d.p, s.p, isum.p, k}, nullptr);
  return {qs.get(), d.get(), s.get(), isum.get()};
}

std::vector<float> matvec(const Weight& w, const std::vector<float>& x, int n) {
  DevW dw(w);
  Dev<float> dx(x), y(static_cast<size_t>(n) * w.rows);
  Dev<int8_t> qs(static_cast<size_t>(n) * w.cols);
  Dev<float> d(static_cast<size_t>(n) * w.cols / 32), s(d.n);
  Dev<int32_t> isum(d.n);
  const DevActQ8 act{qs.p, d.p, s.p, isum.p, w.cols};
  if (w.type == GgmlType::Q4_0 || w.type == GgmlType::Q4_1 || w.type == GgmlType::Q8_0) cuda::quantize_q8(dx.p, n, w.cols, act, nullptr);
  cuda::matvec(dw.w, dx.p, &act, n, y.p, w.rows, nullptr);
  return y.get();
}

std::vector<float> gemm(const Weight& w, const std::vector<float>& x, int n) {
  DevW dw(w);
  Dev<float> dx(x), y(static_cast<size_t>(n) * w.rows);
  cuda::gemm(dw.w, dx.p, n, y.p, w.rows, nullptr);
  return y.get();
}

std::vector<float> attention(const std::vector<float>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, int cap, int n,
                             int pos0, int n_head, int n_head_kv, int head_dim) {
  const size_t kv_dim = static_cast<size_t>(n_head_kv) * head_dim;
  // Layer 0 of a one-layer cache: K then V, each [cap][kv_dim].
  std::vector<uint16_t> cache(2 * cap * kv_dim);
  std::memcpy(cache.data(), k.data(), cap * kv_dim * 2);
  std::memcpy(cache.data() + cap * kv_dim, v.data(), cap * kv_dim * 2);
  Dev<uint16_t> dcache(cache);
  Dev<float> dq(q);
  const AttnSlice slice{reinterpret_cast<const __half*>(dcache.p), cap, 0, n, pos0};
  // The forward pass's budget for a micro-batch of 512 tokens, so one sequence gets every split.
  const size_t parts = static_cast<size_t>(512) * kPartsPerToken;
  std::vector<AttnWork> works(parts);
  std::vector<AttnCombine> comb(n);
  const int n_works = plan_attention(&slice, 1, works.data(), comb.data(), static_cast<int>(parts));
  works.resize(n_works);
  Dev<AttnWork> dworks(works);
  Dev<AttnCombine> dcomb(comb);
  Dev<float> part_o(parts * n_head * head_dim), part_ml(parts * n_head * 2), out(static_cast<size_t>(n) * n_head * head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cuda::attention(dq.p, dworks.p, n_works, n_head, n_head_kv, head_dim, 0, scale, part_o.p, part_ml.p, nullptr);
  cuda::attention_combine(part_o.p, part_ml.p, dcomb.p, n, n_head, head_dim, out.p, nullptr);
  return out.get();
}

std::vector<float> swiglu(const std::vector<float>& gate, const std::vector<float>& up) {
  Dev<float> g(gate), u(up);
  cuda::swiglu(g.p, u.p, gate.size(), nullptr);
  return g.get();
}

std::vector<int32_t> argmax(const std::vector<float>& logits, int rows, int n_vocab) {
  Dev<float> l(logits);
  Dev<int32_t> out(rows);
  Dev<ArgmaxPartial> scratch(static_cast<size_t>(rows) * argmax_chunks(n_vocab));
  cuda::argmax(l.p, rows, n_vocab, scratch.p, out.p, nullptr);
  return out.get();
}

}  // namespace ctx::cuda::testing
