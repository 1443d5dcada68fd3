// Fast decode matvecs: repacked Q4_0/Q4_1/Q8_0 weights (DevQWeight, repack.h) times 8-bit
// activations (DevActQ8) for micro-batches of 1..kMatvecTokens tokens. Integer dot products per
// 32-element block (dp4a), each block's term computed as the CPU engine does (kernels_scalar.cc
// gemm_q4_0/q4_1/q8_0), so only the order of the float sums across blocks differs from the CPU.
// The variants fuse what a latency-bound decode step would otherwise launch separately: the
// residual add, the Q/K/V projections, and gate/up with SwiGLU.
//
// Every launcher checks its arguments and throws std::invalid_argument when: n is outside
// 1..kMatvecTokens; a weight is not Q4_0/Q4_1/Q8_0, has no rows, or its cols differ from a.k (a
// multiple of 32); the weights of one launch differ in type or cols (or, for SwiGLU, in rows); an
// output stride is below the weight's rows; w.qs or a.qs is not 16-byte aligned or w.dm not
// 4-byte aligned (cudaMalloc'd buffers are; a sub-allocation must keep 16 bytes).
#pragma once
#include "cuda/kernels.cuh"

namespace ctx::cuda {

// y[t * ldy + r] = (accumulate ? y[t * ldy + r] : 0) + dot(w row r, activation row t) for t < n,
// r < w.rows. With accumulate, y may be the residual stream itself (x += W a).
void matvec_fast(const DevQWeight& w, const DevActQ8& a, int n, float* y, int ldy, bool accumulate, cudaStream_t st);

// matvec_fast without accumulate for `count` (1..3) weights sharing type, cols and activations,
// in one launch (the Q, K and V projections): y[i][t * ldy[i] + r] = dot(w[i] row r, activation row t).
void matvec_fast_multi(const DevQWeight* const w[3], float* const y[3], const int ldy[3], int count, const DevActQ8& a, int n,
                       cudaStream_t st);

// out[t * ldo + r] = silu(g) * u with g = dot(gate row r, activation row t), u the same for `up`,
// and silu(g) = g / (1 + expf(-g)) as the swiglu kernel computes it. gate and up share type and shape.
void matvec_fast_swiglu(const DevQWeight& gate, const DevQWeight& up, const DevActQ8& a, int n, float* out, int ldo, cudaStream_t st);

}  // namespace ctx::cuda
