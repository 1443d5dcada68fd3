// Each CUDA kernel against its CPU reference (CUDA builds only; skipped, with the reason, on a
// machine without a usable GPU). The references are the CPU engine's own code where it exists
// (scalar kernel table, dequantize_row, engine.cc's RMSNorm/RoPE/SwiGLU formulas), else a
// double-precision computation here. Shapes cross every tile boundary of the kernels: matvec
// rows in groups of 4 and tokens in groups of 8, GEMM tiles of 64 x 64 x 32, attention tiles of
// 16 queries x 64 keys, and decode splits of 256+ keys (up to 128 of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels.cuh"
#include "cuda/testing.h"
#include "dequant.h"
#include "device.h"
#include "fp16.h"
#include "gguf_writer.h"
#include "kernels.h"
#include "packed.h"

namespace {

using namespace ctx;
namespace gpu = ctx::cuda::testing;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

std::vector<float> randoms(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  return ctxtest::random_floats(n, rng, lo, hi);
}

// A [rows][cols] weight of `type` (ggml numbering) holding random values, in the file layout.
struct HostWeight {
  std::string bytes;
  Weight w;
  HostWeight(uint32_t type, int rows, int cols, uint32_t seed) {
    const std::vector<float> f = randoms(static_cast<size_t>(rows) * cols, seed, -0.5f, 0.5f);
    for (int r = 0; r < rows; ++r) {
      const float* row = f.data() + static_cast<size_t>(r) * cols;
      if (type == ctxtest::kTF32)
        bytes += std::string(reinterpret_cast<const char*>(row), cols * sizeof(float));
      else
        bytes += ctxtest::quantize_row(type, row, cols);
    }
    w.type = static_cast<GgmlType>(type);
    w.data = reinterpret_cast<const uint8_t*>(bytes.data());
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = bytes.size() / rows;
  }
  std::vector<float> dequantized() const {
    std::vector<float> out(static_cast<size_t>(w.rows) * w.cols);
    for (int r = 0; r < w.rows; ++r) dequantize_row(w, r, out.data() + static_cast<size_t>(r) * w.cols);
    return out;
  }
};

bool quantized(uint32_t t) { return t == ctxtest::kTQ4_0 || t == ctxtest::kTQ4_1 || t == ctxtest::kTQ8_0; }

// The CPU engine's product for n tokens: scalar kernels, activations quantized for quantized weights.
std::vector<float> cpu_matmul(const HostWeight& hw, const std::vector<float>& x, int n) {
  const Weight& w = hw.w;
  const KernelTable& k = scalar_kernels();
  std::vector<float> y(static_cast<size_t>(n) * w.rows);
  if (quantized(static_cast<uint32_t>(w.type))) {
    std::vector<uint8_t> packed(packed_group_bytes(w.type, w.cols) * ((w.rows + kRowGroup - 1) / kRowGroup));
    pack_matrix(w.type, w.data, w.rows, w.cols, packed.data());
    const int nb = w.cols / 32;
    std::vector<int8_t> qs(static_cast<size_t>(n) * w.cols);
    std::vector<float> d(static_cast<size_t>(n) * nb), s(d.size());
    std::vector<int32_t> isum(d.size());
    for (int t = 0; t < n; ++t)
      k.quantize_q8(x.data() + static_cast<size_t>(t) * w.cols, w.cols, qs.data() + static_cast<size_t>(t) * w.cols, d.data() + t * nb,
                    s.data() + t * nb, isum.data() + t * nb);
    const ActQ8 act{qs.data(), d.data(), s.data(), isum.data(), w.cols};
    const GemmQ8Args a{packed.data(), packed_group_bytes(w.type, w.cols), w.rows, &act, 0, n, y.data(), w.rows};
    gemm_q8_for(k, w.type)(a);
  } else {
    const GemmF32Args a{w.data, w.row_bytes, w.rows, x.data(), w.cols, n, y.data(), w.rows};
    (w.type == GgmlType::F32 ? k.gemm_f32 : k.gemm_f16)(a);
  }
  return y;
}

// |a - b| <= rel * scale[i] + abs everywhere; reports the worst element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::fabs(static_cast<double>(got[i]) - want[i]) - (rel * scale[i] + abs);
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " got " << got[worst] << " want " << want[worst];
}

const uint32_t kTypes[] = {ctxtest::kTF32, ctxtest::kTF16, ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0};

TEST(CudaKernels, QuantizeQ8MatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const int n = 5, k = 576;
  std::vector<float> x = randoms(static_cast<size_t>(n) * k, 1, -3.f, 3.f);
  for (int j = 0; j < 32; ++j) x[j] = 0.f;  // an all-zero block
  const gpu::Q8 g = gpu::quantize_q8(x, n, k);
  const int nb = k / 32;
  std::vector<int8_t> qs(static_cast<size_t>(n) * k);
  std::vector<float> d(static_cast<size_t>(n) * nb), s(d.size());
  std::vector<int32_t> isum(d.size());
  for (int t = 0; t < n; ++t)
    scalar_kernels().quantize_q8(x.data() + static_cast<size_t>(t) * k, k, qs.data() + static_cast<size_t>(t) * k, d.data() + t * nb,
                                 s.data() + t * nb, isum.data() + t * nb);
  EXPECT_EQ(g.qs, qs);
  EXPECT_EQ(g.d, d);
  EXPECT_EQ(g.s, s);
  EXPECT_EQ(g.isum, isum);
}

TEST(CudaKernels, MatvecMatchesTheCpuKernels) {
  SKIP_WITHOUT_GPU();
  for (uint32_t type : kTypes)
    for (int n : {1, 3, 8}) {
      const HostWeight hw(type, 77, 96, 10 + type);
      const std::vector<float> x = randoms(static_cast<size_t>(n) * 96, 20 + n, -2.f, 2.f);
      const std::vector<float> want = cpu_matmul(hw, x, n);
      const std::vector<float> deq = hw.dequantized();
      std::vector<double> scale(want.size());
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < 77; ++r) {
          double s = 0;
          for (int c = 0; c < 96; ++c) s += std::fabs(deq[static_cast<size_t>(r) * 96 + c] * x[static_cast<size_t>(t) * 96 + c]);
          scale[static_cast<size_t>(t) * 77 + r] = s;
        }
      // Same integer dot products per block; only the order of the float sums differs.
      expect_close(gpu::matvec(hw.w, x, n), want, scale, 1e-5, 1e-6, "type " + std::to_string(type) + " n " + std::to_string(n));
    }
}

TEST(CudaKernels, GemmMatchesADoublePrecisionProduct) {
  SKIP_WITHOUT_GPU();
  for (uint32_t type : kTypes)
    for (int n : {9, 64, 100}) {
      const int rows = 130, cols = 160;  // tiles: 3 x 64 rows, 2 x 64 tokens, 5 x 32 columns
      const HostWeight hw(type, rows, cols, 30 + type);
      const std::vector<float> x = randoms(static_cast<size_t>(n) * cols, 40 + n, -2.f, 2.f);
      const std::vector<float> deq = hw.dequantized();
      std::vector<float> want(static_cast<size_t>(n) * rows);
      std::vector<double> scale(want.size());
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
          double s = 0, a = 0;
          for (int c = 0; c < cols; ++c) {
            const double p = static_cast<double>(deq[static_cast<size_t>(r) * cols + c]) * x[static_cast<size_t>(t) * cols + c];
            s += p;
            a += std::fabs(p);
          }
          want[static_cast<size_t>(t) * rows + r] = static_cast<float>(s);
          scale[static_cast<size_t>(t) * rows + r] = a;
        }
      // Both operands rounded to f16 (relative error up to 2^-11 each, so under 1e-3 per product
      // in the worst case): 2e-3 of the absolute sum. A wrong tile or index is off by O(1).
      expect_close(gpu::gemm(hw.w, x, n), want, scale, 2e-3, 1e-5, "type " + std::to_string(type) + " n " + std::to_string(n));
    }
}

TEST(CudaKernels, EmbedIsDequantizeRow) {
  SKIP_WITHOUT_GPU();
  for (uint32_t type : kTypes) {
    const HostWeight hw(type, 50, 64, 50 + type);
    const std::vector<int32_t> tokens = {0, 49, 7, 7, 23};
    const std::vector<float> got = gpu::embed(hw.w, tokens);
    std::vector<float> want(tokens.size() * 64);
    for (size_t i = 0; i < tokens.size(); ++i) dequantize_row(hw.w, tokens[i], want.data() + i * 64);
    EXPECT_EQ(got, want) << "type " << type;
  }
}

// Q5_0, Q5_1 and the K-quants have no 8-bit-activation kernels on the GPU: its float paths read
// them through load_weight. Embedding rows are dequantize_row's bit for bit; the matvec (f32
// activations and sums) and the f16 tensor-core GEMM match a double-precision product with the
// dequantized weights (the same bounds as the float types above).
TEST(CudaKernels, FloatPathsReadQ5AndKQuantWeights) {
  SKIP_WITHOUT_GPU();
  for (uint32_t type : {ctxtest::kTQ5_0, ctxtest::kTQ5_1, ctxtest::kTQ4_K, ctxtest::kTQ5_K, ctxtest::kTQ6_K}) {
    const int rows = 130, cols = 512;  // 3 x 64-row GEMM tiles; 2 super-blocks
    const HostWeight hw(type, rows, cols, 60 + type);
    const std::vector<float> deq = hw.dequantized();
    const std::vector<int32_t> tokens = {0, 129, 7, 7, 64};
    std::vector<float> rows_want(tokens.size() * cols);
    for (size_t i = 0; i < tokens.size(); ++i)
      std::copy(deq.begin() + static_cast<size_t>(tokens[i]) * cols, deq.begin() + static_cast<size_t>(tokens[i] + 1) * cols,
                rows_want.begin() + i * cols);
    EXPECT_EQ(gpu::embed(hw.w, tokens), rows_want) << "type " << type;
    for (int n : {1, 3, 8, 9, 64, 100}) {
      const std::vector<float> x = randoms(static_cast<size_t>(n) * cols, 70 + n, -2.f, 2.f);
      std::vector<float> want(static_cast<size_t>(n) * rows);
      std::vector<double> scale(want.size());
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
          double s = 0, a = 0;
          for (int c = 0; c < cols; ++c) {
            const double p = static_cast<double>(deq[static_cast<size_t>(r) * cols + c]) * x[static_cast<size_t>(t) * cols + c];
            s += p;
            a += std::fabs(p);
          }
          want[static_cast<size_t>(t) * rows + r] = static_cast<float>(s);
          scale[static_cast<size_t>(t) * rows + r] = a;
        }
      const std::string what = "type " + std::to_string(type) + " n " + std::to_string(n);
      if (n <= 8)
        expect_close(gpu::matvec(hw.w, x, n), want, scale, 1e-5, 1e-6, what + " matvec");
      else
        expect_close(gpu::gemm(hw.w, x, n), want, scale, 2e-3, 1e-5, what + " gemm");
    }
  }
}

TEST(CudaKernels, RmsNormMatchesTheEngine) {
  SKIP_WITHOUT_GPU();
  const int n = 3, e = 576;
  const float eps = 1e-5f;
  const std::vector<float> x = randoms(static_cast<size_t>(n) * e, 2, -4.f, 4.f), w = randoms(e, 3, 0.5f, 1.5f);
  std::vector<float> want(x.size());
  for (int t = 0; t < n; ++t) {  // engine.cc Engine::rms_norm
    const float* xr = &x[static_cast<size_t>(t) * e];
    double sum = 0;
    for (int i = 0; i < e; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / e) + eps);
    for (int i = 0; i < e; ++i) want[static_cast<size_t>(t) * e + i] = xr[i] * scale * w[i];
  }
  const std::vector<float> got = gpu::rms_norm(x, w, n, e, eps);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FLOAT_EQ(got[i], want[i]) << i;
}

TEST(CudaKernels, RopeRotatesAdjacentPairsLikeTheEngine) {
  SKIP_WITHOUT_GPU();
  const int n = 4, heads = 3, d = 64, half = d / 2, max_pos = 5000;
  std::vector<float> cs(static_cast<size_t>(max_pos) * half), sn(cs.size());
  const float theta_scale = std::pow(10000.f, -2.0f / d);
  for (int p = 0; p < max_pos; ++p) {
    float theta = static_cast<float>(p);
    for (int i = 0; i < half; ++i, theta *= theta_scale) cs[p * half + i] = std::cos(theta), sn[p * half + i] = std::sin(theta);
  }
  const std::vector<int> pos = {0, 1, 777, 4999};
  const std::vector<float> x = randoms(static_cast<size_t>(n) * heads * d, 4);
  std::vector<float> want = x;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        float* v = &want[(static_cast<size_t>(t) * heads + h) * d];
        const float c = cs[pos[t] * half + i], s = sn[pos[t] * half + i], x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
      }
  const std::vector<float> got = gpu::rope(x, n, heads, d, pos, cs, sn);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FLOAT_EQ(got[i], want[i]) << i;
}

// Causal GQA attention in double precision: query i (position pos0 + i) over keys 0..pos0 + i.
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, int n,
                                       int pos0, int n_head, int n_head_kv, int d) {
  const int kv_dim = n_head_kv * d, group = n_head / n_head_kv;
  std::vector<float> out(static_cast<size_t>(n) * n_head * d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < n_head; ++h) {
      const int kvh = h / group, keys = pos0 + i + 1;
      std::vector<double> s(keys);
      double m = -1e300;
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c)
          dot += static_cast<double>(q[(static_cast<size_t>(i) * n_head + h) * d + c]) *
                 fp16_to_fp32(k[static_cast<size_t>(j) * kv_dim + kvh * d + c]);
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (double& x : s) l += (x = std::exp(x - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (int j = 0; j < keys; ++j) o += s[j] * fp16_to_fp32(v[static_cast<size_t>(j) * kv_dim + kvh * d + c]);
        out[(static_cast<size_t>(i) * n_head + h) * d + c] = static_cast<float>(o / l);
      }
    }
  return out;
}

TEST(CudaKernels, AttentionMatchesADoublePrecisionReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int n, pos0, n_head, n_head_kv, d;
    const char* what;
  };
  const Case cases[] = {
      {1, 0, 6, 2, 64, "first token"},
      {100, 0, 6, 2, 64, "prefill: 7 query tiles, 2 key tiles"},
      {37, 200, 6, 2, 64, "a prefill chunk after 200 tokens"},
      {1, 63, 4, 4, 32, "decode at a key-tile boundary, no GQA, d 32"},
      {1, 1000, 6, 2, 64, "decode split 3 ways"},
      {4, 5000, 8, 1, 128, "4-token step split 19 ways, d 128, MQA"},
      {5, 3000, 6, 2, 64, "5 tokens: one unsplit tile over 3005 keys"},
      {1, 20000, 6, 3, 64, "decode split 78 ways"},
      {2, 40000, 6, 3, 64, "2-token step split the most ways (128)"},
  };
  for (const Case& c : cases) {
    const int cap = c.pos0 + c.n + 3, kv_dim = c.n_head_kv * c.d;
    const std::vector<float> q = randoms(static_cast<size_t>(c.n) * c.n_head * c.d, 5 + c.n, -2.f, 2.f);
    const std::vector<float> kf = randoms(static_cast<size_t>(cap) * kv_dim, 6 + c.n, -2.f, 2.f);
    const std::vector<float> vf = randoms(kf.size(), 7 + c.n);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) k[i] = fp32_to_fp16(kf[i]), v[i] = fp32_to_fp16(vf[i]);
    const std::vector<float> want = reference_attention(q, k, v, c.n, c.pos0, c.n_head, c.n_head_kv, c.d);
    const std::vector<float> got = gpu::attention(q, k, v, cap, c.n, c.pos0, c.n_head, c.n_head_kv, c.d);
    expect_close(got, want, std::vector<double>(want.size(), 1.0), 0, 2e-5, c.what);
  }
}

TEST(CudaKernels, SwigluMatchesTheEngine) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> g = randoms(1000, 8, -8.f, 8.f), u = randoms(1000, 9, -2.f, 2.f);
  const std::vector<float> got = gpu::swiglu(g, u);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(got[i], g[i] / (1.0f + std::exp(-g[i])) * u[i], 1e-6f * (1 + std::fabs(got[i]))) << i;
}

TEST(CudaKernels, ArgmaxTakesTheFirstLargest) {
  SKIP_WITHOUT_GPU();
  const int rows = 3, vocab = 49152;
  std::vector<float> l = randoms(static_cast<size_t>(rows) * vocab, 10);
  l[5] = 7.f, l[40000] = 7.f;                                                    // row 0: a tie, the first wins
  l[vocab + vocab - 1] = 9.f;                                                    // row 1: the last element
  for (int i = 0; i < vocab; ++i) l[2 * static_cast<size_t>(vocab) + i] = -1.f;  // row 2: all equal
  EXPECT_EQ(gpu::argmax(l, rows, vocab), (std::vector<int32_t>{5, vocab - 1, 0}));
}

// The greedy token as the one-pass kernel before the chunked argmax took it: the first element
// greater than everything before it and -inf, NaN passed over, 0 when nothing is.
int32_t first_largest(const float* row, int n) {
  float best = -INFINITY;
  int32_t at = 0;
  for (int i = 0; i < n; ++i)
    if (row[i] > best) {
      best = row[i];
      at = i;
    }
  return at;
}

// Rows searched in chunks (kernels.cuh kArgmaxChunk) by separate blocks, then merged: the maximum
// in the last chunk or the first element, ties in different chunks (the lowest index wins), a
// row of -inf, NaNs, rows of few distinct values (ties everywhere), a partial last chunk, and many
// rows at once, each against the one-pass reference (and std::max_element where no NaN is).
TEST(CudaKernels, ArgmaxInChunksMatchesOnePass) {
  SKIP_WITHOUT_GPU();
  constexpr int kChunk = ctx::cuda::kArgmaxChunk;
  for (const int vocab : {262144, 50001, 300}) {
    const int rows = 12;
    std::vector<float> l = randoms(static_cast<size_t>(rows) * vocab, 11 + vocab, -4.f, 4.f);
    auto row = [&](int r) { return l.data() + static_cast<size_t>(r) * vocab; };
    row(0)[vocab - 3] = 9.f;  // in the last chunk
    row(1)[0] = 9.f;          // the first element
    // Equal maxima in several chunks, the first at a chunk's last element (or, in a one-chunk row,
    // among the others).
    for (int i : {kChunk - 1, kChunk, 33 * kChunk, 40 * kChunk + 7, vocab / 2, vocab - 1})
      if (i < vocab) row(2)[i] = 9.f;
    std::fill(row(3), row(3) + vocab, -INFINITY);
    std::fill(row(4), row(4) + vocab, NAN);
    for (int i = 0; i < vocab; ++i) row(5)[i] = i % 3 ? -INFINITY : NAN;
    for (int i = 0; i < vocab; i += kChunk / 2) row(6)[i] = NAN;  // NaN first in every chunk and between
    row(6)[vocab - 2] = 9.f;
    std::fill(row(7), row(7) + vocab, -INFINITY);
    row(7)[vocab - 1] = -1e30f;  // the only value above -inf, last
    for (int r : {8, 9})         // few distinct values: ties inside every warp, block and chunk
      for (int i = 0; i < vocab; ++i) row(r)[i] = std::floor(row(r)[i]);
    row(9)[vocab - 1] = 4.f;  // above every floor of [-4, 4)
    // Rows 10 and 11: random.
    const std::vector<int32_t> got = gpu::argmax(l, rows, vocab);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const float* x = row(r);
      EXPECT_EQ(got[r], first_largest(x, vocab)) << "vocab " << vocab << ", row " << r;
      if (std::none_of(x, x + vocab, [](float v) { return std::isnan(v); }))
        EXPECT_EQ(got[r], std::max_element(x, x + vocab) - x) << "vocab " << vocab << ", row " << r;
    }
    EXPECT_EQ(got[0], vocab - 3);
    EXPECT_EQ(got[1], 0);
    EXPECT_EQ(got[2], vocab > kChunk ? kChunk - 1 : vocab / 2);
    EXPECT_EQ(got[3], 0);
    EXPECT_EQ(got[4], 0);
    EXPECT_EQ(got[5], 0);
    EXPECT_EQ(got[6], vocab - 2);
    EXPECT_EQ(got[7], vocab - 1);
    EXPECT_EQ(got[9], vocab - 1);
  }
  // One row, as a batch-1 greedy step, at the largest vocabulary.
  std::vector<float> one(262144, 0.f);
  one[262143] = 1.f;
  EXPECT_EQ(gpu::argmax(one, 1, 262144), (std::vector<int32_t>{262143}));
}

}  // namespace
