// The CUDA backend's kernels, each behind a host launcher that takes device pointers and a stream.
// Every kernel has a scalar CPU reference it is compared with on a GPU (tests/cuda_kernels_test.cc):
// the CPU engine's own code where one exists (engine.cc, kernels_scalar.cc), else testing.cu.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ggml_types.h"

namespace ctx::cuda {

// A weight in GPU memory, in the GGUF file's own layout (rows of quant blocks, `row_bytes` apart).
struct DevWeight {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  size_t row_bytes = 0;
};

// A Q4_0/Q4_1/Q8_0 weight repacked for the fast kernels (repack.h: quants contiguous and 16-byte
// aligned per block, the (d, m) scales apart). The backend keeps it beside the file-layout copy.
struct DevQWeight {
  GgmlType type = GgmlType::Q4_1;
  int rows = 0, cols = 0;
  const uint8_t* qs = nullptr;  // [rows][cols/32][16] (Q4) or [rows][cols/32][32] (Q8_0)
  const __half2* dm = nullptr;  // [rows][cols/32]: (d, m)
};

// Activations quantized to 8 bits per 32-element block exactly as the CPU engine does (kernels.h
// ActQ8, kernels_scalar.cc quantize_q8), so quantized matvecs match the CPU's integer dot products.
struct DevActQ8 {
  int8_t* qs = nullptr;  // [n][k]
  float* d = nullptr;    // [n][k/32]
  float* s = nullptr;    // [n][k/32]
  int32_t* isum = nullptr;
  int k = 0;
};

// Where token t of a micro-batch writes its K/V: its sequence's cache (layer-major, kv_cache.h
// layout: layer l's K at base + l*2*cap*kv_dim, V cap*kv_dim later; rows [token][kv_dim]).
struct TokenKv {
  __half* base;
  int cap;
  int pos;
};

// One block of attention work: queries [q0, q0 + nq) of the micro-batch (consecutive positions
// pos0.., one sequence) against that sequence's keys [key_begin, key_end) (each query also stops
// at its own position: causal). The result is a partial (max, sum, unnormalised output) written
// to partial rows part0 + i, merged per token by attention_combine.
struct AttnWork {
  const __half* base;  // the sequence's cache
  int cap;
  int q0, nq, pos0;
  int key_begin, key_end;
  int part0;
  // Reserved for sparse decode (next step): a per-layer token list to attend instead of the
  // range; nullptr = the range. Indexed [layer * list_stride + j], j < key_end - key_begin.
  const int32_t* keys;
  int list_stride;
};
// Per token: its partial rows are part0 + s * stride for s < n_splits.
struct AttnCombine {
  int part0, stride, n_splits;
};

// One slice of a micro-batch as attention sees it: `count` queries at batch rows q0.. and positions
// pos0.., of one sequence whose cache is `base` (capacity `cap`).
struct AttnSlice {
  const __half* base;
  int cap, q0, count, pos0;
};
// Fills the work list and per-token combine entries of a micro-batch; returns the number of work
// items. Prefill slices: tiles of kAttnQueries queries, each over every key it may see. Decode
// slices (at most kSplitTokens queries): their keys split into up to kMaxSplits ranges of at least
// kSplitKeys keys (flash-decoding), merged by attention_combine, with fewer splits when the
// batch's partial rows would exceed `max_parts` (at least the batch's token count). `works` and
// the partial buffers hold max_parts entries/rows, `comb` one per token.
int plan_attention(const AttnSlice* slices, int n_slices, AttnWork* works, AttnCombine* comb, int max_parts);
// plan_attention for a micro-batch of single-token decode steps only, made for replaying a
// captured graph: every token gets the same number of splits, `*bucket`: plan_attention's count
// for the batch's longest context (within the same budget) rounded down to a power of two, so
// never more than plan_attention gives any token of the batch; a small step (a few sequences,
// far from filling the GPU) rounds up to ceil(keys / kSplitKeys) instead. Each split is an equal share of
// that token's own keys (empty for the last ones of a shorter context). The work list's size then
// depends on the token count and the bucket alone, so one graph serves every step until the
// longest context reaches the next power of two times kSplitKeys keys, where plan_attention's work
// count changes every 256 keys.
int plan_decode_bucketed(const AttnSlice* slices, int n_slices, AttnWork* works, AttnCombine* comb, int max_parts, int* bucket);
constexpr int kSplitTokens = 4;
constexpr int kSplitKeys = 256;
constexpr int kMaxSplits = 128;
constexpr int kPartsPerToken = 32;  // partial-row budget per micro-batch token (scratch size)

constexpr int kAttnQueries = 16;  // queries per attention work item (a prefill tile)
constexpr int kAttnKeys = 64;     // keys per shared-memory tile
constexpr int kMaxHeadDimGpu = 128;
constexpr int kMatvecTokens = 8;  // micro-batches up to this many tokens use the matvec kernels

void embed(const DevWeight& w, const int32_t* tokens, int n, float* x, cudaStream_t st);
void rms_norm(const float* x, const float* weight, float* out, int n, int e, float eps, cudaStream_t st);
// Adjacent-pair ("normal") RoPE, as the CPU engine: cos/sin tables [position][head_dim/2].
void rope(float* x, int n, int n_heads, int head_dim, const int* pos, const float* cos_t, const float* sin_t, cudaStream_t st);
void quantize_q8(const float* x, int n, int k, const DevActQ8& a, cudaStream_t st);
// y[t * ldy + r] = dot(w row r, x row t) for t < n. Quantized weights with n <= kMatvecTokens use
// act (already quantized from x); everything else reads x ([n][cols] f32).
void matvec(const DevWeight& w, const float* x, const DevActQ8* act, int n, float* y, int ldy, cudaStream_t st);
// Tensor-core GEMM on f16 tiles: activations and dequantized weights rounded to f16, f32 sums.
void gemm(const DevWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st);
void store_kv(const float* k, const float* v, const TokenKv* tokens, int n, int kv_dim, int layer, cudaStream_t st);
void attention(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
               float* part_o, float* part_ml, cudaStream_t st);
void attention_combine(const float* part_o, const float* part_ml, const AttnCombine* comb, int n, int n_head, int head_dim, float* out,
                       cudaStream_t st);
void swiglu(float* gate, const float* up, size_t count, cudaStream_t st);
void add(float* x, const float* y, size_t count, cudaStream_t st);
void gather_rows(const float* x, const int* rows, int n, int width, float* out, cudaStream_t st);
// out[r] = the lowest index of the largest value of row r (ties: the first, as std::max_element);
// NaNs are passed over, and a row of nothing above -inf gives 0. Each row is cut into chunks of
// kArgmaxChunk elements searched by blocks of their own (one block per row was ~8% of a decode
// step's kernel time on an H100, Nsight Compute), their best kept in `scratch`, allocated once by
// the caller with argmax_chunks(n_vocab) entries per row. Two launches on `st`, nothing else, so
// a graph can capture them.
struct ArgmaxPartial {
  float value;
  int index;
};
constexpr int kArgmaxChunk = 2048;
constexpr int argmax_chunks(int n_vocab) { return (n_vocab + kArgmaxChunk - 1) / kArgmaxChunk; }
void argmax(const float* logits, int rows, int n_vocab, ArgmaxPartial* scratch, int32_t* out, cudaStream_t st);

}  // namespace ctx::cuda
