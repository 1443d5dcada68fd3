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

// The fused forms (the fused-decode kernel set): the activations come as f32 rows and every block
// quantizes them into its own shared memory first, RMS-normalised when `norm` is set, so a decode
// step launches no norm or quantize kernel of its own. Each block repeats rms_norm's double sums
// in the same order and quantize_q8's steps: the activations are the same bits as
// rms_norm_quantize's (or quantize_q8's), and the results those of the launcher above, up to the
// compiler's use of FMAs (an ulp or so of a block's term). The rows are read by every block: the
// fused forms suit the small matrices of a layer, not the output matrix's 49,152 rows.
struct F32Act {
  const float* x = nullptr;     // [n][k]
  int k = 0;                    // a multiple of 32
  const float* norm = nullptr;  // RMSNorm weight [k], or none
  float eps = 0.f;
};
// Whether a launch of n tokens of `in` fits a block's shared memory (48 KiB): at n = 8, k up to
// 2,400 with the norm and 4,096 without. The launchers below throw std::invalid_argument otherwise.
bool fused_act_fits(const F32Act& in, int n);

// pdl: launch with programmatic dependent launch (the `pdl` kernel set): the kernel's blocks may
// start while the previous kernel in the stream runs, fetch their weights into L2, and wait for
// it before touching anything it may write; the results are the same bits either way. Hopper
// (sm_90) and later only: the kernels built for older GPUs do not wait.
void matvec_fast(const DevQWeight& w, const F32Act& in, int n, float* y, int ldy, bool accumulate, cudaStream_t st, bool pdl = false);
void matvec_fast_swiglu(const DevQWeight& gate, const DevQWeight& up, const F32Act& in, int n, float* out, int ldo, cudaStream_t st,
                        bool pdl = false);

// Where the Q/K/V launch puts its results: q (n_head * head_dim rows) rotated into q[t * ldq + r],
// k rotated and v as they are into the KV cache at tokens[t] in `layer` (f16), as rope_store_kv
// does (adjacent-pair RoPE, cos/sin tables [position][head_dim / 2]).
struct RopeStore {
  float* q;
  int ldq;
  int head_dim;  // even; every weight's rows a multiple of it
  const int* pos;
  const float* cos_t;
  const float* sin_t;
  const TokenKv* tokens;
  int layer;
};
// The Q, K and V products of `in` in one launch, then RoPE and the KV store: what
// matvec_fast_multi followed by rope_store_kv computes (as above). wk and wv share their shape (the KV width).
void matvec_qkv_rope(const DevQWeight& wq, const DevQWeight& wk, const DevQWeight& wv, const F32Act& in, int n, const RopeStore& out,
                     cudaStream_t st, bool pdl = false);

}  // namespace ctx::cuda
