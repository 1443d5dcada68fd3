// The forward pass. On tiny generated models (always) and on the real SmolLM2 GGUF (when
// present: $CTXBANK_MODEL, else /tmp/smollm2.gguf):
// - a tiny F32 model matches an independent double-precision Llama forward pass;
// - how a batch is cut (one call, several calls, micro-batches of 7) does not change logits;
// - a batched decode step equals each sequence decoded alone; 1 vs 2 threads agree;
// - forward() refuses bad batches with std::invalid_argument before touching any KV.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine.h"
#include "gguf_writer.h"
#include "model.h"

namespace {

using namespace ctx;
using ctxtest::TinyLlama;

// ---------------------------------------------------------------------------------------------
// Models under test, loaded once per process.

constexpr TinyLlama kTiny = [] {
  TinyLlama c;
  c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 128, c.n_layer = 2, c.n_vocab = 50, c.n_ctx = 256;
  c.rope_base = 100.f;  // a small base makes every RoPE pair rotate noticeably within 40 tokens
  return c;
}();

std::string real_model_path(std::string* why_missing) {
  if (const char* env = std::getenv("CTXBANK_MODEL"); env && *env) return env;  // must exist: checked by the caller
  struct stat st {};
  if (stat("/tmp/smollm2.gguf", &st) == 0) return "/tmp/smollm2.gguf";
  *why_missing = "real model not found: set CTXBANK_MODEL or put SmolLM2-135M Q4_1 at /tmp/smollm2.gguf";
  return "";
}

struct Models {
  ctxtest::TempDir dir;
  std::shared_ptr<Model> tiny_f32, tiny_q;
  std::shared_ptr<Model> real;
  std::string real_missing;
  Models() {
    tiny_f32 = Model::load(dir.write("tiny_f32.gguf", ctxtest::build(ctxtest::tiny_llama_spec(kTiny, 7)).bytes));
    // Same shapes with Q4_1 matrices and embedding (as SmolLM2) and an untied Q8_0 output head.
    ctxtest::Spec q = ctxtest::tiny_llama_spec(kTiny, 8);
    q.tensors.push_back(q.tensor("token_embd.weight"));
    q.tensors.back().name = "output.weight";
    for (auto& t : q.tensors)
      if (t.dims.size() == 2) ctxtest::quantize_tensor(t, t.name == "output.weight" ? ctxtest::kTQ8_0 : ctxtest::kTQ4_1);
    tiny_q = Model::load(dir.write("tiny_q.gguf", ctxtest::build(q).bytes));
    const std::string path = real_model_path(&real_missing);
    if (!path.empty()) real = Model::load(path);  // throws (fails every test) if CTXBANK_MODEL is bad
  }
};

Models& models() {
  static Models m;
  return m;
}

// ---------------------------------------------------------------------------------------------
// Helpers.

// Engine options by name. Decode steps get the same thread count as prefill (when the engine
// has a separate decode setting; the overload resolution keeps this compiling without one).
template <typename O>
auto set_decode_threads(O& o, int n, int) -> decltype(o.n_threads_decode = n, void()) { o.n_threads_decode = n; }
template <typename O>
void set_decode_threads(O&, int, long) {}

EngineOptions options(int threads, int ubatch, int max_context) {
  EngineOptions o;
  o.n_threads = threads;
  set_decode_threads(o, threads, 0);
  o.ubatch = ubatch;
  o.max_context = max_context;
  return o;
}

std::vector<int32_t> prompt(int n, int vocab, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + seed * 104729 + 17) % vocab);
  return t;
}

// Appends `tokens` to `seq` in calls of the given sizes; returns the logits after the last.
std::vector<float> run(Engine& e, Sequence& seq, const std::vector<int32_t>& tokens, std::vector<int> chunks = {}) {
  if (chunks.empty()) chunks = {static_cast<int>(tokens.size())};
  std::vector<float> logits(e.config().n_vocab);
  int off = 0;
  for (int c : chunks) {
    e.forward({{&seq, tokens.data() + off, c, logits.data()}});
    off += c;
  }
  EXPECT_EQ(off, static_cast<int>(tokens.size()));
  return logits;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Same KV rows for tokens [0, n) in every layer.
::testing::AssertionResult SameKv(const Sequence& a, const Sequence& b, int n) {
  const size_t row = a.kv.row_elems() * sizeof(uint16_t);
  for (int l = 0; l < a.kv.n_layer(); ++l)
    for (int t = 0; t < n; ++t)
      if (std::memcmp(a.kv.k(l, t), b.kv.k(l, t), row) || std::memcmp(a.kv.v(l, t), b.kv.v(l, t), row))
        return ::testing::AssertionFailure() << "KV differs at layer " << l << " token " << t;
  return ::testing::AssertionSuccess();
}

std::vector<uint8_t> snapshot(const Sequence& s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.kv.k(0));
  return std::vector<uint8_t>(p, p + s.kv.bytes_reserved());
}

// ---------------------------------------------------------------------------------------------
// A tiny F32 model against an independent double-precision Llama forward pass: the engine's
// RoPE convention (adjacent pairs), GQA head mapping, causal mask, RMSNorm, SwiGLU and tied
// output all have to be right. K and V are rounded to f16 as the engine's cache stores them.

struct RefModel {
  const Model& m;
  std::vector<double> w(const std::string& name) const {
    const GgufTensorInfo* t = m.file().find_tensor(name);
    const auto* f = reinterpret_cast<const float*>(t->data);
    return std::vector<double>(f, f + t->n_elements());
  }
};

std::vector<double> matvec(const std::vector<double>& W, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = W.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += W[r * cols + c] * x[c];
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& g, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = x[i] * s * g[i];
  return o;
}

double to_f16(double v) { return ctxtest::from_half(ctxtest::to_half(static_cast<float>(v))); }

// Logits after each token of `tokens`.
std::vector<std::vector<double>> reference_forward(const Model& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  const RefModel rm{model};
  const int E = c.n_embd, d = c.head_dim, group = c.n_head / c.n_head_kv;
  const auto embd = rm.w("token_embd.weight"), out_norm = rm.w("output_norm.weight");
  std::vector<std::vector<std::vector<double>>> K(c.n_layer), V(c.n_layer);  // [layer][pos][kv_dim]
  std::vector<std::vector<double>> logits;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> x(embd.begin() + tokens[pos] * E, embd.begin() + (tokens[pos] + 1) * E);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto xn = rms_norm(x, rm.w(p + "attn_norm.weight"), c.rms_eps);
      auto q = matvec(rm.w(p + "attn_q.weight"), xn), k = matvec(rm.w(p + "attn_k.weight"), xn),
           v = matvec(rm.w(p + "attn_v.weight"), xn);
      auto rope = [&](std::vector<double>& h) {
        for (size_t base = 0; base < h.size(); base += d)
          for (int i = 0; i < d / 2; ++i) {
            const double th = pos * std::pow(static_cast<double>(c.rope_base), -2.0 * i / d);
            const double a = h[base + 2 * i], b = h[base + 2 * i + 1];
            h[base + 2 * i] = a * std::cos(th) - b * std::sin(th);
            h[base + 2 * i + 1] = a * std::sin(th) + b * std::cos(th);
          }
      };
      rope(q);
      rope(k);
      for (auto& e : k) e = to_f16(e);
      for (auto& e : v) e = to_f16(e);
      K[l].push_back(k);
      V[l].push_back(v);
      std::vector<double> att(E, 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / group;
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += q[h * d + i] * K[l][j][kvh * d + i];
          s[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= pos; ++j)
          for (int i = 0; i < d; ++i) att[h * d + i] += s[j] / sum * V[l][j][kvh * d + i];
      }
      const auto o = matvec(rm.w(p + "attn_output.weight"), att);
      for (int i = 0; i < E; ++i) x[i] += o[i];
      xn = rms_norm(x, rm.w(p + "ffn_norm.weight"), c.rms_eps);
      auto g = matvec(rm.w(p + "ffn_gate.weight"), xn);
      const auto u = matvec(rm.w(p + "ffn_up.weight"), xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto dn = matvec(rm.w(p + "ffn_down.weight"), g);
      for (int i = 0; i < E; ++i) x[i] += dn[i];
    }
    logits.push_back(matvec(embd, rms_norm(x, out_norm, c.rms_eps)));
  }
  return logits;
}

TEST(EngineReference, TinyF32ModelMatchesDoublePrecisionForward) {
  const Model& model = *models().tiny_f32;
  // 140 tokens: the engine's attention works in blocks of keys and of query tokens; this spans
  // several of each, and the decode steps cross a key-block boundary (128).
  const std::vector<int32_t> toks = prompt(140, kTiny.n_vocab, 3);
  const auto want = reference_forward(model, toks);
  Engine e(models().tiny_f32, options(1, 512, 0));
  Sequence seq(model.config(), 256);
  // Prefill the first 125 tokens, then decode the rest one by one: both paths are checked.
  std::vector<std::vector<float>> got;
  got.push_back(run(e, seq, std::vector<int32_t>(toks.begin(), toks.begin() + 125)));
  for (int i = 125; i < 140; ++i) got.push_back(run(e, seq, {toks[i]}));
  for (size_t k = 0; k < got.size(); ++k) {
    const auto& ref = want[124 + k];
    double scale = 0, err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, std::fabs(ref[i]));
      err = std::max(err, std::fabs(got[k][i] - ref[i]));
    }
    // Float vs double arithmetic only (K/V are f16 in both): measured <= 1.2e-6 of the scale;
    // a wrong RoPE pairing, head mapping or mask is off by O(scale).
    EXPECT_LT(err, 2e-5 * scale) << "logits after token " << 124 + k << " (scale " << scale << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// Consistency properties, on the tiny quantized model and on the real one.

class EngineConsistency : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "real") {
      model_ = models().real;
      if (!model_) GTEST_SKIP() << models().real_missing;
    } else {
      model_ = models().tiny_q;
    }
  }
  std::unique_ptr<Engine> engine(int threads, int ubatch = 512) {
    return std::make_unique<Engine>(model_, options(threads, ubatch, 256));
  }
  const ModelConfig& cfg() const { return model_->config(); }
  std::shared_ptr<Model> model_;
};

// Micro-batch and call boundaries change nothing numerically: every per-token computation
// (norms, activation quantization, GEMM rows, attention over the cache) is independent of
// which other tokens share its batch. So the results are expected to be bit-identical.
TEST_P(EngineConsistency, ChunkingDoesNotChangeLogits) {
  const auto toks = prompt(150, cfg().n_vocab, 1);  // several query and key blocks
  auto e = engine(1), e7 = engine(2, 7);  // also differs in threads: both must not matter
  Sequence one(cfg(), 256), chunked(cfg(), 256), ub7(cfg(), 256);
  const auto l_one = run(*e, one, toks);
  const auto l_chunked = run(*e, chunked, toks, {13, 1, 70, 66});
  const auto l_ub7 = run(*e7, ub7, toks);
  EXPECT_EQ(one.n_past(), 150);
  EXPECT_EQ(chunked.n_past(), 150);
  EXPECT_EQ(ub7.n_past(), 150);
  EXPECT_EQ(max_diff(l_one, l_chunked), 0.f) << "scale " << max_abs(l_one);
  EXPECT_EQ(max_diff(l_one, l_ub7), 0.f) << "scale " << max_abs(l_one);
  EXPECT_TRUE(SameKv(one, chunked, 150));
  EXPECT_TRUE(SameKv(one, ub7, 150));
}

TEST_P(EngineConsistency, BatchedDecodeEqualsSingleDecode) {
  auto e = engine(2);
  const int lens[3] = {5, 17, 130};
  std::vector<std::unique_ptr<Sequence>> batched, alone;
  for (int i = 0; i < 3; ++i) {
    batched.push_back(std::make_unique<Sequence>(cfg(), 256));
    alone.push_back(std::make_unique<Sequence>(cfg(), 256));
    run(*e, *batched[i], prompt(lens[i], cfg().n_vocab, 10 + i));
    run(*e, *alone[i], prompt(lens[i], cfg().n_vocab, 10 + i));
  }
  for (int step = 0; step < 2; ++step) {
    const int32_t next[3] = {3, 7 + step, 11};
    std::vector<std::vector<float>> lb(3, std::vector<float>(cfg().n_vocab));
    std::vector<BatchItem> items;
    for (int i = 0; i < 3; ++i) items.push_back({batched[i].get(), &next[i], 1, lb[i].data()});
    e->forward(items);
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + " seq " + std::to_string(i));
      const auto la = run(*e, *alone[i], {next[i]});
      EXPECT_EQ(batched[i]->n_past(), lens[i] + step + 1);
      EXPECT_EQ(max_diff(la, lb[i]), 0.f) << "scale " << max_abs(la);
      EXPECT_TRUE(SameKv(*alone[i], *batched[i], lens[i] + step + 1));
    }
  }
}

// A prefill chunk and decode steps of other sequences in one forward() (continuous batching),
// with a micro-batch size that splits the prefill.
TEST_P(EngineConsistency, MixedPrefillAndDecodeBatch) {
  auto e = engine(2, 6);
  Sequence a(cfg(), 64), b(cfg(), 64), a_alone(cfg(), 64), b_alone(cfg(), 64), c(cfg(), 64), c_alone(cfg(), 64);
  run(*e, b, prompt(9, cfg().n_vocab, 20));
  run(*e, b_alone, prompt(9, cfg().n_vocab, 20));
  const auto pa = prompt(11, cfg().n_vocab, 21), pc = prompt(4, cfg().n_vocab, 22);
  const int32_t tb = 5;
  std::vector<float> la(cfg().n_vocab), lb(cfg().n_vocab);
  // c has no logits requested: it must still get its KV.
  e->forward({{&a, pa.data(), 11, la.data()}, {&b, &tb, 1, lb.data()}, {&c, pc.data(), 4, nullptr}});
  EXPECT_EQ(max_diff(la, run(*e, a_alone, pa)), 0.f);
  EXPECT_EQ(max_diff(lb, run(*e, b_alone, {tb})), 0.f);
  run(*e, c_alone, pc);
  EXPECT_EQ(c.n_past(), 4);
  EXPECT_TRUE(SameKv(a, a_alone, 11));
  EXPECT_TRUE(SameKv(b, b_alone, 10));
  EXPECT_TRUE(SameKv(c, c_alone, 4));
}

TEST_P(EngineConsistency, ThreadCountDoesNotChangeLogits) {
  const auto toks = prompt(100, cfg().n_vocab, 2);
  auto e1 = engine(1), e2 = engine(2);
  Sequence s1(cfg(), 256), s2(cfg(), 256);
  const auto l1 = run(*e1, s1, toks), l2 = run(*e2, s2, toks);
  EXPECT_EQ(max_diff(l1, l2), 0.f) << "scale " << max_abs(l1);
  EXPECT_TRUE(SameKv(s1, s2, 100));
  const int32_t t = 9;
  EXPECT_EQ(max_diff(run(*e1, s1, {t}), run(*e2, s2, {t})), 0.f);
}

// Every refusal is std::invalid_argument, thrown before any KV is written: a valid item in
// the same batch is not run either.
TEST_P(EngineConsistency, ForwardRefusesBadBatchesWithoutSideEffects) {
  auto e = engine(1);
  Sequence s(cfg(), 32), other(cfg(), 32);
  run(*e, s, prompt(20, cfg().n_vocab, 4));
  run(*e, other, prompt(3, cfg().n_vocab, 5));
  const auto before_s = snapshot(s), before_other = snapshot(other);
  std::vector<float> logits(cfg().n_vocab, 0.f);
  const int32_t ok[1] = {1};
  const int32_t too_big[1] = {cfg().n_vocab}, negative[1] = {-1};
  const std::vector<int32_t> many(13, 1);

  auto refuses = [&](std::vector<BatchItem> items, const std::string& needle) {
    SCOPED_TRACE(needle);
    try {
      e->forward(items);
      ADD_FAILURE() << "batch accepted";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find(needle), std::string::npos) << ex.what();
    }
    EXPECT_EQ(s.n_past(), 20);
    EXPECT_EQ(other.n_past(), 3);
    EXPECT_TRUE(snapshot(s) == before_s);
    EXPECT_TRUE(snapshot(other) == before_other);
    EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return v == 0.f; }));
  };
  refuses({{&other, ok, 1, logits.data()}, {&s, too_big, 1, logits.data()}}, "outside the vocabulary");
  refuses({{&other, ok, 1, logits.data()}, {&s, negative, 1, logits.data()}}, "outside the vocabulary");
  refuses({{&other, ok, 1, logits.data()}, {&s, ok, 0, logits.data()}}, "empty token list");
  refuses({{&other, ok, 1, logits.data()}, {&s, many.data(), 13, logits.data()}}, "exceed the context limit of 32");
  refuses({{&other, ok, 1, logits.data()}, {&s, ok, 1, logits.data()}, {&s, ok, 1, logits.data()}}, "appears twice");
  refuses({{&other, ok, 1, logits.data()}, {nullptr, ok, 1, logits.data()}}, "without a sequence");
  // A sequence whose capacity exceeds the engine's max_context is held to the latter.
  Sequence big(cfg(), 300);
  const std::vector<int32_t> longer(257, 1);
  refuses({{&big, longer.data(), 257, logits.data()}}, "exceed the context limit of 256 (model context)");
  EXPECT_EQ(big.n_past(), 0);

  // The engine is still healthy: the next valid step gives what a fresh engine gives.
  const auto l = run(*e, s, {ok[0]});
  auto fresh = engine(1);
  Sequence s2(cfg(), 32);
  run(*fresh, s2, prompt(20, cfg().n_vocab, 4));
  EXPECT_EQ(max_diff(l, run(*fresh, s2, {ok[0]})), 0.f);
  // Exactly full is allowed.
  const std::vector<int32_t> fill(32 - 21, 2);
  run(*e, s, fill);
  EXPECT_EQ(s.n_past(), 32);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineConsistency, ::testing::Values("tiny", "real"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The real model's weights are read right: it continues a repeated pattern of ten tokens
// (in-context copying, which even small models do reliably), which random or misread
// weights cannot.
TEST(EngineRealModel, ContinuesARepeatedPattern) {
  if (!models().real) GTEST_SKIP() << models().real_missing;
  Engine e(models().real, options(2, 512, 256));
  Sequence s(models().real->config(), 64);
  const std::vector<int32_t> cycle = {2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 11000};
  std::vector<int32_t> toks;
  for (int rep = 0; rep < 3; ++rep) toks.insert(toks.end(), cycle.begin(), cycle.end());
  toks.insert(toks.end(), cycle.begin(), cycle.begin() + 4);
  auto l = run(e, s, toks);
  for (int k = 4; k < 10; ++k) {
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
    const int top = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(top, cycle[k]) << "position " << k << " of the 4th repetition";
    l = run(e, s, {cycle[k]});
  }
}

}  // namespace
