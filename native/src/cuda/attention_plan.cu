// The attention work list of a micro-batch (kernels.cuh plan_attention): host code.
#include <algorithm>

#include "cuda/kernels.cuh"

namespace ctx::cuda {
namespace {

// The splits of a decode slice whose last query sees n_keys keys, given the partial rows each
// decode token may have beyond its own.
int decode_splits(int n_keys, int extra_per_token) { return std::max(1, std::min({kMaxSplits, n_keys / kSplitKeys, 1 + extra_per_token})); }

// A bucketed step with at most this many work items (before its KV heads) is small: it is far from
// filling the GPU, so it rounds its split count up, not down (more blocks in flight at batch 1).
constexpr int kSmallStepWorks = 256;

}  // namespace

int plan_attention(const AttnSlice* slices, int n_slices, AttnWork* works, AttnCombine* comb, int max_parts) {
  // Every token needs one partial row; the rest of the budget is shared by the decode tokens.
  int tokens = 0, decode_tokens = 0;
  for (int i = 0; i < n_slices; ++i) {
    tokens += slices[i].count;
    if (slices[i].count <= kSplitTokens) decode_tokens += slices[i].count;
  }
  const int extra_per_token = decode_tokens > 0 ? std::max(0, max_parts - tokens) / decode_tokens : 0;
  int n_works = 0, part = 0;
  for (int i = 0; i < n_slices; ++i) {
    const AttnSlice& s = slices[i];
    const int n_keys = s.pos0 + s.count;  // the last query sees every key up to its own
    const int splits = s.count <= kSplitTokens ? decode_splits(n_keys, extra_per_token) : 1;
    if (splits > 1) {
      const int chunk = (n_keys + splits - 1) / splits;
      for (int sp = 0; sp < splits; ++sp) {
        const int k0 = sp * chunk, k1 = std::min(n_keys, k0 + chunk);
        works[n_works++] = {s.base, s.cap, s.q0, s.count, s.pos0, k0, k1, part + sp * s.count, nullptr, 0};
      }
      for (int q = 0; q < s.count; ++q) comb[s.q0 + q] = {part + q, s.count, splits};
      part += splits * s.count;
    } else {
      for (int q = 0; q < s.count; q += kAttnQueries) {
        const int nq = std::min(kAttnQueries, s.count - q);
        works[n_works++] = {s.base, s.cap, s.q0 + q, nq, s.pos0 + q, 0, s.pos0 + q + nq, part + q, nullptr, 0};
      }
      for (int q = 0; q < s.count; ++q) comb[s.q0 + q] = {part + q, 0, 1};
      part += s.count;
    }
  }
  return n_works;
}

int plan_decode_bucketed(const AttnSlice* slices, int n_slices, AttnWork* works, AttnCombine* comb, int max_parts, int* bucket) {
  // plan_attention's count for the longest context, rounded down to a power of two. Rounded up, a
  // step at 4,097 keys had 32 splits of 129 keys where plan_attention has 16 of 257: at B = 128,
  // where 16 already fill the GPU, twice the works and partial rows took decode at 4K from 13,200
  // to 11,200 tok/s (H100, GPU run-2/run-3). A small step rounds up instead (as run-3's batch-1
  // decode did, 1.33 ms at 4K): one doubling reaches ceil(keys / kSplitKeys) from the floor.
  int longest = 0;
  for (int i = 0; i < n_slices; ++i) longest = std::max(longest, slices[i].pos0 + 1);
  const int exact = decode_splits(longest, std::max(0, max_parts - n_slices) / std::max(1, n_slices));
  int splits = 1;
  while (2 * splits <= exact) splits *= 2;
  const int want = std::min(kMaxSplits, (longest + kSplitKeys - 1) / kSplitKeys);
  if (splits < want && 2 * splits * n_slices <= std::min(kSmallStepWorks, max_parts)) splits *= 2;
  int n_works = 0;
  for (int i = 0; i < n_slices; ++i) {
    const AttnSlice& s = slices[i];
    const int n_keys = s.pos0 + 1, chunk = (n_keys + splits - 1) / splits, part = i * splits;
    for (int sp = 0; sp < splits; ++sp) {
      const int k0 = std::min(n_keys, sp * chunk), k1 = std::min(n_keys, k0 + chunk);
      works[n_works++] = {s.base, s.cap, s.q0, 1, s.pos0, k0, k1, part + sp, nullptr, 0};
    }
    comb[s.q0] = {part, 1, splits};
  }
  *bucket = splits;
  return n_works;
}

}  // namespace ctx::cuda
