// Faster attention kernels, drop-in alternatives to attention() (kernels.cuh): the same work list
// (plan_attention) and the same partial rows (part_o [row][head][d] unnormalised, part_ml
// [row][head] = (running max m, sum l)), so attention_combine merges them unchanged. Each is
// tested against a double-precision reference and against attention() (tests/cuda_attention_fast_test.cc).
//
// Both are one tensor-core kernel (attention_fast.cu attention_tc_kernel) in two configurations.
// A block takes one work item and up to 4 query heads of one KV head, so each K/V tile is read
// from global memory once for all of them (a larger GQA group takes several blocks, each reading
// the tiles again); tiles are copied to shared memory with cp.async, several in flight. Both
// accept any work item:
//   - any nq (queries beyond what one pass of a block holds are taken in further passes);
//   - any key range, and sparse key lists (`keys` != nullptr) read as attention() reads them;
//   - any group size n_head / n_head_kv; head_dim 32, 64, 96 or 128 (another falls back to attention()).
// What the caller must guarantee (the backend's caches do): n_head % n_head_kv == 0, and every
// work item's cache `base` 16-byte aligned (cudaMalloc'd).
#pragma once
#include "cuda/kernels.cuh"

namespace ctx::cuda {

// Decode attention, for work items of kSplitTokens queries or fewer over a key range
// (flash-decoding splits): up to 16 (query, head) rows per pass, 4 warps splitting each 64-key
// tile. q and the softmax weights enter the tensor cores as f16 pairs (hi + lo, two MMAs each),
// scores use expf: results within a few float roundings of attention() (2e-5 in the tests).
// Prefill tiles are correct too, but take several passes: attention_prefill_tc is for them.
// With part_ml null (attention_gqa only), every work item must be the only one of its queries, over every key they see,
// with partial rows = token rows (a decode step planned with one split: plan_decode_bucketed's
// bucket 1): part_o then receives the output [token][head][d], o / l, the bits
// attention_combine(_wide) would write from the partials (o * 1 and l * 1 merged), in one launch.
void attention_gqa(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                   float* part_o, float* part_ml, cudaStream_t st);

// Prefill attention, for tiles of up to kAttnQueries queries: a block's rows are its work item's
// queries times its query heads (16 x 3 = 48 for a group of 3), 16 rows per pair of warps that
// split each tile's keys. q and the softmax weights P are rounded to f16 (K and V already are):
// relative error up to 2^-11 in each, so results differ from attention()'s by up to about 1e-3
// for values in [-1, 1] (the test derives the bound).
void attention_prefill_tc(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                          float* part_o, float* part_ml, cudaStream_t st);

// attention_combine with the splits spread over a block: one block of 128 threads per (token,
// head) reads every split's (m, l) and output rows at once, where attention_combine walks them in
// sequence with one warp (up to 128 splits at a 32K+ context: a chain of dependent memory reads
// per head). Same arithmetic per split; the sums are added in another order (results within a
// few float roundings of attention_combine's).
void attention_combine_wide(const float* part_o, const float* part_ml, const AttnCombine* comb, int n, int n_head, int head_dim, float* out,
                            cudaStream_t st);

}  // namespace ctx::cuda
