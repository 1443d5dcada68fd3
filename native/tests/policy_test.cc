// OmniKV policy pieces against straightforward references on small inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

#include "policy.h"

namespace ctx {
namespace {

ModelConfig thirty_layers() {
  ModelConfig c;
  c.n_layer = 30;
  return c;
}

TEST(OmniKvRoles, FollowTheOfficialLayout) {
  OmniKvConfig cfg;
  cfg.filter_layers = {2, 8, 18};
  const AttentionPolicy p = AttentionPolicy::make_omnikv(cfg, thirty_layers());
  for (int l = 0; l < 30; ++l) {
    LayerRole want = LayerRole::Sparse;
    int group = -1;
    if (l < 2) want = LayerRole::Dense;
    else if (l == 2 || l == 8 || l == 18) want = LayerRole::Filter;
    else if (l == 3 || l == 9 || l == 19) want = LayerRole::Guard;
    else group = l < 8 ? 0 : l < 18 ? 1 : 2;
    EXPECT_EQ(p.roles[l], want) << "layer " << l;
    EXPECT_EQ(p.group[l], group) << "layer " << l;
  }
  cfg.guard = false;
  const AttentionPolicy q = AttentionPolicy::make_omnikv(cfg, thirty_layers());
  EXPECT_EQ(q.roles[3], LayerRole::Sparse);
  EXPECT_EQ(q.group[3], 0);
}

TEST(OmniKvRoles, RefuseBadConfigurations) {
  OmniKvConfig cfg;
  cfg.filter_layers = {30};
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.filter_layers = {-1};
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.filter_layers = {8, 2};
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.filter_layers = {};
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.filter_layers = {2};
  cfg.budget = 0;
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.budget = 8;
  cfg.lazy_iou = 1.f;
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
}

TEST(Selection, TopKMatchesSortReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int n : {1, 7, 64, 1000}) {
    std::vector<float> s(n);
    for (auto& x : s) x = std::round(u(rng) * 4) / 4;  // ties on purpose
    for (int k : {1, 3, n / 2 + 1, n, n + 5}) {
      std::vector<int32_t> got;
      top_k_sorted(s.data(), n, k, got);
      std::vector<int32_t> ref(n);
      std::iota(ref.begin(), ref.end(), 0);
      std::stable_sort(ref.begin(), ref.end(), [&](int a, int b) { return s[a] > s[b]; });
      ref.resize(std::min(k, n));
      std::sort(ref.begin(), ref.end());
      EXPECT_EQ(got, ref) << "n " << n << " k " << k;
    }
  }
}

TEST(Selection, RankCandidatesLastAndSoftmax) {
  // 2 heads over 5 keys, the first 3 are candidates.
  const float raw[] = {1, 5, 2, 9, 0,   //
                       4, 0, 3, 0, 8};
  float out[3];
  rank_candidates(Selector::Last, raw, 2, 5, 3, out);
  EXPECT_FLOAT_EQ(out[0], 4);
  EXPECT_FLOAT_EQ(out[1], 5);
  EXPECT_FLOAT_EQ(out[2], 3);
  rank_candidates(Selector::LastSoftmax, raw, 2, 5, 3, out);
  for (int j = 0; j < 3; ++j) {
    double best = 0;
    for (int h = 0; h < 2; ++h) {
      double sum = 0;
      for (int i = 0; i < 5; ++i) sum += std::exp(raw[h * 5 + i]);
      best = std::max(best, std::exp(raw[h * 5 + j]) / sum);
    }
    EXPECT_NEAR(out[j], best, 1e-6);
  }
}

TEST(Selection, Iou) {
  EXPECT_FLOAT_EQ(iou({1, 2, 3}, {2, 3, 4}), 0.5f);
  EXPECT_FLOAT_EQ(iou({}, {}), 1.f);
  EXPECT_FLOAT_EQ(iou({1}, {2}), 0.f);
  EXPECT_FLOAT_EQ(iou({1, 5, 9}, {1, 5, 9}), 1.f);
}

}  // namespace
}  // namespace ctx
