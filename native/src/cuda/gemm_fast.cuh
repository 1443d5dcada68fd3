// Tensor-core GEMM on repacked quantized weights (DevQWeight, repack.h) for micro-batches of more
// than kMatvecTokens tokens: prefill chunks and batched decode. The drop-in alternative to gemm()
// (kernels.cuh) for Q4_0/Q4_1/Q8_0 weights, with the same numerics: the weight dequantized and the
// activations rounded to f16, products summed in f32 (mma.sync m16n8k16). Each output element is
// summed in an order fixed by the plan (below), so the same inputs give bit-identical outputs.
//
// Requirements (std::invalid_argument otherwise, from gemm_fast): gemm_fast_supports(w); n >= 0
// (0 launches nothing); ldy >= w.rows; x 16-byte aligned (its rows are then too: cols is a
// multiple of 32); a plan's split_k in 1..kGemmFastMaxSplit, and 1 on a device without
// thread-block clusters (before sm_90). No scratch memory: x is read as f32 and rounded to f16 on
// the way into shared memory.
#pragma once
#include "cuda/kernels.cuh"

namespace ctx::cuda {

// Block tiles of gemm_fast, weight rows x tokens (gemm_fast.cu: Tiling).
enum class GemmFastTiling { k128x64, k64x64, k32x32, k32x16 };
constexpr int kGemmFastMaxSplit = 8;  // the portable thread-block cluster size

// How a call is cut up: the block tile, and split_k (1..kGemmFastMaxSplit) blocks per output tile,
// each summing a contiguous range of the K dimension; the split_k blocks of a tile form a
// thread-block cluster and the first adds the others' partial sums, read from their shared memory,
// in a fixed order (so results stay bit-identical run to run, though they differ in rounding
// between plans). Every plan gives the same products up to that rounding.
struct GemmFastPlan {
  GemmFastTiling tiling = GemmFastTiling::k128x64;
  int split_k = 1;
};

// Whether gemm_fast takes w: Q4_0, Q4_1 or Q8_0, rows >= 1, cols a positive multiple of 32, the
// quants 16-byte aligned and the scales 4-byte aligned.
bool gemm_fast_supports(const DevQWeight& w);

// The plan gemm_fast uses for n tokens and a rows x cols weight on a device of `sm_count` SMs:
// the largest block tile whose grid still gives every SM a block (else the smallest, the most
// blocks); then, on a device with thread-block `clusters` and while the blocks would fill less
// than one wave of the SMs' resident blocks, K split into ranges of at least two 64-column steps,
// as many as still fit that wave. Small micro-batches have few output tiles, each a long chain of
// dependent K steps: splitting K shortens the chain.
GemmFastPlan gemm_fast_plan(int n, int rows, int cols, int sm_count, bool clusters);

// y[t * ldy + r] = sum_c W[r][c] * x[t][c] for t < n, r < w.rows; x is [n][w.cols] f32.
// Elements of y with r >= w.rows are left untouched. The first form plans with gemm_fast_plan for
// the current device; the second runs the given plan (tests, benchmarks).
void gemm_fast(const DevQWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st);
void gemm_fast(const DevQWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st, const GemmFastPlan& plan);

}  // namespace ctx::cuda
