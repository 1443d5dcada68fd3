// Fast decode matvecs on repacked quantized weights (matvec_fast.cuh).
//
// Thread mapping, both kernels: one warp per output row r, kWarpsPerBlock rows per block. Lane l
// takes the row's 32-element blocks l, l + 32, ...: at the model's 576 columns (18 blocks) that is
// a single round of loads per lane, the shortest chain of memory latencies for the small matrices
// of a decode step, and still one coalesced stream per warp for the 49152-row output matrix. Per
// block a lane loads the weight quants once (one 16-byte load for Q4, two for Q8_0) and applies
// them to all n tokens (two 16-byte loads of each token's activation block: a few KiB in all, so
// L1 hits after the first warp). The n per-token sums are then reduced across the warp, and lane t
// writes token t's result: every output element is read and written by exactly one thread.
// n is a template parameter (1..kMatvecTokens), so the token loops unroll with no idle work.
// Rows are per warp, so a warp past the last row leaves whole and the shuffles see full warps.
#include "cuda/matvec_fast.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/repack.h"

namespace ctx::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
// Register budgets by the dot products a lane accumulates (tokens x rows): a single one gets 12
// blocks an SM (42 registers), enough loads in flight to stream the 49152-row output matrix;
// more get 4 blocks (128 registers), which still fit the 1536 rows of the model's gate/up (384
// blocks) on the 132 SMs in one wave at n = 8.
constexpr int min_blocks_per_sm(int dots) { return dots == 1 ? 12 : 4; }
constexpr int kMaxJobs = 3;  // weights per matvec_fast_multi launch

template <GgmlType T>
constexpr int kQuantBytes = T == GgmlType::Q8_0 ? 32 : 16;  // per 32-element block, repacked

// One row of a repacked weight: its blocks' quants and (d, m) scales.
struct QRow {
  const uint8_t* qs;
  const __half2* dm;
};

template <GgmlType T>
__device__ __forceinline__ QRow row_at(const uint8_t* qs, const __half2* dm, int row, int nb) {
  const size_t first = static_cast<size_t>(row) * nb;
  return {qs + first * kQuantBytes<T>, dm + first};
}

// Block b's 32 quants as 8 words of 4 int8 lanes, word i holding elements 4i..4i+3: the order of
// the activation block's bytes, as dp4a pairs them. Q4 byte j holds element j in its low nibble and
// element j + 16 in its high nibble, so word i's low nibbles are elements 4i..4i+3 and its high
// nibbles elements 16 + 4i..16 + 4i + 3.
template <GgmlType T>
__device__ __forceinline__ void load_quants(const QRow& row, int b, int (&q)[8]) {
  if constexpr (T == GgmlType::Q8_0) {
    const int4* p = reinterpret_cast<const int4*>(row.qs) + 2 * b;
    const int4 lo = __ldg(p), hi = __ldg(p + 1);
    q[0] = lo.x, q[1] = lo.y, q[2] = lo.z, q[3] = lo.w;
    q[4] = hi.x, q[5] = hi.y, q[6] = hi.z, q[7] = hi.w;
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row.qs) + b);
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = static_cast<int>(words[i] & 0x0F0F0F0Fu);
      q[i + 4] = static_cast<int>((words[i] >> 4) & 0x0F0F0F0Fu);
    }
  }
}

// Token t's activation block b: its 32 quants (a token's row is k = 32 * nb bytes, so every block
// is 16-byte aligned), its scale, and the term the weight type needs (Q4_0: isum, Q4_1: s).
struct ActBlock {
  int4 lo, hi;  // elements 0..15, 16..31
  float d, s;
  int isum;
};

template <GgmlType T>
__device__ __forceinline__ ActBlock load_act(const DevActQ8& a, int t, int b, int nb) {
  const size_t blk = static_cast<size_t>(t) * nb + b;
  const int4* q = reinterpret_cast<const int4*>(a.qs + blk * 32);
  ActBlock x;
  x.lo = __ldg(q);
  x.hi = __ldg(q + 1);
  x.d = __ldg(a.d + blk);
  x.s = T == GgmlType::Q4_1 ? __ldg(a.s + blk) : 0.f;
  x.isum = T == GgmlType::Q4_0 ? __ldg(a.isum + blk) : 0;
  return x;
}

// One block's term, the CPU's formula: Q4_0 d*xd*(sumi - 8*isum), Q4_1 d*xd*sumi + m*s,
// Q8_0 d*xd*sumi (sumi exact: at most 32 * 127 * 127 in magnitude).
template <GgmlType T>
__device__ __forceinline__ float block_term(const int (&q)[8], float2 dm, const ActBlock& x) {
  int lo = __dp4a(q[0], x.lo.x, 0), hi = __dp4a(q[4], x.hi.x, 0);
  lo = __dp4a(q[1], x.lo.y, lo), hi = __dp4a(q[5], x.hi.y, hi);
  lo = __dp4a(q[2], x.lo.z, lo), hi = __dp4a(q[6], x.hi.z, hi);
  lo = __dp4a(q[3], x.lo.w, lo), hi = __dp4a(q[7], x.hi.w, hi);
  const int sumi = lo + hi;
  if constexpr (T == GgmlType::Q4_0)
    return dm.x * x.d * static_cast<float>(sumi - 8 * x.isum);
  else if constexpr (T == GgmlType::Q4_1)
    return dm.x * x.d * static_cast<float>(sumi) + dm.y * x.s;
  else
    return dm.x * x.d * static_cast<float>(sumi);
}

// acc[i][t] += this lane's share of dot(rows[i], activation row t): blocks lane, lane + 32, ...
// NR rows (1, or gate and up) read each activation block once. Rows longer than 32 blocks (the
// FFN down projection's 48) take two rounds; unrolled by two while few dot products leave
// registers to spare, so both rounds' loads are in flight together.
template <GgmlType T, int NT, int NR>
__device__ __forceinline__ void accumulate_rows(const QRow (&rows)[NR], int nb, const DevActQ8& a, int lane, float (&acc)[NR][NT]) {
#pragma unroll(NT* NR <= 4 ? 2 : 1)
  for (int b = lane; b < nb; b += 32) {
    int q[NR][8];
    float2 dm[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      load_quants<T>(rows[i], b, q[i]);
      dm[i] = __half22float2(__ldg(rows[i].dm + b));
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const ActBlock x = load_act<T>(a, t, b, nb);
#pragma unroll
      for (int i = 0; i < NR; ++i) acc[i][t] += block_term<T>(q[i], dm[i], x);
    }
  }
}

// The sum over the warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// One weight of a launch: its repacked data, its output, and where its rows start in the grid.
struct MatvecJob {
  const uint8_t* qs;
  const __half2* dm;
  float* y;
  int ldy;
  int row_begin;
};
// The weights of a launch (same type and cols), by value: the rows of all form one grid.
struct MatvecJobs {
  MatvecJob job[kMaxJobs];
  int count;
  int rows;  // all jobs' rows
  int nb;    // blocks per row
  bool accumulate;
};

template <GgmlType T, int NT>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(NT)) matvec_fast_kernel(MatvecJobs jobs, DevActQ8 a) {
  const int grid_row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (grid_row >= jobs.rows) return;
  // The job holding this row: the last whose rows begin at or before it (fixed indices, so the
  // jobs stay in parameter space).
  MatvecJob job = jobs.job[0];
#pragma unroll
  for (int j = 1; j < kMaxJobs; ++j)
    if (j < jobs.count && grid_row >= jobs.job[j].row_begin) job = jobs.job[j];
  const int row = grid_row - job.row_begin;
  const QRow rows[1] = {row_at<T>(job.qs, job.dm, row, jobs.nb)};
  float acc[1][NT] = {};
  accumulate_rows<T, NT>(rows, jobs.nb, a, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[0][t]);
    if (lane == t) {
      float* out = job.y + static_cast<size_t>(t) * job.ldy + row;
      *out = jobs.accumulate ? *out + v : v;
    }
  }
}

// The same mapping with two rows per warp: row r of gate and of up, then SwiGLU as swiglu_kernel.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(2 * NT))
    matvec_swiglu_kernel(DevQWeight gate, DevQWeight up, DevActQ8 a, float* out, int ldo) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= gate.rows) return;
  const int nb = gate.cols / 32;
  const QRow rows[2] = {row_at<T>(gate.qs, gate.dm, row, nb), row_at<T>(up.qs, up.dm, row, nb)};
  float acc[2][NT] = {};
  accumulate_rows<T, NT>(rows, nb, a, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float g = warp_sum(acc[0][t]), u = warp_sum(acc[1][t]);
    if (lane == t) out[static_cast<size_t>(t) * ldo + row] = g / (1.0f + expf(-g)) * u;
  }
}

// Calls launch(integral_constant<GgmlType, T>, integral_constant<int, NT>) with T = type and
// NT = n, both already checked.
template <GgmlType T, int NT = 1, typename Launch>
void dispatch_tokens(int n, Launch& launch) {
  if constexpr (NT <= kMatvecTokens) {
    if (n == NT) return launch(std::integral_constant<GgmlType, T>{}, std::integral_constant<int, NT>{});
    dispatch_tokens<T, NT + 1>(n, launch);
  }
}
template <typename Launch>
void dispatch(GgmlType type, int n, Launch&& launch) {
  switch (type) {
    case GgmlType::Q4_0:
      return dispatch_tokens<GgmlType::Q4_0>(n, launch);
    case GgmlType::Q4_1:
      return dispatch_tokens<GgmlType::Q4_1>(n, launch);
    case GgmlType::Q8_0:
      return dispatch_tokens<GgmlType::Q8_0>(n, launch);
    default:
      return;  // refused by check_weight
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_act(const DevActQ8& a, int n, const char* what) {
  if (n < 1 || n > kMatvecTokens)
    throw std::invalid_argument(std::string(what) + ": n = " + std::to_string(n) + " is outside 1.." + std::to_string(kMatvecTokens));
  if (a.k <= 0 || a.k % kQuantBlock != 0 || !aligned(a.qs, 16))
    throw std::invalid_argument(std::string(what) + ": activations need k a multiple of 32 and 16-byte aligned quants");
}

void check_weight(const DevQWeight& w, const DevActQ8& a, int ldy, const char* what) {
  if (!repackable(w.type)) throw std::invalid_argument(std::string(what) + ": not a Q4_0/Q4_1/Q8_0 weight");
  if (w.rows < 1 || w.cols != a.k)
    throw std::invalid_argument(std::string(what) + ": a " + std::to_string(w.rows) + " x " + std::to_string(w.cols) +
                                " weight against activations of " + std::to_string(a.k));
  if (ldy < w.rows) throw std::invalid_argument(std::string(what) + ": output stride below the weight's rows");
  if (!aligned(w.qs, 16) || !aligned(w.dm, 4))
    throw std::invalid_argument(std::string(what) + ": repacked quants must be 16-byte aligned, scales 4-byte");
}

unsigned blocks_for_rows(int rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void launch_jobs(GgmlType type, const MatvecJobs& jobs, const DevActQ8& a, int n, cudaStream_t st) {
  dispatch(type, n, [&](auto t, auto nt) {
    matvec_fast_kernel<decltype(t)::value, decltype(nt)::value><<<blocks_for_rows(jobs.rows), kThreads, 0, st>>>(jobs, a);
  });
  CTX_CUDA_LAUNCHED("matvec_fast");
}

}  // namespace

void matvec_fast(const DevQWeight& w, const DevActQ8& a, int n, float* y, int ldy, bool accumulate, cudaStream_t st) {
  check_act(a, n, "matvec_fast");
  check_weight(w, a, ldy, "matvec_fast");
  MatvecJobs jobs{};
  jobs.job[0] = {w.qs, w.dm, y, ldy, 0};
  jobs.count = 1;
  jobs.rows = w.rows;
  jobs.nb = w.cols / kQuantBlock;
  jobs.accumulate = accumulate;
  launch_jobs(w.type, jobs, a, n, st);
}

void matvec_fast_multi(const DevQWeight* const w[3], float* const y[3], const int ldy[3], int count, const DevActQ8& a, int n,
                       cudaStream_t st) {
  check_act(a, n, "matvec_fast_multi");
  if (count < 1 || count > kMaxJobs) throw std::invalid_argument("matvec_fast_multi: count must be 1..3");
  MatvecJobs jobs{};
  for (int j = 0; j < count; ++j) {
    check_weight(*w[j], a, ldy[j], "matvec_fast_multi");
    if (w[j]->type != w[0]->type) throw std::invalid_argument("matvec_fast_multi: the weights differ in type");
    jobs.job[j] = {w[j]->qs, w[j]->dm, y[j], ldy[j], jobs.rows};
    jobs.rows += w[j]->rows;
  }
  jobs.count = count;
  jobs.nb = w[0]->cols / kQuantBlock;
  jobs.accumulate = false;
  launch_jobs(w[0]->type, jobs, a, n, st);
}

void matvec_fast_swiglu(const DevQWeight& gate, const DevQWeight& up, const DevActQ8& a, int n, float* out, int ldo, cudaStream_t st) {
  check_act(a, n, "matvec_fast_swiglu");
  check_weight(gate, a, ldo, "matvec_fast_swiglu");
  check_weight(up, a, ldo, "matvec_fast_swiglu");
  if (up.type != gate.type || up.rows != gate.rows) throw std::invalid_argument("matvec_fast_swiglu: gate and up differ in type or rows");
  dispatch(gate.type, n, [&](auto t, auto nt) {
    matvec_swiglu_kernel<decltype(t)::value, decltype(nt)::value><<<blocks_for_rows(gate.rows), kThreads, 0, st>>>(gate, up, a, out, ldo);
  });
  CTX_CUDA_LAUNCHED("matvec_fast_swiglu");
}

}  // namespace ctx::cuda
