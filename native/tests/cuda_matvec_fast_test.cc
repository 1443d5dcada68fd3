// The fast quantized matvecs (cuda/matvec_fast.cuh) against the CPU engine's scalar kernels, on
// weights repacked on the host (cuda/repack.h). CUDA builds only; skipped, with the reason, on a
// machine without a usable GPU, except the argument checks (host code). Shapes cross the kernels'
// boundaries: rows in blocks of 4 warps (77 and 193 leave partial blocks), rows of 3, 18 and 48
// quant blocks (some lanes idle, one or two rounds of lanes), 1, 3 and 8 tokens, output strides
// with padding that must stay untouched, and multi launches whose weights meet inside a block.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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
  HostAct(int tokens, int cols, uint32_t seed) : n(tokens), k(cols), x(randoms(static_cast<size_t>(tokens) * cols, seed, -2.f, 2.f)) {
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

// The argument checks are host code: they run, and throw before any launch, without a GPU.
TEST(CudaMatvecFast, LaunchersRejectWhatTheKernelsCannotRead) {
  alignas(16) static uint8_t quants[64];
  alignas(16) static int8_t act_qs[64];
  cuda::DevQWeight w;
  w.type = GgmlType::Q4_1;
  w.rows = 4;
  w.cols = 64;
  w.qs = quants;
  w.dm = reinterpret_cast<const __half2*>(quants);
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
  misaligned.qs = quants + 8;
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

}  // namespace
