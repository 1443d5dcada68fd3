// ctxbank_gpu_bench: the engine's speed on one device, the figures compared with llama.cpp's CUDA
// build (bench/gpu/README.md). A plain C++ program on the engine's own API (no Node), so the GPU
// machine needs nothing but this binary and the model file.
//
//   ctxbank_gpu_bench --model PATH --out FILE.json [--device cuda|cpu] [--kernels SET] [--subset]
//                     [--quick] [--deadline SECONDS]
//   ctxbank_gpu_bench --layout MODEL     prints "DATA_START FILE_SIZE": where the weights begin
//                                        (bench/gpu/pack.sh sends only the bytes before them)
//
// For one kernel set (a device.h parse_cuda_kernels string: simple, fast, matvec, ...):
//   decode   batch-1 ms/token at contexts 0, 4K, 8K, 32K, 128K (the KV before the step is declared,
//            zeros: speed does not depend on values, as llama-bench's -d fills its own), graphs off/on
//   prefill  tokens/s of one 512- and one 8192-token prompt (micro-batches of 2048)
//   batched  aggregate decode tokens/s of B = 1, 8, 32, 128 sequences at a 4K context each, graphs off/on
// --subset measures a few of them (decode at 0 and 32K with graphs, prefill 8K, B = 128 with
// graphs): enough to see what one variant gives in a short run. --quick: small sizes (a CPU
// rehearsal). Decode steps
// ask for the greedy token only (argmax on the device, 4 bytes back per sequence). Each point: a
// warm-up, then the median of 3 timed runs. The JSON is rewritten after every point, so a run
// cut off by its deadline (or killed) leaves what it measured.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "gguf.h"
#include "model.h"

namespace {

using namespace ctx;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, out, device = "cuda", kernels = "simple";
  bool quick = false, subset = false;
  double deadline_s = 1e9;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model")
      a.model = value();
    else if (k == "--out")
      a.out = value();
    else if (k == "--device")
      a.device = value();
    else if (k == "--kernels")
      a.kernels = value();
    else if (k == "--quick")
      a.quick = true;
    else if (k == "--subset")
      a.subset = true;
    else if (k == "--deadline")
      a.deadline_s = std::stod(value());
    else
      throw std::invalid_argument("unknown argument " + k);
  }
  if (a.model.empty() || a.out.empty())
    throw std::invalid_argument(
        "usage: ctxbank_gpu_bench --model PATH --out FILE [--device cuda|cpu] [--kernels SET] [--subset] [--quick] [--deadline S]");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The results as JSON objects, one per point, written out whole after each point.
class Report {
 public:
  Report(std::string path, std::string header) : path_(std::move(path)), header_(std::move(header)) {}
  void add(const std::string& point) {
    points_.push_back(point);
    write(false);
  }
  void write(bool finished) const {
    std::ofstream f(path_, std::ios::trunc);
    f << "{\n" << header_ << ",\n  \"finished\": " << (finished ? "true" : "false") << ",\n  \"points\": [\n";
    for (size_t i = 0; i < points_.size(); ++i) f << "    " << points_[i] << (i + 1 < points_.size() ? ",\n" : "\n");
    f << "  ]\n}\n";
  }

 private:
  std::string path_, header_;
  std::vector<std::string> points_;
};

std::string runs_json(const std::vector<double>& runs) {
  std::string s = "[";
  for (size_t i = 0; i < runs.size(); ++i) s += (i ? ", " : "") + std::to_string(runs[i]);
  return s + "]";
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

class Bench {
 public:
  Bench(const Args& a, std::shared_ptr<const Model> model) : a_(a), model_(std::move(model)), start_(Clock::now()) {}

  bool out_of_time() const { return std::chrono::duration<double>(Clock::now() - start_).count() > a_.deadline_s; }

  // `steps` greedy decode steps of every sequence at once; ms per step.
  double decode_steps(Engine& e, const std::vector<std::shared_ptr<Sequence>>& seqs, int steps) {
    const int V = model_->config().n_vocab;
    std::vector<int32_t> next(seqs.size(), 1), best(seqs.size(), 0);
    std::vector<BatchItem> items(seqs.size());
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) {
      for (size_t j = 0; j < seqs.size(); ++j) {
        next[j] = best[j] % V;
        items[j] = BatchItem{seqs[j].get(), &next[j], 1};
        items[j].argmax = &best[j];
      }
      e.forward(items);
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
  }

  EngineOptions options(const std::string& kernels, bool graphs, int max_context, int ubatch) const {
    EngineOptions o;
    o.device = a_.device;
    o.cuda_kernels = kernels;
    o.cuda_graphs = graphs;
    o.max_context = max_context;
    o.ubatch = ubatch;
    if (a_.device == "cpu") o.n_threads = o.n_threads_decode = 1;
    return o;
  }

  void decode_batch1(Report& r, const std::string& kernels, bool graphs, const std::vector<int>& contexts) {
    const int max_ctx = *std::max_element(contexts.begin(), contexts.end()) + 512;
    Engine e(model_, options(kernels, graphs, max_ctx, 512));
    auto seq = e.create_sequence(max_ctx);
    for (int ctx : contexts) {
      if (out_of_time()) return;
      const int steps = a_.quick ? 8 : 64;
      std::vector<double> runs;
      for (int rep = -1; rep < 3; ++rep) {  // rep -1: warm-up (and graph capture)
        seq->kv.set_size(ctx);
        const double ms = decode_steps(e, {seq}, rep < 0 ? 8 : steps);
        if (rep >= 0) runs.push_back(ms);
      }
      std::printf("decode batch 1, context %6d, kernels %-20s graphs %-3s: %8.3f ms/token\n", ctx, kernels.c_str(), graphs ? "on" : "off",
                  median(runs));
      std::fflush(stdout);
      r.add("{\"test\": \"decode\", \"kernels\": " + quoted(kernels) + ", \"graphs\": " + (graphs ? "true" : "false") + ", \"context\": " +
            std::to_string(ctx) + ", \"ms_per_token\": " + std::to_string(median(runs)) + ", \"runs_ms\": " + runs_json(runs) + "}");
    }
  }

  void prefill(Report& r, const std::string& kernels, const std::vector<int>& lengths) {
    const int max_ctx = *std::max_element(lengths.begin(), lengths.end()) + 64;
    Engine e(model_, options(kernels, false, max_ctx, 2048));
    const int V = model_->config().n_vocab;
    for (int n : lengths) {
      if (out_of_time()) return;
      auto seq = e.create_sequence(n + 8);
      std::vector<int32_t> tokens(n);
      for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7919LL + 104729 + 17) % V);
      std::vector<double> runs;
      for (int rep = -1; rep < 3; ++rep) {
        seq->kv.set_size(0);
        int32_t best = 0;
        BatchItem it{seq.get(), tokens.data(), n};
        it.argmax = &best;
        const auto t0 = Clock::now();
        e.forward({it});
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (rep >= 0) runs.push_back(ms);
      }
      const double tps = n / median(runs) * 1000;
      std::printf("prefill %5d tokens,        kernels %-20s           : %8.0f tok/s\n", n, kernels.c_str(), tps);
      std::fflush(stdout);
      r.add("{\"test\": \"prefill\", \"kernels\": " + quoted(kernels) + ", \"tokens\": " + std::to_string(n) +
            ", \"tokens_per_second\": " + std::to_string(tps) + ", \"runs_ms\": " + runs_json(runs) + "}");
    }
  }

  void batched(Report& r, const std::string& kernels, bool graphs, const std::vector<int>& batches) {
    const int ctx = a_.quick ? 512 : 4096, steps = a_.quick ? 4 : 32;
    Engine e(model_, options(kernels, graphs, ctx + 256, 512));
    for (int b : batches) {
      if (out_of_time()) return;
      std::vector<std::shared_ptr<Sequence>> seqs;
      for (int i = 0; i < b; ++i) seqs.push_back(e.create_sequence(ctx + 160));
      std::vector<double> runs;
      for (int rep = -1; rep < 3; ++rep) {
        for (auto& s : seqs) s->kv.set_size(ctx);
        const double ms = decode_steps(e, seqs, rep < 0 ? 4 : steps);
        if (rep >= 0) runs.push_back(ms);
      }
      const double tps = b / median(runs) * 1000;
      std::printf("batched decode B %3d at %d, kernels %-20s graphs %-3s: %8.0f tok/s (%.3f ms/step)\n", b, ctx, kernels.c_str(),
                  graphs ? "on" : "off", tps, median(runs));
      std::fflush(stdout);
      r.add("{\"test\": \"batched\", \"kernels\": " + quoted(kernels) + ", \"graphs\": " + (graphs ? "true" : "false") + ", \"batch\": " +
            std::to_string(b) + ", \"context\": " + std::to_string(ctx) + ", \"tokens_per_second\": " + std::to_string(tps) +
            ", \"ms_per_step\": " + std::to_string(median(runs)) + ", \"runs_ms\": " + runs_json(runs) + "}");
    }
  }

 private:
  const Args& a_;
  std::shared_ptr<const Model> model_;
  Clock::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::strcmp(argv[1], "--layout") == 0) {
      const auto f = GgufFile::open(argv[2]);
      std::printf("%llu %llu\n", static_cast<unsigned long long>(f->data_start()), static_cast<unsigned long long>(f->file_size()));
      return 0;
    }
    const Args a = parse(argc, argv);
    auto model = Model::load(a.model);
    std::string description = "cpu";
    {
      Engine probe(model, [&] {
        EngineOptions o;
        o.device = a.device;
        return o;
      }());
      description = probe.device_description();
    }
    std::printf("device: %s\n", description.c_str());
    Report report(a.out, "  \"model\": " + quoted(a.model) + ",\n  \"device\": " + quoted(a.device) +
                             ",\n  \"device_description\": " + quoted(description) + ",\n  \"kernels\": " + quoted(a.kernels) +
                             ",\n  \"quick\": " + (a.quick ? "true" : "false") + ",\n  \"subset\": " + (a.subset ? "true" : "false"));
    report.write(false);
    Bench b(a, model);
    const std::string& k = a.kernels;
    const bool all = !a.subset;
    const std::vector<int> contexts = a.quick ? std::vector<int>{0, 1024}
                                      : all   ? std::vector<int>{0, 4096, 8192, 32768, 131072}
                                              : std::vector<int>{0, 32768};
    const std::vector<int> lengths = a.quick ? std::vector<int>{512} : all ? std::vector<int>{512, 8192} : std::vector<int>{8192};
    const std::vector<int> batches = a.quick ? std::vector<int>{1, 8} : all ? std::vector<int>{1, 8, 32, 128} : std::vector<int>{128};
    // Graphs off and on for every set (on a CUDA device); the subset with graphs only.
    std::vector<bool> graphs = {false, true};
    if (a.device == "cpu")
      graphs = {false};
    else if (!all)
      graphs = {true};
    for (bool g : graphs) b.decode_batch1(report, k, g, contexts);
    b.prefill(report, k, lengths);
    for (bool g : graphs) b.batched(report, k, g, batches);
    if (b.out_of_time()) std::printf("deadline reached: stopping before every point was measured\n");
    report.write(!b.out_of_time());  // "finished": every point was measured
    std::printf("wrote %s\n", a.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctxbank_gpu_bench: %s\n", e.what());
    return 1;
  }
}
