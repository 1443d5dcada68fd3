// Fused forms of the backend's small per-token kernels (kernels.cuh), for the launch-bound decode
// step: each computes bit for bit what the kernels it replaces compute in sequence, in one launch.
#pragma once
#include "cuda/kernels.cuh"

namespace ctx::cuda {

// rms_norm then quantize_q8 of its output: `out` (optional, may be nullptr) receives the f32
// normalised rows, `a` their 8-bit blocks. e must be a multiple of 32.
void rms_norm_quantize(const float* x, const float* weight, float* out, int n, int e, float eps, const DevActQ8& a, cudaStream_t st);
// rope of q (n_head heads) and k (n_head_kv heads), then store_kv of the rotated k and of v: q is
// rotated in place; k is read, not written.
void rope_store_kv(float* q, const float* k, const float* v, int n, int n_head, int n_head_kv, int head_dim, const int* pos,
                   const float* cos_t, const float* sin_t, const TokenKv* tokens, int layer, cudaStream_t st);

}  // namespace ctx::cuda
