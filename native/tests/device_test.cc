// Device selection (device.h), in every build: parsing, the clear error `cuda` gives where no
// GPU can be used (or the build has no CUDA backend), `auto` falling back to the CPU with the CPU
// engine's exact logits, and the greedy token the engine can return instead of the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "engine.h"
#include "model.h"
#include "tiny_model.h"

namespace {

using namespace ctx;

std::shared_ptr<Model> tiny_model() {
  ctxtest::TinyLlama c;
  c.n_ctx = 128;
  return ctxtest::tiny_model(c, 3);
}

EngineOptions on(const std::string& device) {
  EngineOptions o;
  o.device = device;
  return o;
}

std::vector<float> prefill_logits(Engine& e, const std::vector<int32_t>& tokens, int32_t* argmax = nullptr) {
  auto seq = e.create_sequence(64);
  std::vector<float> logits(e.config().n_vocab);
  BatchItem item{seq.get(), tokens.data(), static_cast<int>(tokens.size()), logits.data()};
  item.argmax = argmax;
  e.forward({item});
  return logits;
}

TEST(Device, ParsesTheDeviceStrings) {
  EXPECT_EQ(parse_device("cpu").kind, DeviceSpec::Kind::Cpu);
  EXPECT_EQ(parse_device("auto").kind, DeviceSpec::Kind::Auto);
  EXPECT_EQ(parse_device("cuda").kind, DeviceSpec::Kind::Cuda);
  EXPECT_EQ(parse_device("cuda").index, 0);
  EXPECT_EQ(parse_device("cuda:3").index, 3);
  EXPECT_EQ(parse_device("cuda:120").index, 120);
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:01", "cuda:x", "cuda:1234", "cpu ", "cuda:1a"}) {
    try {
      parse_device(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const DeviceError& e) {
      EXPECT_EQ(e.code(), "invalid_device") << bad;
    }
  }
}

TEST(Device, ParsesTheCudaKernelSets) {
  EXPECT_EQ(parse_cuda_kernels("simple"), CudaKernelSet{});
  const CudaKernelSet all = parse_cuda_kernels("fast");
  EXPECT_TRUE(all.fused && all.matvec && all.attention && all.prefill_attention && all.gemm);
  EXPECT_FALSE(all.fused_decode) << "fast holds only the variants that have passed on a GPU";
  const CudaKernelSet more = parse_cuda_kernels("fast,fused-decode");
  EXPECT_TRUE(more.fused_decode && more.gemm && more.fused);
  EXPECT_EQ(parse_cuda_kernels("fused-decode,gemm,prefill-attention,attention,matvec,fused"), more);
  const CudaKernelSet alone = parse_cuda_kernels("fused-decode");
  EXPECT_TRUE(alone.fused_decode && alone.matvec && !alone.gemm) << "fused-decode brings matvec's kernels";
  const CudaKernelSet pdl = parse_cuda_kernels("pdl");
  EXPECT_TRUE(pdl.pdl && pdl.fused_decode && pdl.matvec && !pdl.attention) << "pdl brings fused-decode's kernels";
  EXPECT_FALSE(all.pdl);
  EXPECT_EQ(cuda_kernels_name(parse_cuda_kernels("fast,pdl")), "fast,fused-decode,pdl");
  const CudaKernelSet two = parse_cuda_kernels("gemm,matvec");
  EXPECT_TRUE(two.gemm && two.matvec && !two.fused && !two.attention && !two.prefill_attention);
  EXPECT_EQ(parse_cuda_kernels("fused,matvec,attention,prefill-attention,gemm"), all);
  // The canonical name reads back as the same set.
  for (const char* s :
       {"simple", "fast", "matvec", "gemm,matvec", "prefill-attention,fused", "fast,fused-decode", "fused-decode", "pdl", "fast,pdl"})
    EXPECT_EQ(parse_cuda_kernels(cuda_kernels_name(parse_cuda_kernels(s))), parse_cuda_kernels(s)) << s;
  EXPECT_EQ(cuda_kernels_name(two), "matvec,gemm");
  EXPECT_EQ(cuda_kernels_name(all), "fast");
  EXPECT_EQ(cuda_kernels_name(more), "fast,fused-decode");
  EXPECT_EQ(cuda_kernels_name(alone), "matvec,fused-decode");
  EXPECT_EQ(parse_cuda_kernels("fast,matvec"), all) << "naming a variant fast holds changes nothing";
  for (const char* bad :
       {"", "quick", "fast,", ",matvec", "matvec,,gemm", "FAST", "simple,matvec", "attention ", "fast,,gemm", "fused_matvec"}) {
    try {
      parse_cuda_kernels(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const DeviceError& e) {
      EXPECT_EQ(e.code(), "invalid_cuda_kernels") << bad;
    }
  }
  // Refused by the engine on any device, like a bad device string.
  EngineOptions o = on("cpu");
  o.cuda_kernels = "quick";
  EXPECT_THROW(Engine(tiny_model(), o), DeviceError);
}

TEST(Device, CudaWithoutAUsableGpuFailsWithACode) {
  const std::unique_ptr<DeviceError> why = cuda_unusable(0);
  if (!why) GTEST_SKIP() << "a GPU is usable here: the CUDA tests (cuda_*_test.cc) cover it";
  if (!cuda_compiled())
    EXPECT_EQ(why->code(), "cuda_unavailable_in_build");
  else
    EXPECT_TRUE(why->code() == "no_gpu" || why->code() == "cuda_driver_too_old") << why->code();
  for (const char* device : {"cuda", "cuda:0", "cuda:7"}) {
    try {
      Engine e(tiny_model(), on(device));
      ADD_FAILURE() << device << " gave an engine without a GPU";
    } catch (const DeviceError& e) {
      EXPECT_EQ(e.code(), why->code()) << device;
      EXPECT_NE(std::string(e.what()), "") << device;
    }
  }
}

TEST(Device, AutoRunsOnTheCpuWithoutAGpu) {
  if (!cuda_unusable(0)) GTEST_SKIP() << "a GPU is usable here: auto picks it";
  Engine cpu(tiny_model(), on("cpu")), autod(tiny_model(), on("auto"));
  EXPECT_EQ(autod.device_name(), "cpu");
  EXPECT_EQ(autod.device(), nullptr);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 30, 11};
  EXPECT_EQ(prefill_logits(cpu, tokens), prefill_logits(autod, tokens));
}

TEST(Device, TheEngineReturnsTheGreedyToken) {
  Engine cpu(tiny_model(), on("cpu"));
  const std::vector<int32_t> tokens = {4, 8, 15, 16, 23, 32};
  int32_t best = -1;
  const std::vector<float> logits = prefill_logits(cpu, tokens, &best);
  EXPECT_EQ(best, std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Without logits too.
  auto seq = cpu.create_sequence(64);
  int32_t only = -1;
  BatchItem item{seq.get(), tokens.data(), static_cast<int>(tokens.size())};
  item.argmax = &only;
  cpu.forward({item});
  EXPECT_EQ(only, best);
}

}  // namespace
