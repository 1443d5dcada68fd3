// Reference kernels: plain C++, the numerics every SIMD table is tested against.
#include <cmath>

#include "fp16.h"
#include "ggml_types.h"
#include "kernels.h"
#include "packed.h"

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

// One activation row's view at a packed block's columns: its first 8-bit quant and the
// per-32 scale, scaled sum and integer sum of each of its 32-element blocks.
struct XBlock {
  const int8_t* qs;
  const float* d;
  const float* s;
  const int32_t* isum;
};

// Walks packed row groups of blocks of kCols columns; dot_block(block, row, x) gives one row's
// term for one block.
template <typename Packed, int kCols, typename DotBlock>
void gemm_packed(const GemmQ8Args& a, DotBlock dot_block) {
  const int nb = a.x->k / kCols, nb32 = a.x->blocks();
  constexpr int kSub = kCols / 32;
  for (int g0 = 0; g0 < a.n_rows; g0 += kRowGroup) {
    const auto* pb = reinterpret_cast<const Packed*>(a.w + (g0 / kRowGroup) * a.group_bytes);
    for (int t = 0; t < a.n_tok; ++t) {
      const int row = a.tok0 + t;
      const int8_t* xq = a.x->qs + static_cast<size_t>(row) * a.x->k;
      const float* xd = a.x->d + static_cast<size_t>(row) * nb32;
      const float* xs = a.x->s + static_cast<size_t>(row) * nb32;
      const int32_t* xi = a.x->isum + static_cast<size_t>(row) * nb32;
      for (int r = 0; r < kRowGroup && g0 + r < a.n_rows; ++r) {
        float acc = 0;
        for (int b = 0; b < nb; ++b) acc += dot_block(pb[b], r, XBlock{xq + b * kCols, xd + b * kSub, xs + b * kSub, xi + b * kSub});
        a.y[static_cast<size_t>(t) * a.ldy + g0 + r] = acc;
      }
    }
  }
}

// Sum over a Q4 run (packed.h) of one row: byte (g*8+r)*4+i holds weights 4g+i and 16+4g+i.
int q4_dot(const uint8_t* qs, int r, const int8_t* x) {
  int sumi = 0;
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < 4; ++i) {
      const uint8_t q = qs[(g * 8 + r) * 4 + i];
      sumi += (q & 0xF) * x[4 * g + i] + (q >> 4) * x[16 + 4 * g + i];
    }
  return sumi;
}

// The same for 5-bit quants: the Q4 run plus bit 4 from the high-bit vector (packed.h).
int q5_dot(const uint8_t* qs, const uint8_t* qh, int r, const int8_t* x) {
  int sumi = 0;
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < 4; ++i) {
      const uint8_t q = qs[(g * 8 + r) * 4 + i], h = qh[r * 4 + i];
      const int lo = (q & 0xF) | ((h >> g) & 1) << 4, hi = (q >> 4) | ((h >> (4 + g)) & 1) << 4;
      sumi += lo * x[4 * g + i] + hi * x[16 + 4 * g + i];
    }
  return sumi;
}

// 6-bit quants (offset not applied): the sums over the first and the second 16 weights, which
// have scales of their own.
void q6_dots(const uint8_t* qs, const uint8_t* qh, int r, const int8_t* x, int* first, int* second) {
  *first = *second = 0;
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < 4; ++i) {
      const uint8_t q = qs[(g * 8 + r) * 4 + i], h = qh[32 * (g / 2) + r * 4 + i];
      const int sh = 2 * (g % 2);
      *first += ((q & 0xF) | ((h >> sh) & 3) << 4) * x[4 * g + i];
      *second += ((q >> 4) | ((h >> (4 + sh)) & 3) << 4) * x[16 + 4 * g + i];
    }
}

void gemm_q4_0(const GemmQ8Args& a) {
  gemm_packed<PackedQ4_0, 32>(a, [](const PackedQ4_0& p, int r, const XBlock& x) {
    return fp16_to_fp32(p.d[r]) * x.d[0] * static_cast<float>(q4_dot(p.qs, r, x.qs) - 8 * x.isum[0]);
  });
}

void gemm_q4_1(const GemmQ8Args& a) {
  gemm_packed<PackedQ4_1, 32>(a, [](const PackedQ4_1& p, int r, const XBlock& x) {
    return fp16_to_fp32(p.d[r]) * x.d[0] * static_cast<float>(q4_dot(p.qs, r, x.qs)) + fp16_to_fp32(p.m[r]) * x.s[0];
  });
}

void gemm_q5_0(const GemmQ8Args& a) {
  gemm_packed<PackedQ5_0, 32>(a, [](const PackedQ5_0& p, int r, const XBlock& x) {
    return fp16_to_fp32(p.d[r]) * x.d[0] * static_cast<float>(q5_dot(p.qs, p.qh, r, x.qs) - 16 * x.isum[0]);
  });
}

void gemm_q5_1(const GemmQ8Args& a) {
  gemm_packed<PackedQ5_1, 32>(a, [](const PackedQ5_1& p, int r, const XBlock& x) {
    return fp16_to_fp32(p.d[r]) * x.d[0] * static_cast<float>(q5_dot(p.qs, p.qh, r, x.qs)) + fp16_to_fp32(p.m[r]) * x.s[0];
  });
}

void gemm_q8_0(const GemmQ8Args& a) {
  gemm_packed<PackedQ8_0, 32>(a, [](const PackedQ8_0& p, int r, const XBlock& x) {
    int sumi = 0;
    for (int g = 0; g < 8; ++g)
      for (int i = 0; i < 4; ++i) sumi += p.qs[(g * 8 + r) * 4 + i] * x.qs[4 * g + i];
    return fp16_to_fp32(p.d[r]) * x.d[0] * static_cast<float>(sumi);
  });
}

// Q4_K / Q5_K super-block: d * sum_s xd_s * sc_s * dot_s - dmin * sum_s xd_s * m_s * isum_s. The
// integer products are exact (|sc * dot| <= 63 * 31 * 127 * 32 < 2^24, so exact in float too).
template <typename Packed, typename Dot>
float k4_block(const Packed& p, int r, const XBlock& x, Dot dot) {
  float sum = 0, mins = 0;
  for (int s = 0; s < 8; ++s) {
    sum += static_cast<float>(p.sc[s][r] * dot(s)) * x.d[s];
    mins += static_cast<float>(p.m[s][r] * x.isum[s]) * x.d[s];
  }
  return fp16_to_fp32(p.d[r]) * sum - fp16_to_fp32(p.dmin[r]) * mins;
}

void gemm_q4_k(const GemmQ8Args& a) {
  gemm_packed<PackedQ4_K, 256>(a, [](const PackedQ4_K& p, int r, const XBlock& x) {
    return k4_block(p, r, x, [&](int s) { return q4_dot(p.qs[s], r, x.qs + 32 * s); });
  });
}

void gemm_q5_k(const GemmQ8Args& a) {
  gemm_packed<PackedQ5_K, 256>(a, [](const PackedQ5_K& p, int r, const XBlock& x) {
    return k4_block(p, r, x, [&](int s) { return q5_dot(p.qs[s], p.qh[s], r, x.qs + 32 * s); });
  });
}

// Q6_K super-block: d * sum_s xd_s * (sc_2s * (dot_first - 32 sum_first(x)) + sc_2s+1 * (...)).
void gemm_q6_k(const GemmQ8Args& a) {
  gemm_packed<PackedQ6_K, 256>(a, [](const PackedQ6_K& p, int r, const XBlock& x) {
    float sum = 0;
    for (int s = 0; s < 8; ++s) {
      const int8_t* xs = x.qs + 32 * s;
      int first, second, x_first = 0;
      q6_dots(p.qs[s], p.qh[s], r, xs, &first, &second);
      for (int j = 0; j < 16; ++j) x_first += xs[j];
      const int x_second = x.isum[s] - x_first;
      const int t = p.sc[2 * s][r] * (first - 32 * x_first) + p.sc[2 * s + 1][r] * (second - 32 * x_second);
      sum += static_cast<float>(t) * x.d[s];
    }
    return fp16_to_fp32(p.d[r]) * sum;
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

void kv_to_f32(const uint16_t* src, size_t stride, int n, int width, float* dst) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < width; ++i) dst[static_cast<size_t>(j) * width + i] = fp16_to_fp32(src[j * stride + i]);
}

void kv_gather_f32(const uint16_t* base, size_t stride, const int32_t* idx, int n, int width, float* dst) {
  for (int j = 0; j < n; ++j)
    kv_to_f32(base + static_cast<size_t>(idx[j]) * stride, stride, 1, width, dst + static_cast<size_t>(j) * width);
}

void attn_scores(const float* q, int nq, const float* k, size_t ldk, int nk, int d, float scale, float* s, size_t lds) {
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) {
      float acc = 0;
      for (int t = 0; t < d; ++t) acc += q[i * d + t] * k[j * ldk + t];
      s[i * lds + j] = acc * scale;
    }
}

void attn_scores_f16(const float* q, int nq, const uint16_t* k, size_t ldk, int nk, int d, float scale, float* s, size_t lds,
                     const uint16_t*) {
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) {
      float acc = 0;
      for (int t = 0; t < d; ++t) acc += q[i * d + t] * fp16_to_fp32(k[j * ldk + t]);
      s[i * lds + j] = acc * scale;
    }
}

void attn_values(const float* p, size_t ldp, int nq, const float* v, size_t ldv, int nk, int d, float* out) {
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) {
      const float pj = p[i * ldp + j];
      for (int t = 0; t < d; ++t) out[i * d + t] += pj * v[j * ldv + t];
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

// Row by row: scores of the row's keys, the new max, the old state rescaled by exp(m - max), then
// the keys' weights added to the sum and their weighted values to the output.
void flash_block(const float* q, int nq, const uint16_t* k, const uint16_t* v, size_t ld, int nk, int d, float scale, const int* lo,
                 const int* hi, float* m, float* l, float* acc, float* work, const uint16_t*, const uint16_t*, float* raw, size_t ldraw) {
  for (int i = 0; i < nq; ++i) {
    if (lo[i] >= hi[i]) continue;
    float mx = m[i];
    for (int j = lo[i]; j < hi[i]; ++j) {
      float a = 0;
      for (int t = 0; t < d; ++t) a += q[i * d + t] * fp16_to_fp32(k[j * ld + t]);
      work[j] = a * scale;
      if (raw) raw[i * ldraw + j] = work[j];
      mx = std::fmax(mx, work[j]);
    }
    const float alpha = std::exp(m[i] - mx);  // 0 for the first keys (m = -inf)
    float* o = acc + static_cast<size_t>(i) * d;
    for (int t = 0; t < d; ++t) o[t] *= alpha;
    float sum = 0;
    for (int j = lo[i]; j < hi[i]; ++j) {
      const float p = std::exp(work[j] - mx);
      sum += p;
      for (int t = 0; t < d; ++t) o[t] += p * fp16_to_fp32(v[j * ld + t]);
    }
    l[i] = l[i] * alpha + sum;
    m[i] = mx;
  }
}

void f32_to_f16(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void swiglu(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void geglu(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-2.0f * gelu_tanh_arg(g[i]))) * u[i];
}

const KernelTable kScalar = {
    "scalar",        quantize_q8, gemm_q4_0, gemm_q4_1,   gemm_q8_0,  gemm_q5_0, gemm_q5_1,     gemm_q4_k,
    gemm_q5_k,       gemm_q6_k,   gemm_f32,  gemm_f16,    gemm_bf16,  kv_to_f32, kv_gather_f32, attn_scores,
    attn_scores_f16, attn_values, exp_sum,   flash_block, f32_to_f16, swiglu,    geglu,
};

}  // namespace

const KernelTable& scalar_kernels() { return kScalar; }

}  // namespace ctx
