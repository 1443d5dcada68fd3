// The DecodePolicy contract on a tiny generated model (always run): the engine drives any
// implementation through the interface alone. A policy written here, listing every cached
// position for every head, must give the same logits as full attention bit for bit, and the
// engine must call it as decode_policy.h documents (begin per micro-batch, observe_prompt per
// layer of a prompt chunk, keys and then update per head at each layer of a decode step).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine.h"
#include "model.h"
#include "tiny_model.h"

namespace {

using namespace ctx;

std::shared_ptr<Model> tiny_model() { return ctxtest::tiny_model(ctxtest::tiny_gqa(3, 256), 5); }

class EveryKeyListed final : public DecodePolicy {
 public:
  EveryKeyListed() : DecodePolicy(AttentionPolicy{}) {}
  void reset() override {}
  void begin(const PolicyStep& step) override {
    ++begins;
    heads.resize(step.backend.config().n_head_kv);
  }
  void observe_prompt(int layer, const PolicyStep& step) override { ++observed[layer]; }
  LayerKeys keys(int layer, const PolicyStep& step) override {
    ++keyed[layer];
    for (auto& h : heads) {
      h.clear();
      for (int p = 0; p <= step.pos0; ++p) h.push_back(p);
    }
    return LayerKeys{&heads, PackedRows{}};
  }
  void update(int layer, int g, const float* probs, int n_keys, std::vector<int32_t>* evicted) override {
    updated[layer] += 1;
    last_n_keys = n_keys;
    EXPECT_EQ(evicted, nullptr);  // no reclaiming unless the policy asks for it
  }
  PolicyStats stats() const override { return PolicyStats{}; }
  size_t state_bytes() const override { return 0; }

  std::vector<std::vector<int32_t>> heads;
  int begins = 0, last_n_keys = 0;
  std::vector<int> observed = std::vector<int>(3), keyed = std::vector<int>(3), updated = std::vector<int>(3);
};

TEST(DecodePolicyContract, AnImplementationListingEveryKeyEqualsFullAttention) {
  Engine e(tiny_model(), EngineOptions{});
  const ModelConfig& c = e.config();
  Sequence full(c, 64), listed(c, 64);
  auto policy = std::make_unique<EveryKeyListed>();
  EveryKeyListed& p = *policy;
  listed.policy = std::move(policy);
  std::vector<int32_t> prompt(20);
  for (int i = 0; i < 20; ++i) prompt[i] = (i * 7 + 3) % c.n_vocab;
  std::vector<float> a(c.n_vocab), b(c.n_vocab);
  e.forward({{&full, prompt.data(), 20, a.data()}});
  e.forward({{&listed, prompt.data(), 20, b.data()}});
  EXPECT_EQ(a, b);
  EXPECT_EQ(p.begins, 1);
  EXPECT_EQ(p.observed, std::vector<int>({1, 1, 1}));
  EXPECT_EQ(p.keyed, std::vector<int>({0, 0, 0}));
  for (int step = 0; step < 5; ++step) {
    const int32_t t = static_cast<int32_t>(step * 11 % c.n_vocab);
    e.forward({{&full, &t, 1, a.data()}, {&listed, &t, 1, b.data()}});  // one batch, two policies
    EXPECT_EQ(a, b) << "decode step " << step;
  }
  EXPECT_EQ(p.begins, 6);
  EXPECT_EQ(p.keyed, std::vector<int>({5, 5, 5}));
  EXPECT_EQ(p.updated, std::vector<int>({5 * c.n_head_kv, 5 * c.n_head_kv, 5 * c.n_head_kv}));
  EXPECT_EQ(p.last_n_keys, 25);  // the prompt and every decode token, the current one included
}

}  // namespace
