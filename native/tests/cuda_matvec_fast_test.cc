// The fast quantized matvecs (cuda/matvec_fast.cuh) against the CPU engine's scalar kernels, on
// weights repacked on the host (cuda/repack.h), and their fused forms against the unfused kernels
// they replace. CUDA builds only; skipped, with the reason, on a machine without a usable GPU,
// except the argument checks (host code). Shapes cross the kernels' boundaries: rows in blocks of
// 4 warps (77 and 193 leave partial blocks), rows of 3, 18 and 48 quant blocks (some lanes idle,
// one or two rounds of lanes), 1, 3 and 8 tokens, output strides with padding that must stay
// untouched, and multi launches whose weights meet inside a block.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda/fused.cuh"
#include "cuda/matvec_fast.cuh"
#include "cuda/repack.h"
#include "dequant.h"
#include "device.h"
#include "gguf_writer.h"
#include "kernels.h"
#include "packed.h"

namespace {

using namespace ctx;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

const uint32_t kQuantTypes[] = {ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0};

std::vector<float> randoms(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  return ctxtest::random_floats(n, rng, lo, hi);
}

// Device memory of one test, freed when the test ends (an assertion failure included).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    for (void* p : blocks_) cudaFree(p);
  }
  // *out = a new device copy of v (cudaMalloc: 256-byte aligned).
  template <typename T>
  void copy_in(const std::vector<T>& v, T** out) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
    blocks_.push_back(p);
    ASSERT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    *out = static_cast<T*>(p);
  }

 private:
  std::vector<void*> blocks_;
};

void copy_out(const float* dev, size_t count, std::vector<float>* out) {
  out->resize(count);
  ASSERT_EQ(cudaMemcpy(out->data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
}

// A [rows][cols] weight of a quantized type holding random values, in the file layout.
struct HostWeight {
  std::string bytes;
  Weight w;  // points into bytes: not copyable
  HostWeight(uint32_t type, int rows, int cols, uint32_t seed) {
    const std::vector<float> f = randoms(static_cast<size_t>(rows) * cols, seed, -0.5f, 0.5f);
    for (int r = 0; r < rows; ++r) bytes += ctxtest::quantize_row(type, f.data() + static_cast<size_t>(r) * cols, cols);
    w.type = static_cast<GgmlType>(type);
    w.data = reinterpret_cast<const uint8_t*>(bytes.data());
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = bytes.size() / rows;
  }
  HostWeight(const HostWeight&) = delete;
  HostWeight& operator=(const HostWeight&) = delete;
};

// n tokens of random activations, quantized as the CPU engine quantizes them (scalar quantize_q8).
struct HostAct {
  int n, k;
  std::vector<float> x;  // [n][k]
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> isum;
  HostAct(int tokens, int cols, uint32_t seed) : HostAct(tokens, cols, randoms(static_cast<size_t>(tokens) * cols, seed, -2.f, 2.f)) {}
  HostAct(int tokens, int cols, std::vector<float> values) : n(tokens), k(cols), x(std::move(values)) {
    const int nb = k / 32;
    qs.resize(x.size());
    d.resize(static_cast<size_t>(n) * nb);
    s.resize(d.size());
    isum.resize(d.size());
    for (int t = 0; t < n; ++t)
      scalar_kernels().quantize_q8(x.data() + static_cast<size_t>(t) * k, k, qs.data() + static_cast<size_t>(t) * k, d.data() + t * nb,
                                   s.data() + t * nb, isum.data() + t * nb);
  }
  ActQ8 view() { return {qs.data(), d.data(), s.data(), isum.data(), k}; }
};

// Repacks a weight on the host and uploads it.
void upload_weight(const HostWeight& hw, DeviceMemory& mem, cuda::DevQWeight* out) {
  const Weight& w = hw.w;
  std::vector<uint8_t> qs(cuda::repacked_qs_bytes(w.type, w.rows, w.cols));
  std::vector<uint16_t> dm(2 * cuda::repacked_blocks(w.rows, w.cols));
  cuda::repack_weight(w, qs.data(), dm.data());
  uint8_t* dev_qs = nullptr;
  uint16_t* dev_dm = nullptr;
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(qs, &dev_qs));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(dm, &dev_dm));
  out->type = w.type;
  out->rows = w.rows;
  out->cols = w.cols;
  out->qs = dev_qs;
  out->dm = reinterpret_cast<const __half2*>(dev_dm);
}

void upload_act(const HostAct& act, DeviceMemory& mem, cuda::DevActQ8* out) {
  out->k = act.k;
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(act.qs, &out->qs));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(act.d, &out->d));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(act.s, &out->s));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(act.isum, &out->isum));
}

// The CPU engine's y [n][rows]: the scalar kernel of the weight's type on its packed layout.
std::vector<float> cpu_product(const HostWeight& hw, HostAct& act) {
  const Weight& w = hw.w;
  const size_t group_bytes = packed_group_bytes(w.type, w.cols);
  std::vector<uint8_t> packed(group_bytes * ((w.rows + kRowGroup - 1) / kRowGroup));
  pack_matrix(w.type, w.data, w.rows, w.cols, packed.data());
  const ActQ8 x = act.view();
  std::vector<float> y(static_cast<size_t>(act.n) * w.rows);
  const GemmQ8Args a{packed.data(), group_bytes, w.rows, &x, 0, act.n, y.data(), w.rows};
  const KernelTable& k = scalar_kernels();
  (w.type == GgmlType::Q4_0 ? k.gemm_q4_0 : w.type == GgmlType::Q4_1 ? k.gemm_q4_1 : k.gemm_q8_0)(a);
  return y;
}

// [n][rows]: sum over c of |w[r][c] * x[t][c]| (dequantized weights, unquantized activations), the
// scale of the rounding in a dot product.
std::vector<double> abs_products(const HostWeight& hw, const HostAct& act) {
  const Weight& w = hw.w;
  std::vector<double> out(static_cast<size_t>(act.n) * w.rows);
  std::vector<float> row(w.cols);
  for (int r = 0; r < w.rows; ++r) {
    dequantize_row(w, r, row.data());
    for (int t = 0; t < act.n; ++t) {
      const float* x = act.x.data() + static_cast<size_t>(t) * w.cols;
      double s = 0;
      for (int c = 0; c < w.cols; ++c) s += std::fabs(static_cast<double>(row[c]) * x[c]);
      out[static_cast<size_t>(t) * w.rows + r] = s;
    }
  }
  return out;
}

// |got - want| <= rel * scale[i] + abs everywhere; reports the worst element.
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

// The [n][rows] results in an output of stride ldy, after checking that its padding (columns
// rows..ldy-1) still holds what it held before.
std::vector<float> results(const std::vector<float>& out, const std::vector<float>& before, int n, int rows, int ldy,
                           const std::string& what) {
  std::vector<float> y(static_cast<size_t>(n) * rows);
  for (int t = 0; t < n; ++t) {
    for (int r = 0; r < rows; ++r) y[static_cast<size_t>(t) * rows + r] = out[static_cast<size_t>(t) * ldy + r];
    for (int r = rows; r < ldy; ++r)
      EXPECT_EQ(out[static_cast<size_t>(t) * ldy + r], before[static_cast<size_t>(t) * ldy + r])
          << what << ": padding of token " << t << " written";
  }
  return y;
}

std::string describe(uint32_t type, int rows, int cols, int n) {
  return "type " + std::to_string(type) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " n " + std::to_string(n);
}

// matvec_fast on random data against the CPU, y starting from random values (kept or overwritten).
void check_matvec(uint32_t type, int rows, int cols, int n, bool accumulate) {
  const std::string what = describe(type, rows, cols, n) + (accumulate ? " accumulate" : "");
  const uint32_t seed = type * 1000 + rows + n;
  const HostWeight hw(type, rows, cols, seed);
  HostAct act(n, cols, seed + 1);
  const int ldy = rows + 3;
  const std::vector<float> y0 = randoms(static_cast<size_t>(n) * ldy, seed + 2, -1.f, 1.f);
  DeviceMemory mem;
  cuda::DevQWeight w;
  cuda::DevActQ8 a;
  float* y = nullptr;
  ASSERT_NO_FATAL_FAILURE(upload_weight(hw, mem, &w));
  ASSERT_NO_FATAL_FAILURE(upload_act(act, mem, &a));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(y0, &y));
  cuda::matvec_fast(w, a, n, y, ldy, accumulate, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<float> out;
  ASSERT_NO_FATAL_FAILURE(copy_out(y, y0.size(), &out));
  const std::vector<float> got = results(out, y0, n, rows, ldy, what);

  std::vector<float> want = cpu_product(hw, act);
  std::vector<double> scale = abs_products(hw, act);
  if (accumulate)
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < rows; ++r) {
        const float before = y0[static_cast<size_t>(t) * ldy + r];
        want[static_cast<size_t>(t) * rows + r] += before;
        scale[static_cast<size_t>(t) * rows + r] += std::fabs(before);
      }
  // Same integer dot product per block and the same block term; only the order of the float sums
  // across blocks (and with the old y) differs.
  expect_close(got, want, scale, 1e-5, 1e-6, what);
}

TEST(CudaMatvecFast, MatvecMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols;
  };
  for (uint32_t type : kQuantTypes)
    for (const Shape& shape : {Shape{77, 96}, Shape{193, 576}, Shape{64, 1536}})
      for (int n : {1, 3, 8})
        for (bool accumulate : {false, true}) ASSERT_NO_FATAL_FAILURE(check_matvec(type, shape.rows, shape.cols, n, accumulate));
}

TEST(CudaMatvecFast, MatvecStreamsTheOutputMatrix) {
  SKIP_WITHOUT_GPU();
  // The tied output projection of SmolLM2-135M: 49152 x 576, Q8_0, one token.
  check_matvec(ctxtest::kTQ8_0, 49152, 576, 1, false);
}

TEST(CudaMatvecFast, MultiComputesEachWeightInOneLaunch) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int rows[3], cols;
  };
  // Odd row counts (weights meeting inside a block of 4 rows), then the model's Q, K and V.
  for (const Case& c : {Case{{77, 193, 32}, 96}, Case{{576, 192, 192}, 576}})
    for (uint32_t type : kQuantTypes)
      for (int n : {1, 3, 8})
        for (int count = 1; count <= 3; ++count) {
          const std::string what = describe(type, c.rows[0], c.cols, n) + " count " + std::to_string(count);
          const uint32_t seed = type * 1000 + c.cols + n * 10 + count;
          HostAct act(n, c.cols, seed);
          const HostWeight hw[3] = {
              {type, c.rows[0], c.cols, seed + 1}, {type, c.rows[1], c.cols, seed + 2}, {type, c.rows[2], c.cols, seed + 3}};
          std::vector<float> before[3];
          DeviceMemory mem;
          cuda::DevActQ8 a;
          cuda::DevQWeight w[3];
          float* y[3];
          int ldy[3];
          ASSERT_NO_FATAL_FAILURE(upload_act(act, mem, &a));
          for (int i = 0; i < 3; ++i) {
            ldy[i] = c.rows[i] + 1 + i;
            before[i] = randoms(static_cast<size_t>(n) * ldy[i], seed + 5 + i, -1.f, 1.f);
            ASSERT_NO_FATAL_FAILURE(upload_weight(hw[i], mem, &w[i]));
            ASSERT_NO_FATAL_FAILURE(mem.copy_in(before[i], &y[i]));
          }
          const cuda::DevQWeight* const weights[3] = {&w[0], &w[1], &w[2]};
          cuda::matvec_fast_multi(weights, y, ldy, count, a, n, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          for (int i = 0; i < 3; ++i) {
            std::vector<float> out;
            ASSERT_NO_FATAL_FAILURE(copy_out(y[i], before[i].size(), &out));
            if (i >= count) {
              EXPECT_EQ(out, before[i]) << what << ": weight " << i << " is not part of the launch";
              continue;
            }
            const std::vector<float> got = results(out, before[i], n, c.rows[i], ldy[i], what);
            expect_close(got, cpu_product(hw[i], act), abs_products(hw[i], act), 1e-5, 1e-6, what + " weight " + std::to_string(i));
          }
        }
}

TEST(CudaMatvecFast, SwigluIsSiluOfGateTimesUp) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols;
  };
  for (uint32_t type : kQuantTypes)
    for (const Shape& shape : {Shape{77, 96}, Shape{193, 576}, Shape{64, 1536}, Shape{1536, 576}})
      for (int n : {1, 3, 8}) {
        const int rows = shape.rows, cols = shape.cols, ldo = rows + 2;
        const std::string what = describe(type, rows, cols, n);
        const uint32_t seed = type * 1000 + rows + n;
        const HostWeight gate(type, rows, cols, seed), up(type, rows, cols, seed + 1);
        HostAct act(n, cols, seed + 2);
        const std::vector<float> before = randoms(static_cast<size_t>(n) * ldo, seed + 3, -1.f, 1.f);
        DeviceMemory mem;
        cuda::DevQWeight g_dev, u_dev;
        cuda::DevActQ8 a;
        float* out_dev = nullptr;
        ASSERT_NO_FATAL_FAILURE(upload_weight(gate, mem, &g_dev));
        ASSERT_NO_FATAL_FAILURE(upload_weight(up, mem, &u_dev));
        ASSERT_NO_FATAL_FAILURE(upload_act(act, mem, &a));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(before, &out_dev));
        cuda::matvec_fast_swiglu(g_dev, u_dev, a, n, out_dev, ldo, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        std::vector<float> out;
        ASSERT_NO_FATAL_FAILURE(copy_out(out_dev, before.size(), &out));
        const std::vector<float> got = results(out, before, n, rows, ldo, what);

        const std::vector<float> g = cpu_product(gate, act), u = cpu_product(up, act);
        const std::vector<double> sg = abs_products(gate, act), su = abs_products(up, act);
        std::vector<float> want(g.size());
        std::vector<double> tol(g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          const float silu = g[i] / (1.0f + std::exp(-g[i]));
          want[i] = silu * u[i];
          // g and u each within e = 1e-5 * (their sum of |products|) + 1e-6 of the CPU's, as the
          // plain matvec. silu is 1.1-Lipschitz (its slope lies in [-0.1, 1.1]), so
          // |silu(g')u' - silu(g)u| <= 1.1 e_g (|u| + e_u) + |silu(g)| e_u; plus a few ulps of the
          // result for the two sides' own expf and rounding.
          const double eg = 1e-5 * sg[i] + 1e-6, eu = 1e-5 * su[i] + 1e-6;
          tol[i] = 1.1 * eg * (std::fabs(u[i]) + eu) + std::fabs(silu) * eu + 1e-6 * std::fabs(want[i]);
        }
        expect_close(got, want, tol, 1.0, 0.0, what);
      }
}

// A 4 x 64 Q4_1 weight over 64 static bytes, for the argument checks (never launched).
cuda::DevQWeight unlaunched_weight() {
  alignas(16) static uint8_t quants[64];
  cuda::DevQWeight w;
  w.type = GgmlType::Q4_1;
  w.rows = 4;
  w.cols = 64;
  w.qs = quants;
  w.dm = reinterpret_cast<const __half2*>(quants);
  return w;
}

// The argument checks are host code: they run, and throw before any launch, without a GPU.
TEST(CudaMatvecFast, LaunchersRejectWhatTheKernelsCannotRead) {
  alignas(16) static int8_t act_qs[64];
  const cuda::DevQWeight w = unlaunched_weight();
  cuda::DevActQ8 a;
  a.qs = act_qs;
  a.k = 64;
  float* y = nullptr;
  auto rejects = [&](cuda::DevQWeight bad_w, cuda::DevActQ8 bad_a, int n, int ldy) {
    EXPECT_THROW(cuda::matvec_fast(bad_w, bad_a, n, y, ldy, false, nullptr), std::invalid_argument);
  };
  rejects(w, a, 0, 4);                        // no tokens
  rejects(w, a, cuda::kMatvecTokens + 1, 4);  // too many tokens
  rejects(w, a, 1, 3);                        // output stride below the rows
  cuda::DevQWeight f32 = w;
  f32.type = GgmlType::F32;
  rejects(f32, a, 1, 4);
  cuda::DevQWeight narrow = w;
  narrow.cols = 32;
  rejects(narrow, a, 1, 4);  // cols differ from the activations'
  cuda::DevQWeight misaligned = w;
  misaligned.qs = w.qs + 8;
  rejects(misaligned, a, 1, 4);
  cuda::DevActQ8 misaligned_act = a;
  misaligned_act.qs = act_qs + 4;
  rejects(w, misaligned_act, 1, 4);

  cuda::DevQWeight q8 = w;
  q8.type = GgmlType::Q8_0;
  const cuda::DevQWeight* const weights[3] = {&w, &q8, &w};
  float* const ys[3] = {y, y, y};
  const int ldys[3] = {4, 4, 4};
  EXPECT_THROW(cuda::matvec_fast_multi(weights, ys, ldys, 0, a, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::matvec_fast_multi(weights, ys, ldys, 4, a, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::matvec_fast_multi(weights, ys, ldys, 2, a, 1, nullptr), std::invalid_argument);  // types differ

  cuda::DevQWeight shorter = w;
  shorter.rows = 2;
  EXPECT_THROW(cuda::matvec_fast_swiglu(w, shorter, a, 1, y, 4, nullptr), std::invalid_argument);
}

// --- the fused forms (F32Act): against the unfused kernels run in sequence on the same inputs --

constexpr float kEps = 1e-5f;

// n rows of k random activations, token 0's first block zeros (it quantizes to a zero scale).
std::vector<float> fused_input(int n, int k, uint32_t seed) {
  std::vector<float> x = randoms(static_cast<size_t>(n) * k, seed, -2.f, 2.f);
  for (int i = 0; i < 32; ++i) x[i] = 0.f;
  return x;
}

// What the activations are after the RMSNorm (on the host, for the rounding scale only).
std::vector<float> normed(const std::vector<float>& x, const std::vector<float>& weight, int n, int k) {
  std::vector<float> out(x.size());
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int i = 0; i < k; ++i) ss += static_cast<double>(x[static_cast<size_t>(t) * k + i]) * x[static_cast<size_t>(t) * k + i];
    const double scale = 1.0 / std::sqrt(ss / k + kEps);
    for (int i = 0; i < k; ++i)
      out[static_cast<size_t>(t) * k + i] = static_cast<float>(x[static_cast<size_t>(t) * k + i] * scale * weight[i]);
  }
  return out;
}

// The unfused path's 8-bit activations in device memory: rms_norm_quantize (with a norm weight)
// or quantize_q8 of x.
void reference_act(const float* x, const float* norm, int n, int k, DeviceMemory& mem, cuda::DevActQ8* a) {
  const size_t blocks = static_cast<size_t>(n) * k / 32;
  a->k = k;
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<int8_t>(static_cast<size_t>(n) * k), &a->qs));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<float>(blocks), &a->d));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<float>(blocks), &a->s));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<int32_t>(blocks), &a->isum));
  if (norm)
    cuda::rms_norm_quantize(x, norm, nullptr, n, k, kEps, *a, nullptr);
  else
    cuda::quantize_q8(x, n, k, *a, nullptr);
}

// The fused and unfused kernels compute the same sums in the same order from the same activation
// bits; only the compiler's FMA contraction of a block term may differ: e = 2e-6 * (sum of |products|)
// bounds that with room (48 blocks a row at most, half an ulp each), while one activation quant
// off by one already moves a result by ~1e-5 of that sum. Counts the bit-identical elements.
constexpr double kFusedRel = 2e-6, kFusedAbs = 1e-7;

// A stream for the launches with programmatic dependent launch (pdl), destroyed at scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
};

// A copy of `count` floats at src that a kernel on `st` writes (zeros + src, cuda::add) just
// before: a pdl launch after it that read its input before waiting for that kernel would see zeros.
float* written_just_before(const float* src, size_t count, cudaStream_t st, DeviceMemory& mem) {
  float* out = nullptr;
  mem.copy_in(std::vector<float>(count, 0.f), &out);
  if (out) cuda::add(out, src, count, st);
  return out;
}
int identical(const std::vector<float>& a, const std::vector<float>& b) {
  int same = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) same += std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
  return same;
}

void check_fused_matvec(uint32_t type, int rows, int cols, int n, bool accumulate, bool norm) {
  const std::string what = describe(type, rows, cols, n) + (accumulate ? " accumulate" : "") + (norm ? " norm" : "");
  const uint32_t seed = type * 1000 + rows + cols + n;
  const HostWeight hw(type, rows, cols, seed);
  const std::vector<float> x = fused_input(n, cols, seed + 1), weight = randoms(cols, seed + 2, 0.5f, 1.5f);
  const int ldy = rows + 3;
  const std::vector<float> y0 = randoms(static_cast<size_t>(n) * ldy, seed + 3, -1.f, 1.f);
  DeviceMemory mem;
  cuda::DevQWeight w;
  cuda::DevActQ8 a;
  float *x_dev = nullptr, *norm_dev = nullptr, *y_ref = nullptr, *y_fused = nullptr;
  ASSERT_NO_FATAL_FAILURE(upload_weight(hw, mem, &w));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(x, &x_dev));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(weight, &norm_dev));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(y0, &y_ref));
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(y0, &y_fused));
  ASSERT_NO_FATAL_FAILURE(reference_act(x_dev, norm ? norm_dev : nullptr, n, cols, mem, &a));
  cuda::matvec_fast(w, a, n, y_ref, ldy, accumulate, nullptr);
  const cuda::F32Act in{x_dev, cols, norm ? norm_dev : nullptr, kEps};
  ASSERT_TRUE(cuda::fused_act_fits(in, n)) << what;
  cuda::matvec_fast(w, in, n, y_fused, ldy, accumulate, nullptr);
  // With pdl, its input written by the kernel just before it on the same stream: the same bits.
  Stream st;
  float* y_pdl = nullptr;
  ASSERT_NO_FATAL_FAILURE(mem.copy_in(y0, &y_pdl));
  const cuda::F32Act pdl_in{written_just_before(x_dev, x.size(), st.s, mem), cols, in.norm, kEps};
  cuda::matvec_fast(w, pdl_in, n, y_pdl, ldy, accumulate, st.s, /*pdl=*/true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<float> ref, fused, with_pdl;
  ASSERT_NO_FATAL_FAILURE(copy_out(y_ref, y0.size(), &ref));
  ASSERT_NO_FATAL_FAILURE(copy_out(y_fused, y0.size(), &fused));
  ASSERT_NO_FATAL_FAILURE(copy_out(y_pdl, y0.size(), &with_pdl));
  EXPECT_EQ(with_pdl, fused) << what << ": launched with pdl";
  const std::vector<float> want = results(ref, y0, n, rows, ldy, what), got = results(fused, y0, n, rows, ldy, what);
  std::vector<double> scale = abs_products(hw, HostAct(n, cols, norm ? normed(x, weight, n, cols) : x));
  if (accumulate)
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < rows; ++r) scale[static_cast<size_t>(t) * rows + r] += std::fabs(y0[static_cast<size_t>(t) * ldy + r]);
  expect_close(got, want, scale, kFusedRel, kFusedAbs, what);
  std::printf("[ %s ] %d of %zu bit-identical\n", what.c_str(), identical(got, want), got.size());
}

TEST(CudaMatvecFused, MatvecIsQuantizeThenMatvec) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols;
  };
  for (uint32_t type : kQuantTypes)
    for (const Shape& shape : {Shape{77, 96}, Shape{193, 576}, Shape{64, 1536}})
      for (int n : {1, 3, 8})
        for (bool accumulate : {false, true})
          for (bool norm : {false, true}) ASSERT_NO_FATAL_FAILURE(check_fused_matvec(type, shape.rows, shape.cols, n, accumulate, norm));
}

TEST(CudaMatvecFused, SwigluIsNormQuantizeThenSwiglu) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols;
  };
  for (uint32_t type : kQuantTypes)
    for (const Shape& shape : {Shape{77, 96}, Shape{1536, 576}, Shape{64, 1536}})
      for (int n : {1, 3, 8})
        for (bool norm : {false, true}) {
          const int rows = shape.rows, cols = shape.cols, ldo = rows + 2;
          const std::string what = describe(type, rows, cols, n) + (norm ? " norm" : "");
          const uint32_t seed = type * 1000 + rows + cols + n + norm;
          const HostWeight gate(type, rows, cols, seed), up(type, rows, cols, seed + 1);
          const std::vector<float> x = fused_input(n, cols, seed + 2), weight = randoms(cols, seed + 3, 0.5f, 1.5f);
          const std::vector<float> before = randoms(static_cast<size_t>(n) * ldo, seed + 4, -1.f, 1.f);
          DeviceMemory mem;
          cuda::DevQWeight g_dev, u_dev;
          cuda::DevActQ8 a;
          float *x_dev = nullptr, *norm_dev = nullptr, *ref_dev = nullptr, *fused_dev = nullptr;
          ASSERT_NO_FATAL_FAILURE(upload_weight(gate, mem, &g_dev));
          ASSERT_NO_FATAL_FAILURE(upload_weight(up, mem, &u_dev));
          ASSERT_NO_FATAL_FAILURE(mem.copy_in(x, &x_dev));
          ASSERT_NO_FATAL_FAILURE(mem.copy_in(weight, &norm_dev));
          ASSERT_NO_FATAL_FAILURE(mem.copy_in(before, &ref_dev));
          ASSERT_NO_FATAL_FAILURE(mem.copy_in(before, &fused_dev));
          ASSERT_NO_FATAL_FAILURE(reference_act(x_dev, norm ? norm_dev : nullptr, n, cols, mem, &a));
          cuda::matvec_fast_swiglu(g_dev, u_dev, a, n, ref_dev, ldo, nullptr);
          cuda::matvec_fast_swiglu(g_dev, u_dev, cuda::F32Act{x_dev, cols, norm ? norm_dev : nullptr, kEps}, n, fused_dev, ldo, nullptr);
          Stream st;
          float* pdl_dev = nullptr;
          ASSERT_NO_FATAL_FAILURE(mem.copy_in(before, &pdl_dev));
          const cuda::F32Act pdl_in{written_just_before(x_dev, x.size(), st.s, mem), cols, norm ? norm_dev : nullptr, kEps};
          cuda::matvec_fast_swiglu(g_dev, u_dev, pdl_in, n, pdl_dev, ldo, st.s, /*pdl=*/true);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          std::vector<float> ref, fused, with_pdl;
          ASSERT_NO_FATAL_FAILURE(copy_out(ref_dev, before.size(), &ref));
          ASSERT_NO_FATAL_FAILURE(copy_out(fused_dev, before.size(), &fused));
          ASSERT_NO_FATAL_FAILURE(copy_out(pdl_dev, before.size(), &with_pdl));
          EXPECT_EQ(with_pdl, fused) << what << ": launched with pdl";
          const std::vector<float> want = results(ref, before, n, rows, ldo, what), got = results(fused, before, n, rows, ldo, what);
          // g and u each within e of the unfused kernel's; SwiGLU's error bound as in
          // SwigluIsSiluOfGateTimesUp, with |g| and |u| bounded from the CPU's products (within
          // 1e-5 of the sums of |products| of the kernel's).
          HostAct act(n, cols, norm ? normed(x, weight, n, cols) : x);
          const std::vector<float> g = cpu_product(gate, act), u = cpu_product(up, act);
          const std::vector<double> sg = abs_products(gate, act), su = abs_products(up, act);
          std::vector<double> tol(want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            const double eg = kFusedRel * sg[i] + kFusedAbs, eu = kFusedRel * su[i] + kFusedAbs;
            const double ug = std::fabs(u[i]) + 1e-5 * su[i] + 1e-6;    // |u| of either side, bounded
            const double silu = std::fabs(g[i]) + 1e-5 * sg[i] + 1e-6;  // |silu(g)| <= |g|
            tol[i] = 1.1 * eg * (ug + eu) + silu * eu + 1e-6 * std::fabs(want[i]);
          }
          expect_close(got, want, tol, 1.0, 0.0, what);
          std::printf("[ %s ] %d of %zu bit-identical\n", what.c_str(), identical(got, want), got.size());
        }
}

// A [layers][2][cap][kv_dim] f16 cache as uint16 bits: both sides start from the same bits, so
// every element the launches do not write must stay as it was.
std::vector<uint16_t> cache_bits(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = static_cast<uint16_t>(0x3000 + rng() % 0x0C00);  // f16 values in [0.125, 1)
  return bits;
}

float half_to_float(uint16_t h) {
  const __half v = *reinterpret_cast<const __half*>(&h);
  return __half2float(v);
}

TEST(CudaMatvecFused, QkvRopeIsMultiThenRopeStoreKv) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int n_head, n_head_kv, head_dim, cols;
  };
  const int layers = 2, layer = 1, cap = 20;
  // SmolLM2's attention (9 / 3 heads of 64 over 576), then a small one (heads meet inside a block).
  for (const Shape& sh : {Shape{9, 3, 64, 576}, Shape{5, 1, 32, 96}})
    for (uint32_t type : kQuantTypes)
      for (int n : {1, 3, 8}) {
        const int q_rows = sh.n_head * sh.head_dim, kv_dim = sh.n_head_kv * sh.head_dim, pairs = sh.head_dim / 2;
        const int ldq = q_rows;  // rope_store_kv reads q rows back to back
        const std::string what = describe(type, q_rows, sh.cols, n) + " head_dim " + std::to_string(sh.head_dim);
        const uint32_t seed = type * 1000 + sh.cols + n;
        const HostWeight wq(type, q_rows, sh.cols, seed), wk(type, kv_dim, sh.cols, seed + 1), wv(type, kv_dim, sh.cols, seed + 2);
        const std::vector<float> x = fused_input(n, sh.cols, seed + 3), weight = randoms(sh.cols, seed + 4, 0.5f, 1.5f);
        // Tokens at scattered positions of one cache; RoPE tables of real angles for every position.
        std::vector<int> pos(n);
        std::vector<cuda::TokenKv> tokens(n);
        for (int t = 0; t < n; ++t) pos[t] = (7 * t + 3) % cap;
        std::vector<float> cos_t(static_cast<size_t>(cap) * pairs), sin_t(cos_t.size());
        const std::vector<float> angles = randoms(cos_t.size(), seed + 5, -3.14159f, 3.14159f);
        for (size_t i = 0; i < angles.size(); ++i) cos_t[i] = std::cos(angles[i]), sin_t[i] = std::sin(angles[i]);
        const std::vector<uint16_t> cache0 = cache_bits(static_cast<size_t>(layers) * 2 * cap * kv_dim, seed + 6);
        const std::vector<float> q0 = randoms(static_cast<size_t>(n) * ldq, seed + 7, -1.f, 1.f);

        DeviceMemory mem;
        cuda::DevQWeight w[3];
        cuda::DevActQ8 a;
        float *x_dev, *norm_dev, *cos_dev, *sin_dev, *q_ref, *q_fused, *k_f32, *v_f32;
        int* pos_dev;
        uint16_t *cache_ref, *cache_fused;
        cuda::TokenKv *tokens_ref, *tokens_fused;
        ASSERT_NO_FATAL_FAILURE(upload_weight(wq, mem, &w[0]));
        ASSERT_NO_FATAL_FAILURE(upload_weight(wk, mem, &w[1]));
        ASSERT_NO_FATAL_FAILURE(upload_weight(wv, mem, &w[2]));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(x, &x_dev));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(weight, &norm_dev));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(cos_t, &cos_dev));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(sin_t, &sin_dev));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(pos, &pos_dev));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(q0, &q_ref));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(q0, &q_fused));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<float>(static_cast<size_t>(n) * kv_dim), &k_f32));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(std::vector<float>(static_cast<size_t>(n) * kv_dim), &v_f32));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(cache0, &cache_ref));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(cache0, &cache_fused));
        for (int t = 0; t < n; ++t) tokens[t] = {reinterpret_cast<__half*>(cache_ref), cap, pos[t]};
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(tokens, &tokens_ref));
        for (int t = 0; t < n; ++t) tokens[t].base = reinterpret_cast<__half*>(cache_fused);
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(tokens, &tokens_fused));

        // Unfused: RMSNorm + quantize, the three products, then RoPE and the store.
        ASSERT_NO_FATAL_FAILURE(reference_act(x_dev, norm_dev, n, sh.cols, mem, &a));
        const cuda::DevQWeight* const weights[3] = {&w[0], &w[1], &w[2]};
        float* const ys[3] = {q_ref, k_f32, v_f32};
        const int ldys[3] = {ldq, kv_dim, kv_dim};
        cuda::matvec_fast_multi(weights, ys, ldys, 3, a, n, nullptr);
        cuda::rope_store_kv(q_ref, k_f32, v_f32, n, sh.n_head, sh.n_head_kv, sh.head_dim, pos_dev, cos_dev, sin_dev, tokens_ref, layer,
                            nullptr);
        // Fused: one launch.
        const cuda::RopeStore out{q_fused, ldq, sh.head_dim, pos_dev, cos_dev, sin_dev, tokens_fused, layer};
        cuda::matvec_qkv_rope(w[0], w[1], w[2], cuda::F32Act{x_dev, sh.cols, norm_dev, kEps}, n, out, nullptr);
        // With pdl, its input written by the kernel just before it, into a cache of its own.
        Stream st;
        float* q_pdl = nullptr;
        uint16_t* cache_pdl = nullptr;
        cuda::TokenKv* tokens_pdl = nullptr;
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(q0, &q_pdl));
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(cache0, &cache_pdl));
        for (int t = 0; t < n; ++t) tokens[t].base = reinterpret_cast<__half*>(cache_pdl);
        ASSERT_NO_FATAL_FAILURE(mem.copy_in(tokens, &tokens_pdl));
        const cuda::RopeStore out_pdl{q_pdl, ldq, sh.head_dim, pos_dev, cos_dev, sin_dev, tokens_pdl, layer};
        const cuda::F32Act pdl_in{written_just_before(x_dev, x.size(), st.s, mem), sh.cols, norm_dev, kEps};
        cuda::matvec_qkv_rope(w[0], w[1], w[2], pdl_in, n, out_pdl, st.s, /*pdl=*/true);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;

        std::vector<float> qr, qf;
        ASSERT_NO_FATAL_FAILURE(copy_out(q_ref, q0.size(), &qr));
        ASSERT_NO_FATAL_FAILURE(copy_out(q_fused, q0.size(), &qf));
        std::vector<uint16_t> cr(cache0.size()), cf(cache0.size()), cp(cache0.size());
        ASSERT_EQ(cudaMemcpy(cr.data(), cache_ref, cr.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(cf.data(), cache_fused, cf.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(cp.data(), cache_pdl, cp.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<float> qp;
        ASSERT_NO_FATAL_FAILURE(copy_out(q_pdl, q0.size(), &qp));
        EXPECT_EQ(qp, qf) << what << ": q launched with pdl";
        EXPECT_EQ(cp, cf) << what << ": the cache written with pdl";

        // The rounding scale of a rotated element: both products of its pair (|cos|, |sin| <= 1).
        const HostAct act(n, sh.cols, normed(x, weight, n, sh.cols));
        auto pair_scale = [](const std::vector<double>& s) {
          std::vector<double> out(s.size());
          for (size_t i = 0; i < s.size(); ++i) out[i] = s[i] + s[i ^ 1];  // rows even, so i ^ 1 is the pair's other row
          return out;
        };
        const std::vector<double> sq = pair_scale(abs_products(wq, act)), sk = pair_scale(abs_products(wk, act)),
                                  sv = abs_products(wv, act);
        const std::vector<float> want_q = results(qr, q0, n, q_rows, ldq, what), got_q = results(qf, q0, n, q_rows, ldq, what);
        expect_close(got_q, want_q, sq, kFusedRel, kFusedAbs, what + " q");
        std::printf("[ %s ] q: %d of %zu bit-identical\n", what.c_str(), identical(got_q, want_q), got_q.size());

        // The cache: the written rows within e plus an f16 rounding step, every other element untouched.
        std::vector<char> written(cache0.size(), 0);
        std::vector<float> got_kv, want_kv;
        std::vector<double> scale_kv;
        for (int t = 0; t < n; ++t)
          for (int kv = 0; kv < 2; ++kv)
            for (int c = 0; c < kv_dim; ++c) {
              const size_t i = ((static_cast<size_t>(layer) * 2 + kv) * cap + pos[t]) * kv_dim + c;
              written[i] = 1;
              got_kv.push_back(half_to_float(cf[i]));
              want_kv.push_back(half_to_float(cr[i]));
              const double e = kFusedRel * (kv == 0 ? sk : sv)[static_cast<size_t>(t) * kv_dim + c] + kFusedAbs;
              scale_kv.push_back(e + std::ldexp(std::fabs(want_kv.back()), -10));
            }
        expect_close(got_kv, want_kv, scale_kv, 1.0, 0.0, what + " k/v in the cache");
        int same = 0, untouched_changed = 0;
        for (size_t i = 0; i < cache0.size(); ++i) {
          if (written[i])
            same += cf[i] == cr[i];
          else
            untouched_changed += cf[i] != cache0[i];
        }
        EXPECT_EQ(untouched_changed, 0) << what << ": cache elements outside the tokens' rows were written";
        std::printf("[ %s ] k/v: %d of %zu bit-identical\n", what.c_str(), same, got_kv.size());
      }
}

// The fused launchers' argument checks are host code: they run, and throw before any launch,
// without a GPU.
TEST(CudaMatvecFused, LaunchersRejectWhatTheyCannotRead) {
  alignas(16) static float xs[64];
  const cuda::DevQWeight w = unlaunched_weight();
  const cuda::F32Act in{xs, 64, xs, kEps};
  float* y = nullptr;
  EXPECT_TRUE(cuda::fused_act_fits(in, cuda::kMatvecTokens));
  EXPECT_TRUE(cuda::fused_act_fits({xs, 1536, xs, kEps}, cuda::kMatvecTokens)) << "SmolLM2's FFN width, with a norm";
  EXPECT_FALSE(cuda::fused_act_fits({xs, 4096, xs, kEps}, cuda::kMatvecTokens)) << "8 x 4096 with a norm needs > 48 KiB";
  EXPECT_TRUE(cuda::fused_act_fits({xs, 4096, nullptr, 0.f}, 1));
  auto rejects = [&](cuda::DevQWeight bad_w, cuda::F32Act bad_in, int n, int ldy) {
    EXPECT_THROW(cuda::matvec_fast(bad_w, bad_in, n, y, ldy, false, nullptr), std::invalid_argument);
    EXPECT_THROW(cuda::matvec_fast_swiglu(bad_w, bad_w, bad_in, n, y, ldy, nullptr), std::invalid_argument);
  };
  rejects(w, in, 0, 4);
  rejects(w, in, cuda::kMatvecTokens + 1, 4);
  rejects(w, in, 1, 3);                       // output stride below the rows
  rejects(w, {xs, 48, xs, kEps}, 1, 4);       // k not a multiple of 32
  rejects(w, {nullptr, 64, xs, kEps}, 1, 4);  // no activations
  rejects(w, {xs, 32, xs, kEps}, 1, 4);       // cols differ from k
  cuda::DevQWeight wide = w;
  wide.cols = 8192;
  rejects(wide, {xs, 8192, xs, kEps}, 8, 4);  // beyond a block's shared memory
  cuda::DevQWeight f32 = w;
  f32.type = GgmlType::F32;
  rejects(f32, in, 1, 4);

  // Q/K/V: head_dim 2 makes 4 rows two heads; odd head_dim, rows not whole heads, K and V apart,
  // types apart are refused.
  cuda::RopeStore out{y, 4, 2, nullptr, nullptr, nullptr, nullptr, 0};
  cuda::DevQWeight two = w;
  two.rows = 2;
  cuda::DevQWeight q8 = w;
  q8.type = GgmlType::Q8_0;
  auto qkv_rejects = [&](const cuda::DevQWeight& q, const cuda::DevQWeight& k, const cuda::DevQWeight& v, cuda::RopeStore o) {
    EXPECT_THROW(cuda::matvec_qkv_rope(q, k, v, in, 1, o, nullptr), std::invalid_argument);
  };
  cuda::RopeStore odd = out;
  odd.head_dim = 3;
  qkv_rejects(w, w, w, odd);
  cuda::RopeStore four = out;
  four.head_dim = 4;
  qkv_rejects(w, two, two, four);  // K and V of 2 rows are not whole heads of 4
  qkv_rejects(w, w, two, out);     // K and V differ
  qkv_rejects(w, q8, q8, out);     // types differ
  cuda::RopeStore narrow = out;
  narrow.ldq = 3;
  qkv_rejects(w, w, w, narrow);  // q's stride below its rows
}

}  // namespace
