// Greedy tokens of the real model under every decode policy, pinned. First recorded at 729943d
// (before the policies became DecodePolicy objects: the refactor kept them bit for bit); recorded
// again when attention became single-pass (online softmax), which changes rounding and hence,
// on this prompt of random tokens full of near-ties, the sparse policies' selections (full
// attention's tokens stayed; the logits' agreement with llama.cpp is test/engine/oracle.test.ts's).
// Set CTXBANK_RECORD_TOKENS=1 to print new values. Any change to what a policy attends to shows
// up here as a different token sequence. Each case decodes alone and, once more, in one batch with all the
// others (different policies share every forward), on two threads; besides the tokens, a hash
// of every step's logits must match bit for bit. The policies that can free evicted KV rows run a
// third time with reclamation asked for (AttentionPolicy::reclaim), to the same values.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "policy_configs.h"
#include "engine.h"
#include "model.h"

namespace {

using namespace ctx;

std::shared_ptr<Model> real_model() {
  static std::shared_ptr<Model> m = [] {
    std::string path;
    if (const char* env = std::getenv("CTXBANK_MODEL"); env && *env) path = env;
    struct stat st {};
    if (path.empty() && stat("/tmp/smollm2.gguf", &st) == 0) path = "/tmp/smollm2.gguf";
    return path.empty() ? nullptr : Model::load(path);
  }();
  return m;
}

// Segments of 20 pseudo-random tokens, some repeated, so that copying (attention to specific
// earlier tokens) drives the greedy continuation and a policy that drops them diverges.
std::vector<int32_t> make_prompt(int n_segments, uint32_t seed) {
  std::vector<std::vector<int32_t>> segs;
  uint32_t x = seed;
  auto next = [&] {
    x = x * 1664525u + 1013904223u;
    return static_cast<int32_t>(200 + (x >> 8) % 20000);
  };
  std::vector<int32_t> out;
  for (int s = 0; s < n_segments; ++s) {
    if (s >= 3 && s % 3 == 0) {
      const std::vector<int32_t>& again = segs[(s * 7) % segs.size()];
      out.insert(out.end(), again.begin(), again.end());
      continue;
    }
    std::vector<int32_t> seg(20);
    for (auto& t : seg) t = next();
    segs.push_back(seg);
    out.insert(out.end(), seg.begin(), seg.end());
  }
  return out;
}

struct Case {
  std::string name;
  AttentionPolicy policy;
};

std::vector<Case> cases(const ModelConfig& m) {
  std::vector<Case> c;
  c.push_back({"full", AttentionPolicy{}});
  auto omni = [](std::vector<int> f, int budget, Selector sel) { return test::omnikv_config(std::move(f), budget, sel); };
  c.push_back({"omnikv_last", AttentionPolicy::make_omnikv(omni({4, 12}, 64, Selector::Last), m)});
  {
    OmniKvConfig o = omni({6}, 48, Selector::LastSoftmax);
    o.guard = false;
    c.push_back({"omnikv_last_softmax_noguard", AttentionPolicy::make_omnikv(o, m)});
  }
  {
    OmniKvConfig o = omni({4, 12}, 64, Selector::Uniform);
    o.window = 8;
    c.push_back({"omnikv_uniform", AttentionPolicy::make_omnikv(o, m)});
  }
  {
    OmniKvConfig o = omni({4, 12}, 64, Selector::Exp);
    o.window = 8;
    o.lazy_iou = 0.5f;
    c.push_back({"omnikv_exp_lazy", AttentionPolicy::make_omnikv(o, m)});
  }
  {
    OmniKvConfig o = omni({4, 12}, 64, Selector::Last);
    o.offload = true;
    c.push_back({"omnikv_offload", AttentionPolicy::make_omnikv(o, m)});
  }
  auto scope = [](ScopeMode mode, int alpha1) {
    ScopeConfig s = test::scope_config(8, 8, 40, mode);
    s.alpha1 = alpha1;
    s.alpha2 = 8;
    return s;
  };
  c.push_back({"scope_slide", AttentionPolicy::make_scope(scope(ScopeMode::Slide, 0), m)});
  c.push_back({"scope_adaptive", AttentionPolicy::make_scope(scope(ScopeMode::Adaptive, 0), m)});
  c.push_back({"scope_discontinuous", AttentionPolicy::make_scope(scope(ScopeMode::Discontinuous, 0), m)});
  c.push_back({"scope_prompt_pool", AttentionPolicy::make_scope(scope(ScopeMode::Slide, 64), m)});
  c.push_back({"omnikv_scope", AttentionPolicy::make_omnikv_scope(omni({4, 12}, 64, Selector::Last), scope(ScopeMode::Slide, 0), m)});
  {
    RoundsConfig r = test::rounds_config(10, {0, 100, 200, 280}, 1);
    c.push_back({"rounds_top1", AttentionPolicy::make_rounds(r, m)});
    r.top_k = 0;
    c.push_back({"rounds_adaptive", AttentionPolicy::make_rounds(r, m)});
  }
  c.push_back({"streaming", AttentionPolicy::make_streaming({4, 28, false})});
  c.push_back({"h2o", AttentionPolicy::make_h2o({48, 16, false})});
  return c;
}

constexpr int kGenerate = 40;

int argmax(const std::vector<float>& v) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(v.size()); ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

std::string join(const std::vector<int32_t>& t) {
  std::ostringstream s;
  for (size_t i = 0; i < t.size(); ++i) s << (i ? "," : "") << t[i];
  return s.str();
}

// Greedy continuation of every case, each sequence decoded alone or all in one batch per step.
// FNV-1a over the bits of every logit of every step: equal only if each step computed the same
// numbers, which a change in any attended key set breaks even where the argmax survives.
struct Run {
  std::vector<int32_t> tokens;
  uint64_t logits_hash = 1469598103934665603ull;
};

void hash_logits(Run& r, const std::vector<float>& logits) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(logits.data());
  for (size_t i = 0; i < logits.size() * sizeof(float); ++i) r.logits_hash = (r.logits_hash ^ bytes[i]) * 1099511628211ull;
}

std::vector<Run> generate(Engine& e, const std::vector<Case>& cs, const std::vector<int32_t>& prompt, bool batched, bool reclaim = false) {
  const ModelConfig& m = e.config();
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::vector<float>> logits(cs.size(), std::vector<float>(m.n_vocab));
  std::vector<Run> runs(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    seqs.push_back(std::make_unique<Sequence>(m, static_cast<int>(prompt.size()) + kGenerate + 1));
    seqs[i]->set_policy(reclaim ? test::reclaiming(cs[i].policy) : cs[i].policy);
    e.forward({{seqs[i].get(), prompt.data(), static_cast<int>(prompt.size()), logits[i].data()}});
    runs[i].tokens.push_back(argmax(logits[i]));
    hash_logits(runs[i], logits[i]);
  }
  for (int step = 1; step < kGenerate; ++step) {
    std::vector<BatchItem> batch;
    for (size_t i = 0; i < cs.size(); ++i) {
      BatchItem it{seqs[i].get(), &runs[i].tokens.back(), 1, logits[i].data()};
      if (batched)
        batch.push_back(it);
      else
        e.forward({it});
    }
    if (batched) e.forward(batch);
    for (size_t i = 0; i < cs.size(); ++i) {
      runs[i].tokens.push_back(argmax(logits[i]));
      hash_logits(runs[i], logits[i]);
    }
  }
  return runs;
}

struct Expected {
  const char* name;
  const char* tokens;
  uint64_t logits_hash;
};

// Recorded with CTXBANK_RECORD_TOKENS (see the file comment).
const Expected kExpected[] = {
#include "policy_tokens.inc"
};

void check(const std::vector<Case>& cs, const std::vector<Run>& got, const Expected* want, size_t n_want, const char* label) {
  ASSERT_EQ(cs.size(), n_want);
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(cs[i].name, want[i].name);
    EXPECT_EQ(join(got[i].tokens), want[i].tokens) << label << ": policy " << cs[i].name;
    EXPECT_EQ(got[i].logits_hash, want[i].logits_hash) << label << ": policy " << cs[i].name;
  }
}

TEST(PolicyTokens, GreedyTokensUnderEveryPolicyAreUnchanged) {
  auto model = real_model();
  if (!model) GTEST_SKIP() << "real model not found: set CTXBANK_MODEL";
  EngineOptions o;
  o.n_threads = 2;
  o.n_threads_decode = 2;
  o.max_context = 1024;
  Engine e(model, o);
  const auto cs = cases(model->config());
  const auto prompt = make_prompt(16, 7);
  const auto alone = generate(e, cs, prompt, false);
  if (std::getenv("CTXBANK_RECORD_TOKENS"))
    for (size_t i = 0; i < cs.size(); ++i)
      std::printf("    {\"%s\", \"%s\", %lluull},\n", cs[i].name.c_str(), join(alone[i].tokens).c_str(),
                  static_cast<unsigned long long>(alone[i].logits_hash));
  check(cs, alone, kExpected, std::size(kExpected), "alone");
  // The same in one batch of every policy per decode step.
  check(cs, generate(e, cs, prompt, true), kExpected, std::size(kExpected), "batched");
  // Reclaiming evicted KV rows (kv_slots.h) changes nothing either, for the policies that do it.
  std::vector<Case> reclaiming;
  std::vector<Expected> want;
  for (size_t i = 0; i < cs.size(); ++i)
    if (make_decode_policy(cs[i].policy)->reclaims()) {
      reclaiming.push_back(cs[i]);
      want.push_back(kExpected[i]);
    }
  ASSERT_EQ(reclaiming.size(), 6u);  // four scope cases, streaming, h2o
  check(reclaiming, generate(e, reclaiming, prompt, false, true), want.data(), want.size(), "reclaiming");
  // The test can fail: the sparse policies' budgets are small enough to change every policy's logits.
  for (size_t i = 1; i < cs.size(); ++i) EXPECT_NE(alone[i].logits_hash, alone[0].logits_hash) << cs[i].name;
}

}  // namespace
