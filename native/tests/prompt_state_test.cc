// The prompt state a prefill ships with the KV (prompt_state.h): a sequence that computed its
// prompt without the decode policy, then loads the state of one that computed it under the
// policy (derived eagerly, as a prefill that exports it does, or not), decodes bit for bit like
// one that had the policy from the start; a blob made for another policy is refused without a
// change; a malformed blob is an invalid_argument, whatever its bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine.h"
#include "model.h"
#include "tiny_model.h"
#include "policy_configs.h"
#include "prompt_state.h"

namespace {

using namespace ctx;

std::shared_ptr<Model> tiny_model() { return ctxtest::tiny_model(ctxtest::tiny_gqa(3, 256), 9); }

AttentionPolicy scope_pool(const ModelConfig& c, int alpha2) {
  ScopeConfig s = test::scope_config(4, 4, 64);
  s.alpha1 = 6, s.alpha2 = alpha2;
  return AttentionPolicy::make_scope(s, c);
}

AttentionPolicy omnikv_window(const ModelConfig& c, Selector selector) {
  OmniKvConfig o = test::omnikv_config({1}, 10, selector);
  o.guard = false;  // layer 2 attends to the selection
  o.window = 4;     // 3 prompt tokens forced in, the rest of the budget ranked
  return AttentionPolicy::make_omnikv(o, c);
}

std::vector<int32_t> prompt_of(const ModelConfig& c, int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 13 + 5) % c.n_vocab;
  return p;
}

// Logits of `steps` decode steps after the prompt.
std::vector<std::vector<float>> decode(Engine& e, Sequence& s, int steps) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < steps; ++i) {
    const int32_t t = static_cast<int32_t>((i * 7 + 1) % e.config().n_vocab);
    out.emplace_back(e.config().n_vocab);
    e.forward({{&s, &t, 1, out.back().data()}});
  }
  return out;
}

// `kind`: the blob's section (5th u32): 1 query windows, 2 kept lists.
void expect_shipped_state_decodes_alike(const AttentionPolicy& policy, bool eager, uint32_t kind) {
  Engine e(tiny_model(), EngineOptions{});
  const ModelConfig& c = e.config();
  const std::vector<int32_t> prompt = prompt_of(c, 40);
  std::vector<float> logits(c.n_vocab);
  Sequence local(c, 64), exporter(c, 64), shipped(c, 64), bare(c, 64);
  local.set_policy(policy);  // one process: the policy set before the prompt, derived lazily
  exporter.set_policy(policy);
  if (eager) derive_prompt_state_eagerly(*exporter.policy);
  for (Sequence* s : {&local, &exporter, &shipped, &bare}) e.forward({{s, prompt.data(), 40, logits.data()}});
  const std::vector<uint8_t> state = export_prompt_state(*exporter.policy, c, 40);
  ASSERT_GE(state.size(), 20u);
  uint32_t got;
  std::memcpy(&got, state.data() + 16, 4);
  EXPECT_EQ(got, kind);
  shipped.set_policy(policy);
  bare.set_policy(policy);
  EXPECT_TRUE(import_prompt_state(*shipped.policy, c, 40, state.data(), state.size()));
  const auto want = decode(e, local, 6);
  EXPECT_EQ(decode(e, exporter, 6), want);
  EXPECT_EQ(decode(e, shipped, 6), want);
  EXPECT_NE(decode(e, bare, 6), want);  // the state matters for this policy
}

TEST(PromptState, ScopeKeptListsDecodeAsIfObserved) { expect_shipped_state_decodes_alike(scope_pool(tiny_model()->config(), 4), true, 2); }

TEST(PromptState, ScopeQueriesDecodeAsIfObserved) { expect_shipped_state_decodes_alike(scope_pool(tiny_model()->config(), 4), false, 1); }

TEST(PromptState, OmniKvUniformWindowDecodesAsIfObserved) {
  expect_shipped_state_decodes_alike(omnikv_window(tiny_model()->config(), Selector::Uniform), true, 1);
}

TEST(PromptState, OmniKvExpWindowDecodesAsIfObserved) {
  expect_shipped_state_decodes_alike(omnikv_window(tiny_model()->config(), Selector::Exp), true, 1);
}

TEST(PromptState, PoliciesWithoutPromptQueriesExportNothing) {
  const ModelConfig& c = tiny_model()->config();
  for (const AttentionPolicy& p : {AttentionPolicy{}, AttentionPolicy::make_scope(test::scope_config(4, 4, 64), c)})
    EXPECT_TRUE(export_prompt_state(*make_decode_policy(p), c, 10).empty());
}

// Every truncation, trailing bytes, and each header or section field set to out-of-range values:
// an invalid_argument or a clean refusal, never a read past the end.
void expect_malformed_refused(DecodePolicy& policy, const ModelConfig& c, int n_tokens, const std::vector<uint8_t>& state) {
  EXPECT_THROW(import_prompt_state(policy, c, n_tokens + 1, state.data(), state.size()), std::invalid_argument);
  for (size_t n = 0; n < state.size(); ++n)
    EXPECT_THROW(import_prompt_state(policy, c, n_tokens, state.data(), n), std::invalid_argument) << n;
  std::vector<uint8_t> longer = state;
  longer.push_back(0);
  EXPECT_THROW(import_prompt_state(policy, c, n_tokens, longer.data(), longer.size()), std::invalid_argument);
  for (size_t at = 0; at + 4 <= 44 && at + 4 <= state.size(); at += 4)
    for (uint32_t v : {0u, 0xffffffffu, 0x7fffffffu, 1000u}) {
      std::vector<uint8_t> bad = state;
      std::memcpy(bad.data() + at, &v, 4);
      try {
        import_prompt_state(policy, c, n_tokens, bad.data(), bad.size());
      } catch (const std::invalid_argument&) {
      }
    }
}

TEST(PromptState, BlobsForOtherPoliciesAreRefusedAndMalformedOnesThrow) {
  Engine e(tiny_model(), EngineOptions{});
  const ModelConfig& c = e.config();
  const std::vector<int32_t> prompt = prompt_of(c, 20);
  std::vector<float> logits(c.n_vocab);
  Sequence windows(c, 32), lists(c, 32);
  windows.set_policy(scope_pool(c, 4));
  lists.set_policy(scope_pool(c, 4));
  derive_prompt_state_eagerly(*lists.policy);
  for (Sequence* s : {&windows, &lists}) e.forward({{s, prompt.data(), 20, logits.data()}});
  for (Sequence* s : {&windows, &lists}) {
    const std::vector<uint8_t> state = export_prompt_state(*s->policy, c, 20);
    auto other = make_decode_policy(scope_pool(c, 3));
    EXPECT_FALSE(import_prompt_state(*other, c, 20, state.data(), state.size()));
    auto omni = make_decode_policy(omnikv_window(c, Selector::Exp));
    EXPECT_FALSE(import_prompt_state(*omni, c, 20, state.data(), state.size()));
    auto full = make_decode_policy(AttentionPolicy{});
    EXPECT_FALSE(import_prompt_state(*full, c, 20, state.data(), state.size()));

    auto same = make_decode_policy(scope_pool(c, 4));
    expect_malformed_refused(*same, c, 20, state);
    EXPECT_TRUE(import_prompt_state(*same, c, 20, state.data(), state.size()));
    EXPECT_EQ(export_prompt_state(*same, c, 20), state);  // the round trip is exact
  }
  // A query that is not finite.
  std::vector<uint8_t> nan = export_prompt_state(*windows.policy, c, 20);
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + nan.size() - 4, &q, 4);
  auto same = make_decode_policy(scope_pool(c, 4));
  EXPECT_THROW(import_prompt_state(*same, c, 20, nan.data(), nan.size()), std::invalid_argument);
}

}  // namespace
