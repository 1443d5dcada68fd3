// The engine's numeric kernels behind one dispatch table. Each instruction set (scalar,
// AVX2, AVX-512) provides a table; select_kernels() picks the best the CPU supports once at
// start-up. The scalar table is the reference that tests compare every SIMD kernel against.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml_types.h"

namespace ctx {

// Activations quantized to 8 bits in 32-element blocks, the way ggml feeds quantized
// weights: per block a scale d (rounded to f16), the f16-rounded d*sum(qs) (for Q4_1/Q5_1, as
// ggml's Q8_1) and the integer sum of qs (for the other offsets: Q4_0, Q5_0, the K-quants' mins
// and Q6_K's -32). Stored structure-of-arrays, one row per token. The K-quants use the same
// 32-element blocks, one per sub-block (ggml uses 256-element Q8_K activations for them).
struct ActQ8 {
  int8_t* qs = nullptr;     // [rows][k]
  float* d = nullptr;       // [rows][k/32]
  float* s = nullptr;       // [rows][k/32]
  int32_t* isum = nullptr;  // [rows][k/32]
  int k = 0;                // row length (multiple of 32)
  int blocks() const { return k / 32; }
};

// y[t * ldy + r] = dot(weight row r, activation row t) for r < n_rows, t < n_tok, with the
// weights in the packed 8-row layout of packed.h.
struct GemmQ8Args {
  const uint8_t* w;    // first packed row group
  size_t group_bytes;  // bytes between row groups
  int n_rows;          // rows to compute from the first group on (the last group may be partial)
  const ActQ8* x;
  int tok0, n_tok;  // activation rows [tok0, tok0 + n_tok)
  float* y;         // already offset to (tok0, first row)
  int ldy;
};
// The same for F32/F16/BF16 weights in their file layout, f32 activations.
struct GemmF32Args {
  const uint8_t* w;
  size_t w_stride;
  int n_rows;
  const float* x;  // [n_tok][k], already offset to tok0
  int k, n_tok;
  float* y;
  int ldy;
};

constexpr int kMaxHeadDim = 256;  // attention kernels keep a few head-sized rows on the stack

struct KernelTable {
  const char* name;
  void (*quantize_q8)(const float* x, int k, int8_t* qs, float* d, float* s, int32_t* isum);
  void (*gemm_q4_0)(const GemmQ8Args&);
  void (*gemm_q4_1)(const GemmQ8Args&);
  void (*gemm_q8_0)(const GemmQ8Args&);
  void (*gemm_q5_0)(const GemmQ8Args&);
  void (*gemm_q5_1)(const GemmQ8Args&);
  void (*gemm_q4_k)(const GemmQ8Args&);
  void (*gemm_q5_k)(const GemmQ8Args&);
  void (*gemm_q6_k)(const GemmQ8Args&);
  void (*gemm_f32)(const GemmF32Args&);
  void (*gemm_f16)(const GemmF32Args&);
  void (*gemm_bf16)(const GemmF32Args&);
  // Attention, one block of keys at a time (the engine tiles over the cache). kv_to_f32 widens
  // n f16 rows, `stride` elements apart and `width` wide, into dst as [n][width].
  void (*kv_to_f32)(const uint16_t* src, size_t stride, int n, int width, float* dst);
  // The same for the rows idx[0..n) of a cache whose row i starts at base + idx[i] * stride.
  void (*kv_gather_f32)(const uint16_t* base, size_t stride, const int32_t* idx, int n, int width, float* dst);
  // s[i * lds + j] = dot(q[i], k[j]) * scale for i < nq, j < nk; q is [nq][d], key j at k + j*ldk.
  void (*attn_scores)(const float* q, int nq, const float* k, size_t ldk, int nk, int d, float scale, float* s, size_t lds);
  // The same straight from f16 keys (the cache), equal to attn_scores on their widened copy bit for
  // bit; next_k: where the caller's next nk keys lie (same ldk), fetched ahead; nullptr: unknown.
  void (*attn_scores_f16)(const float* q, int nq, const uint16_t* k, size_t ldk, int nk, int d, float scale, float* s, size_t lds,
                          const uint16_t* next_k);
  // out[i] += sum_j p[i * ldp + j] * v[j] for i < nq, j < nk; value j at v + j*ldv, out is [nq][d].
  void (*attn_values)(const float* p, size_t ldp, int nq, const float* v, size_t ldv, int nk, int d, float* out);
  // x[i] = exp(x[i] - max), returns the sum.
  float (*exp_sum)(float* x, int n, float max);
  // Online-softmax (flash) attention over one block of nk keys straight from the f16 cache, for
  // nq query rows of one KV head (q: [nq][d]). Row i keeps a running max m[i], sum l[i] and
  // unnormalised output acc[i] ([nq][d]) across blocks and takes the block's keys [lo[i], hi[i])
  // (none when lo >= hi); key j's K and V (this head's d columns) at k + j*ld and v + j*ld. Scores
  // are attn_scores' bit for bit. A row's result depends on its own query, keys and range only,
  // never on nq, nk or the other rows, bit for bit: the engine attends a token in blocks whose
  // size and company depend on how its prompt was chunked, and its logits must not. `work` holds
  // flash_work_floats(nq, nk, d) floats. next_k/next_v: where the caller's next block of nk keys
  // lies (same ld), which a kernel may fetch ahead while this one computes; nullptr: unknown.
  // raw (nullable): receives row i's scores of its keys [lo[i], hi[i]) at raw + i*ldraw + j, the
  // others untouched (a decode policy that ranks keys by them reads the block once: OmniKV).
  void (*flash_block)(const float* q, int nq, const uint16_t* k, const uint16_t* v, size_t ld, int nk, int d, float scale, const int* lo,
                      const int* hi, float* m, float* l, float* acc, float* work, const uint16_t* next_k, const uint16_t* next_v,
                      float* raw, size_t ldraw);
  void (*f32_to_f16)(const float* x, uint16_t* y, int n);
  // SwiGLU: g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i].
  void (*swiglu)(float* g, const float* u, int n);
  // GeGLU with the tanh GELU: g[i] = 0.5 x (1 + tanh(y)) * u[i], y = sqrt(2/pi) (x + 0.044715 x^3),
  // x = g[i]; computed as x / (1 + exp(-2y)) (the same function; no cancellation where tanh ~ -1).
  void (*geglu)(float* g, const float* u, int n);
};

// The tanh GELU's argument y = sqrt(2/pi) (x + 0.044715 x^3) (geglu's tails, the references).
constexpr float kGeluSqrt2OverPi = 0.79788456080286535587989211986876f, kGeluCoef = 0.044715f;
inline float gelu_tanh_arg(float x) { return kGeluSqrt2OverPi * x * (1.0f + kGeluCoef * x * x); }

// Scratch flash_block needs: the rows' scores and rescale factors, and the keys and values
// widened to f32, padded to whole 8-key tiles.
constexpr size_t flash_work_floats(int nq, int nk, int d) {
  return static_cast<size_t>((nk + 7) / 8 * 8) * (static_cast<size_t>(nq) + 2 * static_cast<size_t>(d)) + static_cast<size_t>(nq);
}

// The table's GEMM for a packed quantized weight type (packed.h is_packable); nullptr for others.
using GemmQ8Fn = void (*)(const GemmQ8Args&);
GemmQ8Fn gemm_q8_for(const KernelTable& k, GgmlType t);

const KernelTable& scalar_kernels();
const KernelTable* avx2_kernels();    // nullptr when not compiled in
const KernelTable* avx512_kernels();  // nullptr when not compiled in

// The best table this CPU runs; CTXBANK_KERNELS=scalar|avx2|avx512 overrides (tests, benches).
const KernelTable& select_kernels();
bool cpu_has_avx2();
bool cpu_has_avx512();

}  // namespace ctx
