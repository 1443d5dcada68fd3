// gemm_fast (cuda/gemm_fast.cuh) against a double-precision product of the dequantized weight, for
// each repacked type, every tiling and several K splits (down to ranges of no steps at all), and
// the automatic plan. Shapes cross every tile boundary: 130 rows (2 past a multiple of 32, 64 and
// 128), token counts that leave partial tiles of 16, 32 and 64, and cols with an odd number of
// 32-column blocks (a final half step of 64 columns); also a strided output, the output head's
// shape, and bit-identical repeated runs. GPU tests skip, with the reason, on a machine without a
// usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gemm_fast.cuh"
#include "cuda/repack.h"
#include "dequant.h"
#include "device.h"
#include "gguf_writer.h"

namespace {

using namespace ctx;
using cuda::GemmFastTiling;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

// A plan to run, or the automatic one (gemm_fast without a plan).
struct Plan {
  std::string name;
  bool automatic;
  cuda::GemmFastPlan plan;
};
// Every tiling unsplit and, on a device with thread-block clusters (split-K), split in 2 and 3 (at
// 2 or 3 steps some ranges are empty), the small tilings also in 8; and the automatic plan.
std::vector<Plan> plans() {
  int clusters = 0;
  if (cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, 0) != cudaSuccess) clusters = 0;
  const std::pair<GemmFastTiling, const char*> tilings[] = {{GemmFastTiling::k128x64, "128x64"},
                                                            {GemmFastTiling::k64x64, "64x64"},
                                                            {GemmFastTiling::k32x32, "32x32"},
                                                            {GemmFastTiling::k32x16, "32x16"}};
  std::vector<Plan> out = {{"auto", true, {}}};
  for (const auto& [tiling, name] : tilings)
    for (int split : {1, 2, 3, 8})
      if ((split == 1 || clusters) && (split < 8 || tiling == GemmFastTiling::k32x32 || tiling == GemmFastTiling::k32x16))
        out.push_back({std::string(name) + " split " + std::to_string(split), false, {tiling, split}});
  return out;
}

std::vector<float> randoms(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  return ctxtest::random_floats(n, rng, lo, hi);
}

// A [rows][cols] weight of a quantized `type` (ggml numbering) holding random values, in the file layout.
struct HostWeight {
  std::string bytes;
  Weight w;
  HostWeight(uint32_t type, int rows, int cols, uint32_t seed) {
    const std::vector<float> f = randoms(static_cast<size_t>(rows) * cols, seed, -0.5f, 0.5f);
    for (int r = 0; r < rows; ++r) bytes += ctxtest::quantize_row(type, f.data() + static_cast<size_t>(r) * cols, cols);
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

// GPU memory for `count` elements, freed when it goes out of scope; p is null if cudaMalloc failed.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A weight repacked (repack.h) and copied to the GPU; ok() says whether that worked.
class GpuWeight {
 public:
  explicit GpuWeight(const Weight& w)
      : qs_(cuda::repacked_qs_bytes(w.type, w.rows, w.cols)), dm_(2 * cuda::repacked_blocks(w.rows, w.cols)) {
    std::vector<uint8_t> qs(cuda::repacked_qs_bytes(w.type, w.rows, w.cols));
    std::vector<uint16_t> dm(2 * cuda::repacked_blocks(w.rows, w.cols));
    cuda::repack_weight(w, qs.data(), dm.data());
    ok_ = qs_.p && dm_.p && cudaMemcpy(qs_.p, qs.data(), qs.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaMemcpy(dm_.p, dm.data(), dm.size() * sizeof(uint16_t), cudaMemcpyHostToDevice) == cudaSuccess;
    q_ = cuda::DevQWeight{w.type, w.rows, w.cols, qs_.p, reinterpret_cast<const __half2*>(dm_.p)};
  }
  bool ok() const { return ok_; }
  const cuda::DevQWeight& q() const { return q_; }

 private:
  DeviceBuffer<uint8_t> qs_;
  DeviceBuffer<uint16_t> dm_;
  cuda::DevQWeight q_;
  bool ok_ = false;
};

constexpr uint32_t kUnwritten = 0xFFFFFFFFu;  // a NaN: what y holds before the GEMM

// y ([n][ldy], every element first set to kUnwritten) = gemm_fast(w, x) with the given plan.
void run_gemm(const cuda::DevQWeight& w, const float* x, int n, int ldy, const Plan& plan, std::vector<float>* y) {
  const size_t count = static_cast<size_t>(n) * ldy;
  DeviceBuffer<float> dy(count);
  ASSERT_NE(dy.p, nullptr);
  ASSERT_EQ(cudaMemset(dy.p, 0xFF, count * sizeof(float)), cudaSuccess);
  if (plan.automatic)
    cuda::gemm_fast(w, x, n, dy.p, ldy, nullptr);
  else
    cuda::gemm_fast(w, x, n, dy.p, ldy, nullptr, plan.plan);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  y->resize(count);
  ASSERT_EQ(cudaMemcpy(y->data(), dy.p, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
}

// The exact product at the rows listed in `rows` ([n][rows.size()]), and the sum of |w * x| over
// each dot product, the scale of its rounding errors.
struct Reference {
  std::vector<int> rows;
  std::vector<double> want, scale;
};
Reference reference(const std::vector<float>& deq, const std::vector<float>& x, int n, int cols, std::vector<int> rows) {
  Reference ref;
  ref.want.resize(static_cast<size_t>(n) * rows.size());
  ref.scale.resize(ref.want.size());
  for (int t = 0; t < n; ++t)
    for (size_t k = 0; k < rows.size(); ++k) {
      const float* wr = deq.data() + static_cast<size_t>(rows[k]) * cols;
      const float* xr = x.data() + static_cast<size_t>(t) * cols;
      double s[4] = {}, a[4] = {};  // four independent sums (cols is a multiple of 32)
      for (int c = 0; c < cols; c += 4)
        for (int i = 0; i < 4; ++i) {
          const double p = static_cast<double>(wr[c + i]) * xr[c + i];
          s[i] += p;
          a[i] += std::fabs(p);
        }
      ref.want[static_cast<size_t>(t) * rows.size() + k] = (s[0] + s[1]) + (s[2] + s[3]);
      ref.scale[static_cast<size_t>(t) * rows.size() + k] = (a[0] + a[1]) + (a[2] + a[3]);
    }
  ref.rows = std::move(rows);
  return ref;
}
std::vector<int> all_rows(int rows) {
  std::vector<int> r(rows);
  for (int i = 0; i < rows; ++i) r[i] = i;
  return r;
}

// Both operands are rounded to f16 (relative error up to 2^-11 each, so under 1e-3 per product in
// the worst case): every checked element within 2e-3 of its sum |w * x|, plus 1e-5. A wrong tile,
// index or dequantization is off by O(1); an element never written is a NaN and fails too.
void expect_matches(const std::vector<float>& y, int n, int ldy, const Reference& ref, const std::string& what) {
  size_t bad = 0;
  std::string first;
  const size_t nr = ref.rows.size();
  for (int t = 0; t < n; ++t)
    for (size_t k = 0; k < nr; ++k) {
      const float got = y[static_cast<size_t>(t) * ldy + ref.rows[k]];
      const double want = ref.want[static_cast<size_t>(t) * nr + k];
      const double tol = 2e-3 * ref.scale[static_cast<size_t>(t) * nr + k] + 1e-5;
      if (!(std::fabs(static_cast<double>(got) - want) <= tol) && bad++ == 0)
        first = "token " + std::to_string(t) + " row " + std::to_string(ref.rows[k]) + " got " + std::to_string(got) + " want " +
                std::to_string(want) + " (tolerance " + std::to_string(tol) + ")";
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements off, the first at " << first;
}

std::string describe(uint32_t type, int n, int rows, int cols, const Plan& plan) {
  return "type " + std::to_string(type) + " n " + std::to_string(n) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " plan " +
         plan.name;
}

TEST(CudaGemmFast, MatchesADoublePrecisionProductWithEveryPlan) {
  SKIP_WITHOUT_GPU();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major >= 9) ASSERT_GT(plans().size(), 5u) << "an sm_90 device without thread-block clusters: split-K untested";
  struct Case {
    uint32_t type;
    int n, rows, cols;
  };
  const Case cases[] = {
      {ctxtest::kTQ4_0, 9, 130, 96},     {ctxtest::kTQ4_1, 9, 130, 96},     {ctxtest::kTQ8_0, 9, 130, 96},
      {ctxtest::kTQ4_0, 17, 192, 160},   {ctxtest::kTQ4_1, 17, 192, 160},   {ctxtest::kTQ8_0, 17, 192, 160},
      {ctxtest::kTQ4_0, 64, 576, 576},   {ctxtest::kTQ4_1, 64, 576, 576},   {ctxtest::kTQ8_0, 64, 576, 576},
      {ctxtest::kTQ4_1, 100, 130, 1536}, {ctxtest::kTQ4_0, 128, 1536, 576}, {ctxtest::kTQ4_1, 128, 576, 1536},
      {ctxtest::kTQ8_0, 129, 192, 1536}, {ctxtest::kTQ4_1, 700, 576, 160},  {ctxtest::kTQ8_0, 700, 130, 576},
      {ctxtest::kTQ4_0, 2048, 192, 96},  {ctxtest::kTQ4_1, 2048, 1536, 96},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const HostWeight hw(c.type, c.rows, c.cols, ++seed);
    const std::vector<float> x = randoms(static_cast<size_t>(c.n) * c.cols, ++seed, -2.f, 2.f);
    const Reference ref = reference(hw.dequantized(), x, c.n, c.cols, all_rows(c.rows));
    const GpuWeight gw(hw.w);
    ASSERT_TRUE(gw.ok());
    DeviceBuffer<float> dx(x.size());
    ASSERT_NE(dx.p, nullptr);
    ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    for (const Plan& plan : plans()) {
      std::vector<float> y;
      ASSERT_NO_FATAL_FAILURE(run_gemm(gw.q(), dx.p, c.n, c.rows, plan, &y));
      expect_matches(y, c.n, c.rows, ref, describe(c.type, c.n, c.rows, c.cols, plan));
    }
  }
}

TEST(CudaGemmFast, WritesAStridedOutputAndNothingPastTheRows) {
  SKIP_WITHOUT_GPU();
  const int n = 100, rows = 130, cols = 160, ldy = rows + 13;  // rows of y start unaligned
  for (uint32_t type : {ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0}) {
    const HostWeight hw(type, rows, cols, 200 + type);
    const std::vector<float> x = randoms(static_cast<size_t>(n) * cols, 300 + type, -2.f, 2.f);
    const Reference ref = reference(hw.dequantized(), x, n, cols, all_rows(rows));
    const GpuWeight gw(hw.w);
    ASSERT_TRUE(gw.ok());
    DeviceBuffer<float> dx(x.size());
    ASSERT_NE(dx.p, nullptr);
    ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    for (const Plan& plan : plans()) {
      std::vector<float> y;
      ASSERT_NO_FATAL_FAILURE(run_gemm(gw.q(), dx.p, n, ldy, plan, &y));
      const std::string what = describe(type, n, rows, cols, plan) + " ldy " + std::to_string(ldy);
      expect_matches(y, n, ldy, ref, what);
      size_t touched = 0;
      for (int t = 0; t < n; ++t)
        for (int r = rows; r < ldy; ++r) {
          uint32_t bits;
          std::memcpy(&bits, &y[static_cast<size_t>(t) * ldy + r], sizeof bits);
          touched += bits != kUnwritten;
        }
      EXPECT_EQ(touched, 0u) << what << ": elements past the rows were written";
    }
  }
}

TEST(CudaGemmFast, MatchesAtTheOutputHeadShape) {
  SKIP_WITHOUT_GPU();
  // SmolLM2-135M's Q8_0 output matrix for 32 tokens; every 7th row and the last 130 are checked
  // (every row tile of every plan has some).
  const int n = 32, rows = 49152, cols = 576;
  const HostWeight hw(ctxtest::kTQ8_0, rows, cols, 400);
  const std::vector<float> x = randoms(static_cast<size_t>(n) * cols, 401, -2.f, 2.f);
  std::vector<int> checked;
  for (int r = 0; r < rows; ++r)
    if (r % 7 == 0 || r >= rows - 130) checked.push_back(r);
  const Reference ref = reference(hw.dequantized(), x, n, cols, checked);
  const GpuWeight gw(hw.w);
  ASSERT_TRUE(gw.ok());
  DeviceBuffer<float> dx(x.size());
  ASSERT_NE(dx.p, nullptr);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (const Plan& plan : plans()) {
    std::vector<float> y;
    ASSERT_NO_FATAL_FAILURE(run_gemm(gw.q(), dx.p, n, rows, plan, &y));
    expect_matches(y, n, rows, ref, describe(ctxtest::kTQ8_0, n, rows, cols, plan));
  }
}

TEST(CudaGemmFast, RepeatedRunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int n = 700, rows = 576, cols = 576;
  const HostWeight hw(ctxtest::kTQ4_1, rows, cols, 500);
  const std::vector<float> x = randoms(static_cast<size_t>(n) * cols, 501, -2.f, 2.f);
  const GpuWeight gw(hw.w);
  ASSERT_TRUE(gw.ok());
  DeviceBuffer<float> dx(x.size());
  ASSERT_NE(dx.p, nullptr);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (const Plan& plan : plans()) {
    std::vector<float> first, second;
    ASSERT_NO_FATAL_FAILURE(run_gemm(gw.q(), dx.p, n, rows, plan, &first));
    ASSERT_NO_FATAL_FAILURE(run_gemm(gw.q(), dx.p, n, rows, plan, &second));
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0) << plan.name;
  }
}

// Argument checks come before any CUDA call, so this runs on any machine. The pointers are never
// dereferenced.
TEST(CudaGemmFast, RefusesWhatItCannotTake) {
  alignas(16) static uint8_t qs[64];
  alignas(16) static float x[64];
  float y[64];
  const auto* dm = reinterpret_cast<const __half2*>(qs);
  const cuda::DevQWeight good{GgmlType::Q4_1, 2, 32, qs, dm};
  EXPECT_TRUE(cuda::gemm_fast_supports(good));
  cuda::DevQWeight bad = good;
  bad.type = GgmlType::F16;
  EXPECT_FALSE(cuda::gemm_fast_supports(bad));
  bad = good;
  bad.cols = 48;
  EXPECT_FALSE(cuda::gemm_fast_supports(bad));
  bad = good;
  bad.qs = qs + 4;
  EXPECT_FALSE(cuda::gemm_fast_supports(bad));
  EXPECT_THROW(cuda::gemm_fast(bad, x, 1, y, 2, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::gemm_fast(good, x, 1, y, 1, nullptr), std::invalid_argument);      // ldy below rows
  EXPECT_THROW(cuda::gemm_fast(good, x + 1, 1, y, 2, nullptr), std::invalid_argument);  // x unaligned
  EXPECT_THROW(cuda::gemm_fast(good, x, -1, y, 2, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::gemm_fast(good, x, 1, y, 2, nullptr, {GemmFastTiling::k32x16, 0}), std::invalid_argument);
  EXPECT_THROW(cuda::gemm_fast(good, x, 1, y, 2, nullptr, {GemmFastTiling::k32x16, 9}), std::invalid_argument);
}

// Host code: the automatic plan splits K into 1..8 ranges, none of them empty, and splits only
// what is too small to fill the SMs (here, not the prefill shapes of 2048 tokens), and only with
// thread-block clusters.
TEST(CudaGemmFast, PlansNonEmptyKRanges) {
  for (int n : {1, 9, 16, 17, 32, 64, 100, 128, 129, 512, 700, 2048})
    for (int rows : {130, 192, 576, 1536, 49152})
      for (int cols : {32, 96, 160, 576, 1536}) {
        EXPECT_EQ(cuda::gemm_fast_plan(n, rows, cols, 108, false).split_k, 1);
        const cuda::GemmFastPlan plan = cuda::gemm_fast_plan(n, rows, cols, 132, true);
        const int steps = (cols / 32 + 1) / 2, per_split = (steps + plan.split_k - 1) / plan.split_k;
        EXPECT_GE(plan.split_k, 1);
        EXPECT_LE(plan.split_k, cuda::kGemmFastMaxSplit);
        EXPECT_LT((plan.split_k - 1) * per_split, steps) << "n " << n << " " << rows << "x" << cols << ": an empty range";
        if (n == 2048 && rows >= 576) EXPECT_EQ(plan.split_k, 1) << rows << "x" << cols;
      }
}

}  // namespace
