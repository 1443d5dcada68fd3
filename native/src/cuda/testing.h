// Host wrappers around single CUDA kernels, for the tests (tests/cuda_kernels_test.cc): plain C++
// in and out (host vectors), so a test compiled by the host compiler can compare each kernel with
// its CPU reference. Each call copies its inputs to the GPU, runs one launcher of kernels.cuh and
// copies the result back. Throws DeviceError when CUDA fails.
#pragma once
#include <cstdint>
#include <vector>

#include "model.h"

namespace ctx::cuda::testing {

std::vector<float> embed(const Weight& w, const std::vector<int32_t>& tokens);
std::vector<float> rms_norm(const std::vector<float>& x, const std::vector<float>& weight, int n, int e, float eps);
std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int head_dim, const std::vector<int>& pos,
                        const std::vector<float>& cos_t, const std::vector<float>& sin_t);
struct Q8 {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> isum;
};
Q8 quantize_q8(const std::vector<float>& x, int n, int k);
// y [n][w.rows]: the matvec path (quantized weights use quantize_q8 activations); n <= 8.
std::vector<float> matvec(const Weight& w, const std::vector<float>& x, int n);
// y [n][w.rows]: the tensor-core GEMM path.
std::vector<float> gemm(const Weight& w, const std::vector<float>& x, int n);
// One sequence, one layer: `k`, `v` are f16 bits [cap][n_head_kv * head_dim]; `q` [n][n_head *
// head_dim] for the queries at positions pos0..pos0+n-1. Runs plan_attention, attention and
// attention_combine as the forward pass does; returns [n][n_head * head_dim].
std::vector<float> attention(const std::vector<float>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, int cap, int n,
                             int pos0, int n_head, int n_head_kv, int head_dim);
std::vector<float> swiglu(const std::vector<float>& gate, const std::vector<float>& up);
std::vector<int32_t> argmax(const std::vector<float>& logits, int rows, int n_vocab);

}  // namespace ctx::cuda::testing
