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
//
// The fused forms (matvec_fast.cuh F32Act) run the same loops on activations each block quantized
// into its shared memory first (quantize_in_block), every thread taking part before any leaves:
// the same activation bits, the same sums in the same order. Only the compiler's choice to contract
// a block term's last product and the sum into an FMA, made per instantiation, may differ, by an
// ulp or so of a term (rounding the terms explicitly instead made the 49,152-row output matvec spill).
#include "cuda/matvec_fast.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/repack.h"
#include "ggml_types.h"

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

// A load from global memory through the read-only cache, or a plain one from shared memory (the
// fused forms' activations: __ldg's global-only load must not see a shared address).
template <bool kShared, typename V>
__device__ __forceinline__ V load(const V* p) {
  if constexpr (kShared)
    return *p;
  else
    return __ldg(p);
}

template <GgmlType T, bool kShared>
__device__ __forceinline__ ActBlock load_act(const DevActQ8& a, int t, int b, int nb) {
  const size_t blk = static_cast<size_t>(t) * nb + b;
  const int4* q = reinterpret_cast<const int4*>(a.qs + blk * 32);
  ActBlock x;
  x.lo = load<kShared>(q);
  x.hi = load<kShared>(q + 1);
  x.d = load<kShared>(a.d + blk);
  x.s = T == GgmlType::Q4_1 ? load<kShared>(a.s + blk) : 0.f;
  x.isum = T == GgmlType::Q4_0 ? load<kShared>(a.isum + blk) : 0;
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
template <GgmlType T, int NT, int NR, bool kShared>
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
      const ActBlock x = load_act<T, kShared>(a, t, b, nb);
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

// --- the fused forms' prologue ---------------------------------------------------------------
// Launched with programmatic dependent launch (the launchers' `pdl`), a fused kernel's blocks may
// start while the kernel before it in the stream still runs. They first prefetch their weight rows
// into L2 (weights are never written), then wait for that kernel (griddepcontrol.wait: it has
// completed and its writes are visible; a no-op in a normal launch) before they read or write
// anything else, every thread of the block, so the kernel completes only after its predecessor
// and the one after it may rely on both. Then they let their own dependent start its prologue.

// This lane's share of a repacked row's quants and scales, fetched into L2: one 128-byte line
// per lane from the start of each.
template <GgmlType T>
__device__ __forceinline__ void prefetch_row(const QRow& row, int nb, int lane) {
  const int quant_lines = (nb * kQuantBytes<T> + 127) / 128, scale_lines = (nb * 4 + 127) / 128;
  if (lane < quant_lines) asm volatile("prefetch.global.L2 [%0];" ::"l"(row.qs + lane * 128));
  if (lane < scale_lines) asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(row.dm) + lane * 128));
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900  // Hopper's instructions; before it, the backend launches without pdl
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
constexpr int kNormThreads = 256;  // rms_norm_kernel's block, whose partial sums are repeated here
static_assert(2 * kThreads == kNormThreads, "each thread takes two of rms_norm's 256 partial sums");

// A block's shared memory for NT tokens of k activations: with the norm, rms_norm's 256 double
// partials per token first (8-byte aligned at 0; a multiple of 16 bytes), then the quants (k a
// multiple of 32, so every token's row and block stays 16-byte aligned), d, s, isum, and the
// tokens' norm scales.
__host__ __device__ constexpr size_t in_block_bytes(int nt, int k, bool norm) {
  return (norm ? static_cast<size_t>(nt) * kNormThreads * sizeof(double) : 0) + static_cast<size_t>(nt) * k +
         3 * static_cast<size_t>(nt) * (k / kQuantBlock) * 4 + static_cast<size_t>(nt) * sizeof(float);
}
constexpr size_t kInBlockMaxBytes = 48 * 1024;  // without opting in to more per block

// in.x's NT rows quantized into this block's shared memory, RMS-normalised first with in.norm:
// rms_norm_kernel's arithmetic (each of its 256 threads' strided double sums, here two per thread,
// then the same tree), then quantize_q8_block (one warp per 32-element block). Every thread of
// the block must call it; it returns after a barrier, with the activations ready.
template <int NT>
__device__ DevActQ8 quantize_in_block(const F32Act& in) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int k = in.k, nb = k / kQuantBlock, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool norm = in.norm != nullptr;
  double* partial = reinterpret_cast<double*>(smem);  // [NT][kNormThreads], with the norm
  DevActQ8 a;
  a.qs = reinterpret_cast<int8_t*>(smem + (norm ? NT * kNormThreads * sizeof(double) : 0));
  a.d = reinterpret_cast<float*>(a.qs + NT * k);
  a.s = a.d + NT * nb;
  a.isum = reinterpret_cast<int32_t*>(a.s + NT * nb);
  a.k = k;
  float* scale = reinterpret_cast<float*>(a.isum + NT * nb);  // [NT]
  if (norm) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float* xr = in.x + static_cast<size_t>(t) * k;
      double lo = 0, hi = 0;  // rms_norm's threads tid and tid + 128
      for (int i = tid; i < k; i += kNormThreads) lo += static_cast<double>(xr[i] * xr[i]);
      for (int i = tid + kThreads; i < k; i += kNormThreads) hi += static_cast<double>(xr[i] * xr[i]);
      partial[t * kNormThreads + tid] = lo;
      partial[t * kNormThreads + tid + kThreads] = hi;
    }
    __syncthreads();
    for (int s = kNormThreads / 2; s > 0; s >>= 1) {
      if (tid < s) {
#pragma unroll
        for (int t = 0; t < NT; ++t) partial[t * kNormThreads + tid] += partial[t * kNormThreads + tid + s];
      }
      __syncthreads();
    }
    if (tid < NT) {
      const float mean = static_cast<float>(partial[tid * kNormThreads] / k);
      scale[tid] = 1.0f / sqrtf(mean + in.eps);
    }
    __syncthreads();
  }
  for (int j = warp; j < NT * nb; j += kWarpsPerBlock) {
    const int t = j / nb, first = (j % nb) * kQuantBlock;  // token t's block j % nb
    float v = in.x[static_cast<size_t>(t) * k + first + lane];
    if (norm) v = __fmul_rn(__fmul_rn(v, scale[t]), in.norm[first + lane]);
    quantize_q8_block(v, lane, a, static_cast<size_t>(t) * k + first, j);
  }
  __syncthreads();
  return a;
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

// The job holding grid row r: the last whose rows begin at or before it (fixed indices, so the
// jobs stay in parameter space).
__device__ __forceinline__ MatvecJob job_of(const MatvecJobs& jobs, int r) {
  MatvecJob job = jobs.job[0];
#pragma unroll
  for (int j = 1; j < kMaxJobs; ++j)
    if (j < jobs.count && r >= jobs.job[j].row_begin) job = jobs.job[j];
  return job;
}

// kInBlock: the fused form (quantize_in_block from `in`; `a` is unused). It takes the larger
// register budget at one token too: it serves a layer's matrices (<= 384 blocks, one wave at 4
// blocks an SM), and its prologue spills under the output matrix's 42 registers.
template <GgmlType T, int NT, bool kInBlock>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kInBlock ? 2 : NT))
    matvec_fast_kernel(MatvecJobs jobs, DevActQ8 a, F32Act in) {
  const int grid_row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (kInBlock) {
    if (grid_row < jobs.rows) {
      const MatvecJob job = job_of(jobs, grid_row);
      prefetch_row<T>(row_at<T>(job.qs, job.dm, grid_row - job.row_begin, jobs.nb), jobs.nb, lane);
    }
    wait_for_previous_kernel();
    a = quantize_in_block<NT>(in);
  }
  if (grid_row >= jobs.rows) return;
  const MatvecJob job = job_of(jobs, grid_row);
  const int row = grid_row - job.row_begin;
  const QRow rows[1] = {row_at<T>(job.qs, job.dm, row, jobs.nb)};
  float acc[1][NT] = {};
  accumulate_rows<T, NT, 1, kInBlock>(rows, jobs.nb, a, lane, acc);
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
template <GgmlType T, int NT, bool kInBlock>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(2 * NT))
    matvec_swiglu_kernel(DevQWeight gate, DevQWeight up, DevActQ8 a, F32Act in, float* out, int ldo) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (kInBlock) {
    if (row < gate.rows) {
      const int nb = gate.cols / 32;
      prefetch_row<T>(row_at<T>(gate.qs, gate.dm, row, nb), nb, lane);
      prefetch_row<T>(row_at<T>(up.qs, up.dm, row, nb), nb, lane);
    }
    wait_for_previous_kernel();
    a = quantize_in_block<NT>(in);
  }
  if (row >= gate.rows) return;
  const int nb = gate.cols / 32;
  const QRow rows[2] = {row_at<T>(gate.qs, gate.dm, row, nb), row_at<T>(up.qs, up.dm, row, nb)};
  float acc[2][NT] = {};
  accumulate_rows<T, NT, 2, kInBlock>(rows, nb, a, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float g = warp_sum(acc[0][t]), u = warp_sum(acc[1][t]);
    if (lane == t) out[static_cast<size_t>(t) * ldo + row] = g / (1.0f + expf(-g)) * u;
  }
}

// The Q/K/V products from f32 rows (the fused form's prologue), two adjacent rows per warp, so a
// lane holds both halves of a RoPE pair: jobs 0, 1, 2 are Q, K and V, whose row counts are
// multiples of head_dim (so no pair or head straddles two). Lane t then does token t's share of
// rope_store_kv_kernel, with its products: Q rotated into out.q, K rotated and V as it is stored
// in the cache as f16.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(2 * NT)) matvec_qkv_rope_kernel(MatvecJobs jobs, F32Act in, RopeStore out) {
  const int grid_row = 2 * (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32), lane = threadIdx.x % 32;
  MatvecJob job = jobs.job[0];
  int which = 0;
#pragma unroll
  for (int j = 1; j < kMaxJobs; ++j)
    if (grid_row >= jobs.job[j].row_begin) job = jobs.job[j], which = j;
  const int row = grid_row - job.row_begin, kv_dim = jobs.job[2].row_begin - jobs.job[1].row_begin;
  const QRow rows[2] = {row_at<T>(job.qs, job.dm, row, jobs.nb), row_at<T>(job.qs, job.dm, row + 1, jobs.nb)};
  if (grid_row < jobs.rows) prefetch_row<T>(rows[0], jobs.nb, lane), prefetch_row<T>(rows[1], jobs.nb, lane);
  wait_for_previous_kernel();
  const DevActQ8 a = quantize_in_block<NT>(in);
  if (grid_row >= jobs.rows) return;
  float acc[2][NT] = {};
  accumulate_rows<T, NT, 2, true>(rows, jobs.nb, a, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float x0 = warp_sum(acc[0][t]), x1 = warp_sum(acc[1][t]);
    if (lane == t) {
      if (which == 2) {
        __half* v = token_k_row(out.tokens[t], out.layer, kv_dim) + static_cast<size_t>(out.tokens[t].cap) * kv_dim;
        v[row] = __float2half_rn(x0);
        v[row + 1] = __float2half_rn(x1);
      } else {
        const int pairs = out.head_dim / 2, pair = (row % out.head_dim) / 2;
        const float c = out.cos_t[static_cast<size_t>(out.pos[t]) * pairs + pair];
        const float s = out.sin_t[static_cast<size_t>(out.pos[t]) * pairs + pair];
        const float r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float r1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        if (which == 0) {
          float* q = out.q + static_cast<size_t>(t) * out.ldq + row;
          q[0] = r0;
          q[1] = r1;
        } else {
          __half* k = token_k_row(out.tokens[t], out.layer, kv_dim);
          k[row] = __float2half_rn(r0);
          k[row + 1] = __float2half_rn(r1);
        }
      }
    }
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
    matvec_fast_kernel<decltype(t)::value, decltype(nt)::value, false><<<blocks_for_rows(jobs.rows), kThreads, 0, st>>>(jobs, a, F32Act{});
  });
  CTX_CUDA_LAUNCHED("matvec_fast");
}

// The fused forms' activation checks; returns the shared memory a block needs. The DevActQ8 it
// fills (k only) lets check_weight compare shapes as for the unfused forms.
size_t check_in(const F32Act& in, int n, DevActQ8* shape, const char* what) {
  if (n < 1 || n > kMatvecTokens)
    throw std::invalid_argument(std::string(what) + ": n = " + std::to_string(n) + " is outside 1.." + std::to_string(kMatvecTokens));
  if (in.k <= 0 || in.k % kQuantBlock != 0 || in.x == nullptr)
    throw std::invalid_argument(std::string(what) + ": activations need rows and k a multiple of 32");
  if (!fused_act_fits(in, n))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " rows of " + std::to_string(in.k) +
                                " activations exceed a block's shared memory");
  shape->k = in.k;
  return in_block_bytes(n, in.k, in.norm != nullptr);
}

// Launches a fused kernel, with programmatic dependent launch when `pdl` (its blocks may start
// before the previous kernel in the stream ends; they wait for it, wait_for_previous_kernel).
template <typename... Params, typename... Args>
void launch_fused(void (*kernel)(Params...), unsigned blocks, size_t smem, cudaStream_t st, bool pdl, Args... args) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = st;
  config.attrs = pdl ? &attr : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  CTX_CUDA(cudaLaunchKernelEx(&config, kernel, args...));
}

MatvecJobs single_job(const DevQWeight& w, float* y, int ldy, bool accumulate) {
  MatvecJobs jobs{};
  jobs.job[0] = {w.qs, w.dm, y, ldy, 0};
  jobs.count = 1;
  jobs.rows = w.rows;
  jobs.nb = w.cols / kQuantBlock;
  jobs.accumulate = accumulate;
  return jobs;
}

}  // namespace

bool fused_act_fits(const F32Act& in, int n) {
  return n >= 1 && in.k > 0 && in_block_bytes(n, in.k, in.norm != nullptr) <= kInBlockMaxBytes;
}

void matvec_fast(const DevQWeight& w, const DevActQ8& a, int n, float* y, int ldy, bool accumulate, cudaStream_t st) {
  check_act(a, n, "matvec_fast");
  check_weight(w, a, ldy, "matvec_fast");
  launch_jobs(w.type, single_job(w, y, ldy, accumulate), a, n, st);
}

void matvec_fast(const DevQWeight& w, const F32Act& in, int n, float* y, int ldy, bool accumulate, cudaStream_t st, bool pdl) {
  DevActQ8 shape;
  const size_t smem = check_in(in, n, &shape, "matvec_fast (fused)");
  check_weight(w, shape, ldy, "matvec_fast (fused)");
  const MatvecJobs jobs = single_job(w, y, ldy, accumulate);
  dispatch(w.type, n, [&](auto t, auto nt) {
    launch_fused(matvec_fast_kernel<decltype(t)::value, decltype(nt)::value, true>, blocks_for_rows(jobs.rows), smem, st, pdl, jobs, shape,
                 in);
  });
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
    matvec_swiglu_kernel<decltype(t)::value, decltype(nt)::value, false>
        <<<blocks_for_rows(gate.rows), kThreads, 0, st>>>(gate, up, a, F32Act{}, out, ldo);
  });
  CTX_CUDA_LAUNCHED("matvec_fast_swiglu");
}

void matvec_fast_swiglu(const DevQWeight& gate, const DevQWeight& up, const F32Act& in, int n, float* out, int ldo, cudaStream_t st,
                        bool pdl) {
  DevActQ8 shape;
  const size_t smem = check_in(in, n, &shape, "matvec_fast_swiglu (fused)");
  check_weight(gate, shape, ldo, "matvec_fast_swiglu (fused)");
  check_weight(up, shape, ldo, "matvec_fast_swiglu (fused)");
  if (up.type != gate.type || up.rows != gate.rows)
    throw std::invalid_argument("matvec_fast_swiglu (fused): gate and up differ in type or rows");
  dispatch(gate.type, n, [&](auto t, auto nt) {
    launch_fused(matvec_swiglu_kernel<decltype(t)::value, decltype(nt)::value, true>, blocks_for_rows(gate.rows), smem, st, pdl, gate, up,
                 shape, in, out, ldo);
  });
}

void matvec_qkv_rope(const DevQWeight& wq, const DevQWeight& wk, const DevQWeight& wv, const F32Act& in, int n, const RopeStore& out,
                     cudaStream_t st, bool pdl) {
  const char* what = "matvec_qkv_rope";
  DevActQ8 shape;
  const size_t smem = check_in(in, n, &shape, what);
  if (out.head_dim < 2 || out.head_dim % 2 != 0) throw std::invalid_argument(std::string(what) + ": head_dim must be even");
  const DevQWeight* const w[3] = {&wq, &wk, &wv};
  MatvecJobs jobs{};
  for (int j = 0; j < 3; ++j) {
    check_weight(*w[j], shape, j == 0 ? out.ldq : w[j]->rows, what);
    if (w[j]->type != wq.type) throw std::invalid_argument(std::string(what) + ": the weights differ in type");
    if (w[j]->rows % out.head_dim != 0) throw std::invalid_argument(std::string(what) + ": rows must be whole heads");
    jobs.job[j] = {w[j]->qs, w[j]->dm, j == 0 ? out.q : nullptr, j == 0 ? out.ldq : 0, jobs.rows};
    jobs.rows += w[j]->rows;
  }
  if (wk.rows != wv.rows) throw std::invalid_argument(std::string(what) + ": K and V differ in rows");
  jobs.count = 3;
  jobs.nb = wq.cols / kQuantBlock;
  const unsigned blocks = static_cast<unsigned>((jobs.rows / 2 + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch(wq.type, n, [&](auto t, auto nt) {
    launch_fused(matvec_qkv_rope_kernel<decltype(t)::value, decltype(nt)::value>, blocks, smem, st, pdl, jobs, in, out);
  });
}

}  // namespace ctx::cuda
