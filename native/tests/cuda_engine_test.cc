// The CUDA engine against the CPU engine (CUDA builds only; skipped, with the reason, without a
// usable GPU): the same batches on both, logits compared step by step, on synthetic models of
// every weight type with GQA, over contexts that cross every tile boundary (prefill GEMM vs decode
// matvec, 16-query and 64-key attention tiles, decode splits), in mixed batches of prefill chunks
// and decode steps of many sequences; KV moved between a CPU and a GPU sequence; and, when present,
// the real SmolLM2 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "engine.h"
#include "gguf_writer.h"
#include "model.h"

namespace {

using namespace ctx;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (auto why = ctx::cuda_unusable(0)) GTEST_SKIP() << "no usable GPU: " << why->what(); \
  } while (0)

// GPU-shaped tiny models: head_dim 32 (a multiple of 32), 4 query heads over 2 KV heads.
ctxtest::TinyLlama shape() {
  ctxtest::TinyLlama c;
  c.n_embd = 128, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 256, c.n_layer = 2, c.n_vocab = 300, c.n_ctx = 4096;
  c.rope_base = 1000.f;
  return c;
}

// Matrices and embedding of `type`; the output head Q8_0 (untied) unless the type is F32.
std::shared_ptr<Model> model_of(uint32_t type) {
  static ctxtest::TempDir dir;
  ctxtest::Spec s = ctxtest::tiny_llama_spec(shape(), 11 + type);
  if (type != ctxtest::kTF32) {
    s.tensors.push_back(s.tensor("token_embd.weight"));
    s.tensors.back().name = "output.weight";
    for (auto& t : s.tensors)
      if (t.dims.size() == 2) ctxtest::quantize_tensor(t, t.name == "output.weight" ? ctxtest::kTQ8_0 : type);
  }
  return Model::load(dir.write("m" + std::to_string(type) + ".gguf", ctxtest::build(s).bytes));
}

EngineOptions opts(const std::string& device, int ubatch = 512, const std::string& kernels = "simple") {
  EngineOptions o;
  o.device = device;
  o.ubatch = ubatch;
  o.cuda_kernels = kernels;
  return o;
}

std::vector<int32_t> tokens(int n, int vocab, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + seed * 104729 + 17) % vocab);
  return t;
}

// Logits of both engines agree to `rel` of the logits' range, and pick the same greedy token
// unless the CPU's top two are closer than that.
void expect_same_logits(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel, const std::string& what) {
  float range = 1e-6f, diff = 0;
  for (size_t i = 0; i < cpu.size(); ++i) range = std::max(range, std::fabs(cpu[i])), diff = std::max(diff, std::fabs(gpu[i] - cpu[i]));
  EXPECT_LE(diff, rel * range) << what << ": max |dlogit| " << diff << " of range " << range;
  const size_t g = std::max_element(gpu.begin(), gpu.end()) - gpu.begin(), c = std::max_element(cpu.begin(), cpu.end()) - cpu.begin();
  if (g != c) EXPECT_LE(std::fabs(cpu[c] - cpu[g]), rel * range) << what << ": greedy tokens differ";
}

// One batch item per entry: (sequence index, token count); both engines run the same batches.
struct Pair {
  Engine cpu, gpu;
  std::vector<std::shared_ptr<Sequence>> cs, gs;
  Pair(std::shared_ptr<Model> m, int ubatch = 512, const std::string& kernels = "simple", int cpu_threads = 1)
      : cpu(m, cpu_opts(ubatch, cpu_threads)), gpu(m, opts("cuda", ubatch, kernels)) {}
  static EngineOptions cpu_opts(int ubatch, int threads) {
    EngineOptions o = opts("cpu", ubatch);
    o.n_threads = o.n_threads_decode = threads;
    return o;
  }
  void add(int capacity) {
    cs.push_back(cpu.create_sequence(capacity));
    gs.push_back(gpu.create_sequence(capacity));
  }
  void step(const std::vector<std::pair<int, std::vector<int32_t>>>& batch, double rel, const std::string& what) {
    const int V = cpu.config().n_vocab;
    std::vector<std::vector<float>> lc(batch.size(), std::vector<float>(V)), lg = lc;
    std::vector<int32_t> greedy(batch.size(), -1);
    std::vector<BatchItem> ic, ig;
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& [s, t] = batch[i];
      ic.push_back({cs[s].get(), t.data(), static_cast<int>(t.size()), lc[i].data()});
      ig.push_back({gs[s].get(), t.data(), static_cast<int>(t.size()), lg[i].data()});
      ig.back().argmax = &greedy[i];
    }
    cpu.forward(ic);
    gpu.forward(ig);
    for (size_t i = 0; i < batch.size(); ++i) {
      expect_same_logits(lg[i], lc[i], rel, what + ", item " + std::to_string(i));
      EXPECT_EQ(greedy[i], std::max_element(lg[i].begin(), lg[i].end()) - lg[i].begin()) << what << ": GPU argmax vs its logits";
      EXPECT_EQ(gs[batch[i].first]->n_past(), cs[batch[i].first]->n_past());
    }
  }
};

// Prefill runs the f16 tensor-core GEMM (the CPU quantizes activations to 8 bits instead), decode
// the matvecs with the CPU's own activation quantization: 2% of the logit range covers the former.
constexpr double kRel = 0.02;

// The forward-pass tests run once per kernel set: the simple kernels, each faster variant alone
// (so a failure names its variant), all that have passed on a GPU together ("fast"), and those with
// the variants that have not run on one yet (fused-decode, pdl).
class CudaEngineKernels : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Variants, CudaEngineKernels,
                         ::testing::Values("simple", "fused", "matvec", "attention", "prefill-attention", "gemm", "fast", "fused-decode",
                                           "fast,fused-decode", "fast,pdl"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string name = i.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           std::replace(name.begin(), name.end(), ',', '_');
                           return name;
                         });

TEST_P(CudaEngineKernels, EveryWeightTypePrefillThenDecode) {
  SKIP_WITHOUT_GPU();
  for (uint32_t type : {ctxtest::kTF32, ctxtest::kTF16, ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0}) {
    Pair p(model_of(type), 512, GetParam());
    p.add(1024);
    const std::vector<int32_t> prompt = tokens(300, 300, 1);
    p.step({{0, prompt}}, kRel, "type " + std::to_string(type) + " prefill 300");
    for (int i = 0; i < 20; ++i)
      p.step({{0, {static_cast<int32_t>((i * 37) % 300)}}}, kRel, "type " + std::to_string(type) + " decode " + std::to_string(i));
  }
}

// Q5_0, Q5_1 and the K-quants (float paths on the GPU, 8-bit activations on the CPU) in a model
// 256 wide, every matrix and the tied embedding of the type.
TEST_P(CudaEngineKernels, Q5AndKQuantModelsPrefillThenDecode) {
  SKIP_WITHOUT_GPU();
  static ctxtest::TempDir dir;
  ctxtest::TinyLlama c = ctxtest::kTinyWide;
  c.n_vocab = 300, c.n_ctx = 1024, c.rope_base = 1000.f;
  for (uint32_t type : {ctxtest::kTQ5_0, ctxtest::kTQ5_1, ctxtest::kTQ4_K, ctxtest::kTQ5_K, ctxtest::kTQ6_K}) {
    const auto m = Model::load(
        dir.write("w" + std::to_string(type) + ".gguf", ctxtest::build(ctxtest::quantized_tiny_llama_spec(c, type, 21 + type)).bytes));
    Pair p(m, 512, GetParam());
    p.add(1024);
    p.step({{0, tokens(300, 300, 2)}}, kRel, "type " + std::to_string(type) + " prefill 300");
    for (int i = 0; i < 10; ++i)
      p.step({{0, {static_cast<int32_t>((i * 41) % 300)}}}, kRel, "type " + std::to_string(type) + " decode " + std::to_string(i));
  }
}

TEST_P(CudaEngineKernels, LongContextAcrossDecodeSplits) {
  SKIP_WITHOUT_GPU();
  Pair p(model_of(ctxtest::kTQ4_1), 512, GetParam());
  p.add(4096);
  const std::vector<int32_t> prompt = tokens(3000, 300, 2);
  p.step({{0, prompt}}, kRel, "prefill 3000 in micro-batches of 512");
  for (int i = 0; i < 8; ++i) p.step({{0, {static_cast<int32_t>(i + 1)}}}, kRel, "decode at " + std::to_string(3000 + i));
}

TEST_P(CudaEngineKernels, MixedBatchesOfPrefillChunksAndDecodeSteps) {
  SKIP_WITHOUT_GPU();
  Pair p(model_of(ctxtest::kTQ8_0), 64, GetParam());  // small micro-batches: items are cut across them
  for (int i = 0; i < 3; ++i) p.add(2048);
  p.step({{0, tokens(700, 300, 3)}, {1, tokens(5, 300, 4)}}, kRel, "two prefills");
  p.step({{0, {7}}, {1, {8}}, {2, tokens(90, 300, 5)}}, kRel, "two decodes and a prefill chunk");
  p.step({{2, tokens(33, 300, 6)}, {0, {9}}}, kRel, "a second chunk and a decode");
  p.step({{0, {1, 2, 3}}, {1, {4}}, {2, {5, 6}}}, kRel, "short multi-token steps");
}

TEST_P(CudaEngineKernels, ManySequencesDecodeTogether) {
  SKIP_WITHOUT_GPU();
  Pair p(model_of(ctxtest::kTQ4_0), 512, GetParam());
  const int n = 40;
  for (int s = 0; s < n; ++s) {
    p.add(1024);
    p.step({{s, tokens(1 + s * 23 % 600, 300, 10 + s)}}, kRel, "prefill " + std::to_string(s));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<std::pair<int, std::vector<int32_t>>> batch;
    for (int s = 0; s < n; ++s) batch.push_back({s, {static_cast<int32_t>((s + step) % 300)}});
    p.step(batch, kRel, "batch of 40, step " + std::to_string(step));
  }
}

TEST(CudaEngine, KvMovesBetweenCpuAndGpuSequences) {
  SKIP_WITHOUT_GPU();
  auto m = model_of(ctxtest::kTQ4_1);
  Engine cpu(m, opts("cpu")), gpu(m, opts("cuda"));
  const std::vector<int32_t> prompt = tokens(400, 300, 7);
  const int L = m->config().n_layer;
  // CPU prefill -> GPU sequence (upload) -> decode on the GPU equals decode on the CPU.
  auto c = cpu.create_sequence(1024);
  cpu.forward({{c.get(), prompt.data(), 400}});
  auto g = gpu.create_sequence(1024);
  for (int l = 0; l < L; ++l) {
    std::copy(c->kv.k(l, 0), c->kv.k(l, 0) + 400 * c->kv.kv_dim(), g->kv.k(l, 0));
    std::copy(c->kv.v(l, 0), c->kv.v(l, 0) + 400 * c->kv.kv_dim(), g->kv.v(l, 0));
    g->device_kv->upload(g->kv, l, 0, 400);
  }
  g->kv.set_size(400);
  const int32_t next = 42;
  std::vector<float> lc(300), lg(300);
  cpu.forward({{c.get(), &next, 1, lc.data()}});
  gpu.forward({{g.get(), &next, 1, lg.data()}});
  expect_same_logits(lg, lc, 1e-3, "decode after a CPU->GPU import");
  // GPU -> CPU (download): the 401 rows come back as the GPU wrote them, close to the CPU's.
  auto back = cpu.create_sequence(1024);
  for (int l = 0; l < L; ++l) g->device_kv->download(back->kv, l, 0, 401);
  back->kv.set_size(401);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < 400; ++t)  // the imported rows round-trip exactly
      ASSERT_TRUE(std::equal(back->kv.k(l, t), back->kv.k(l, t) + back->kv.kv_dim(), c->kv.k(l, t))) << l << " " << t;
  const int32_t after = 5;
  std::vector<float> l1(300), l2(300);
  cpu.forward({{c.get(), &after, 1, l1.data()}});
  cpu.forward({{back.get(), &after, 1, l2.data()}});
  expect_same_logits(l2, l1, 1e-3, "CPU decode after a GPU->CPU export");
}

TEST(CudaEngine, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  auto m = model_of(ctxtest::kTQ4_1);
  Engine cpu(m, opts("cpu")), gpu(m, opts("cuda"));
  auto cseq = cpu.create_sequence(64);
  auto gseq = gpu.create_sequence(64);
  const int32_t t = 1;
  EXPECT_THROW(gpu.forward({{cseq.get(), &t, 1}}), std::invalid_argument);
  EXPECT_THROW(cpu.forward({{gseq.get(), &t, 1}}), std::invalid_argument);
  AttentionPolicy scope;
  scope.kind = AttentionPolicy::Kind::Scope;
  EXPECT_THROW(gseq->set_policy(scope), std::invalid_argument);
  EXPECT_EQ(gpu.device_name(), "cuda:0");
  EXPECT_GT(gpu.device()->weight_bytes(), 0u);
  // release() frees the GPU cache now; the sequence is usable again afterwards.
  EXPECT_GT(gseq->device_kv->bytes_reserved(), 0u);
  gseq->device_kv->release();
  gseq->kv.set_size(0);
  EXPECT_EQ(gseq->device_kv->bytes_reserved(), 0u);
  std::vector<float> lg(300), lc(300);
  gpu.forward({{gseq.get(), &t, 1, lg.data()}});
  cpu.forward({{cseq.get(), &t, 1, lc.data()}});
  expect_same_logits(lg, lc, kRel, "after release()");
}

TEST_P(CudaEngineKernels, CudaGraphsReplayExactlyTheSameForwardPass) {
  SKIP_WITHOUT_GPU();
  auto m = model_of(ctxtest::kTQ4_1);
  EngineOptions with = opts("cuda", 512, GetParam());
  with.cuda_graphs = true;
  Engine plain(m, opts("cuda", 512, GetParam())), graphs(m, with);
  std::vector<std::shared_ptr<Sequence>> a, b;
  for (int s = 0; s < 3; ++s) a.push_back(plain.create_sequence(2048)), b.push_back(graphs.create_sequence(2048));
  // Steps of every shape the graphs are keyed on: a long prompt (full and partial micro-batch),
  // single decode steps across a split bucket's boundary (1,025 keys: 4 -> 8 splits), and a batch
  // of three.
  auto step = [&](const std::vector<std::pair<int, std::vector<int32_t>>>& batch, const std::string& what) {
    std::vector<std::vector<float>> la(batch.size(), std::vector<float>(300)), lb = la;
    std::vector<BatchItem> ia, ib;
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& [s, t] = batch[i];
      ia.push_back({a[s].get(), t.data(), static_cast<int>(t.size()), la[i].data()});
      ib.push_back({b[s].get(), t.data(), static_cast<int>(t.size()), lb[i].data()});
    }
    plain.forward(ia);
    graphs.forward(ib);
    for (size_t i = 0; i < batch.size(); ++i) ASSERT_EQ(lb[i], la[i]) << what << ", item " << i;
  };
  step({{0, tokens(1000, 300, 12)}}, "prefill 1000");
  for (int i = 0; i < 80; ++i) step({{0, {static_cast<int32_t>(i % 300)}}}, "decode at " + std::to_string(1000 + i));
  step({{1, tokens(300, 300, 13)}, {2, tokens(40, 300, 14)}}, "two prefills");
  for (int i = 0; i < 5; ++i) step({{0, {1}}, {1, {2}}, {2, {3}}}, "batch of 3, step " + std::to_string(i));
}

// A prefill of 600 tokens, then 64 decode steps fed the CPU's greedy token (both engines see the
// same tokens): logits within kRel at every step, greedy tokens equal unless the CPU's top two
// are within the tolerance. Prints how many greedy tokens agree exactly.
void compare_on(const std::shared_ptr<Model>& m, const std::string& kernels, const std::string& what) {
  Pair p(m, 512, kernels, 8);
  p.add(2048);
  p.step({{0, tokens(600, m->config().n_vocab, 9)}}, kRel, what + " prefill 600");
  const int V = m->config().n_vocab;
  std::vector<float> lc(V), lg(V);
  int32_t next = 1, gpu_greedy = -1, same = 0;
  for (int i = 0; i < 64; ++i) {
    p.cpu.forward({{p.cs[0].get(), &next, 1, lc.data()}});
    BatchItem g{p.gs[0].get(), &next, 1, lg.data()};
    g.argmax = &gpu_greedy;
    p.gpu.forward({g});
    expect_same_logits(lg, lc, kRel, what + " decode " + std::to_string(i));
    next = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    same += gpu_greedy == next;
  }
  std::printf("[ %s, kernels %s ] greedy tokens equal in %d of 64 decode steps\n", what.c_str(), kernels.c_str(), same);
}

TEST_P(CudaEngineKernels, RealModelLogitsAndGreedyTokens) {
  SKIP_WITHOUT_GPU();
  const char* path = std::getenv("CTXBANK_MODEL");
  if (!path || !*path) GTEST_SKIP() << "set CTXBANK_MODEL to the SmolLM2 GGUF";
  compare_on(Model::load(path), GetParam(), "real model");
}

// SmolLM2-135M's shapes with random weights, for a GPU machine the real file cannot reach: 30
// layers, 576/1536, 9 query heads over 3 KV heads of 64, Q4_1 layers, a tied Q8_0 embedding of
// 49,152 rows (so the output head is the embedding's copy, as in the real file).
std::shared_ptr<Model> smollm2_shaped() {
  static ctxtest::TempDir dir;
  static std::shared_ptr<Model> model;
  if (model) return model;
  ctxtest::TinyLlama c;
  c.n_embd = 576, c.n_head = 9, c.n_head_kv = 3, c.n_ff = 1536, c.n_layer = 30, c.n_vocab = 49152, c.n_ctx = 8192;
  c.rope_base = 100000.f;
  ctxtest::Spec s = ctxtest::tiny_llama_spec(c, 135);
  for (auto& t : s.tensors)
    if (t.dims.size() == 2) ctxtest::quantize_tensor(t, t.name == "token_embd.weight" ? ctxtest::kTQ8_0 : ctxtest::kTQ4_1);
  model = Model::load(dir.write("smollm2-shaped.gguf", ctxtest::build(s).bytes));
  return model;
}

TEST_P(CudaEngineKernels, SmolLM2ShapedLogitsAndGreedyTokens) {
  SKIP_WITHOUT_GPU();
  compare_on(smollm2_shaped(), GetParam(), "SmolLM2-shaped");
}

// fused-decode against the kernels it fuses, on the GPU alone: the same activation bits and sums,
// so the logits of "fast" and "fast,fused-decode" may differ only by the compiler's FMA choices (an
// ulp or so per block term, matvec_fast.cuh), grown over 30 layers; 1e-3 of the logits' range
// leaves room for that, while a wrong row, pair, norm or merge moves logits by O(1). pdl changes
// when kernels start, not what they compute: "fast,pdl" must give fused-decode's bits exactly (a
// kernel reading its predecessor's output too early would not). Two sequences decode 40 steps
// each, fed fast's greedy tokens: one after a 600-token prompt (split attention, merged), one after
// 20 tokens (one split: the attention writes its output itself); with CUDA graphs, as served.
TEST(CudaEngine, FusedDecodeComputesWhatTheFastKernelsCompute) {
  SKIP_WITHOUT_GPU();
  const std::shared_ptr<Model> m = smollm2_shaped();
  auto graphs = [](const std::string& kernels) {
    EngineOptions o = opts("cuda", 512, kernels);
    o.cuda_graphs = true;
    return o;
  };
  Engine fast(m, graphs("fast")), fused(m, graphs("fast,fused-decode")), pdl(m, graphs("fast,pdl"));
  const int V = m->config().n_vocab;
  for (int prompt_len : {600, 20}) {
    const std::string what = "after " + std::to_string(prompt_len) + " tokens";
    const std::shared_ptr<Sequence> a = fast.create_sequence(1024), b = fused.create_sequence(1024), c = pdl.create_sequence(1024);
    std::vector<float> la(V), lb(V), lc(V);
    const std::vector<int32_t> prompt = tokens(prompt_len, V, 5);
    fast.forward({{a.get(), prompt.data(), prompt_len, la.data()}});
    fused.forward({{b.get(), prompt.data(), prompt_len, lb.data()}});
    pdl.forward({{c.get(), prompt.data(), prompt_len, lc.data()}});
    ASSERT_EQ(lb, la) << what << ": a prefill runs no fused kernel, so the same bits";
    ASSERT_EQ(lc, la) << what << ": a prefill runs no fused kernel, so the same bits";
    int32_t next = 1;
    int identical = 0;
    for (int i = 0; i < 40; ++i) {
      fast.forward({{a.get(), &next, 1, la.data()}});
      fused.forward({{b.get(), &next, 1, lb.data()}});
      pdl.forward({{c.get(), &next, 1, lc.data()}});
      expect_same_logits(lb, la, 1e-3, what + ", decode " + std::to_string(i));
      ASSERT_EQ(lc, lb) << what << ", decode " + std::to_string(i) << ": pdl changed a result";
      identical += lb == la;
      next = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
    }
    std::printf("[ fast vs fast,fused-decode, %s ] logits bit-identical in %d of 40 decode steps\n", what.c_str(), identical);
  }
}

}  // namespace
