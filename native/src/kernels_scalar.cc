// Reference kernels: plain C++, the numerics every SIMD table is tested against.
#include <cmath>

#include "fp16.h"
#include "ggml_types.h"
#include "kernels.h"

namespace ctx {
namespace {

// Same recipe as ggml's x86 quantize_row_q8_1: scale 127/amax, round half to even.
void quantize_q8(const float* x, int k, int8_t* qs, float* d, float* s, int32_t* isum) {
  for (int b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float scale = amax / 127.f;
    const float inv = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * inv));
      qs[b * 32 + j] = static_cast<int8_t>(q);
      sum += q;
    }
    d[b] = round_fp16(scale);
    s[b] = round_fp16(scale * static_cast<float>(sum));
    isum[b] = sum;
  }
}

template <typename Block, typename DotBlock>
void gemm_q8_generic(const GemmQ8Args& a, DotBlock dot_block) {
  const int nb = a.x->blocks();
  for (int t = 0; t < a.n_tok; ++t) {
    const int row = a.tok0 + t;
    const int8_t* xq = a.x->qs + static_cast<size_t>(row) * a.x->k;
    const float* xd = a.x->d + static_cast<size_t>(row) * nb;
    const float* xs = a.x->s + static_cast<size_t>(row) * nb;
    const int32_t* xi = a.x->isum + static_cast<size_t>(row) * nb;
    for (int r = 0; r < a.n_rows; ++r) {
      const auto* w = reinterpret_cast<const Block*>(a.w + r * a.w_stride);
      float acc = 0;
      for (int b = 0; b < nb; ++b) acc += dot_block(w[b], xq + b * 32, xd[b], xs[b], xi[b]);
      a.y[static_cast<size_t>(t) * a.ldy + r] = acc;
    }
  }
}

void gemm_q4_0(const GemmQ8Args& a) {
  gemm_q8_generic<BlockQ4_0>(a, [](const BlockQ4_0& w, const int8_t* x, float xd, float, int32_t xsum) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += (w.qs[j] & 0xF) * x[j] + (w.qs[j] >> 4) * x[j + 16];
    return fp16_to_fp32(w.d) * xd * static_cast<float>(sumi - 8 * xsum);
  });
}

void gemm_q4_1(const GemmQ8Args& a) {
  gemm_q8_generic<BlockQ4_1>(a, [](const BlockQ4_1& w, const int8_t* x, float xd, float xs, int32_t) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += (w.qs[j] & 0xF) * x[j] + (w.qs[j] >> 4) * x[j + 16];
    return fp16_to_fp32(w.d) * xd * static_cast<float>(sumi) + fp16_to_fp32(w.m) * xs;
  });
}

void gemm_q8_0(const GemmQ8Args& a) {
  gemm_q8_generic<BlockQ8_0>(a, [](const BlockQ8_0& w, const int8_t* x, float xd, float, int32_t) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += w.qs[j] * x[j];
    return fp16_to_fp32(w.d) * xd * static_cast<float>(sumi);
  });
}

template <typename Load>
void gemm_float_generic(const GemmF32Args& a, Load load) {
  for (int t = 0; t < a.n_tok; ++t) {
    const float* x = a.x + static_cast<size_t>(t) * a.k;
    for (int r = 0; r < a.n_rows; ++r) {
      const uint8_t* w = a.w + r * a.w_stride;
      float acc = 0;
      for (int j = 0; j < a.k; ++j) acc += load(w, j) * x[j];
      a.y[static_cast<size_t>(t) * a.ldy + r] = acc;
    }
  }
}

void gemm_f32(const GemmF32Args& a) {
  gemm_float_generic(a, [](const uint8_t* w, int j) { return reinterpret_cast<const float*>(w)[j]; });
}
void gemm_f16(const GemmF32Args& a) {
  gemm_float_generic(a, [](const uint8_t* w, int j) { return fp16_to_fp32(reinterpret_cast<const uint16_t*>(w)[j]); });
}
void gemm_bf16(const GemmF32Args& a) {
  gemm_float_generic(a, [](const uint8_t* w, int j) { return bf16_to_fp32(reinterpret_cast<const uint16_t*>(w)[j]); });
}

void attn_scores(const float* q, int n_q, const uint16_t* k, size_t k_stride, int n, int d, float scale,
                 float* scores) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* kr = k + j * k_stride;
    for (int g = 0; g < n_q; ++g) {
      float acc = 0;
      for (int i = 0; i < d; ++i) acc += q[g * d + i] * fp16_to_fp32(kr[i]);
      scores[static_cast<size_t>(g) * n + j] = acc * scale;
    }
  }
}

void attn_values(const float* p, int n_q, const uint16_t* v, size_t v_stride, int n, int d, float* out) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* vr = v + j * v_stride;
    for (int g = 0; g < n_q; ++g) {
      const float pj = p[static_cast<size_t>(g) * n + j];
      for (int i = 0; i < d; ++i) out[g * d + i] += pj * fp16_to_fp32(vr[i]);
    }
  }
}

float exp_sum(float* x, int n, float max) {
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return static_cast<float>(sum);
}

void f32_to_f16(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

const KernelTable kScalar = {
    "scalar", quantize_q8, gemm_q4_0, gemm_q4_1, gemm_q8_0, gemm_f32, gemm_f16, gemm_bf16,
    attn_scores, attn_values, exp_sum, f32_to_f16,
};

}  // namespace

const KernelTable& scalar_kernels() { return kScalar; }

}  // namespace ctx
