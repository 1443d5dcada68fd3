// Physical reclamation (kv_slots.h) on a tiny generated model, always run: a long generation
// under scope (with and without the compressed prompt), h2o and streaming with reclamation asked for (AttentionPolicy::reclaim)
// gives the same tokens and bit-identical
// logits as the masking implementation, while the KV rows it touches (device_bytes, what
// seq.deviceBytesUsed reports) stay within the policy's bound instead of growing with the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "policy_configs.h"
#include "engine.h"
#include "model.h"
#include "tiny_model.h"

namespace {

using namespace ctx;

constexpr int kPrompt = 64, kGenerate = 2000;

std::shared_ptr<Model> tiny_model() { return ctxtest::tiny_model(ctxtest::tiny_gqa(2, 4096), 3); }

struct Generation {
  std::vector<int32_t> tokens;
  uint64_t logits_hash = 1469598103934665603ull;
  size_t max_device_bytes = 0, final_device_bytes = 0;
};

Generation generate(Engine& e, const AttentionPolicy& policy, bool reclaim) {
  const ModelConfig& m = e.config();
  Sequence seq(m, kPrompt + kGenerate);
  seq.set_policy(reclaim ? test::reclaiming(policy) : policy);
  std::vector<int32_t> prompt(kPrompt);
  for (int i = 0; i < kPrompt; ++i) prompt[i] = (i * 17 + 5) % m.n_vocab;
  std::vector<float> logits(m.n_vocab);
  Generation r;
  e.forward({{&seq, prompt.data(), kPrompt, logits.data()}});
  for (int step = 0; step < kGenerate; ++step) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(logits.data());
    for (size_t i = 0; i < logits.size() * sizeof(float); ++i) r.logits_hash = (r.logits_hash ^ bytes[i]) * 1099511628211ull;
    r.tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    r.max_device_bytes = std::max(r.max_device_bytes, seq.device_bytes(seq.n_past()));
    if (step + 1 < kGenerate) e.forward({{&seq, &r.tokens.back(), 1, logits.data()}});
  }
  r.final_device_bytes = seq.device_bytes(seq.n_past());
  if (reclaim) {  // rows were reused, so the dense path's row = position no longer holds
    EXPECT_TRUE(seq.rows_moved());
    EXPECT_THROW(e.forward({{&seq, prompt.data(), 2, logits.data()}}), std::invalid_argument);
    EXPECT_THROW(seq.set_policy(AttentionPolicy{}), std::invalid_argument);  // a new policy would read by position
  }
  return r;
}

struct Case {
  const char* name;
  AttentionPolicy policy;
  int bound;
};  // bound: KV rows per layer

std::vector<Case> cases() {
  const ModelConfig& m = tiny_model()->config();
  const ScopeConfig s = test::scope_config(16, 16, kGenerate);
  ScopeConfig snap = s;  // with the prompt compressed to 16 + 8 tokens per layer and head
  snap.alpha1 = 16;
  snap.alpha2 = 8;
  return {
      // The prompt, the pool, and the token being decoded (written before its step's eviction).
      {"scope", AttentionPolicy::make_scope(s, m), kPrompt + s.beta1 + s.beta2 + 1},
      // The dropped prompt tokens' rows are reused (16 + 8 + 32 + 1 live rows fit in the prompt's);
      // only the first decode token needs a new row, written before the first step's evictions.
      {"scope_prompt_pool", AttentionPolicy::make_scope(snap, m), kPrompt + 1},
      // Every prompt token starts as a candidate; after that the budget plus the current token.
      {"h2o", AttentionPolicy::make_h2o({48, 16, false}), std::max(kPrompt + 1, 48 + 1)},
      {"streaming", AttentionPolicy::make_streaming({4, 28, false}), std::max(kPrompt + 1, 4 + 28)},
  };
}

TEST(Reclaim, LongGenerationHoldsBoundedKvWithTheSameTokens) {
  EngineOptions o;
  o.max_context = kPrompt + kGenerate;
  Engine e(tiny_model(), o);
  const size_t row_bytes = 2 * static_cast<size_t>(e.config().kv_dim()) * sizeof(uint16_t) * e.config().n_layer;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Generation masked = generate(e, c.policy, false), reclaimed = generate(e, c.policy, true);
    EXPECT_EQ(reclaimed.tokens, masked.tokens);
    EXPECT_EQ(reclaimed.logits_hash, masked.logits_hash);
    // Masking holds every token; reclaiming stays within the bound however long the output.
    EXPECT_EQ(masked.final_device_bytes, row_bytes * (kPrompt + kGenerate - 1));  // the last token is never fed back
    EXPECT_LE(reclaimed.max_device_bytes, row_bytes * c.bound);
    EXPECT_GE(reclaimed.final_device_bytes, row_bytes * kPrompt);
  }
}

// omnikv+scope's selectors score evicted generated keys, so its scope.reclaim is refused; scope,
// streaming and h2o reclaim only when asked; any other policy keeps row = position.
TEST(Reclaim, OnlyPoliciesWithFinalEvictionsReclaimAndOnlyWhenAsked) {
  EngineOptions o;
  o.max_context = kPrompt + kGenerate;
  Engine e(tiny_model(), o);
  const OmniKvConfig ok = test::omnikv_config({0}, 16);
  ScopeConfig s = test::scope_config(4, 4, kGenerate);
  Sequence seq(e.config(), 128);
  seq.set_policy(AttentionPolicy::make_omnikv_scope(ok, s, e.config()));
  EXPECT_EQ(seq.slots, nullptr);
  s.reclaim = true;
  EXPECT_THROW(AttentionPolicy::make_omnikv_scope(ok, s, e.config()), std::invalid_argument);
  seq.set_policy(AttentionPolicy::make_scope(s, e.config()));
  EXPECT_NE(seq.slots, nullptr);
  s.reclaim = false;
  seq.set_policy(AttentionPolicy::make_scope(s, e.config()));
  EXPECT_EQ(seq.slots, nullptr);
  seq.set_policy(test::reclaiming(AttentionPolicy::make_h2o({48, 16, false})));
  EXPECT_NE(seq.slots, nullptr);
  seq.set_policy(AttentionPolicy{});
  EXPECT_EQ(seq.slots, nullptr);
}

}  // namespace
