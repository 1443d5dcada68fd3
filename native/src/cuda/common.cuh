// Shared by the CUDA backend's translation units: error checking that turns a CUDA failure into a
// DeviceError with a stable code, and the numeric helpers the kernels share with the CPU engine.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels.cuh"
#include "device.h"

namespace ctx::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what) {
  const std::string msg = std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) throw DeviceError("cuda_out_of_memory", msg);
  if (e == cudaErrorInsufficientDriver) throw DeviceError("cuda_driver_too_old", msg);
  if (e == cudaErrorNoDevice || e == cudaErrorInvalidDevice) throw DeviceError("no_gpu", msg);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorUnsupportedPtxVersion) throw DeviceError("cuda_unsupported_gpu", msg);
  throw DeviceError("cuda_error", msg);
}

#define CTX_CUDA(call)                                                     \
  do {                                                                     \
    const cudaError_t ctx_err_ = (call);                                   \
    if (ctx_err_ != cudaSuccess) ::ctx::cuda::throw_cuda(ctx_err_, #call); \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once.
#define CTX_CUDA_LAUNCHED(name) CTX_CUDA(cudaGetLastError())

// One 32-element activation block quantized as the CPU engine's quantize_q8 (kernels_scalar.cc),
// by a full warp, lane i holding element i (v): its int8 quant into a.qs[quant0 + lane] and, from
// lane 0, the block's f16-rounded scale, scale x quant sum, and quant sum at index `block`. Every
// kernel that quantizes activations calls this, so they all write the same bits.
__device__ __forceinline__ void quantize_q8_block(float v, int lane, const DevActQ8& a, size_t quant0, size_t block) {
  constexpr unsigned kAllLanes = 0xffffffffu;
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kAllLanes, amax, o));
  const float scale = amax / 127.f;
  const float inv = amax != 0.f ? 127.f / amax : 0.f;
  const int q = __float2int_rn(__fmul_rn(v, inv));
  a.qs[quant0 + lane] = static_cast<int8_t>(q);
  int sum = q;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kAllLanes, sum, o);
  if (lane == 0) {
    a.d[block] = __half2float(__float2half_rn(scale));
    a.s[block] = __half2float(__float2half_rn(scale * static_cast<float>(sum)));
    a.isum[block] = sum;
  }
}

// Token tk's K row in `layer` of its sequence's cache (TokenKv's layout); its V row is
// tk.cap * kv_dim further.
__device__ __forceinline__ __half* token_k_row(const TokenKv& tk, int layer, int kv_dim) {
  return tk.base + static_cast<size_t>(layer) * 2 * tk.cap * kv_dim + static_cast<size_t>(tk.pos) * kv_dim;
}

}  // namespace ctx::cuda
