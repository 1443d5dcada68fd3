// OmniKV policy pieces against straightforward references on small inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

#include "policy_configs.h"
#include "policy.h"

namespace ctx {
namespace {

ModelConfig thirty_layers() {
  ModelConfig c;
  c.n_layer = 30;
  return c;
}

TEST(OmniKvRoles, FollowTheOfficialLayout) {
  OmniKvConfig cfg = test::omnikv_config({2, 8, 18}, 1024);
  const AttentionPolicy p = AttentionPolicy::make_omnikv(cfg, thirty_layers());
  for (int l = 0; l < 30; ++l) {
    LayerRole want = LayerRole::Sparse;
    int group = -1;
    if (l < 2)
      want = LayerRole::Dense;
    else if (l == 2 || l == 8 || l == 18)
      want = LayerRole::Filter;
    else if (l == 3 || l == 9 || l == 19)
      want = LayerRole::Guard;
    else
      group = l < 8 ? 0 : l < 18 ? 1 : 2;
    EXPECT_EQ(p.roles[l], want) << "layer " << l;
    EXPECT_EQ(p.group[l], group) << "layer " << l;
  }
  cfg.guard = false;
  const AttentionPolicy q = AttentionPolicy::make_omnikv(cfg, thirty_layers());
  EXPECT_EQ(q.roles[3], LayerRole::Sparse);
  EXPECT_EQ(q.group[3], 0);
}

TEST(OmniKvRoles, RefuseBadConfigurations) {
  OmniKvConfig cfg = test::omnikv_config({30}, 1024);
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
  const float raw[] = {1, 5, 2, 9, 0,  //
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

TEST(Selection, WindowScoresSumWeightedSoftmaxMaxOverHeads) {
  // Two queries, two heads, 5 keys of which the first 3 are candidates.
  const int H = 2, N = 5, C = 3;
  const std::vector<float> raw1 = {0.1f, 2.0f, -1.0f, 0.5f, 0.0f, 1.5f, 0.2f, 0.3f, -0.4f, 0.9f};
  const std::vector<float> raw2 = {3.0f, 0.0f, 1.0f, 0.0f, 0.0f, -2.0f, 1.0f, 0.5f, 0.5f, 0.1f};
  auto reference = [&](const std::vector<float>& raw, int j) {  // max over heads of softmax prob of key j
    float best = -1;
    for (int h = 0; h < H; ++h) {
      double sum = 0;
      for (int k = 0; k < N; ++k) sum += std::exp(raw[h * N + k]);
      best = std::max(best, static_cast<float>(std::exp(raw[h * N + j]) / sum));
    }
    return best;
  };
  std::vector<float> out(C, 0.f), scratch;
  const float w1 = window_weight(Selector::Exp, 0, 2), w2 = window_weight(Selector::Exp, 1, 2);
  EXPECT_FLOAT_EQ(w1, 0.5f);
  EXPECT_FLOAT_EQ(w2, 1.0f);
  EXPECT_FLOAT_EQ(window_weight(Selector::Uniform, 0, 16), 1.0f);
  EXPECT_FLOAT_EQ(window_weight(Selector::Exp, 0, 16), std::ldexp(1.0f, -15));
  accumulate_window_scores(raw1.data(), H, N, C, w1, out.data(), scratch);
  accumulate_window_scores(raw2.data(), H, N, C, w2, out.data(), scratch);
  for (int j = 0; j < C; ++j) EXPECT_NEAR(out[j], w1 * reference(raw1, j) + w2 * reference(raw2, j), 1e-6) << j;
}

TEST(Selection, WindowSelectorsParseAndValidate) {
  Selector s;
  ASSERT_TRUE(parse_selector("uniform", &s));
  EXPECT_EQ(s, Selector::Uniform);
  ASSERT_TRUE(parse_selector("exp", &s));
  EXPECT_EQ(s, Selector::Exp);
  EXPECT_FALSE(parse_selector("window", &s));
  OmniKvConfig cfg = test::omnikv_config({2}, 1024, Selector::Uniform);
  cfg.window = 0;
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.window = 65;
  EXPECT_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()), std::invalid_argument);
  cfg.window = 16;
  EXPECT_NO_THROW(AttentionPolicy::make_omnikv(cfg, thirty_layers()));
}

TEST(Rounds, ChooseTopKOrAboveMeanPlusStd) {
  const std::vector<double> mass = {0.30, 0.05, 0.30, 0.02, 0.90};
  EXPECT_EQ(choose_rounds(mass, 2), (std::vector<int>{0, 4}));  // ties go to the earlier round
  EXPECT_EQ(choose_rounds(mass, 3), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(choose_rounds(mass, 9), (std::vector<int>{0, 1, 2, 3, 4}));
  // mean 0.314, population std 0.3156: only round 4 is above 0.63.
  EXPECT_EQ(choose_rounds(mass, 0), (std::vector<int>{4}));
  EXPECT_EQ(choose_rounds({0.5, 0.5}, 0), (std::vector<int>{}));  // nothing stands out
  EXPECT_EQ(choose_rounds({}, 2), (std::vector<int>{}));
}

TEST(Rounds, RolesAndRefusals) {
  RoundsConfig cfg = test::rounds_config(10, {0, 40, 95}, 0);
  const AttentionPolicy p = AttentionPolicy::make_rounds(cfg, thirty_layers());
  EXPECT_EQ(p.kind, AttentionPolicy::Kind::Rounds);
  for (int l = 0; l < 30; ++l) EXPECT_EQ(p.roles[l], l < 10 ? LayerRole::Dense : l == 10 ? LayerRole::Filter : LayerRole::Sparse) << l;
  cfg.watershed_layer = 29;
  EXPECT_THROW(AttentionPolicy::make_rounds(cfg, thirty_layers()), std::invalid_argument);
  cfg.watershed_layer = 10;
  cfg.starts = {5, 40};
  EXPECT_THROW(AttentionPolicy::make_rounds(cfg, thirty_layers()), std::invalid_argument);
  cfg.starts = {0, 40, 40};
  EXPECT_THROW(AttentionPolicy::make_rounds(cfg, thirty_layers()), std::invalid_argument);
  cfg.starts = {0};
  cfg.top_k = -1;
  EXPECT_THROW(AttentionPolicy::make_rounds(cfg, thirty_layers()), std::invalid_argument);
}

TEST(Selection, Iou) {
  EXPECT_FLOAT_EQ(iou({1, 2, 3}, {2, 3, 4}), 0.5f);
  EXPECT_FLOAT_EQ(iou({}, {}), 1.f);
  EXPECT_FLOAT_EQ(iou({1}, {2}), 0.f);
  EXPECT_FLOAT_EQ(iou({1, 5, 9}, {1, 5, 9}), 1.f);
}

}  // namespace
}  // namespace ctx

namespace ctx {
namespace {

// The pool size SCOPE's kv_utils.py leaves after step t (t = 0-based index of the current
// generated token), re-derived here from its rules: W_t = W (slide) or R + t // delta
// (adaptive, discontinuous) with delta = (T - R) // beta1; keep all while the generated count is
// below W_t; discontinuous re-selects only every delta + 1 steps.
int official_pool_after(ScopeMode mode, int beta1, int beta2, int T, int t, int before) {
  const int W = beta1 + beta2, delta = (T - beta2) / beta1;
  const int Wt = mode == ScopeMode::Slide ? W : std::min(W, beta2 + t / delta);
  const int count = before + 1;
  if (mode == ScopeMode::Discontinuous && t % (delta + 1) != 0) return count;
  return count < Wt ? count : Wt;
}

TEST(Scope, PoolSizesFollowTheOfficialRulesStepByStep) {
  for (ScopeMode mode : {ScopeMode::Slide, ScopeMode::Adaptive, ScopeMode::Discontinuous}) {
    const ScopeConfig cfg = test::scope_config(16, 8, 200, mode);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<int32_t> pool, out, scratch;
    int want = 0;
    for (int t = 0; t < 300; ++t) {
      std::vector<int32_t> positions = pool;
      positions.push_back(1000 + t);
      std::vector<float> importance(positions.size());
      for (auto& x : importance) x = u(rng);
      const int n = static_cast<int>(positions.size());
      if (scope_reselects(cfg, t) && n > scope_budget(cfg, t))
        scope_select(importance.data(), positions.data(), n, scope_budget(cfg, t), cfg.beta2, out, scratch);
      else
        out = positions;
      pool = out;
      want = official_pool_after(mode, cfg.beta1, cfg.beta2, cfg.max_output, t, want);
      ASSERT_EQ(static_cast<int>(pool.size()), want) << "mode " << static_cast<int>(mode) << " step " << t;
      ASSERT_TRUE(std::is_sorted(pool.begin(), pool.end()));
      ASSERT_EQ(pool.back(), 1000 + t) << "the current token is always kept";
    }
  }
}

TEST(Scope, SelectKeepsRecentAndTopImportance) {
  const int32_t positions[] = {10, 11, 12, 13, 14, 15, 16, 17};
  const float importance[] = {0.9f, 0.1f, 0.5f, 0.8f, 0.2f, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> out, scratch;
  scope_select(importance, positions, 8, 5, 3, out, scratch);  // last 3 + best 2 of the first 5
  EXPECT_EQ(out, (std::vector<int32_t>{10, 13, 15, 16, 17}));
  scope_select(importance, positions, 4, 5, 3, out, scratch);  // under budget: all
  EXPECT_EQ(out, (std::vector<int32_t>{10, 11, 12, 13}));
  scope_select(importance, positions, 8, 2, 3, out, scratch);  // recent clamped to the budget
  EXPECT_EQ(out, (std::vector<int32_t>{16, 17}));
}

TEST(Scope, SnapSelectKeepsTheObservationWindowAndTheMostAttended) {
  // 10 prompt tokens, alpha2 = 3 (positions 7, 8, 9 always), alpha1 = 2 of positions 0..6.
  const std::vector<float> importance = {0.5f, 0.1f, 0.9f, 0.2f, 0.9f, 0.05f, 0.3f, 9.f, 9.f, 9.f};
  std::vector<int32_t> out;
  snap_select(importance.data(), 10, 2, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 4, 7, 8, 9}));  // the tie at 0.9 keeps both; the window is kept whatever its scores
  snap_select(importance.data(), 5, 2, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4}));  // fits: everything
  // Against a sort-based reference on random inputs.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 20 + trial, a1 = 1 + trial % 7, a2 = 1 + trial % 5;
    std::vector<float> imp(n);
    for (float& x : imp) x = u(rng);
    snap_select(imp.data(), n, a1, a2, out);
    std::vector<int32_t> order(n - a2);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return imp[a] > imp[b]; });
    std::set<int32_t> want(order.begin(), order.begin() + a1);
    for (int p = n - a2; p < n; ++p) want.insert(p);
    EXPECT_EQ(std::set<int32_t>(out.begin(), out.end()), want);
    EXPECT_TRUE(std::is_sorted(out.begin(), out.end()));
  }
}

TEST(Scope, RefuseBadConfigurations) {
  ModelConfig m;
  m.n_layer = 30;
  ScopeConfig cfg = test::scope_config(-1, 256, 4096);
  EXPECT_THROW(AttentionPolicy::make_scope(cfg, m), std::invalid_argument);
  cfg.beta1 = 8;
  cfg.beta2 = 0;
  EXPECT_THROW(AttentionPolicy::make_scope(cfg, m), std::invalid_argument);
  cfg.beta2 = 8;
  cfg.mode = ScopeMode::Adaptive;
  cfg.max_output = 8;
  EXPECT_THROW(AttentionPolicy::make_scope(cfg, m), std::invalid_argument);
}

}  // namespace
}  // namespace ctx
