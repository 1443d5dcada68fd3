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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dequant.h"
#include "engine.h"
#include "gguf_writer.h"
#include "kernels.h"
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
auto set_decode_threads(O& o, int n, int) -> decltype(o.n_threads_decode = n, void()) {
  o.n_threads_decode = n;
}
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
  // A tensor's values: F32 as stored, quantized ones dequantized (dequantize_row, checked bit for
  // bit against llama.cpp's gguf-py in quants_test.cc).
  std::vector<double> w(const std::string& name) const {
    const GgufTensorInfo* t = m.file().find_tensor(name);
    if (t->type == static_cast<uint32_t>(GgmlType::F32)) {
      const auto* f = reinterpret_cast<const float*>(t->data);
      return std::vector<double>(f, f + t->n_elements());
    }
    const GgmlTypeTraits& tr = *ggml_type_traits(t->type);
    Weight wt;
    wt.type = static_cast<GgmlType>(t->type);
    wt.data = t->data;
    wt.cols = static_cast<int>(t->ne[0]);
    wt.rows = static_cast<int>(t->n_elements() / t->ne[0]);
    wt.row_bytes = t->ne[0] / tr.block_size * tr.type_size;
    std::vector<float> row(wt.cols);
    std::vector<double> out;
    for (int r = 0; r < wt.rows; ++r) {
      dequantize_row(wt, r, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
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
  const auto head = c.tied_output ? embd : rm.w("output.weight");
  std::vector<std::vector<std::vector<double>>> K(c.n_layer), V(c.n_layer);  // [layer][pos][kv_dim]
  std::vector<std::vector<double>> logits;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> x(embd.begin() + tokens[pos] * E, embd.begin() + (tokens[pos] + 1) * E);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto xn = rms_norm(x, rm.w(p + "attn_norm.weight"), c.rms_eps);
      auto q = matvec(rm.w(p + "attn_q.weight"), xn), k = matvec(rm.w(p + "attn_k.weight"), xn), v = matvec(rm.w(p + "attn_v.weight"), xn);
      auto rope = [&](std::vector<double>& h) {
        for (size_t base = 0; base < h.size(); base += d)
          for (int i = 0; i < d / 2; ++i) {
            const double th = pos * std::pow(static_cast<double>(c.rope.base), -2.0 * i / d);
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
    logits.push_back(matvec(head, rms_norm(x, out_norm, c.rms_eps)));
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
  std::unique_ptr<Engine> engine(int threads, int ubatch = 512) { return std::make_unique<Engine>(model_, options(threads, ubatch, 256)); }
  const ModelConfig& cfg() const { return model_->config(); }
  std::shared_ptr<Model> model_;
};

// Micro-batch and call boundaries change nothing numerically: every per-token computation
// (norms, activation quantization, GEMM rows, attention over the cache) is independent of
// which other tokens share its batch. So the results are expected to be bit-identical.
TEST_P(EngineConsistency, ChunkingDoesNotChangeLogits) {
  const auto toks = prompt(150, cfg().n_vocab, 1);  // several query and key blocks
  auto e = engine(1), e7 = engine(2, 7);            // also differs in threads: both must not matter
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

// An item that asks for the greedy token only (Engine::greedy_tokens: the output matrix in
// slices, no logits row written) gets the logits path's argmax: the lowest index of the largest
// logit. Alone and batched, after a prompt and at decode steps; on the real model across many
// slices of its 49,152 outputs.
TEST_P(EngineConsistency, GreedyTokenWithoutLogitsIsTheArgmaxOfTheLogits) {
  auto e = engine(2);
  std::vector<std::unique_ptr<Sequence>> with, without;
  std::vector<int32_t> next(3);
  for (int i = 0; i < 3; ++i) {
    with.push_back(std::make_unique<Sequence>(cfg(), 256));
    without.push_back(std::make_unique<Sequence>(cfg(), 256));
    const auto p = prompt(20 + 9 * i, cfg().n_vocab, 40 + i);
    const auto logits = run(*e, *with[i], p);
    int32_t got = -1;
    e->forward({{without[i].get(), p.data(), static_cast<int>(p.size()), nullptr, nullptr, &got}});
    next[i] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(got, next[i]) << "prompt " << i;
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> logits(3, std::vector<float>(cfg().n_vocab));
    std::vector<int32_t> both(3, -1), only(3, -1);
    std::vector<BatchItem> a, b;
    for (int i = 0; i < 3; ++i) {
      a.push_back({with[i].get(), &next[i], 1, logits[i].data(), nullptr, &both[i]});
      b.push_back({without[i].get(), &next[i], 1, nullptr, nullptr, &only[i]});
    }
    e->forward(a);
    e->forward(b);
    for (int i = 0; i < 3; ++i) {
      const int32_t want = static_cast<int32_t>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
      EXPECT_EQ(both[i], want) << "step " << step << " seq " << i;
      EXPECT_EQ(only[i], want) << "step " << step << " seq " << i;
      next[i] = want;
    }
  }
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

// ---------------------------------------------------------------------------------------------
// Every quantized type (Q5_0, Q5_1, Q4_K, Q5_K and Q6_K above all) through whole forward passes:
// a tiny model whose embedding (looked up by row), matrices and tied output head (the packed
// embedding) are all of the type prefills and then decodes, and gives
// - with each SIMD table the scalar reference table's logits, and
// - logits close to a double-precision forward pass on the dequantized weights: only the engine's
//   8-bit activations (and float arithmetic) separate them, so a misread block, a wrong packing or
//   dispatch is caught even where scalar and SIMD code share it.

class EngineQuantTypes : public ::testing::TestWithParam<uint32_t> {
 protected:
  static std::shared_ptr<Model> load(uint32_t type) {
    static ctxtest::TempDir dir;
    ctxtest::TinyLlama c = ctxtest::kTinyWide;
    c.rope_base = 100.f;
    return Model::load(
        dir.write("q" + std::to_string(type) + ".gguf", ctxtest::build(ctxtest::quantized_tiny_llama_spec(c, type, 9)).bytes));
  }
};

// Logits after a 40-token prefill and after each of 8 decode steps.
std::vector<std::vector<float>> prefill_then_decode(const std::shared_ptr<Model>& m, const KernelTable& kt,
                                                    const std::vector<int32_t>& toks) {
  EngineOptions o = options(1, 512, 256);
  o.kernels = &kt;
  Engine e(m, o);
  Sequence seq(m->config(), 64);
  std::vector<std::vector<float>> out;
  out.push_back(run(e, seq, std::vector<int32_t>(toks.begin(), toks.begin() + 40)));
  for (size_t i = 40; i < toks.size(); ++i) out.push_back(run(e, seq, {toks[i]}));
  return out;
}

void expect_matches_scalar_and_double_precision(const std::shared_ptr<Model>& model) {
  const std::vector<int32_t> toks = prompt(48, model->config().n_vocab, 5);
  const auto ref = prefill_then_decode(model, scalar_kernels(), toks);

  // The tables sum floats in different orders: logits agree to ~1e-7 of their range, except
  // where that moves an activation across a rounding boundary of its 8-bit quantization, which
  // changes the next product by one quantum of it (1/127 of its block's largest value) times a
  // weight. Measured on these models: at most 1.2e-3 of the range, at single steps, for Q5_0,
  // Q4_K, Q5_K, Q6_K and the older Q4_1 alike; 5e-3 leaves room, and a wrong block, row or
  // kernel is off by the order of the range.
  int tables = 0;
  for (const KernelTable* kt : {cpu_has_avx2() ? avx2_kernels() : nullptr, cpu_has_avx512() ? avx512_kernels() : nullptr}) {
    if (!kt) continue;
    ++tables;
    SCOPED_TRACE(kt->name);
    const auto got = prefill_then_decode(model, *kt, toks);
    for (size_t step = 0; step < ref.size(); ++step) {
      const float range = max_abs(ref[step]);
      EXPECT_LE(max_diff(got[step], ref[step]), 5e-3f * range) << "logits after token " << 39 + step;
    }
  }
  if (tables == 0) std::printf("note: this CPU runs the scalar table only; checked against double precision alone\n");

  // Against double precision: the engine quantizes every matrix product's input to 8 bits per 32
  // values (rounding error up to 1/254 of each block's largest value), layer after layer.
  // Measured: at most 1.8e-3 of the logit range on these models; 5e-3 allows for it, and a wrong
  // weight layout gives errors of the order of the range itself.
  const auto want = reference_forward(*model, toks);
  for (size_t step = 0; step < ref.size(); ++step) {
    const auto& w = want[39 + step];
    double range = 0, err = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      range = std::max(range, std::fabs(w[i]));
      err = std::max(err, std::fabs(ref[step][i] - w[i]));
    }
    EXPECT_LE(err, 5e-3 * range) << "logits after token " << 39 + step;
  }
}

TEST_P(EngineQuantTypes, PrefillAndDecodeMatchScalarAndDoublePrecision) { expect_matches_scalar_and_double_precision(load(GetParam())); }

// Types mixed as a Q4_K_M file mixes them (and more): the matrices that share an input (Q/K/V,
// gate/up) are of different types, so one quantized activation feeds several kernels; the
// output head is an untied Q8_0 matrix.
TEST(EngineMixedQuantTypes, PrefillAndDecodeMatchScalarAndDoublePrecision) {
  static ctxtest::TempDir dir;
  ctxtest::TinyLlama c = ctxtest::kTinyWide;
  c.rope_base = 100.f;
  ctxtest::Spec s = ctxtest::tiny_llama_spec(c, 10);
  s.tensors.push_back(s.tensor("token_embd.weight"));
  s.tensors.back().name = "output.weight";
  const std::map<std::string, uint32_t> types = {
      {"token_embd", ctxtest::kTQ6_K}, {"output", ctxtest::kTQ8_0}, {"attn_q", ctxtest::kTQ4_K},
      {"attn_k", ctxtest::kTQ5_0},     {"attn_v", ctxtest::kTQ6_K}, {"attn_output", ctxtest::kTQ5_K},
      {"ffn_gate", ctxtest::kTQ4_K},   {"ffn_up", ctxtest::kTQ5_1}, {"ffn_down", ctxtest::kTQ6_K}};
  for (auto& t : s.tensors) {
    if (t.dims.size() != 2) continue;
    std::string kind = t.name.substr(0, t.name.rfind('.'));
    kind = kind.substr(kind.rfind('.') + 1);  // "blk.0.attn_q.weight" -> "attn_q"
    ctxtest::quantize_tensor(t, types.at(kind));
  }
  const auto model = Model::load(dir.write("mixed.gguf", ctxtest::build(s).bytes));
  ASSERT_FALSE(model->config().tied_output);
  EXPECT_EQ(model->layers()[0].wk.type, GgmlType::Q5_0);
  expect_matches_scalar_and_double_precision(model);
}

INSTANTIATE_TEST_SUITE_P(Types, EngineQuantTypes,
                         ::testing::Values(ctxtest::kTQ5_0, ctxtest::kTQ5_1, ctxtest::kTQ4_K, ctxtest::kTQ5_K, ctxtest::kTQ6_K,
                                           ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0),
                         [](const ::testing::TestParamInfo<uint32_t>& i) { return ggml_type_name(i.param); });

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
