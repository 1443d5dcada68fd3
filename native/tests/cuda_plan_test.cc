// The attention work plan of a micro-batch (cuda/attention_plan.cu): host code, so it runs in
// every CUDA build, GPU or not (CI). Every query must see each of its keys in exactly one work
// item, every partial row must belong to one (query, split), and the budget must hold.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/kernels.cuh"

namespace {

using namespace ctx::cuda;

struct Checked {
  int works = 0, max_splits = 0, parts = 0;
};

// Plans `slices` (count, pos0) and checks the plan against its contract (with plan_decode_bucketed
// when `bucketed`: single-token slices only).
Checked check(const std::vector<std::pair<int, int>>& slices_spec, int max_parts, bool bucketed = false) {
  std::vector<AttnSlice> slices;
  int tokens = 0;
  for (size_t i = 0; i < slices_spec.size(); ++i) {
    // A distinct fake cache address per slice: the plan only copies it.
    slices.push_back({reinterpret_cast<const __half*>(0x1000 * (i + 1)), 1 << 20, tokens, slices_spec[i].first, slices_spec[i].second});
    tokens += slices_spec[i].first;
  }
  std::vector<AttnWork> works(max_parts + 1);
  std::vector<AttnCombine> comb(tokens);
  int bucket = 0;
  const int n = bucketed
                    ? plan_decode_bucketed(slices.data(), static_cast<int>(slices.size()), works.data(), comb.data(), max_parts, &bucket)
                    : plan_attention(slices.data(), static_cast<int>(slices.size()), works.data(), comb.data(), max_parts);
  if (bucketed) EXPECT_EQ(n, bucket * static_cast<int>(slices.size()));
  Checked out;
  out.works = n;
  EXPECT_LE(n, max_parts);
  // For each batch token: the keys each work item lets it see, and the partial row it writes.
  std::map<int, std::vector<std::pair<int, int>>> seen;  // token -> [key_begin, key_end) per work
  std::map<int, std::set<int>> rows_of;                  // token -> partial rows written
  std::set<int> all_rows;
  for (int w = 0; w < n; ++w) {
    const AttnWork& a = works[w];
    EXPECT_GE(a.nq, 1);
    EXPECT_LE(a.nq, kAttnQueries);
    EXPECT_EQ(a.keys, nullptr);
    for (int q = 0; q < a.nq; ++q) {
      const int t = a.q0 + q, pos = a.pos0 + q;
      const int end = std::min(a.key_end, pos + 1);  // the kernel's causal cut
      if (end > a.key_begin) seen[t].push_back({a.key_begin, end});
      const int row = a.part0 + q;
      EXPECT_TRUE(all_rows.insert(row).second) << "partial row " << row << " written twice";
      EXPECT_LT(row, max_parts);
      rows_of[t].insert(row);
    }
  }
  out.parts = static_cast<int>(all_rows.size());
  for (size_t s = 0; s < slices.size(); ++s)
    for (int q = 0; q < slices[s].count; ++q) {
      const int t = slices[s].q0 + q, pos = slices[s].pos0 + q;
      // Keys 0..pos, each exactly once.
      std::vector<int> hits(pos + 1, 0);
      for (auto [b, e] : seen[t])
        for (int k = b; k < e; ++k) ++hits[k];
      int bad = -1;
      for (int k = 0; k <= pos && bad < 0; ++k)
        if (hits[k] != 1) bad = k;
      EXPECT_EQ(bad, -1) << "token " << t << " sees key " << bad << " " << (bad >= 0 ? hits[bad] : 0) << " times";
      // The combine entry names exactly the rows written for this token.
      const AttnCombine& c = comb[t];
      std::set<int> named;
      for (int sp = 0; sp < c.n_splits; ++sp) named.insert(c.part0 + sp * c.stride);
      EXPECT_EQ(named, rows_of[t]) << "token " << t;
      out.max_splits = std::max(out.max_splits, c.n_splits);
      if (slices[s].count > kSplitTokens) EXPECT_EQ(c.n_splits, 1);
    }
  return out;
}

TEST(CudaPlan, PrefillTilesCoverEveryCausalKeyOnce) {
  const Checked c = check({{100, 0}, {37, 200}, {16, 16}, {17, 5}}, 512 * kPartsPerToken);
  EXPECT_EQ(c.max_splits, 1);
  EXPECT_EQ(c.works, 7 + 3 + 1 + 2);
}

TEST(CudaPlan, DecodeStepsSplitLongContexts) {
  EXPECT_EQ(check({{1, 0}}, 1024).max_splits, 1);
  EXPECT_EQ(check({{1, 510}}, 1024).max_splits, 1);  // 511 keys: one range of >= 256 only
  EXPECT_EQ(check({{1, 1000}}, 1024).max_splits, 3);
  EXPECT_EQ(check({{4, 5000}}, 4096).max_splits, 19);
  EXPECT_EQ(check({{1, 131071}}, 16384).max_splits, kMaxSplits);
  EXPECT_EQ(check({{2, 40000}}, 16384).max_splits, kMaxSplits);
}

TEST(CudaPlan, TheBudgetLimitsSplitsNotCoverage) {
  // 128 decode steps at 4K plus a prefill chunk, in a budget of 32 rows per token.
  std::vector<std::pair<int, int>> slices(128, {1, 4096});
  slices.push_back({64, 100});
  const int budget = (128 + 64) * kPartsPerToken;
  const Checked c = check(slices, budget);
  EXPECT_LE(c.parts, budget);
  EXPECT_EQ(c.max_splits, 16);  // 4097 keys / 256: the budget (1 + 47 per token) is not binding
  // A tight budget: every step still sees all its keys, in fewer splits.
  const Checked tight = check(std::vector<std::pair<int, int>>(64, {1, 100000}), 64 * 3);
  EXPECT_EQ(tight.max_splits, 3);
  EXPECT_LE(tight.parts, 64 * 3);
}

TEST(CudaPlan, BucketedDecodeStepsHaveOneWorkCountPerBucket) {
  // Contexts of one bucket give the same work count, so a captured graph serves them all; every
  // key is still seen once. A small step's buckets: 1 to 256 keys, 1 split; 257 to 512, 2; 1,025
  // to 2,048, 8 (ceil(keys / 256) rounded up to a power of two).
  EXPECT_EQ(check({{1, 0}}, 1024, true).works, 1);
  EXPECT_EQ(check({{1, 255}}, 1024, true).works, 1);
  EXPECT_EQ(check({{1, 256}}, 1024, true).works, 2);
  EXPECT_EQ(check({{1, 1024}, {1, 1500}, {1, 3}}, 4096, true).works, 3 * 8);
  EXPECT_EQ(check({{1, 2047}, {1, 1500}, {1, 10}}, 4096, true).works, 3 * 8);
  EXPECT_EQ(check({{1, 2048}, {1, 1500}, {1, 10}}, 4096, true).works, 3 * 16);  // 2,049 keys: the next bucket
  // A large step's buckets (128 sequences): 4,096 to 8,191 keys, 16 splits (plan_attention's floor).
  const int budget = 512 * kPartsPerToken;
  EXPECT_EQ(check(std::vector<std::pair<int, int>>(128, {1, 4095}), budget, true).max_splits, 16);
  EXPECT_EQ(check(std::vector<std::pair<int, int>>(128, {1, 8190}), budget, true).max_splits, 16);
  EXPECT_EQ(check(std::vector<std::pair<int, int>>(128, {1, 8191}), budget, true).max_splits, 32);
  EXPECT_EQ(check({{1, 131071}}, 16384, true).max_splits, kMaxSplits);
  // The budget caps the bucket (a power of two): 64 steps at 100K keys in 3 rows each -> 2 splits.
  const Checked tight = check(std::vector<std::pair<int, int>>(64, {1, 100000}), 64 * 3, true);
  EXPECT_EQ(tight.max_splits, 2);
  EXPECT_LE(tight.parts, 64 * 3);
}

TEST(CudaPlan, BucketedDecodeSplitsMoreThanPlanAttentionOnlyInSmallSteps) {
  // B single-token steps at one context, in the backend's budget for micro-batches of 512 tokens:
  // the bucket is plan_attention's split count rounded down to a power of two, so never more works
  // or partial rows (rounding up took B = 128 at 4K from 13,200 to 11,200 tok/s on an H100), unless
  // the step is small (at most 256 works), where it rounds up: at most twice plan_attention's
  // splits; always more than half as many.
  const int budget = 512 * kPartsPerToken;
  for (int b : {1, 8, 32, 128, 512})
    for (int pos : {0, 255, 511, 1000, 4095, 4096, 4127, 8191, 32768, 131072}) {
      const std::vector<std::pair<int, int>> steps(b, {1, pos});
      const Checked exact = check(steps, budget), bucketed = check(steps, budget, true);
      const std::string at = "B " + std::to_string(b) + " at " + std::to_string(pos + 1) + " keys";
      EXPECT_LE(bucketed.max_splits, 2 * exact.max_splits) << at;
      EXPECT_GT(2 * bucketed.max_splits, exact.max_splits) << at;
      if (bucketed.works > exact.works || bucketed.parts > exact.parts) {
        EXPECT_LE(bucketed.works, 256) << at;
        EXPECT_LE(bucketed.parts, 256) << at;
      }
    }
  // The bench's steps past 4,096 keys: batch 1 and 8 in 32 splits (as run-3), 128 in 16 (as plan_attention).
  EXPECT_EQ(check({{1, 4100}}, budget, true).max_splits, 32);
  EXPECT_EQ(check(std::vector<std::pair<int, int>>(8, {1, 4100}), budget, true).max_splits, 32);
  EXPECT_EQ(check(std::vector<std::pair<int, int>>(128, {1, 4100}), budget, true).max_splits, 16);
  // Mixed contexts: the longest one sets the bucket, within plan_attention's largest count (twice
  // it for a small step).
  for (int b : {2, 8, 128}) {
    std::vector<std::pair<int, int>> steps;
    for (int i = 0; i < b; ++i) steps.push_back({1, (i * 7919) % 40000});
    const Checked exact = check(steps, budget), bucketed = check(steps, budget, true);
    EXPECT_LE(bucketed.max_splits, (bucketed.works > 256 ? 1 : 2) * exact.max_splits) << "B " << b;
  }
}

}  // namespace
