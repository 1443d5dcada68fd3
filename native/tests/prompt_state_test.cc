// The prompt state a prefill ships with the KV (prompt_state.h): a sequence that computed its
// prompt without the decode policy, then loads the state of one that computed it under the
// policy, decodes bit for bit like it; a blob made for other windows is refused without a
// change; a malformed blob is an invalid_argument, whatever its bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine.h"
#include "gguf_writer.h"
#include "model.h"
#include "prompt_state.h"

namespace {

using namespace ctx;

std::shared_ptr<Model> tiny_model() {
  static ctxtest::TempDir dir;
  static std::shared_ptr<Model> m = [] {
    ctxtest::TinyLlama c;
    c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 128, c.n_layer = 3, c.n_vocab = 50, c.n_ctx = 256;
    return Model::load(dir.write("tiny_prompt_state.gguf", ctxtest::build(ctxtest::tiny_llama_spec(c, 9)).bytes));
  }();
  return m;
}

AttentionPolicy scope_pool(const ModelConfig& c, int alpha2) {
  ScopeConfig s;
  s.beta1 = 4, s.beta2 = 4, s.alpha1 = 6, s.alpha2 = alpha2;
  return AttentionPolicy::make_scope(s, c);
}

AttentionPolicy omnikv_window(const ModelConfig& c, Selector selector) {
  OmniKvConfig o;
  o.filter_layers = {1};
  o.budget = 10;
  o.selector = selector;
  o.guard = false;  // layer 2 attends to the selection
  o.window = 4;  // 3 prompt tokens forced in, the rest of the budget ranked
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

void expect_shipped_state_decodes_alike(const AttentionPolicy& policy) {
  Engine e(tiny_model(), EngineOptions{});
  const ModelConfig& c = e.config();
  const std::vector<int32_t> prompt = prompt_of(c, 40);
  std::vector<float> logits(c.n_vocab);
  Sequence observed(c, 64), shipped(c, 64), bare(c, 64);
  observed.set_policy(policy);  // before the prompt: the policy remembers its queries
  for (Sequence* s : {&observed, &shipped, &bare}) e.forward({{s, prompt.data(), 40, logits.data()}});
  const std::vector<uint8_t> state = export_prompt_state(*observed.policy, c, 40);
  ASSERT_FALSE(state.empty());
  shipped.set_policy(policy);
  bare.set_policy(policy);
  EXPECT_TRUE(import_prompt_state(*shipped.policy, c, 40, state.data(), state.size()));
  const auto want = decode(e, observed, 6);
  EXPECT_EQ(decode(e, shipped, 6), want);
  EXPECT_NE(decode(e, bare, 6), want);  // the state matters for this policy

}

TEST(PromptState, ScopePromptPoolDecodesAsIfObserved) { expect_shipped_state_decodes_alike(scope_pool(tiny_model()->config(), 4)); }

TEST(PromptState, OmniKvUniformWindowDecodesAsIfObserved) {
  expect_shipped_state_decodes_alike(omnikv_window(tiny_model()->config(), Selector::Uniform));
}

TEST(PromptState, OmniKvExpWindowDecodesAsIfObserved) {
  expect_shipped_state_decodes_alike(omnikv_window(tiny_model()->config(), Selector::Exp));
}

TEST(PromptState, PoliciesWithoutPromptQueriesExportNothing) {
  const ModelConfig& c = tiny_model()->config();
  for (const AttentionPolicy& p : {AttentionPolicy{}, AttentionPolicy::make_scope(ScopeConfig{}, c)})
    EXPECT_TRUE(export_prompt_state(*make_decode_policy(p), c, 10).empty());
}

TEST(PromptState, BlobsForOtherWindowsAreRefusedAndMalformedOnesThrow) {
  Engine e(tiny_model(), EngineOptions{});
  const ModelConfig& c = e.config();
  const std::vector<int32_t> prompt = prompt_of(c, 20);
  std::vector<float> logits(c.n_vocab);
  Sequence s(c, 32);
  s.set_policy(scope_pool(c, 4));
  e.forward({{&s, prompt.data(), 20, logits.data()}});
  const std::vector<uint8_t> state = export_prompt_state(*s.policy, c, 20);

  auto other = make_decode_policy(scope_pool(c, 3));
  EXPECT_FALSE(import_prompt_state(*other, c, 20, state.data(), state.size()));
  EXPECT_TRUE(export_prompt_state(*other, c, 20).size() < state.size());  // still empty windows
  auto omni = make_decode_policy(omnikv_window(c, Selector::Exp));
  EXPECT_FALSE(import_prompt_state(*omni, c, 20, state.data(), state.size()));

  auto same = make_decode_policy(scope_pool(c, 4));
  EXPECT_THROW(import_prompt_state(*same, c, 21, state.data(), state.size()), std::invalid_argument);  // another prompt length
  for (size_t n = 0; n < state.size(); ++n)  // every truncation
    EXPECT_THROW(import_prompt_state(*same, c, 20, state.data(), n), std::invalid_argument) << n;
  std::vector<uint8_t> longer = state;
  longer.push_back(0);
  EXPECT_THROW(import_prompt_state(*same, c, 20, longer.data(), longer.size()), std::invalid_argument);
  // Every header and window field set to a value out of range: refused, never read past the end.
  for (size_t at = 0; at + 4 <= 40; at += 4)
    for (uint32_t v : {0u, 0xffffffffu, 0x7fffffffu}) {
      std::vector<uint8_t> bad = state;
      uint32_t old;
      std::memcpy(&old, bad.data() + at, 4);
      if (old == v) continue;
      std::memcpy(bad.data() + at, &v, 4);
      try {
        import_prompt_state(*same, c, 20, bad.data(), bad.size());
      } catch (const std::invalid_argument&) {
      }
    }
  std::vector<uint8_t> nan = state;
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + nan.size() - 4, &q, 4);
  EXPECT_THROW(import_prompt_state(*same, c, 20, nan.data(), nan.size()), std::invalid_argument);
  EXPECT_TRUE(import_prompt_state(*same, c, 20, state.data(), state.size()));
  EXPECT_EQ(export_prompt_state(*same, c, 20), state);  // the round trip is exact
}

}  // namespace
