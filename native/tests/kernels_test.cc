// Every SIMD kernel table against the scalar reference on random inputs (fixed seeds), and
// every table against independent double-precision references, so a bug the scalar and SIMD
// code share is caught too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dequant.h"
#include "fp16.h"
#include "ggml_types.h"
#include "kernels.h"
#include "model.h"
#include "packed.h"
#include "quant_test_util.h"

namespace {

using namespace ctx;

// Independent IEEE half -> float decoding (not fp16.h's bit tricks).
double half_ref(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(m, -24);
  else if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(m + 1024, e - 25);
  return (h & 0x8000) ? -v : v;
}

std::vector<float> rand_floats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

::testing::AssertionResult Within(double a, double b, double tol) {
  if (std::fabs(a - b) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " vs " << b << " differ by " << std::fabs(a - b) << " > " << tol;
}
// |a - b| <= rel * mag, with a tiny floor for magnitudes that are exactly zero.
::testing::AssertionResult Close(double a, double b, double mag, double rel) { return Within(a, b, rel * mag + 1e-30); }

// ---------------------------------------------------------------------------------------------
// Quantized weights and activations.

// A quantized matrix in ggml's row layout (for dequantize_row) and packed for the kernels.
struct QWeights {
  std::vector<uint8_t> bytes, packed;
  Weight w;
  size_t group_bytes = 0;
};

// Byte offsets of a block's f16 fields (d, and m or dmin).
std::vector<size_t> half_fields(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q6_K:
      return {208};
    default:
      return {0};
  }
}

// Random blocks: every quant and sub-block scale bit pattern; the f16 fields overwritten with
// sane halves (d positive, m and dmin of either sign). Q8_0 includes -128, which ggml never
// writes but the format allows.
QWeights make_qweights(GgmlType type, int rows, int k, std::mt19937& rng) {
  const GgmlTypeTraits& tr = *ggml_type_traits(static_cast<uint32_t>(type));
  const size_t bsize = tr.type_size;
  QWeights q;
  q.bytes.resize(static_cast<size_t>(rows) * (k / tr.block_size) * bsize);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : q.bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), mn(-0.3f, 0.3f);
  const std::vector<size_t> fields = half_fields(type);
  for (size_t off = 0; off < q.bytes.size(); off += bsize)
    for (size_t i = 0; i < fields.size(); ++i) {
      // The second field is Q4_1/Q5_1's offset m, or the K-quants' dmin (a scale of 6-bit mins).
      const float v = i == 0 ? scale(rng) : type == GgmlType::Q4_K || type == GgmlType::Q5_K ? mn(rng) / 16 : mn(rng);
      const uint16_t h = fp32_to_fp16(v);
      std::memcpy(&q.bytes[off + fields[i]], &h, 2);
    }
  q.w = {type, q.bytes.data(), k, rows, k / tr.block_size * bsize};
  q.group_bytes = packed_group_bytes(type, k);
  q.packed.resize(q.group_bytes * ((rows + kRowGroup - 1) / kRowGroup));
  pack_matrix(type, q.bytes.data(), rows, k, q.packed.data());
  q.w.packed = q.packed.data();
  q.w.group_bytes = q.group_bytes;
  return q;
}

using quanttest::Act;
using quanttest::quantize_all;

// Activation rows for quantization tests: random values, an all-zero block, a block whose
// values sit exactly halfway between integers after scaling (round-half-even ties), and one
// with a single non-zero value.
std::vector<float> activation_rows(std::mt19937& rng, int rows, int k) {
  std::vector<float> x = rand_floats(rng, static_cast<size_t>(rows) * k, -3.f, 3.f);
  if (k >= 128) {
    std::fill(x.begin(), x.begin() + 32, 0.f);
    for (int j = 0; j < 32; ++j) x[32 + j] = j == 0 ? 127.f : static_cast<float>(j % 9) - 4.5f;
    std::fill(x.begin() + 64, x.begin() + 96, 0.f);
    x[70] = -1e-3f;
  }
  return x;
}

// Float rounding in a quantized GEMM is relative to this bound on the magnitudes it sums
// (quant_test_util.h), not to the (possibly cancelling) result.
double gemm_magnitude(const Weight& w, int row, const ActQ8& x, int tok) {
  std::vector<float> wr(w.cols);
  dequantize_row(w, row, wr.data());
  return quanttest::gemm_magnitude(w, row, wr, x, tok);
}

const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
// Packed groups hold 8 rows: counts below, at and above one group, partial last groups.
const int kRowCounts[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 17};
const int kTokCounts[] = {1, 2, 3, 4, 5, 7, 8, 33};
// Row lengths: one block, and several (K-quants: whole super-blocks of 256).
std::vector<int> ks_for(GgmlType t) {
  if (packed_block_cols(t) == kSuperBlock) return {256, 1536};
  return {32, 576, 1536};
}

// ---------------------------------------------------------------------------------------------
// SIMD tables vs scalar.

class SimdVsScalar : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "avx2") {
      if (!cpu_has_avx2() || !avx2_kernels()) GTEST_SKIP() << "CPU or build lacks AVX2";
      kt_ = avx2_kernels();
    } else {
      if (!cpu_has_avx512() || !avx512_kernels()) GTEST_SKIP() << "CPU or build lacks AVX-512 VNNI";
      kt_ = avx512_kernels();
    }
  }
  const KernelTable& simd() const { return *kt_; }
  const KernelTable& ref() const { return scalar_kernels(); }
  const KernelTable* kt_ = nullptr;
};

TEST_P(SimdVsScalar, QuantizeQ8IsBitIdentical) {
  std::mt19937 rng(11);
  for (int k : {32, 64, 576, 1536}) {
    SCOPED_TRACE(k);
    const std::vector<float> x = activation_rows(rng, 3, k);
    const Act a = quantize_all(ref(), x, 3, k), b = quantize_all(simd(), x, 3, k);
    EXPECT_EQ(a.qs, b.qs);
    EXPECT_EQ(a.isum, b.isum);
    for (size_t i = 0; i < a.d.size(); ++i) {
      EXPECT_EQ(fp32_to_bits(a.d[i]), fp32_to_bits(b.d[i])) << "block " << i;
      EXPECT_EQ(fp32_to_bits(a.s[i]), fp32_to_bits(b.s[i])) << "block " << i;
    }
  }
}

TEST_P(SimdVsScalar, QuantizedGemms) {
  std::mt19937 rng(12);
  for (GgmlType type : kQuantTypes)
    for (int k : ks_for(type))
      for (int rows : kRowCounts)
        for (int n_tok : kTokCounts) {
          SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)) + " k=" + std::to_string(k) + " rows=" + std::to_string(rows) +
                       " tok=" + std::to_string(n_tok));
          const QWeights qw = make_qweights(type, rows, k, rng);
          // One extra activation row in front: tok0 = 1 checks the row offset.
          const int tok0 = 1, ldy = rows + 3;
          const Act act = quantize_all(ref(), activation_rows(rng, n_tok + tok0, k), n_tok + tok0, k);
          const float kSentinel = -12345.f;
          std::vector<float> ya(static_cast<size_t>(n_tok) * ldy, kSentinel), yb = ya;
          // The scalar table does all rows in one call; the SIMD one as an engine task split
          // would (first group, then the rest from the second group on) when there are two.
          GemmQ8Args a{qw.packed.data(), qw.group_bytes, rows, &act.a, tok0, n_tok, ya.data(), ldy};
          gemm_q8_for(ref(), type)(a);
          GemmQ8Args b = a;
          b.y = yb.data();
          if (rows > kRowGroup) {
            b.n_rows = kRowGroup;
            gemm_q8_for(simd(), type)(b);
            b.w += qw.group_bytes;
            b.n_rows = rows - kRowGroup;
            b.y += kRowGroup;
          }
          gemm_q8_for(simd(), type)(b);
          for (int t = 0; t < n_tok; ++t)
            for (int r = 0; r < ldy; ++r) {
              const size_t i = static_cast<size_t>(t) * ldy + r;
              if (r >= rows) {  // padding columns must not be written
                EXPECT_EQ(ya[i], kSentinel);
                EXPECT_EQ(yb[i], kSentinel);
                continue;
              }
              EXPECT_TRUE(Close(yb[i], ya[i], gemm_magnitude(qw.w, r, act.a, tok0 + t), 1e-5)) << "t=" << t << " r=" << r;
            }
        }
}

TEST_P(SimdVsScalar, FloatGemms) {
  std::mt19937 rng(13);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int k : {5, 32, 37, 576, 1536})
      for (int rows : {1, 3, 4, 7})
        for (int n_tok : {1, 2, 3, 4, 5, 8, 33}) {
          SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)) + " k=" + std::to_string(k) + " rows=" + std::to_string(rows) +
                       " tok=" + std::to_string(n_tok));
          const std::vector<float> wf = rand_floats(rng, static_cast<size_t>(rows) * k, -1.f, 1.f);
          std::vector<uint8_t> wb;
          size_t es = 4;
          if (type == GgmlType::F32) {
            wb.resize(wf.size() * 4);
            std::memcpy(wb.data(), wf.data(), wb.size());
          } else {
            es = 2;
            wb.resize(wf.size() * 2);
            for (size_t i = 0; i < wf.size(); ++i) {
              const uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(wf[i]) : static_cast<uint16_t>(fp32_to_bits(wf[i]) >> 16);
              std::memcpy(&wb[i * 2], &h, 2);
            }
          }
          const std::vector<float> x = rand_floats(rng, static_cast<size_t>(n_tok) * k, -2.f, 2.f);
          const int ldy = rows + 2;
          std::vector<float> ya(static_cast<size_t>(n_tok) * ldy, 0.f), yb = ya;
          GemmF32Args a{wb.data(), k * es, rows, x.data(), k, n_tok, ya.data(), ldy}, b = a;
          b.y = yb.data();
          auto fn = [&](const KernelTable& kt) {
            return type == GgmlType::F32 ? kt.gemm_f32 : type == GgmlType::F16 ? kt.gemm_f16 : kt.gemm_bf16;
          };
          fn(ref())(a);
          fn(simd())(b);
          for (int t = 0; t < n_tok; ++t)
            for (int r = 0; r < rows; ++r) {
              double mag = 0;
              for (int j = 0; j < k; ++j) mag += std::fabs(wf[static_cast<size_t>(r) * k + j] * x[static_cast<size_t>(t) * k + j]);
              const size_t i = static_cast<size_t>(t) * ldy + r;
              EXPECT_TRUE(Close(yb[i], ya[i], mag, 1e-5)) << "t=" << t << " r=" << r;
            }
        }
}

std::vector<uint16_t> rand_halves(std::mt19937& rng, size_t n) {
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = fp32_to_fp16(std::uniform_real_distribution<float>(-2.f, 2.f)(rng));
  return v;
}

// flash_block chained the way the engine chains it: query rows [nq][d], row i attending keys
// [begin[i], end[i]) of an f16 cache (rows `ld` apart), in blocks of `block` keys from key 0, each
// as long as the rows need (up to the largest end), or ending at each row's end when `tight`
// (with nq = 1: a decode step).
struct FlashState {
  std::vector<float> m, l, acc;
  double out(int i, int t, int d) const { return static_cast<double>(acc[static_cast<size_t>(i) * d + t]) / l[i]; }
};
FlashState flash_run(const KernelTable& kt, const std::vector<float>& q, int nq, const std::vector<uint16_t>& k,
                     const std::vector<uint16_t>& v, size_t ld, int d, float scale, const std::vector<int>& begin,
                     const std::vector<int>& end, int block) {
  FlashState st{std::vector<float>(nq, -INFINITY), std::vector<float>(nq, 0.f), std::vector<float>(static_cast<size_t>(nq) * d, 0.f)};
  const int n_keys = *std::max_element(end.begin(), end.end());
  std::vector<float> work(flash_work_floats(nq, block, d));
  std::vector<int> lo(nq), hi(nq);
  for (int k0 = 0; k0 < n_keys; k0 += block) {
    const int nk = std::min(block, n_keys - k0);
    for (int i = 0; i < nq; ++i) {
      lo[i] = std::clamp(begin[i] - k0, 0, nk);
      hi[i] = std::clamp(end[i] - k0, 0, nk);
    }
    const bool more = k0 + block < n_keys;  // the next block, for the kernels that fetch ahead
    kt.flash_block(q.data(), nq, k.data() + k0 * ld, v.data() + k0 * ld, ld, nk, d, scale, lo.data(), hi.data(), st.m.data(), st.l.data(),
                   st.acc.data(), work.data(), more ? k.data() + (k0 + block) * ld : nullptr, more ? v.data() + (k0 + block) * ld : nullptr,
                   nullptr, 0);
  }
  return st;
}

// Random key ranges [begin, end) within n_keys, never empty.
void random_ranges(std::mt19937& rng, int nq, int n_keys, std::vector<int>& begin, std::vector<int>& end) {
  begin.resize(nq);
  end.resize(nq);
  for (int i = 0; i < nq; ++i) {
    end[i] = std::uniform_int_distribution<int>(1, n_keys)(rng);
    begin[i] = std::uniform_int_distribution<int>(0, end[i] - 1)(rng);
  }
}

// The bound on |score| (its magnitude sum) over a row's keys, for tolerances.
double score_magnitude(const std::vector<float>& q, int i, const std::vector<uint16_t>& k, size_t ld, int d, float scale, int begin,
                       int end) {
  double mag = 0;
  for (int j = begin; j < end; ++j) {
    double m = 0;
    for (int t = 0; t < d; ++t) m += std::fabs(q[static_cast<size_t>(i) * d + t] * half_ref(k[j * ld + t]));
    mag = std::max(mag, m * scale);
  }
  return mag;
}

// Widening f16 cache rows is exact, so every table must match the independent decoder bit
// for bit. The source rows are one head of a wider cache row (stride > d), as in the engine.
TEST_P(SimdVsScalar, KvToF32IsExact) {
  std::mt19937 rng(17);
  for (int d : {16, 64, 80})
    for (int n : {1, 3, 8, 17}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const size_t stride = 3 * d + 8;
      const std::vector<uint16_t> kv = rand_halves(rng, n * stride);
      std::vector<float> a(static_cast<size_t>(n) * d, -1.f), b = a;
      ref().kv_to_f32(kv.data() + d, stride, n, d, a.data());
      simd().kv_to_f32(kv.data() + d, stride, n, d, b.data());
      EXPECT_EQ(a, b);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < d; ++i) ASSERT_EQ(b[static_cast<size_t>(j) * d + i], half_ref(kv[j * stride + d + i])) << j << "," << i;
    }
}

// Gathering rows by index (sparse attention) widens exactly the listed rows, in list order.
TEST_P(SimdVsScalar, KvGatherF32IsExact) {
  std::mt19937 rng(18);
  const int d = 64, rows = 50;
  const size_t stride = 3 * d;
  const std::vector<uint16_t> kv = rand_halves(rng, rows * stride);
  const std::vector<int32_t> idx = {49, 0, 7, 7, 31, 2, 48, 13, 1};  // unordered, repeated
  const int n = static_cast<int>(idx.size());
  std::vector<float> a(static_cast<size_t>(n) * d, -1.f), b = a;
  ref().kv_gather_f32(kv.data() + d, stride, idx.data(), n, d, a.data());
  simd().kv_gather_f32(kv.data() + d, stride, idx.data(), n, d, b.data());
  EXPECT_EQ(a, b);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < d; ++i) ASSERT_EQ(b[static_cast<size_t>(j) * d + i], half_ref(kv[idx[j] * stride + d + i])) << j << "," << i;
}

// Query and key counts around the SIMD tiles, head sizes 16..128, and score/probability
// strides wider than the key block.
TEST_P(SimdVsScalar, AttentionScoresAndValues) {
  std::mt19937 rng(14);
  for (int d : {16, 64, 80, 128})
    for (int nq : {1, 3, 4, 5, 9})
      for (int nk : {1, 7, 15, 16, 17, 33, 100}) {
        SCOPED_TRACE("d=" + std::to_string(d) + " nq=" + std::to_string(nq) + " nk=" + std::to_string(nk));
        // Keys and values as widened cache rows holding three heads; the middle one is used.
        const size_t ld = 3 * d;
        const std::vector<float> kf = rand_floats(rng, nk * ld, -2.f, 2.f);
        const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
        const float scale = 0.125f, kSentinel = -777.f;
        const size_t lds = nk + 3;
        std::vector<float> sa(nq * lds, kSentinel), sb = sa;
        ref().attn_scores(q.data(), nq, kf.data() + d, ld, nk, d, scale, sa.data(), lds);
        simd().attn_scores(q.data(), nq, kf.data() + d, ld, nk, d, scale, sb.data(), lds);
        for (int i = 0; i < nq; ++i)
          for (size_t j = 0; j < lds; ++j) {
            if (j >= static_cast<size_t>(nk)) {
              EXPECT_EQ(sb[i * lds + j], kSentinel) << "padding written, i=" << i << " j=" << j;
              continue;
            }
            double mag = 0;
            for (int t = 0; t < d; ++t) mag += std::fabs(q[i * d + t] * kf[j * ld + d + t]) * scale;
            EXPECT_TRUE(Close(sb[i * lds + j], sa[i * lds + j], mag, 1e-5)) << "i=" << i << " j=" << j;
          }

        // attn_values accumulates into out, so start from non-zero values.
        const size_t ldp = nk + 2;
        const std::vector<float> p = rand_floats(rng, nq * ldp, 0.f, 1.f);
        const std::vector<float> v = rand_floats(rng, nk * ld, -2.f, 2.f);
        const std::vector<float> out0 = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
        std::vector<float> oa = out0, ob = out0;
        ref().attn_values(p.data(), ldp, nq, v.data() + d, ld, nk, d, oa.data());
        simd().attn_values(p.data(), ldp, nq, v.data() + d, ld, nk, d, ob.data());
        for (int i = 0; i < nq; ++i)
          for (int t = 0; t < d; ++t) {
            double mag = std::fabs(out0[i * d + t]);
            for (int j = 0; j < nk; ++j) mag += std::fabs(p[i * ldp + j] * v[j * ld + d + t]);
            EXPECT_TRUE(Close(ob[i * d + t], oa[i * d + t], mag, 1e-5)) << "i=" << i << " t=" << t;
          }
      }
}

// Rows of a query block over several key blocks, ranges of every shape (inside one block,
// across blocks, starting late as on a sliding-window layer), head sizes 16..128, query counts
// around the SIMD tiles: the outputs agree within the rounding the scores' order allows.
TEST_P(SimdVsScalar, FlashAttention) {
  std::mt19937 rng(17);
  for (int d : {16, 64, 80, 128})
    for (int nq : {1, 3, 4, 7, 48})
      for (int n_keys : {1, 9, 64, 65, 200}) {
        SCOPED_TRACE("d=" + std::to_string(d) + " nq=" + std::to_string(nq) + " keys=" + std::to_string(n_keys));
        const size_t ld = 3 * d;  // a cache row of three heads; the kernels read the first
        const std::vector<uint16_t> k = rand_halves(rng, n_keys * ld), v = rand_halves(rng, n_keys * ld);
        const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
        std::vector<int> begin, end;
        random_ranges(rng, nq, n_keys, begin, end);
        const float scale = 0.125f;
        const FlashState a = flash_run(ref(), q, nq, k, v, ld, d, scale, begin, end, 64);
        const FlashState b = flash_run(simd(), q, nq, k, v, ld, d, scale, begin, end, 64);
        for (int i = 0; i < nq; ++i) {
          // Values are at most 2 in size; a score's error moves the weights by about as much.
          const double tol = 2e-5 * (1 + score_magnitude(q, i, k, ld, d, scale, begin[i], end[i]));
          EXPECT_TRUE(Within(b.m[i], a.m[i], tol)) << "max of row " << i;
          for (int t = 0; t < d; ++t) EXPECT_TRUE(Within(b.out(i, t, d), a.out(i, t, d), 2 * tol)) << "i=" << i << " t=" << t;
        }
      }
}

TEST_P(SimdVsScalar, ExpSum) {
  std::mt19937 rng(15);
  for (int n : {1, 7, 8, 9, 33, 100, 1000}) {
    SCOPED_TRACE(n);
    std::vector<float> x = rand_floats(rng, n, -40.f, 5.f);
    if (n > 8) x[3] = -200.f;  // far below the max: exp underflows (clamped in the SIMD code)
    float mx = x[0];
    for (float v : x) mx = std::max(mx, v);
    std::vector<float> xa = x, xb = x;
    const float sa = ref().exp_sum(xa.data(), n, mx), sb = simd().exp_sum(xb.data(), n, mx);
    EXPECT_TRUE(Close(sb, sa, sa, 1e-6));
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(Close(xb[i], xa[i], xa[i], 1e-6)) << "i=" << i << " x=" << x[i];
      // The kernel's input is x - max rounded to float; exp of exactly that.
      EXPECT_TRUE(Close(xa[i], std::exp(static_cast<double>(x[i] - mx)), xa[i], 1e-6)) << "i=" << i;
    }
  }
}

TEST_P(SimdVsScalar, F32ToF16IsBitIdentical) {
  std::mt19937 rng(16);
  std::vector<float> x;
  // Specials, and every half value plus the midpoint above it (a round-half-even tie).
  for (float v : {0.f, -0.f, 1.f, -1.f, 65504.f, 65519.99f, 65520.f, 1e10f, -1e10f, 6e-8f, 3e-8f, 2.9e-8f, 1e-45f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double v = half_ref(static_cast<uint16_t>(h)), next = half_ref(static_cast<uint16_t>(h + 1));
    x.push_back(static_cast<float>(v));
    x.push_back(static_cast<float>(-(v + next) / 2));
  }
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) x.push_back(fp32_from_bits(bits(rng)));  // includes NaNs, subnormals
  x.push_back(0.5f);                                                        // odd length: exercises the scalar tail of the SIMD version
  std::vector<uint16_t> a(x.size()), b(x.size());
  ref().f32_to_f16(x.data(), a.data(), static_cast<int>(x.size()));
  simd().f32_to_f16(x.data(), b.data(), static_cast<int>(x.size()));
  int mismatches = 0;
  for (size_t i = 0; i < x.size() && mismatches < 10; ++i) {
    if (std::isnan(x[i])) {
      // NaN payloads differ (F16C keeps the top payload bits, the scalar code writes 0x7E00);
      // both must still be NaN.
      EXPECT_TRUE(std::isnan(half_ref(a[i])) && std::isnan(half_ref(b[i]))) << std::hex << fp32_to_bits(x[i]);
      continue;
    }
    if (a[i] != b[i]) {
      ++mismatches;
      ADD_FAILURE() << "x=" << x[i] << " (bits " << std::hex << fp32_to_bits(x[i]) << "): scalar " << a[i] << ", simd " << b[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, SimdVsScalar, ::testing::Values("avx2", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---------------------------------------------------------------------------------------------
// Every table (scalar included) against independent references.

class KernelsVsReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string t = GetParam();
    if (t == "scalar") kt_ = &scalar_kernels();
    if (t == "avx2" && cpu_has_avx2()) kt_ = avx2_kernels();
    if (t == "avx512" && cpu_has_avx512()) kt_ = avx512_kernels();
    if (!kt_) GTEST_SKIP() << t << " is not available on this CPU/build";
  }
  const KernelTable* kt_ = nullptr;
};

// Activations exactly representable in the Q8 format (quant_test_util.h): quantizing them gives
// back exactly q and d, so the GEMM result equals the dequantized weights times x up to float
// rounding -- plus, for Q4_1/Q5_1, the f16 rounding of s = d * sum(q) that ggml's Q8_1 format has.
TEST_P(KernelsVsReference, QuantizedGemmMatchesDequantizedWeights) {
  std::mt19937 rng(21);
  for (GgmlType type : kQuantTypes)
    for (int k : ks_for(type))
      for (int n_tok : {1, 3, 4, 5}) {
        const int rows = 11;  // a full group and a partial one
        SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)) + " k=" + std::to_string(k) + " tok=" + std::to_string(n_tok));
        const QWeights qw = make_qweights(type, rows, k, rng);
        const quanttest::ExactAct ex = quanttest::exact_activations(rng, n_tok, k);
        const Act act = quantize_all(*kt_, ex.x, n_tok, k);
        for (size_t i = 0; i < ex.q.size(); ++i) ASSERT_EQ(act.qs[i], ex.q[i]) << "element " << i;
        for (size_t b = 0; b < ex.d.size(); ++b) ASSERT_EQ(act.d[b], ex.d[b]) << "block " << b;

        std::vector<float> y(static_cast<size_t>(n_tok) * rows);
        gemm_q8_for(*kt_, type)({qw.packed.data(), qw.group_bytes, rows, &act.a, 0, n_tok, y.data(), rows});
        std::vector<float> wr(k);
        for (int r = 0; r < rows; ++r) {
          dequantize_row(qw.w, r, wr.data());
          for (int t = 0; t < n_tok; ++t) {
            double want = 0;
            for (int j = 0; j < k; ++j) want += static_cast<double>(wr[j]) * ex.x[static_cast<size_t>(t) * k + j];
            const double mag = quanttest::gemm_magnitude(qw.w, r, wr, act.a, t);
            const double s_err = quanttest::s_rounding_error(qw.w, r, act.a, t);
            EXPECT_TRUE(Within(y[static_cast<size_t>(t) * rows + r], want, 1e-5 * mag + s_err)) << "r=" << r << " t=" << t;
          }
        }
      }
}

TEST_P(KernelsVsReference, QuantizeQ8Definition) {
  // For arbitrary input: d = f16(amax / 127), q = round(x / (amax / 127)), |q| <= 127, and
  // isum / s consistent with q.
  std::mt19937 rng(22);
  const int k = 576;
  const std::vector<float> x = activation_rows(rng, 2, k);
  const Act act = quantize_all(*kt_, x, 2, k);
  for (int b = 0; b < 2 * k / 32; ++b) {
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(act.d[b], round_fp16(amax / 127.f)) << "block " << b;
    for (int j = 0; j < 32; ++j) {
      const int qv = act.qs[b * 32 + j];
      sum += qv;
      const double exact = amax > 0 ? static_cast<double>(x[b * 32 + j]) * 127.0 / amax : 0.0;
      EXPECT_LE(std::fabs(qv - exact), 0.5 + 1e-5) << "block " << b << " j " << j;
    }
    EXPECT_EQ(act.isum[b], sum);
    EXPECT_EQ(act.s[b], round_fp16(amax / 127.f * static_cast<float>(sum)));
  }
}

// One attention block the way the engine chains the kernels: widen K and V from
// an f16 cache, scores, softmax weights, weighted values -- against a double computation.
TEST_P(KernelsVsReference, AttentionMatchesDoubleReference) {
  std::mt19937 rng(23);
  const int d = 64, nq = 3, nk = 37;
  const size_t stride = 192;  // 3 KV heads per cache row; use the second
  const std::vector<uint16_t> k = rand_halves(rng, nk * stride), v = rand_halves(rng, nk * stride);
  const std::vector<float> q = rand_floats(rng, nq * d, -1.f, 1.f);
  // Whole cache rows are widened; the kernels read the second head out of them.
  std::vector<float> kf(nk * stride), vf(nk * stride), s(nq * nk);
  kt_->kv_to_f32(k.data(), stride, nk, stride, kf.data());
  kt_->kv_to_f32(v.data(), stride, nk, stride, vf.data());
  kt_->attn_scores(q.data(), nq, kf.data() + d, stride, nk, d, 0.125f, s.data(), nk);
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) {
      double want = 0, mag = 0;
      for (int t = 0; t < d; ++t) {
        want += q[i * d + t] * half_ref(k[j * stride + d + t]);
        mag += std::fabs(q[i * d + t] * half_ref(k[j * stride + d + t]));
      }
      EXPECT_TRUE(Close(s[i * nk + j], want * 0.125, mag * 0.125, 1e-5)) << "i=" << i << " j=" << j;
    }
  const std::vector<float> p = rand_floats(rng, nq * nk, 0.f, 1.f);
  std::vector<float> out(nq * d, 0.5f);
  kt_->attn_values(p.data(), nk, nq, vf.data() + d, stride, nk, d, out.data());
  for (int i = 0; i < nq; ++i)
    for (int t = 0; t < d; ++t) {
      double want = 0.5, mag = 0.5;
      for (int j = 0; j < nk; ++j) {
        want += p[i * nk + j] * half_ref(v[j * stride + d + t]);
        mag += std::fabs(p[i * nk + j] * half_ref(v[j * stride + d + t]));
      }
      EXPECT_TRUE(Close(out[i * d + t], want, mag, 1e-5)) << "i=" << i << " t=" << t;
    }
}

// Scores straight from the f16 cache are the scores of its widened copy, bit for bit (decode
// steps and policies score in place, prompts on widened blocks), tails and fetch-ahead included.
TEST_P(KernelsVsReference, F16ScoresEqualWidenedScores) {
  std::mt19937 rng(28);
  for (int d : {64, 256})
    for (int nq : {1, 2, 3, 4, 5, 8})
      for (int nk : {1, 7, 64}) {
        SCOPED_TRACE("d=" + std::to_string(d) + " nq=" + std::to_string(nq) + " nk=" + std::to_string(nk));
        const size_t ld = 2 * d;  // two heads per row; the second is scored
        const std::vector<uint16_t> k = rand_halves(rng, 2 * nk * ld);
        const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
        std::vector<float> kf(nk * ld), widened(nq * nk), direct(nq * nk);
        kt_->kv_to_f32(k.data(), ld, nk, static_cast<int>(ld), kf.data());
        kt_->attn_scores(q.data(), nq, kf.data() + d, ld, nk, d, 0.0625f, widened.data(), nk);
        kt_->attn_scores_f16(q.data(), nq, k.data() + d, ld, nk, d, 0.0625f, direct.data(), nk, k.data() + nk * ld + d);
        for (int i = 0; i < nq * nk; ++i) ASSERT_EQ(fp32_to_bits(direct[i]), fp32_to_bits(widened[i])) << "entry " << i;
      }
}

// flash_block's kept scores (OmniKV ranks its filter layer's keys by them) are attn_scores_f16's
// of the same rows and keys, bit for bit, for each row's range only; the rest of raw is untouched.
TEST_P(KernelsVsReference, FlashBlockKeepsTheScoresOfItsRanges) {
  std::mt19937 rng(29);
  for (int d : {64, 256})
    for (int nq : {1, 3, 4, 12})
      for (int nk : {5, 64}) {
        SCOPED_TRACE("d=" + std::to_string(d) + " nq=" + std::to_string(nq) + " nk=" + std::to_string(nk));
        const size_t ld = d;
        const std::vector<uint16_t> k = rand_halves(rng, nk * ld), v = rand_halves(rng, nk * ld);
        const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
        std::vector<int> lo(nq), hi(nq);
        random_ranges(rng, nq, nk, lo, hi);
        std::vector<float> want(static_cast<size_t>(nq) * nk), m(nq, -INFINITY), l(nq, 0.f), acc(static_cast<size_t>(nq) * d, 0.f);
        std::vector<float> work(flash_work_floats(nq, nk, d)), raw(static_cast<size_t>(nq) * nk, 7.f);
        kt_->attn_scores_f16(q.data(), nq, k.data(), ld, nk, d, 0.0625f, want.data(), nk, nullptr);
        kt_->flash_block(q.data(), nq, k.data(), v.data(), ld, nk, d, 0.0625f, lo.data(), hi.data(), m.data(), l.data(), acc.data(),
                         work.data(), nullptr, nullptr, raw.data(), nk);
        for (int i = 0; i < nq; ++i)
          for (int j = 0; j < nk; ++j) {
            const float expect = j >= lo[i] && j < hi[i] ? want[i * nk + j] : 7.f;
            ASSERT_EQ(fp32_to_bits(raw[i * nk + j]), fp32_to_bits(expect)) << "row " << i << ", key " << j;
          }
      }
}

// The engine's attention covers a token's keys with blocks whose sizes depend on which other
// tokens share its micro-batch (the block ends at the last token's position), and groups query
// rows by batch too. For logits not to depend on how a prompt is chunked, the score of (query
// i, key j) and a query's weighted values must not depend on nq, nk or the row's place in a
// tile: bit for bit. (Trailing keys with probability 0 must leave the values unchanged.)
TEST_P(KernelsVsReference, AttentionIsIndependentOfBlockShape) {
  std::mt19937 rng(25);
  const int d = 64, nq = 7, nk = 64;
  const size_t ld = 2 * d;
  const std::vector<float> q = rand_floats(rng, nq * d, -1.f, 1.f), k = rand_floats(rng, nk * ld, -2.f, 2.f),
                           v = rand_floats(rng, nk * ld, -2.f, 2.f);
  std::vector<float> full(nq * nk);
  kt_->attn_scores(q.data(), nq, k.data(), ld, nk, d, 0.125f, full.data(), nk);
  for (int qi = 0; qi < nq; ++qi)
    for (int n = 1; n <= nk; ++n) {
      std::vector<float> one(n);
      kt_->attn_scores(q.data() + qi * d, 1, k.data(), ld, n, d, 0.125f, one.data(), n);
      for (int j = 0; j < n; ++j)
        ASSERT_EQ(fp32_to_bits(one[j]), fp32_to_bits(full[qi * nk + j]))
            << "score of query " << qi << ", key " << j << ": alone with " << n << " keys " << one[j] << ", in the full block "
            << full[qi * nk + j];
    }
  // Values: each query alone over its first n keys equals its row in the full block with the
  // probabilities of keys >= n set to 0.
  const std::vector<float> p0 = rand_floats(rng, nq * nk, 0.f, 1.f);
  for (int n = 1; n <= nk; ++n) {
    std::vector<float> p = p0;
    for (int i = 0; i < nq; ++i) std::fill(p.begin() + i * nk + n, p.begin() + (i + 1) * nk, 0.f);
    std::vector<float> all(nq * d, 0.f);
    kt_->attn_values(p.data(), nk, nq, v.data(), ld, nk, d, all.data());
    for (int qi = 0; qi < nq; ++qi) {
      std::vector<float> one(d, 0.f);
      kt_->attn_values(p.data() + qi * nk, nk, 1, v.data(), ld, n, d, one.data());
      for (int t = 0; t < d; ++t)
        ASSERT_EQ(fp32_to_bits(one[t]), fp32_to_bits(all[qi * d + t])) << "query " << qi << " dim " << t << " n " << n;
    }
  }
}

// Flash attention is softmax attention: against whole score rows in double precision.
TEST_P(KernelsVsReference, FlashAttentionMatchesExactSoftmax) {
  std::mt19937 rng(26);
  const int d = 64, nq = 9, n_keys = 300;
  const size_t ld = 2 * d;
  const std::vector<uint16_t> k = rand_halves(rng, n_keys * ld), v = rand_halves(rng, n_keys * ld);
  const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
  std::vector<int> begin, end;
  random_ranges(rng, nq, n_keys, begin, end);
  const float scale = 0.2f;
  const FlashState st = flash_run(*kt_, q, nq, k, v, ld, d, scale, begin, end, 64);
  for (int i = 0; i < nq; ++i) {
    std::vector<double> p(n_keys, 0.0);
    double mx = -INFINITY, sum = 0;
    for (int j = begin[i]; j < end[i]; ++j) {
      for (int t = 0; t < d; ++t) p[j] += q[static_cast<size_t>(i) * d + t] * half_ref(k[j * ld + t]);
      p[j] *= scale;
      mx = std::max(mx, p[j]);
    }
    for (int j = begin[i]; j < end[i]; ++j) sum += p[j] = std::exp(p[j] - mx);
    const double tol = 2e-5 * (1 + score_magnitude(q, i, k, ld, d, scale, begin[i], end[i]));
    for (int t = 0; t < d; ++t) {
      double want = 0;
      for (int j = begin[i]; j < end[i]; ++j) want += p[j] / sum * half_ref(v[j * ld + t]);
      EXPECT_TRUE(Within(st.out(i, t, d), want, 2 * tol)) << "i=" << i << " t=" << t;
    }
  }
}

// What the engine's bit-for-bit invariance rests on (ChunkingDoesNotChangeLogits and the
// decode/prefill tests in engine_test.cc): a row's running max, sum and output are the same,
// bit for bit, whether it runs alone over blocks that end at its last key (a decode step), in a
// GQA group of a few rows (a decode step of a model with 2-8 query heads per KV head: the kernels
// read K and V in place there), or with 47 other rows of other ranges over whole blocks (a
// prompt's query block: widened copies).
TEST_P(KernelsVsReference, FlashRowIsIndependentOfItsBlock) {
  std::mt19937 rng(27);
  for (int d : {64, 256}) {
    const int nq = 48, n_keys = 200;
    const size_t ld = 3 * d;
    const std::vector<uint16_t> k = rand_halves(rng, n_keys * ld), v = rand_halves(rng, n_keys * ld);
    const std::vector<float> q = rand_floats(rng, static_cast<size_t>(nq) * d, -1.f, 1.f);
    std::vector<int> begin, end;
    random_ranges(rng, nq, n_keys, begin, end);
    const FlashState all = flash_run(*kt_, q, nq, k, v, ld, d, 0.125f, begin, end, 64);
    for (int group : {1, 2, 3, 4, 8})
      for (int i0 = 0; i0 < nq; i0 += group) {
        const auto rows = [&](const auto& x, size_t width) {
          return std::vector<std::decay_t<decltype(x[0])>>(x.begin() + static_cast<ptrdiff_t>(i0 * width),
                                                           x.begin() + static_cast<ptrdiff_t>((i0 + group) * width));
        };
        const FlashState some = flash_run(*kt_, rows(q, d), group, k, v, ld, d, 0.125f, rows(begin, 1), rows(end, 1), 64);
        for (int r = 0; r < group; ++r) {
          const int i = i0 + r;
          SCOPED_TRACE("d=" + std::to_string(d) + " group=" + std::to_string(group) + " row " + std::to_string(i));
          ASSERT_EQ(fp32_to_bits(some.m[r]), fp32_to_bits(all.m[i]));
          ASSERT_EQ(fp32_to_bits(some.l[r]), fp32_to_bits(all.l[i]));
          for (int t = 0; t < d; ++t)
            ASSERT_EQ(fp32_to_bits(some.acc[static_cast<size_t>(r) * d + t]), fp32_to_bits(all.acc[static_cast<size_t>(i) * d + t]))
                << "dim " << t;
        }
      }
  }
}

// The gated activations against double precision, across the range and at its extremes (where
// exp overflows, and where GELU's 1 + tanh would cancel).
TEST_P(KernelsVsReference, GatedActivationsMatchDoubleReference) {
  std::mt19937 rng(29);
  std::vector<float> x = {0.f, -0.f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 30.f, -30.f, 100.f, -100.f, 1e4f, -1e4f, 1e30f, -1e30f};
  for (int i = -400; i <= 400; ++i) x.push_back(static_cast<float>(i) * 0.03f);  // -12 .. 12
  const std::vector<float> u = rand_floats(rng, x.size(), -2.f, 2.f);
  std::vector<float> s = x, g = x;
  kt_->swiglu(s.data(), u.data(), static_cast<int>(x.size()));
  kt_->geglu(g.data(), u.data(), static_cast<int>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i], ui = u[i];
    const double silu = xi / (1 + std::exp(-xi)) * ui;
    const double y = std::sqrt(2 / M_PI) * (xi + 0.044715 * xi * xi * xi);
    const double gelu = 0.5 * xi * (1 + std::tanh(y)) * ui;
    // Relative to the value; where it vanishes, to the product's own rounding.
    const auto tol = [&](double want) { return 1e-5 * std::fabs(want) + 1e-7 * std::fabs(xi * ui) + 1e-37; };
    EXPECT_NEAR(s[i], silu, tol(silu)) << "swiglu x=" << xi;
    EXPECT_NEAR(g[i], gelu, tol(gelu)) << "geglu x=" << xi;
  }
}

TEST_P(KernelsVsReference, ExpSumMatchesStdExp) {
  std::mt19937 rng(24);
  std::vector<float> x = rand_floats(rng, 50, -20.f, 3.f);
  float mx = x[0];
  for (float a : x) mx = std::max(mx, a);
  const std::vector<float> x0 = x;
  const float sum = kt_->exp_sum(x.data(), 50, mx);
  double want_sum = 0;
  for (int i = 0; i < 50; ++i) {
    const double e = std::exp(static_cast<double>(x0[i] - mx));
    want_sum += e;
    EXPECT_TRUE(Close(x[i], e, e, 1e-6)) << "i=" << i;
  }
  EXPECT_TRUE(Close(sum, want_sum, want_sum, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Tables, KernelsVsReference, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// pack_matrix follows the layout packed.h documents: per 8-row group and column block, the
// rows' scales side by side and quants interleaved in 4-byte runs; missing rows are zero.
TEST(Packing, LayoutMatchesDocumentation) {
  std::mt19937 rng(31);
  const int rows = 11, k = 64, nb = k / 32;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)));
    const QWeights qw = make_qweights(type, rows, k, rng);
    ASSERT_EQ(qw.group_bytes, nb * (type == GgmlType::Q4_0   ? sizeof(PackedQ4_0)
                                    : type == GgmlType::Q4_1 ? sizeof(PackedQ4_1)
                                                             : sizeof(PackedQ8_0)));
    for (int r = 0; r < 16; ++r)
      for (int b = 0; b < nb; ++b) {
        const uint8_t* blk = qw.packed.data() + (r / 8) * qw.group_bytes;
        const int rr = r % 8;
        const uint8_t* src = r < rows ? qw.bytes.data() + r * qw.w.row_bytes : nullptr;
        if (type == GgmlType::Q8_0) {
          const auto& p = reinterpret_cast<const PackedQ8_0*>(blk)[b];
          const BlockQ8_0 zero{};
          const auto& o = src ? reinterpret_cast<const BlockQ8_0*>(src)[b] : zero;
          EXPECT_EQ(p.d[rr], o.d);
          int sum = 0;
          for (int j = 0; j < 32; ++j) {
            sum += o.qs[j];
            EXPECT_EQ(p.qs[(j / 4 * 8 + rr) * 4 + j % 4], o.qs[j]) << "r=" << r << " b=" << b << " j=" << j;
          }
          EXPECT_EQ(p.wsum[rr], sum);
        } else {
          // Q4_0 and Q4_1 share the quant layout; Q4_1 has m after d.
          const bool q41 = type == GgmlType::Q4_1;
          const uint8_t* pb = blk + b * (q41 ? sizeof(PackedQ4_1) : sizeof(PackedQ4_0));
          const uint8_t* ob = src ? src + b * (q41 ? 20 : 18) : nullptr;
          const uint8_t* pqs = pb + (q41 ? 32 : 16);
          const uint8_t* oqs = ob ? ob + (q41 ? 4 : 2) : nullptr;
          uint16_t pd, od = 0;
          std::memcpy(&pd, pb + 2 * rr, 2);
          if (ob) std::memcpy(&od, ob, 2);
          EXPECT_EQ(pd, od);
          if (q41) {
            uint16_t pm, om = 0;
            std::memcpy(&pm, pb + 16 + 2 * rr, 2);
            if (ob) std::memcpy(&om, ob + 2, 2);
            EXPECT_EQ(pm, om);
          }
          for (int j = 0; j < 16; ++j)
            EXPECT_EQ(pqs[(j / 4 * 8 + rr) * 4 + j % 4], oqs ? oqs[j] : 0) << "r=" << r << " b=" << b << " j=" << j;
        }
      }
  }
}

// The 5- and 6-bit types and the K-quants, read back from the packed layout as packed.h
// documents it: per row and 32-weight unit the quants (nibbles from the Q4 run, bit 4 or bits
// 4-5 from the high-bit vectors) and the scales equal the source block's; missing rows are zero.
// (The source quants come from ggml_types.h's helpers, which the dequantization tests check
// against gguf-py.)
TEST(Packing, HighBitAndKQuantLayoutsMatchDocumentation) {
  std::mt19937 rng(32);
  const int rows = 11;
  for (GgmlType type : {GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)));
    const int bc = packed_block_cols(type), k = 2 * bc, nb = 2, units = bc / 32;
    const GgmlTypeTraits& tr = *ggml_type_traits(static_cast<uint32_t>(type));
    const QWeights qw = make_qweights(type, rows, k, rng);
    const size_t packed_size = type == GgmlType::Q5_0   ? sizeof(PackedQ5_0)
                               : type == GgmlType::Q5_1 ? sizeof(PackedQ5_1)
                               : type == GgmlType::Q4_K ? sizeof(PackedQ4_K)
                               : type == GgmlType::Q5_K ? sizeof(PackedQ5_K)
                                                        : sizeof(PackedQ6_K);
    ASSERT_EQ(qw.group_bytes, nb * packed_size);
    for (int r = 0; r < 16; ++r)
      for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = qw.packed.data() + (r / 8) * qw.group_bytes + b * packed_size;
        const int rr = r % 8;
        std::vector<uint8_t> src(tr.type_size, 0);  // a missing row reads as a zero block
        if (r < rows) std::memcpy(src.data(), qw.bytes.data() + r * qw.w.row_bytes + b * tr.type_size, tr.type_size);
        for (int u = 0; u < units; ++u) {
          uint8_t want[32], sc = 0, m = 0;
          const uint8_t *run = nullptr, *hv = nullptr;
          int high_bits = 1;
          switch (type) {
            case GgmlType::Q5_0: {
              const auto& s = *reinterpret_cast<const BlockQ5_0*>(src.data());
              const auto& p = *reinterpret_cast<const PackedQ5_0*>(pb);
              quants_q5(s.qh, s.qs, want);
              EXPECT_EQ(p.d[rr], s.d);
              run = p.qs, hv = p.qh;
              break;
            }
            case GgmlType::Q5_1: {
              const auto& s = *reinterpret_cast<const BlockQ5_1*>(src.data());
              const auto& p = *reinterpret_cast<const PackedQ5_1*>(pb);
              quants_q5(s.qh, s.qs, want);
              EXPECT_EQ(p.d[rr], s.d);
              EXPECT_EQ(p.m[rr], s.m);
              run = p.qs, hv = p.qh;
              break;
            }
            case GgmlType::Q4_K: {
              const auto& s = *reinterpret_cast<const BlockQ4_K*>(src.data());
              const auto& p = *reinterpret_cast<const PackedQ4_K*>(pb);
              quants_q4_k(s, u, want);
              k_scale_min(s.scales, u, &sc, &m);
              EXPECT_EQ(p.d[rr], s.d);
              EXPECT_EQ(p.dmin[rr], s.dmin);
              EXPECT_EQ(p.sc[u][rr], sc);
              EXPECT_EQ(p.m[u][rr], m);
              run = p.qs[u], high_bits = 0;
              break;
            }
            case GgmlType::Q5_K: {
              const auto& s = *reinterpret_cast<const BlockQ5_K*>(src.data());
              const auto& p = *reinterpret_cast<const PackedQ5_K*>(pb);
              quants_q5_k(s, u, want);
              k_scale_min(s.scales, u, &sc, &m);
              EXPECT_EQ(p.d[rr], s.d);
              EXPECT_EQ(p.dmin[rr], s.dmin);
              EXPECT_EQ(p.sc[u][rr], sc);
              EXPECT_EQ(p.m[u][rr], m);
              run = p.qs[u], hv = p.qh[u];
              break;
            }
            default: {
              const auto& s = *reinterpret_cast<const BlockQ6_K*>(src.data());
              const auto& p = *reinterpret_cast<const PackedQ6_K*>(pb);
              quants_q6_k(s, u, want);
              EXPECT_EQ(p.d[rr], s.d);
              EXPECT_EQ(p.sc[2 * u][rr], s.scales[2 * u]);
              EXPECT_EQ(p.sc[2 * u + 1][rr], s.scales[2 * u + 1]);
              run = p.qs[u], hv = p.qh[u], high_bits = 2;
              break;
            }
          }
          for (int j = 0; j < 32; ++j) {
            const int g = (j % 16) / 4, i = j % 4;
            const uint8_t byte = run[(g * 8 + rr) * 4 + i];
            int q = j < 16 ? byte & 0xF : byte >> 4;
            if (high_bits == 1) q |= ((hv[rr * 4 + i] >> (j < 16 ? g : 4 + g)) & 1) << 4;
            if (high_bits == 2) q |= ((hv[32 * (g / 2) + rr * 4 + i] >> ((j < 16 ? 0 : 4) + 2 * (g % 2))) & 3) << 4;
            EXPECT_EQ(q, want[j]) << "r=" << r << " b=" << b << " unit=" << u << " j=" << j;
          }
        }
      }
  }
}

// fp16.h's conversions against the independent decoder, for every half.
TEST(Fp16, EveryHalfDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double want = half_ref(static_cast<uint16_t>(h));
    const float got = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    ASSERT_EQ(fp32_to_fp16(got), h) << std::hex << h;
  }
}

}  // namespace
