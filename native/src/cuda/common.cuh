// Shared by the CUDA backend's translation units: error checking that turns a CUDA failure into a
// DeviceError with a stable code, and the numeric helpers the kernels share with the CPU engine.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

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

}  // namespace ctx::cuda
