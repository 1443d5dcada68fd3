// Tensor-core GEMM on repacked quantized weights (gemm_fast.cuh).
//
// Output tile per thread block: kRows weight rows x kTokens tokens; the K dimension (the weight's
// columns) goes in steps of kStepK = 64 columns, two 32-element quant blocks. Per step:
//   1. cp.async copies the step's raw operands into one of kStages shared-memory stages: the
//      weight rows' quants (16-byte chunks of the repacked layout), their (d, m) scales and the
//      tokens' f32 activations. Copies run kStages - 1 steps ahead of the tensor cores, which
//      hides the global-memory latency even when a block has only a few steps of work (the small
//      grids of batched decode). Rows past the weight, tokens past n and the second quant block
//      of a final half step (cols a multiple of 32 but not of 64) are zero-filled instead.
//   2. The whole block converts the stage into two f16 tiles, the weight rows dequantized
//      (element = q*d + m, (q - 8)*d or q*d, in f16 arithmetic: one rounding) and the activations
//      rounded to nearest. Each element is converted once per block, with 16-byte loads and
//      stores, so the per-warp inner loop below is only ldmatrix and mma.
//   3. Each warp multiplies its kWarpRows x kWarpTokens sub-tile with mma.sync m16n8k16 (f16 in,
//      f32 accumulate): the weight rows are the A operand (16 rows, row-major [row][k]) and the
//      tokens the B operand (8 tokens, stored [token][k], i.e. column-major K x N), both loaded
//      with ldmatrix.x4 from rows 144 bytes apart (8 consecutive rows hit 8 distinct bank groups).
// Two barriers per step: one before the stage is read and the f16 tiles rewritten (the previous
// step's MMAs are done), one before the MMAs (the tiles are complete).
//
// The tiles (Tiling below) run from 128 x 64 with 8 warps, for prefill, down to 32 x 16 with 2
// warps, so that 9..128 tokens still spread over every SM; the host picks one per call. Even then
// a small micro-batch has few tiles, each a chain of dependent steps whose latency no other block
// hides, so the host may also split K: gridDim.z blocks per tile, a thread-block cluster, each
// taking a contiguous range of the steps; the cluster's first block then adds the others'
// accumulators, read from their shared memory (distributed shared memory, sm_90), in rank order.
// No scratch memory and no second launch, and the sum's order is fixed.
#include "cuda/gemm_fast.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda/repack.h"

namespace ctx::cuda {
namespace {

constexpr int kStepK = 64;                // weight columns per pipeline step
constexpr int kStepBlocks = kStepK / 32;  // quant blocks per row per step
constexpr int kTileLd = kStepK + 8;       // f16 tile row stride in halves: 144 bytes

template <GgmlType T>
constexpr int kQuantBytes = T == GgmlType::Q8_0 ? 32 : 16;  // per 32-element block, repacked

// A block tile of Rows x Tokens, WarpsM x WarpsN warps (each a (Rows / WarpsM) x (Tokens /
// WarpsN) sub-tile of 16 x 8 MMA tiles), Stages shared-memory stages, MinBlocks for the
// register budget (__launch_bounds__).
template <int Rows, int Tokens, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Tiling {
  static constexpr int kRows = Rows, kTokens = Tokens, kWarpsM = WarpsM, kStages = Stages, kMinBlocks = MinBlocks;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpRows = Rows / WarpsM, kWarpTokens = Tokens / WarpsN;
  static constexpr int kMTiles = kWarpRows / 16, kNTiles = kWarpTokens / 8;
  // ldmatrix.x4 loads 16 tokens (two 8-token B tiles) at a time.
  static_assert(kWarpRows % 16 == 0 && kWarpTokens % 16 == 0, "warp sub-tiles are made of 16 x 16 pieces");
  static_assert(Stages >= 2, "the pipeline needs a stage to fill while another is read");
};
using Tiling128x64 = Tiling<128, 64, 4, 2, 3, 2>;  // warps 32 x 32; large n
using Tiling64x64 = Tiling<64, 64, 2, 2, 3, 2>;    // warps 32 x 32
using Tiling32x32 = Tiling<32, 32, 2, 2, 4, 4>;    // warps 16 x 16
using Tiling32x16 = Tiling<32, 16, 2, 1, 4, 4>;    // warps 16 x 16; the most blocks for small n

// Byte offsets into a block's dynamic shared memory. kStages stages of raw operands, each
//   quants      [kRows][kStepBlocks][kQuantBytes]   as in global memory, rows packed
//   scales      [kRows][kStepBlocks] half2 (d, m)
//   activations [kTokens][kStepK] f32
// then the f16 tiles the MMAs read, [kRows][kTileLd] and [kTokens][kTileLd].
template <GgmlType T, class Tl>
struct Smem {
  static constexpr int kQs = 0;
  static constexpr int kDm = kQs + Tl::kRows * kStepBlocks * kQuantBytes<T>;
  static constexpr int kX = kDm + Tl::kRows * kStepBlocks * 4;
  static constexpr int kStage = kX + Tl::kTokens * kStepK * 4;
  static constexpr int kW16 = Tl::kStages * kStage;
  static constexpr int kX16 = kW16 + Tl::kRows * kTileLd * 2;
  static constexpr int kBytes = kX16 + Tl::kTokens * kTileLd * 2;
  static_assert(kDm % 16 == 0 && kX % 16 == 0 && kStage % 16 == 0 && kX16 % 16 == 0, "16-byte aligned parts");
  static_assert(kBytes <= 227 * 1024, "over an H100 block's shared memory");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Asynchronous global -> shared copies of 16 or 4 bytes; with `valid` false the destination is
// zero-filled and nothing is read (src must still be a valid pointer).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8x8 f16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i gets
// matrix i in the mma fragment layout (lane l: row l / 4, columns 2 * (l % 4) and + 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(p))
               : "memory");
}

// acc += A (16 x 16, row-major fragments a) * B (16 x 8, column-major fragments b).
__device__ __forceinline__ void mma_16x8x16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ __half2 bits_to_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof h);
  return h;
}
__device__ __forceinline__ uint32_t half2_to_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

// Two bytes of q (Selector 0x4140: bytes 0 and 1; 0x4342: bytes 2 and 3) as the f16 pair
// (1024 + first, 1024 + second): 0x64 above a byte is the f16 1024 with the byte as its low
// mantissa bits, exact for 0..255.
template <uint32_t Selector>
__device__ __forceinline__ __half2 biased_pair(uint32_t q) {
  return bits_to_half2(__byte_perm(q, 0x64646464u, Selector));
}

// One Q4 block (16 bytes: byte j holds element j in its low nibble, j + 16 in its high nibble)
// as 32 f16 values in element order, out[i] holding elements 8i..8i+7. Q4_1: q*d + m; Q4_0:
// (q - 8)*d, q - 8 exact as (1024 + q) - 1032.
template <GgmlType T>
__device__ __forceinline__ void dequant_q4(const uint4& q, __half2 dm, uint4 (&out)[4]) {
  const __half2 d = __low2half2(dm), m = __high2half2(dm);
  const __half2 bias = bits_to_half2(T == GgmlType::Q4_1 ? 0x64006400u : 0x64086408u);  // 1024 or 1032
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  uint32_t lo[8], hi[8];  // elements 2i, 2i + 1 and 16 + 2i, 16 + 2i + 1, as f16 pairs
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t low = words[w] & 0x0F0F0F0Fu, high = (words[w] >> 4) & 0x0F0F0F0Fu;
    const __half2 pairs[4] = {biased_pair<0x4140>(low), biased_pair<0x4342>(low), biased_pair<0x4140>(high), biased_pair<0x4342>(high)};
    __half2 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 centered = __hsub2(pairs[i], bias);
      v[i] = T == GgmlType::Q4_1 ? __hfma2(centered, d, m) : __hmul2(centered, d);
    }
    lo[2 * w] = half2_to_bits(v[0]), lo[2 * w + 1] = half2_to_bits(v[1]);
    hi[2 * w] = half2_to_bits(v[2]), hi[2 * w + 1] = half2_to_bits(v[3]);
  }
  out[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  out[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
  out[2] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  out[3] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
}

// 16 int8 quants (half a Q8_0 block) as 16 f16 values q*d. Flipping each byte's sign bit gives
// q + 128 in 0..255, so the biased pair is 1152 + q and subtracting 1152 leaves q exactly.
__device__ __forceinline__ void dequant_q8(const uint4& q, __half2 dm, uint4 (&out)[2]) {
  const __half2 d = __low2half2(dm), bias = bits_to_half2(0x64806480u);  // 1152
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  uint32_t v[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t u = words[w] ^ 0x80808080u;
    v[2 * w] = half2_to_bits(__hmul2(__hsub2(biased_pair<0x4140>(u), bias), d));
    v[2 * w + 1] = half2_to_bits(__hmul2(__hsub2(biased_pair<0x4342>(u), bias), d));
  }
  out[0] = make_uint4(v[0], v[1], v[2], v[3]);
  out[1] = make_uint4(v[4], v[5], v[6], v[7]);
}

// The arguments every part of the kernel reads.
struct Problem {
  const uint8_t* qs;
  const __half2* dm;
  int rows, cols, nb;  // nb = cols / 32 quant blocks per row
  const float* x;
  int n;
  float* y;
  int ldy;
};

// Calls f(i) for this thread's items i = threadIdx.x + k * Threads below Items, in a fixed number
// of unrolled rounds: the work per thread and stage is known at compile time, so no loop control
// or remainder code runs per step.
template <int Items, int Threads, class F>
__device__ __forceinline__ void for_each_item(F&& f) {
#pragma unroll
  for (int k = 0; k < (Items + Threads - 1) / Threads; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * Threads;
    if (Items % Threads == 0 || i < Items) f(i);
  }
}

// Step `step`'s raw operands of the block's tile (rows row0.., tokens tok0..) into `stage`.
// Consecutive threads copy consecutive 16-byte chunks of a row.
template <GgmlType T, class Tl>
__device__ __forceinline__ void load_stage(unsigned char* stage, const Problem& p, int row0, int tok0, int step) {
  using S = Smem<T, Tl>;
  constexpr int kChunksPerBlock = kQuantBytes<T> / 16;
  constexpr int kChunksPerRow = kStepBlocks * kChunksPerBlock;
  const int block0 = step * kStepBlocks;
  for_each_item<Tl::kRows * kChunksPerRow, Tl::kThreads>([&](int i) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const int row = row0 + r, block = block0 + c / kChunksPerBlock;
    const bool valid = row < p.rows && block < p.nb;
    const uint8_t* src = valid ? p.qs + (static_cast<size_t>(row) * p.nb + block) * kQuantBytes<T> + (c % kChunksPerBlock) * 16 : p.qs;
    cp_async16(stage + S::kQs + i * 16, src, valid);
  });
  for_each_item<Tl::kRows * kStepBlocks, Tl::kThreads>([&](int i) {
    const int r = i / kStepBlocks, b = i % kStepBlocks;
    const int row = row0 + r, block = block0 + b;
    const bool valid = row < p.rows && block < p.nb;
    cp_async4(stage + S::kDm + i * 4, valid ? p.dm + static_cast<size_t>(row) * p.nb + block : p.dm, valid);
  });
  constexpr int kChunksPerToken = kStepK / 4;  // 4 floats per chunk
  for_each_item<Tl::kTokens * kChunksPerToken, Tl::kThreads>([&](int i) {
    const int t = i / kChunksPerToken, c = i % kChunksPerToken;
    const int token = tok0 + t, col = step * kStepK + c * 4;
    const bool valid = token < p.n && col < p.cols;  // cols is a multiple of 32: whole chunks
    cp_async16(stage + S::kX + i * 16, valid ? p.x + static_cast<size_t>(token) * p.cols + col : p.x, valid);
  });
}

// A stage's raw operands into the f16 tiles w16 [kRows][kTileLd] and x16 [kTokens][kTileLd].
template <GgmlType T, class Tl>
__device__ __forceinline__ void convert_stage(const unsigned char* stage, __half* w16, __half* x16) {
  using S = Smem<T, Tl>;
  if constexpr (T == GgmlType::Q8_0) {
    // One item: half a block, 16 bytes -> 16 halves.
    constexpr int kItemsPerRow = 2 * kStepBlocks;
    for_each_item<Tl::kRows * kItemsPerRow, Tl::kThreads>([&](int i) {
      const int r = i / kItemsPerRow, part = i % kItemsPerRow;
      const uint4 q = *reinterpret_cast<const uint4*>(stage + S::kQs + i * 16);
      const __half2 dm = *reinterpret_cast<const __half2*>(stage + S::kDm + (r * kStepBlocks + part / 2) * 4);
      uint4 out[2];
      dequant_q8(q, dm, out);
      uint4* dst = reinterpret_cast<uint4*>(w16 + r * kTileLd + part * 16);
      dst[0] = out[0];
      dst[1] = out[1];
    });
  } else {
    // One item: a block, 16 bytes -> 32 halves.
    for_each_item<Tl::kRows * kStepBlocks, Tl::kThreads>([&](int i) {
      const int r = i / kStepBlocks, b = i % kStepBlocks;
      const uint4 q = *reinterpret_cast<const uint4*>(stage + S::kQs + i * 16);
      const __half2 dm = *reinterpret_cast<const __half2*>(stage + S::kDm + i * 4);
      uint4 out[4];
      dequant_q4<T>(q, dm, out);
      uint4* dst = reinterpret_cast<uint4*>(w16 + r * kTileLd + b * 32);
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[j] = out[j];
    });
  }
  constexpr int kChunksPerToken = kStepK / 4;
  for_each_item<Tl::kTokens * kChunksPerToken, Tl::kThreads>([&](int i) {
    const int t = i / kChunksPerToken, c = i % kChunksPerToken;
    const float4 v = *reinterpret_cast<const float4*>(stage + S::kX + i * 16);
    const uint2 h = make_uint2(half2_to_bits(__floats2half2_rn(v.x, v.y)), half2_to_bits(__floats2half2_rn(v.z, v.w)));
    *reinterpret_cast<uint2*>(x16 + t * kTileLd + c * 4) = h;
  });
}

// One step's MMAs of a warp: its sub-tile at rows warp_row.. and tokens warp_tok.. of the f16
// tiles, four k16 slices. B tiles holding no token below n (n_tiles and on) are skipped.
template <class Tl>
__device__ __forceinline__ void mma_step(const __half* w16, const __half* x16, int warp_row, int warp_tok, int n_tiles,
                                         float (&acc)[Tl::kMTiles][Tl::kNTiles][4]) {
  const int lane = threadIdx.x % 32;
  // ldmatrix row addresses. A (16 rows x 16 k): lanes 0-15 rows 0-15 at k 0, lanes 16-31 the same
  // rows at k 8 -> a0..a3 = (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
  // B (16 tokens x 16 k): lanes 0-7 tokens 0-7 at k 0, 8-15 tokens 0-7 at k 8, 16-23 tokens 8-15
  // at k 0, 24-31 tokens 8-15 at k 8 -> (b0, b1) of the first 8 tokens, then of the next 8.
  const __half* a_base = w16 + (warp_row + lane % 16) * kTileLd + (lane / 16) * 8;
  const __half* b_base = x16 + (warp_tok + lane % 8 + (lane / 16) * 8) * kTileLd + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int k = 0; k < kStepK; k += 16) {
    uint32_t a[Tl::kMTiles][4], b[Tl::kNTiles][2];
#pragma unroll
    for (int i = 0; i < Tl::kMTiles; ++i) ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3], a_base + i * 16 * kTileLd + k);
#pragma unroll
    for (int j = 0; j < Tl::kNTiles; j += 2) ldmatrix_x4(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1], b_base + j * 8 * kTileLd + k);
#pragma unroll
    for (int i = 0; i < Tl::kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < Tl::kNTiles; ++j)
        if (j < n_tiles) mma_16x8x16(acc[i][j], a[i], b[j][0], b[j][1]);
  }
}

// Split-K: the blocks of a cluster hold partial sums of one output tile. Each stores its
// accumulators over its (now idle) stages; the first block adds the others' in rank order, read
// from their shared memory. Returns whether this block holds the total. Clusters exist from sm_90
// on; the host never splits K on an older device.
template <class Tl>
__device__ __forceinline__ bool reduce_split_k(unsigned char* smem, float (&acc)[Tl::kMTiles][Tl::kNTiles][4]) {
#if __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kValues = Tl::kMTiles * Tl::kNTiles * 4;  // per thread; kRows * kTokens in all
  cg::cluster_group cluster = cg::this_cluster();
  float* partial = reinterpret_cast<float*>(smem);  // [kValues][kThreads]: threads on consecutive words
  cp_async_wait<0>();                               // only empty groups are left, but no copy may land there afterwards
#pragma unroll
  for (int v = 0; v < kValues; ++v) partial[v * Tl::kThreads + threadIdx.x] = acc[v / (Tl::kNTiles * 4)][v / 4 % Tl::kNTiles][v % 4];
  cluster.sync();  // every block's partial sums are written
  const bool first = cluster.block_rank() == 0;
  if (first)
    for (unsigned r = 1; r < cluster.num_blocks(); ++r) {
      const float* peer = cluster.map_shared_rank(partial, static_cast<int>(r));
#pragma unroll
      for (int v = 0; v < kValues; ++v) acc[v / (Tl::kNTiles * 4)][v / 4 % Tl::kNTiles][v % 4] += peer[v * Tl::kThreads + threadIdx.x];
    }
  cluster.sync();  // the others' shared memory stays until the first block has read it
  return first;
#else
  __trap();
#endif
}

template <GgmlType T, class Tl>
__global__ void __launch_bounds__(Tl::kThreads, Tl::kMinBlocks) gemm_fast_kernel(Problem p) {
  using S = Smem<T, Tl>;
  static_assert(Tl::kRows * Tl::kTokens * 4 <= S::kW16, "split-K partial sums fit over the stages");
  extern __shared__ __align__(16) unsigned char smem[];
  __half* w16 = reinterpret_cast<__half*>(smem + S::kW16);
  __half* x16 = reinterpret_cast<__half*>(smem + S::kX16);
  const int row0 = blockIdx.x * Tl::kRows, tok0 = blockIdx.y * Tl::kTokens;
  // This block's K steps: the blockIdx.z-th of gridDim.z contiguous ranges (one unless split).
  const int all_steps = (p.nb + kStepBlocks - 1) / kStepBlocks;
  const int per_split = (all_steps + gridDim.z - 1) / gridDim.z;
  const int first_step = blockIdx.z * per_split;
  const int steps = max(0, min(all_steps, first_step + per_split) - first_step);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = (warp % Tl::kWarpsM) * Tl::kWarpRows, warp_tok = (warp / Tl::kWarpsM) * Tl::kWarpTokens;
  const int tokens_left = p.n - (tok0 + warp_tok);  // this warp's tokens below n
  const int n_tiles = tokens_left <= 0 ? 0 : min(Tl::kNTiles, (tokens_left + 7) / 8);

  float acc[Tl::kMTiles][Tl::kNTiles][4] = {};
  // Group s of cp.async copies holds step s: the first kStages - 1 now, one more per step.
#pragma unroll
  for (int s = 0; s < Tl::kStages - 1; ++s) {
    if (s < steps) load_stage<T, Tl>(smem + s * S::kStage, p, row0, tok0, first_step + s);
    cp_async_commit();
  }
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<Tl::kStages - 2>();  // this thread's copies of step s have landed
    __syncthreads();                   // everyone's have; everyone is done with step s - 1's tiles
    // Into the stage step s - 1 used (its conversion finished before the last step's second barrier).
    const int ahead = s + Tl::kStages - 1;
    if (ahead < steps) load_stage<T, Tl>(smem + (ahead % Tl::kStages) * S::kStage, p, row0, tok0, first_step + ahead);
    cp_async_commit();  // possibly empty: keeps one group per step
    convert_stage<T, Tl>(smem + (s % Tl::kStages) * S::kStage, w16, x16);
    __syncthreads();
    if (n_tiles > 0) mma_step<Tl>(w16, x16, warp_row, warp_tok, n_tiles, acc);
  }
  if (gridDim.z > 1 && !reduce_split_k<Tl>(smem, acc)) return;

  // Accumulator (i, j): rows +lane/4 and +8, tokens 2*(lane%4) and +1 of MMA tile (i, j). For one
  // token, 8 consecutive lanes write 8 consecutive floats of y (a 32-byte sector).
  const int g = lane / 4, tig = lane % 4;
#pragma unroll
  for (int i = 0; i < Tl::kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < Tl::kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row0 + warp_row + i * 16 + g + (e / 2) * 8;
        const int t = tok0 + warp_tok + j * 8 + 2 * tig + e % 2;
        if (r < p.rows && t < p.n) p.y[static_cast<size_t>(t) * p.ldy + r] = acc[i][j][e];
      }
}

constexpr int kMaxDevices = 64;

// What the plan needs to know of a device, looked up once per device.
struct DeviceInfo {
  int sm_count;
  bool clusters;  // thread-block clusters (sm_90 on): split-K
};
DeviceInfo device_info(int device) {
  static std::atomic<int> known[kMaxDevices];  // zero: not looked up yet; else SM count * 2 + clusters
  if (device < kMaxDevices) {
    const int v = known[device].load(std::memory_order_relaxed);
    if (v > 0) return {v / 2, v % 2 == 1};
  }
  int sms = 0, clusters = 0;
  CTX_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CTX_CUDA(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device));
  if (device < kMaxDevices) known[device] = sms * 2 + (clusters ? 1 : 0);
  return {sms, clusters != 0};
}

// Blocks of a tiling one SM holds at once: an H100's 228 KiB of shared memory (1 KiB of it
// reserved per block) with the largest layout (Q8_0), and 2048 threads; registers (under 128 a
// thread, ptxas) allow more.
template <class Tl>
constexpr int resident_blocks() {
  return std::min(2048 / Tl::kThreads, 228 * 1024 / (Smem<GgmlType::Q8_0, Tl>::kBytes + 1024));
}

template <GgmlType T, class Tl>
void launch(const Problem& p, int split, int device, cudaStream_t st) {
  constexpr int kSmem = Smem<T, Tl>::kBytes;
  // Above 48 KiB a kernel's dynamic shared memory must be allowed explicitly, once per device
  // (setting it twice from two threads is harmless).
  static std::atomic<bool> raised[kMaxDevices];  // zero-initialized: false
  if (device >= kMaxDevices || !raised[device].load(std::memory_order_relaxed)) {
    CTX_CUDA(cudaFuncSetAttribute(gemm_fast_kernel<T, Tl>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    CTX_CUDA(cudaFuncSetAttribute(gemm_fast_kernel<T, Tl>, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    if (device < kMaxDevices) raised[device] = true;
  }
  const dim3 grid((p.rows + Tl::kRows - 1) / Tl::kRows, (p.n + Tl::kTokens - 1) / Tl::kTokens, split);
  if (split == 1) {
    gemm_fast_kernel<T, Tl><<<grid, Tl::kThreads, kSmem, st>>>(p);
    CTX_CUDA_LAUNCHED("gemm_fast");
    return;
  }
  // The split blocks of an output tile (same x and y) as one cluster.
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = static_cast<unsigned>(split);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(Tl::kThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = st;
  config.attrs = &cluster;
  config.numAttrs = 1;
  CTX_CUDA(cudaLaunchKernelEx(&config, gemm_fast_kernel<T, Tl>, p));
}

template <GgmlType T>
void launch_type(const Problem& p, const GemmFastPlan& plan, int device, cudaStream_t st) {
  switch (plan.tiling) {
    case GemmFastTiling::k128x64:
      launch<T, Tiling128x64>(p, plan.split_k, device, st);
      break;
    case GemmFastTiling::k64x64:
      launch<T, Tiling64x64>(p, plan.split_k, device, st);
      break;
    case GemmFastTiling::k32x32:
      launch<T, Tiling32x32>(p, plan.split_k, device, st);
      break;
    case GemmFastTiling::k32x16:
      launch<T, Tiling32x16>(p, plan.split_k, device, st);
      break;
  }
}

// The tilings, largest first, as gemm_fast_plan weighs them.
struct TilingInfo {
  GemmFastTiling tiling;
  int rows, tokens, resident;
};
constexpr TilingInfo kTilings[] = {
    {GemmFastTiling::k128x64, Tiling128x64::kRows, Tiling128x64::kTokens, resident_blocks<Tiling128x64>()},
    {GemmFastTiling::k64x64, Tiling64x64::kRows, Tiling64x64::kTokens, resident_blocks<Tiling64x64>()},
    {GemmFastTiling::k32x32, Tiling32x32::kRows, Tiling32x32::kTokens, resident_blocks<Tiling32x32>()},
    {GemmFastTiling::k32x16, Tiling32x16::kRows, Tiling32x16::kTokens, resident_blocks<Tiling32x16>()},
};

long long blocks_of(const TilingInfo& t, int n, int rows) {
  return static_cast<long long>((rows + t.rows - 1) / t.rows) * ((n + t.tokens - 1) / t.tokens);
}

// The checks both forms of gemm_fast make first (gemm_fast.cuh), before any CUDA call.
void check_arguments(const DevQWeight& w, const float* x, int n, int ldy) {
  if (!gemm_fast_supports(w))
    throw std::invalid_argument(
        "gemm_fast: needs a Q4_0/Q4_1/Q8_0 weight with cols a multiple of 32 and aligned "
        "repacked data (" +
        std::to_string(w.rows) + " x " + std::to_string(w.cols) + ")");
  if (n < 0 || n > 65535 * 16) throw std::invalid_argument("gemm_fast: n = " + std::to_string(n) + " out of range");
  if (ldy < w.rows) throw std::invalid_argument("gemm_fast: output stride below the weight's rows");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) throw std::invalid_argument("gemm_fast: x must be 16-byte aligned");
}

}  // namespace

bool gemm_fast_supports(const DevQWeight& w) {
  return repackable(w.type) && w.rows >= 1 && w.cols >= 32 && w.cols % 32 == 0 && w.qs != nullptr && w.dm != nullptr &&
         reinterpret_cast<uintptr_t>(w.qs) % 16 == 0 && reinterpret_cast<uintptr_t>(w.dm) % 4 == 0;
}

GemmFastPlan gemm_fast_plan(int n, int rows, int cols, int sm_count, bool clusters) {
  const TilingInfo* t = &kTilings[3];
  for (const TilingInfo& c : kTilings)
    if (blocks_of(c, n, rows) >= sm_count) {
      t = &c;
      break;
    }
  const long long blocks = std::max(1LL, blocks_of(*t, n, rows));
  const int steps = (cols / 32 + kStepBlocks - 1) / kStepBlocks;
  const long long wave = static_cast<long long>(sm_count) * t->resident;
  const int wanted = static_cast<int>(std::min<long long>(wave / blocks, steps / 2));
  const int split = clusters ? std::clamp(wanted, 1, kGemmFastMaxSplit) : 1;
  const int per_split = (steps + split - 1) / split;
  return {t->tiling, (steps + per_split - 1) / per_split};  // no empty range
}

void gemm_fast(const DevQWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st, const GemmFastPlan& plan) {
  check_arguments(w, x, n, ldy);
  if (plan.tiling != GemmFastTiling::k128x64 && plan.tiling != GemmFastTiling::k64x64 && plan.tiling != GemmFastTiling::k32x32 &&
      plan.tiling != GemmFastTiling::k32x16)
    throw std::invalid_argument("gemm_fast: not a tiling");
  if (plan.split_k < 1 || plan.split_k > kGemmFastMaxSplit)
    throw std::invalid_argument("gemm_fast: split_k = " + std::to_string(plan.split_k) + " outside 1.." +
                                std::to_string(kGemmFastMaxSplit));
  if (n == 0) return;
  int device = 0;
  CTX_CUDA(cudaGetDevice(&device));
  if (plan.split_k > 1 && !device_info(device).clusters)
    throw std::invalid_argument("gemm_fast: split_k needs thread-block clusters (sm_90 on)");
  const Problem p{w.qs, w.dm, w.rows, w.cols, w.cols / 32, x, n, y, ldy};
  switch (w.type) {
    case GgmlType::Q4_0:
      launch_type<GgmlType::Q4_0>(p, plan, device, st);
      break;
    case GgmlType::Q4_1:
      launch_type<GgmlType::Q4_1>(p, plan, device, st);
      break;
    default:
      launch_type<GgmlType::Q8_0>(p, plan, device, st);
      break;
  }
}

void gemm_fast(const DevQWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st) {
  check_arguments(w, x, n, ldy);
  if (n == 0) return;
  int device = 0;
  CTX_CUDA(cudaGetDevice(&device));
  const DeviceInfo info = device_info(device);
  gemm_fast(w, x, n, y, ldy, st, gemm_fast_plan(n, w.rows, w.cols, info.sm_count, info.clusters));
}

}  // namespace ctx::cuda
