// The fast attention kernels (cuda/attention_fast.cu) against a double-precision reference and
// against the simple attention() kernel, on the same inputs (CUDA builds only; skipped, with the
// reason, on a machine without a usable GPU). Each case runs the work list of plan_attention with:
//   simple:  attention() on every work item;
//   gqa:     attention_gqa() on every work item (decode splits and prefill tiles alike);
//   tc:      attention_prefill_tc() on every work item;
//   mixed:   the backend's split: attention_gqa() on the items of at most kSplitTokens queries,
//            attention_prefill_tc() on the rest;
// then attention_combine(). The cache has two layers and the kernels read layer 1: layer 0 and
// the rows no query may see (past the last query) hold NaN, as do the partial buffers before each
// run, so a wrong layer offset, a read past a range or a partial row left unwritten shows as NaN.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_fast.cuh"
#include "cuda/kernels.cuh"
#include "device.h"
#include "fp16.h"

namespace {

using namespace ctx;
using namespace ctx::cuda;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

#define ASSERT_CUDA(call)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr int kLayers = 2, kLayer = 1;  // the kernels read layer 1 of a two-layer cache
constexpr uint16_t kNanHalf = 0x7E00;
constexpr size_t kMaxParts = static_cast<size_t>(512) * kPartsPerToken;  // the forward pass's budget for 512 tokens

// Device allocations of one check, freed when it ends (also on a failed ASSERT).
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  // nullptr when cudaMalloc fails.
  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // A device copy of h; nullptr when allocating or copying fails.
  template <typename T>
  T* upload(const std::vector<T>& h) {
    T* p = alloc<T>(h.size());
    if (p && cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

std::vector<float> randoms(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// One sequence's attention inputs: q [n][n_head * d] in [-2, 2]; layer kLayer's K in [-2, 2] and
// V in [-1, 1], f16 bits [cap][kv_dim]; rows from pos0 + n on are NaN.
struct Problem {
  int n, pos0, n_head, n_head_kv, d, cap;
  std::vector<float> q;
  std::vector<uint16_t> k, v;
  int kv_dim() const { return n_head_kv * d; }
};

Problem make_problem(int n, int pos0, int n_head, int n_head_kv, int d, uint32_t seed) {
  Problem p{n, pos0, n_head, n_head_kv, d, pos0 + n + 3, {}, {}, {}};
  p.q = randoms(static_cast<size_t>(n) * n_head * d, seed, -2.f, 2.f);
  const size_t used = static_cast<size_t>(pos0 + n) * p.kv_dim(), total = static_cast<size_t>(p.cap) * p.kv_dim();
  const std::vector<float> kf = randoms(used, seed + 1, -2.f, 2.f), vf = randoms(used, seed + 2, -1.f, 1.f);
  p.k.assign(total, kNanHalf);
  p.v.assign(total, kNanHalf);
  for (size_t i = 0; i < used; ++i) p.k[i] = fp32_to_fp16(kf[i]), p.v[i] = fp32_to_fp16(vf[i]);
  return p;
}

// Causal GQA attention in double precision (cuda_kernels_test.cc's reference_attention, with an
// optional key list): query i (position pos0 + i) over keys 0..pos0 + i, or over the keys of
// `list` that are <= pos0 + i.
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, int n,
                                       int pos0, int n_head, int n_head_kv, int d, const std::vector<int>* list = nullptr) {
  const int kv_dim = n_head_kv * d, group = n_head / n_head_kv;
  std::vector<float> out(static_cast<size_t>(n) * n_head * d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int i = 0; i < n; ++i) {
    std::vector<int> keys;
    if (list) {
      for (int key : *list)
        if (key <= pos0 + i) keys.push_back(key);
    } else {
      keys.resize(pos0 + i + 1);
      std::iota(keys.begin(), keys.end(), 0);
    }
    for (int h = 0; h < n_head; ++h) {
      const int kvh = h / group;
      std::vector<double> s(keys.size());
      double m = -1e300;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c)
          dot += static_cast<double>(q[(static_cast<size_t>(i) * n_head + h) * d + c]) *
                 fp16_to_fp32(k[static_cast<size_t>(keys[j]) * kv_dim + kvh * d + c]);
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (double& x : s) l += (x = std::exp(x - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += s[j] * fp16_to_fp32(v[static_cast<size_t>(keys[j]) * kv_dim + kvh * d + c]);
        out[(static_cast<size_t>(i) * n_head + h) * d + c] = static_cast<float>(o / l);
      }
    }
  }
  return out;
}

// Error bounds per output element ([query][head][dim]).
//   decode (gqa): f32-level results like attention() (q and P as f16 hi + lo pairs): 2e-5, as the
//     simple kernel's own test.
//   tc against the reference on f16-rounded q (what the tensor cores multiply): P is rounded to
//     f16 for P.V while l sums the f32 weights, so each weight in the numerator is off by at most
//     2^-11 of itself (2^-25 absolute below f16's normal range); l >= 1 (the largest weight is 1)
//     and |v| <= 1, so the output moves by at most 2^-11 + keys * 2^-25 (about 5e-4). Plus 2e-5
//     for the f32 sums and exp2f.
//   tc against the exact reference and the simple kernel: rounding q to f16 moves each score by
//     at most delta = scale * sum_c |q_c - f16(q_c)| * max|k| (max|k| = 2), each normalised weight
//     by a factor within e^(+-2 delta), so the output by at most (e^(2 delta) - 1) * max|v| more.
constexpr double kDecodeTolerance = 2e-5;

std::vector<double> tc_bound(const Problem& p, const std::vector<int>& keys_seen, bool q_rounding) {
  std::vector<double> bound(p.q.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  for (int i = 0; i < p.n; ++i)
    for (int h = 0; h < p.n_head; ++h) {
      const float* qr = &p.q[(static_cast<size_t>(i) * p.n_head + h) * p.d];
      double delta = 0;
      for (int c = 0; c < p.d; ++c) delta += std::fabs(static_cast<double>(qr[c]) - round_fp16(qr[c]));
      delta *= scale * 2.0;
      const double b = std::ldexp(1.0, -11) + keys_seen[i] * std::ldexp(1.0, -25) + 2e-5 + (q_rounding ? std::expm1(2 * delta) : 0.0);
      std::fill_n(bound.begin() + (static_cast<size_t>(i) * p.n_head + h) * p.d, p.d, b);
    }
  return bound;
}

// |got - want| <= bound everywhere, and every element finite; reports the worst element.
void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i];
      return;
    }
    const double excess = std::fabs(static_cast<double>(got[i]) - want[i]) - bound[i];
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " got " << got[worst] << " want " << want[worst] << " bound "
                               << bound[worst];
}

enum class Variant { kSimple, kGqa, kTc, kMixed };
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kSimple:
      return "simple";
    case Variant::kGqa:
      return "gqa";
    case Variant::kTc:
      return "tc";
    case Variant::kMixed:
      return "mixed";
  }
  return "?";
}

// A problem in GPU memory: the two-layer cache (layer 0 all NaN), q, and the partial and output buffers.
struct DeviceProblem {
  const Problem* p = nullptr;
  __half* cache = nullptr;
  float *q = nullptr, *part_o = nullptr, *part_ml = nullptr, *out = nullptr;
};

void upload_problem(DeviceArena& arena, const Problem& p, DeviceProblem* dp) {
  const size_t layer_halves = 2 * static_cast<size_t>(p.cap) * p.kv_dim();
  std::vector<uint16_t> cache(kLayers * layer_halves, kNanHalf);
  std::copy(p.k.begin(), p.k.end(), cache.begin() + kLayer * layer_halves);
  std::copy(p.v.begin(), p.v.end(), cache.begin() + kLayer * layer_halves + layer_halves / 2);
  dp->p = &p;
  dp->cache = reinterpret_cast<__half*>(arena.upload(cache));
  dp->q = arena.upload(p.q);
  dp->part_o = arena.alloc<float>(kMaxParts * p.n_head * p.d);
  dp->part_ml = arena.alloc<float>(kMaxParts * p.n_head * 2);
  dp->out = arena.alloc<float>(p.q.size());
  ASSERT_TRUE(dp->cache && dp->q && dp->part_o && dp->part_ml && dp->out) << "device allocation or copy failed";
}

// Runs `works` (host list; their `base` is dp.cache) with the variant, then attention_combine;
// `out` receives [n][n_head * d].
void run_variant(Variant variant, DeviceArena& arena, const DeviceProblem& dp, std::vector<AttnWork> works,
                 const std::vector<AttnCombine>& comb, std::vector<float>* out) {
  const Problem& p = *dp.p;
  int n_decode = 0;
  if (variant == Variant::kMixed)
    n_decode = static_cast<int>(std::stable_partition(works.begin(), works.end(), [](const AttnWork& w) { return w.nq <= kSplitTokens; }) -
                                works.begin());
  const AttnWork* d_works = arena.upload(works);
  const AttnCombine* d_comb = arena.upload(comb);
  ASSERT_TRUE(d_works && d_comb) << "device allocation or copy failed";
  ASSERT_CUDA(cudaMemset(dp.part_o, 0xFF, kMaxParts * p.n_head * p.d * sizeof(float)));  // NaN
  ASSERT_CUDA(cudaMemset(dp.part_ml, 0xFF, kMaxParts * p.n_head * 2 * sizeof(float)));
  ASSERT_CUDA(cudaMemset(dp.out, 0xFF, p.q.size() * sizeof(float)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const int n_works = static_cast<int>(works.size());
  auto run = [&](decltype(&ctx::cuda::attention) kernel, const AttnWork* w, int count) {
    kernel(dp.q, w, count, p.n_head, p.n_head_kv, p.d, kLayer, scale, dp.part_o, dp.part_ml, nullptr);
  };
  switch (variant) {
    case Variant::kSimple:
      run(&ctx::cuda::attention, d_works, n_works);
      break;
    case Variant::kGqa:
      run(&attention_gqa, d_works, n_works);
      break;
    case Variant::kTc:
      run(&attention_prefill_tc, d_works, n_works);
      break;
    case Variant::kMixed:
      run(&attention_gqa, d_works, n_decode);
      run(&attention_prefill_tc, d_works + n_decode, n_works - n_decode);
      break;
  }
  attention_combine(dp.part_o, dp.part_ml, d_comb, static_cast<int>(comb.size()), p.n_head, p.d, dp.out, nullptr);
  ASSERT_CUDA(cudaGetLastError());
  ASSERT_CUDA(cudaDeviceSynchronize());
  out->resize(p.q.size());
  ASSERT_CUDA(cudaMemcpy(out->data(), dp.out, out->size() * sizeof(float), cudaMemcpyDeviceToHost));
}

// Runs every variant on the works and checks each against the references and the simple kernel.
// `keys_seen[i]`: how many keys query i sees; `list`: the key list, if the works use one.
void check_variants(DeviceArena& arena, const DeviceProblem& dp, const std::vector<AttnWork>& works, const std::vector<AttnCombine>& comb,
                    const std::vector<int>& keys_seen, const std::string& what, const std::vector<int>* list = nullptr) {
  const Problem& p = *dp.p;
  const std::vector<float> want = reference_attention(p.q, p.k, p.v, p.n, p.pos0, p.n_head, p.n_head_kv, p.d, list);
  std::vector<float> q16(p.q.size());
  for (size_t i = 0; i < q16.size(); ++i) q16[i] = round_fp16(p.q[i]);
  const std::vector<float> want_q16 = reference_attention(q16, p.k, p.v, p.n, p.pos0, p.n_head, p.n_head_kv, p.d, list);
  const std::vector<double> decode_bound(want.size(), kDecodeTolerance);
  const std::vector<double> tc_tight = tc_bound(p, keys_seen, false), tc_loose = tc_bound(p, keys_seen, true);

  std::vector<float> simple;
  ASSERT_NO_FATAL_FAILURE(run_variant(Variant::kSimple, arena, dp, works, comb, &simple));
  for (Variant v : {Variant::kGqa, Variant::kTc, Variant::kMixed}) {
    const std::string name = what + " [" + variant_name(v) + "]";
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(run_variant(v, arena, dp, works, comb, &got));
    if (v == Variant::kGqa) {
      expect_within(got, want, decode_bound, name + " vs reference");
      expect_within(got, simple, decode_bound, name + " vs simple kernel");
    } else {
      expect_within(got, want_q16, tc_tight, name + " vs reference on f16 q");
      expect_within(got, want, tc_loose, name + " vs reference");
      expect_within(got, simple, tc_loose, name + " vs simple kernel");
    }
  }
}

// One slice of n queries at pos0, planned as the forward pass plans it.
void check_planned(int n, int pos0, int n_head, int n_head_kv, int d, const std::string& what) {
  SCOPED_TRACE(what);
  const Problem p = make_problem(n, pos0, n_head, n_head_kv, d, 1000u * n + pos0 + 7u * n_head + d);
  DeviceArena arena;
  DeviceProblem dp;
  ASSERT_NO_FATAL_FAILURE(upload_problem(arena, p, &dp));
  const AttnSlice slice{dp.cache, p.cap, 0, n, pos0};
  std::vector<AttnWork> works(kMaxParts);
  std::vector<AttnCombine> comb(n);
  works.resize(plan_attention(&slice, 1, works.data(), comb.data(), static_cast<int>(kMaxParts)));
  std::vector<int> keys_seen(n);
  for (int i = 0; i < n; ++i) keys_seen[i] = pos0 + i + 1;
  check_variants(arena, dp, works, comb, keys_seen, what);
}

std::string shape_name(int n, int pos0, int n_head, int n_head_kv, int d) {
  return std::to_string(n) + " queries at " + std::to_string(pos0) + ", heads " + std::to_string(n_head) + "/" + std::to_string(n_head_kv) +
         ", d " + std::to_string(d);
}

TEST(CudaAttentionFast, KernelTestCasesMatchTheReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int n, pos0, n_head, n_head_kv, d;
    const char* what;
  };
  // cuda_kernels_test.cc AttentionMatchesADoublePrecisionReference.
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
  for (const Case& c : cases) check_planned(c.n, c.pos0, c.n_head, c.n_head_kv, c.d, c.what);
}

TEST(CudaAttentionFast, DecodeGroupOf3Head64MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  // SmolLM2-135M's shape: 9 query heads over 3 KV heads, d 64. `context`: the keys the first query sees.
  const int contexts[] = {1, 63, 64, 65, 1000, 20000, 131072};
  for (size_t i = 0; i < std::size(contexts); ++i)
    for (int n : {1, 2 + static_cast<int>(i % 3)})
      check_planned(n, contexts[i] - 1, 9, 3, 64, "decode, context " + std::to_string(contexts[i]) + ", " + std::to_string(n) + " queries");
}

TEST(CudaAttentionFast, PrefillTilesMatchTheReference) {
  SKIP_WITHOUT_GPU();
  // Groups of 1, 3, 8 (two KV heads: two blocks of 4 query heads each) and 7 (blocks of 4 and 3).
  struct Heads {
    int n_head, n_head_kv;
  };
  const Heads heads[] = {{4, 4}, {9, 3}, {16, 2}, {7, 1}};
  for (const Heads& h : heads)
    for (int d : {32, 64, 128})
      for (int pos0 : {0, 200})
        for (int n : {1, 16, 100}) check_planned(n, pos0, h.n_head, h.n_head_kv, d, shape_name(n, pos0, h.n_head, h.n_head_kv, d));
  check_planned(50, 100, 9, 3, 96, shape_name(50, 100, 9, 3, 96));
  for (int pos0 : {0, 200}) {
    check_planned(700, pos0, 9, 3, 64, shape_name(700, pos0, 9, 3, 64));
    check_planned(700, pos0, 16, 2, 128, shape_name(700, pos0, 16, 2, 128));
  }
  check_planned(700, 0, 4, 4, 32, shape_name(700, 0, 4, 4, 32));
}

TEST(CudaAttentionFast, WorkItemsThePlanDoesNotMakeYet) {
  SKIP_WITHOUT_GPU();
  const int pos0 = 3000, n_head = 9, n_head_kv = 3, d = 64;
  {
    // 40 queries in one work item (several passes of each kernel), keys [0, pos0 + 40).
    const int n = 40;
    const Problem p = make_problem(n, pos0, n_head, n_head_kv, d, 77);
    DeviceArena arena;
    DeviceProblem dp;
    ASSERT_NO_FATAL_FAILURE(upload_problem(arena, p, &dp));
    const std::vector<AttnWork> works = {{dp.cache, p.cap, 0, n, pos0, 0, pos0 + n, 0, nullptr, 0}};
    std::vector<AttnCombine> comb(n);
    std::vector<int> keys_seen(n);
    for (int i = 0; i < n; ++i) comb[i] = {i, 0, 1}, keys_seen[i] = pos0 + i + 1;
    check_variants(arena, dp, works, comb, keys_seen, "one work item of 40 queries");
  }
  {
    // Sparse key lists for 3 queries (positions pos0 .. pos0 + 2), in three works: a shuffled
    // subset of the keys before pos0 in two works (the second's list pointer starts mid-list, as
    // its key offsets start at key_begin), then keys pos0 + 2 and pos0 + 1 only, so query 0 sees
    // none of the third work's keys and query 1 one. Layer 0's lists name a NaN row.
    const int n = 3;
    const Problem p = make_problem(n, pos0, n_head, n_head_kv, d, 78);
    DeviceArena arena;
    DeviceProblem dp;
    ASSERT_NO_FATAL_FAILURE(upload_problem(arena, p, &dp));
    std::mt19937 rng(5);
    std::vector<int> list;
    for (int key = 0; key < pos0; ++key)
      if (rng() % 3 == 0) list.push_back(key);
    std::shuffle(list.begin(), list.end(), rng);
    const int len_a = static_cast<int>(list.size()), half = len_a / 2 + 5;
    list.push_back(pos0 + 2);
    list.push_back(pos0 + 1);
    const int stride = static_cast<int>(list.size());
    std::vector<int32_t> lists(2 * static_cast<size_t>(stride), p.cap - 1);
    std::copy(list.begin(), list.end(), lists.begin() + stride);
    const int32_t* d_lists = arena.upload(lists);
    ASSERT_NE(d_lists, nullptr);
    const std::vector<AttnWork> works = {
        {dp.cache, p.cap, 0, n, pos0, 0, half, 0, d_lists, stride},
        {dp.cache, p.cap, 0, n, pos0, half, len_a, n, d_lists + half, stride},
        {dp.cache, p.cap, 0, n, pos0, 0, 2, 2 * n, d_lists + len_a, stride},
    };
    std::vector<AttnCombine> comb(n);
    std::vector<int> keys_seen(n);
    for (int i = 0; i < n; ++i) {
      comb[i] = {i, n, 3};
      keys_seen[i] = static_cast<int>(std::count_if(list.begin(), list.end(), [&](int k) { return k <= pos0 + i; }));
    }
    check_variants(arena, dp, works, comb, keys_seen, "sparse key lists", &list);
  }
}

// Not a check: prints each kernel's time on SmolLM2-135M's shape (one layer), for the benchmark
// notes. K/V hold a constant (timing only).
// The block-wide merge against attention_combine on random partials: 1, 3, 37 and 128 splits,
// strided rows, splits a token may not see (m = -inf), head dims 32, 64, 96 and 128.
TEST(CudaAttentionFast, WideCombineMatchesTheSimpleMerge) {
  SKIP_WITHOUT_GPU();
  for (int d : {32, 64, 96, 128})
    for (int splits : {1, 3, 37, 128}) {
      const int n = 3, n_head = 5, rows = n * splits;
      std::vector<float> part_o = randoms(static_cast<size_t>(rows) * n_head * d, 50 + d + splits, -3.f, 3.f);
      std::vector<float> ml = randoms(static_cast<size_t>(rows) * n_head * 2, 60 + d + splits, 0.f, 1.f);
      std::mt19937 rng(70 + d + splits);
      for (size_t r = 0; r < static_cast<size_t>(rows) * n_head; ++r) {
        ml[2 * r] = std::uniform_real_distribution<float>(-20.f, 5.f)(rng);       // m
        ml[2 * r + 1] = std::uniform_real_distribution<float>(0.5f, 300.f)(rng);  // l
        if (splits > 1 && rng() % 5 == 0) ml[2 * r] = -INFINITY, ml[2 * r + 1] = 0.f;
      }
      for (int h = 0; h < n_head; ++h)
        ml[2 * static_cast<size_t>(h)] = 1.f, ml[2 * static_cast<size_t>(h) + 1] = 2.f;  // every token sees a key
      // Token t's split s is row t + s * n (the decode plan's stride).
      std::vector<AttnCombine> comb(n);
      for (int t = 0; t < n; ++t) comb[t] = {t, n, splits};
      for (int t = 1; t < n; ++t)
        for (int h = 0; h < n_head; ++h)
          ml[(static_cast<size_t>(t) * n_head + h) * 2] = 0.5f, ml[(static_cast<size_t>(t) * n_head + h) * 2 + 1] = 1.f;
      DeviceArena arena;
      const float* d_o = arena.upload(part_o);
      const float* d_ml = arena.upload(ml);
      const AttnCombine* d_comb = arena.upload(comb);
      float* simple = arena.alloc<float>(static_cast<size_t>(n) * n_head * d);
      float* wide = arena.alloc<float>(static_cast<size_t>(n) * n_head * d);
      ASSERT_TRUE(d_o && d_ml && d_comb && simple && wide) << "device allocation or copy failed";
      attention_combine(d_o, d_ml, d_comb, n, n_head, d, simple, nullptr);
      attention_combine_wide(d_o, d_ml, d_comb, n, n_head, d, wide, nullptr);
      ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<float> a(static_cast<size_t>(n) * n_head * d), b(a.size());
      ASSERT_CUDA(cudaMemcpy(a.data(), simple, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
      ASSERT_CUDA(cudaMemcpy(b.data(), wide, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(b[i], a[i], 1e-5f * (1.f + std::fabs(a[i]))) << "d " << d << " splits " << splits << " element " << i;
    }
}

// attention_gqa without part_ml (the fused-decode kernel set, a decode step planned with one
// split): the output itself, the bits the partials and attention_combine_wide give (up to the sign
// of a zero, which == ignores). Three single-token sequences, one of them 256 keys long (the
// longest with one split), over one cache.
TEST(CudaAttentionFast, OneSplitDecodeWritesTheMergedOutput) {
  SKIP_WITHOUT_GPU();
  for (int d : {32, 64, 128}) {
    const std::string what = "d " + std::to_string(d);
    const Problem p = make_problem(3, 253, 9, 3, d, 900u + d);  // q for 3 tokens, keys 0..255
    DeviceArena arena;
    DeviceProblem dp;
    ASSERT_NO_FATAL_FAILURE(upload_problem(arena, p, &dp));
    const int pos0[3] = {0, 100, 255};
    std::vector<AttnSlice> slices;
    for (int t = 0; t < 3; ++t) slices.push_back({dp.cache, p.cap, t, 1, pos0[t]});
    std::vector<AttnWork> works(kMaxParts);
    std::vector<AttnCombine> comb(3);
    int bucket = 0;
    works.resize(plan_decode_bucketed(slices.data(), 3, works.data(), comb.data(), static_cast<int>(kMaxParts), &bucket));
    ASSERT_EQ(bucket, 1) << what;
    ASSERT_EQ(works.size(), 3u) << what;
    const AttnWork* d_works = arena.upload(works);
    const AttnCombine* d_comb = arena.upload(comb);
    float* direct = arena.alloc<float>(p.q.size());
    ASSERT_TRUE(d_works && d_comb && direct) << "device allocation or copy failed";
    ASSERT_CUDA(cudaMemset(direct, 0xFF, p.q.size() * sizeof(float)));  // NaN
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    attention_gqa(dp.q, d_works, 3, p.n_head, p.n_head_kv, d, kLayer, scale, dp.part_o, dp.part_ml, nullptr);
    attention_combine_wide(dp.part_o, dp.part_ml, d_comb, 3, p.n_head, d, dp.out, nullptr);
    attention_gqa(dp.q, d_works, 3, p.n_head, p.n_head_kv, d, kLayer, scale, direct, nullptr, nullptr);
    ASSERT_CUDA(cudaGetLastError());
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<float> merged(p.q.size()), got(p.q.size());
    ASSERT_CUDA(cudaMemcpy(merged.data(), dp.out, merged.size() * sizeof(float), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(got.data(), direct, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], merged[i]) << what << ", element " << i;
  }
}

TEST(CudaAttentionFast, PrintsTimings) {
  SKIP_WITHOUT_GPU();
  const int n_head = 9, n_head_kv = 3, d = 64, kv_dim = n_head_kv * d, max_n = 512, cap = 131072 + max_n;
  DeviceArena arena;
  __half* cache = arena.alloc<__half>(2 * static_cast<size_t>(cap) * kv_dim);
  float* q = arena.alloc<float>(static_cast<size_t>(max_n) * n_head * d);
  float* part_o = arena.alloc<float>(kMaxParts * n_head * d);
  float* part_ml = arena.alloc<float>(kMaxParts * n_head * 2);
  AttnWork* d_works = arena.alloc<AttnWork>(kMaxParts);
  ASSERT_TRUE(cache && q && part_o && part_ml && d_works) << "device allocation failed";
  ASSERT_CUDA(cudaMemset(cache, 0x3C, 2 * static_cast<size_t>(cap) * kv_dim * sizeof(__half)));  // halves of about 1.06
  ASSERT_CUDA(cudaMemset(q, 0x3C, static_cast<size_t>(max_n) * n_head * d * sizeof(float)));     // floats of about 0.011
  cudaEvent_t start, stop;
  ASSERT_CUDA(cudaEventCreate(&start));
  ASSERT_CUDA(cudaEventCreate(&stop));
  struct Shape {
    int n, pos0;
    const char* what;
  };
  const Shape shapes[] = {{1, 131071, "decode, 1 token at 128K"},
                          {4, 131068, "decode, 4 tokens at 128K"},
                          {1, 16383, "decode, 1 token at 16K"},
                          {512, 0, "prefill 512 at 0"},
                          {512, 16384, "prefill 512 at 16K"}};
  const float scale = 0.125f;
  for (const Shape& s : shapes) {
    const AttnSlice slice{cache, cap, 0, s.n, s.pos0};
    std::vector<AttnWork> works(kMaxParts);
    std::vector<AttnCombine> comb(s.n);
    const int n_works = plan_attention(&slice, 1, works.data(), comb.data(), static_cast<int>(kMaxParts));
    ASSERT_CUDA(cudaMemcpy(d_works, works.data(), n_works * sizeof(AttnWork), cudaMemcpyHostToDevice));
    double us[3];
    const decltype(&ctx::cuda::attention) kernels[3] = {&ctx::cuda::attention, &attention_gqa, &attention_prefill_tc};
    for (int k = 0; k < 3; ++k) {
      const int reps = 20;
      kernels[k](q, d_works, n_works, n_head, n_head_kv, d, 0, scale, part_o, part_ml, nullptr);  // warm-up
      ASSERT_CUDA(cudaEventRecord(start, nullptr));
      for (int r = 0; r < reps; ++r) kernels[k](q, d_works, n_works, n_head, n_head_kv, d, 0, scale, part_o, part_ml, nullptr);
      ASSERT_CUDA(cudaEventRecord(stop, nullptr));
      ASSERT_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      ASSERT_CUDA(cudaEventElapsedTime(&ms, start, stop));
      us[k] = 1000.0 * ms / reps;
    }
    const double kv_bytes = 2.0 * (s.pos0 + s.n) * kv_dim * sizeof(__half);
    std::printf("[ timing ] %-26s %5d works: simple %9.1f us, gqa %9.1f us, tc %9.1f us; K/V once %.1f MB: %.0f GB/s (gqa)\n", s.what,
                n_works, us[0], us[1], us[2], kv_bytes / 1e6, kv_bytes / us[1] / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
