// The fused kernels (cuda/fused.cuh) against the kernels they replace, run in sequence on the same
// inputs: the results must be the same bits (CUDA builds only; skipped without a usable GPU).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/fused.cuh"
#include "cuda/kernels.cuh"
#include "device.h"

namespace {

using namespace ctx;
using namespace ctx::cuda;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

// Device memory for `n` elements, optionally filled from a host vector; freed at scope exit.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, count * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<float> randoms(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// 8-bit activations for n rows of k: device buffers and the DevActQ8 that points at them.
struct Act {
  Dev<int8_t> qs;
  Dev<float> d, s;
  Dev<int32_t> isum;
  DevActQ8 a;
  Act(int n, int k) : qs(static_cast<size_t>(n) * k), d(static_cast<size_t>(n) * k / 32), s(d.n), isum(d.n), a{qs.p, d.p, s.p, isum.p, k} {}
};

TEST(CudaFused, RmsNormQuantizeIsRmsNormThenQuantize) {
  SKIP_WITHOUT_GPU();
  for (int e : {576, 1536, 96}) {
    const int n = 5;
    std::vector<float> x = randoms(static_cast<size_t>(n) * e, e, -4.f, 4.f);
    for (int j = 0; j < 32; ++j) x[j] = 0.f;  // a block that normalises to zeros
    const Dev<float> dx(x), dw(randoms(e, e + 1, 0.5f, 1.5f));
    Dev<float> out_ref(x.size()), out(x.size());
    Act ref(n, e), fused(n, e);
    rms_norm(dx.p, dw.p, out_ref.p, n, e, 1e-5f, nullptr);
    quantize_q8(out_ref.p, n, e, ref.a, nullptr);
    rms_norm_quantize(dx.p, dw.p, out.p, n, e, 1e-5f, fused.a, nullptr);
    EXPECT_EQ(out.get(), out_ref.get()) << "e " << e;
    EXPECT_EQ(fused.qs.get(), ref.qs.get()) << "e " << e;
    EXPECT_EQ(fused.d.get(), ref.d.get()) << "e " << e;
    EXPECT_EQ(fused.s.get(), ref.s.get()) << "e " << e;
    EXPECT_EQ(fused.isum.get(), ref.isum.get()) << "e " << e;
    Act no_out(n, e);  // without the f32 output
    rms_norm_quantize(dx.p, dw.p, nullptr, n, e, 1e-5f, no_out.a, nullptr);
    EXPECT_EQ(no_out.qs.get(), ref.qs.get()) << "e " << e;
  }
}

TEST(CudaFused, RopeStoreKvIsRopeThenStore) {
  SKIP_WITHOUT_GPU();
  const int n = 6, n_head = 9, n_head_kv = 3, d = 64, half = d / 2, kv_dim = n_head_kv * d, layers = 2, cap = 5000;
  std::vector<float> cs(static_cast<size_t>(cap) * half), sn(cs.size());
  for (int p = 0; p < cap; ++p)
    for (int i = 0; i < half; ++i) {
      const float theta = p * std::pow(10000.f, -2.f * i / d);
      cs[static_cast<size_t>(p) * half + i] = std::cos(theta), sn[static_cast<size_t>(p) * half + i] = std::sin(theta);
    }
  const std::vector<int> pos = {0, 1, 2, 777, 4998, 4999};
  const std::vector<float> q = randoms(static_cast<size_t>(n) * n_head * d, 1, -2.f, 2.f);
  const std::vector<float> k = randoms(static_cast<size_t>(n) * kv_dim, 2, -2.f, 2.f);
  const std::vector<float> v = randoms(k.size(), 3, -2.f, 2.f);
  const Dev<float> dc(cs), ds(sn), dv(v);
  const Dev<int> dp(pos);
  Dev<float> q_ref(q), k_ref(k), q_fused(q), k_fused(k);
  const size_t cache = static_cast<size_t>(layers) * 2 * cap * kv_dim;
  Dev<uint16_t> kv_ref(cache), kv_fused(cache);  // f16 bits
  for (int layer : {0, 1}) {
    auto tokens_for = [&](uint16_t* base) {
      std::vector<TokenKv> t(n);
      for (int i = 0; i < n; ++i) t[i] = {reinterpret_cast<__half*>(base), cap, pos[i]};
      return t;
    };
    const Dev<TokenKv> t_ref(tokens_for(kv_ref.p)), t_fused(tokens_for(kv_fused.p));
    rope(q_ref.p, n, n_head, d, dp.p, dc.p, ds.p, nullptr);
    rope(k_ref.p, n, n_head_kv, d, dp.p, dc.p, ds.p, nullptr);
    store_kv(k_ref.p, dv.p, t_ref.p, n, kv_dim, layer, nullptr);
    rope_store_kv(q_fused.p, k_fused.p, dv.p, n, n_head, n_head_kv, d, dp.p, dc.p, ds.p, t_fused.p, layer, nullptr);
    EXPECT_EQ(q_fused.get(), q_ref.get()) << "layer " << layer;
    // rope rotated k_ref in place: the next layer starts again from the same k.
    EXPECT_EQ(cudaMemcpy(k_ref.p, k.data(), k.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  EXPECT_EQ(kv_fused.get(), kv_ref.get());
}

}  // namespace
