// Where an Engine computes: the CPU (the reference engine in engine.cc) or a CUDA GPU (the backend
// in src/cuda/, compiled only when CMake's CTXBANK_CUDA finds a CUDA compiler). The core sees the
// GPU only through the interfaces below, so a CPU-only build has no CUDA symbol in it.
#pragma once
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx {

struct BatchItem;
struct EngineOptions;
class KvCache;
class Model;
class Sequence;

// A device that cannot be used. `code` is stable (snake_case) for the services' error shape:
//   invalid_device             the device string is not cpu | cuda | cuda:N | auto
//   invalid_cuda_kernels       the kernel set is not simple | fast | a list of known variants
//   cuda_unavailable_in_build  this addon was built without the CUDA backend
//   no_gpu                     no CUDA driver, no GPU, or no GPU with that index
//   cuda_driver_too_old        the driver is older than the runtime the addon was built with
//   cuda_unsupported_gpu       the GPU's architecture has no code in this build
//   cuda_unsupported_model     the model needs what the GPU backend does not compute (another
//                              architecture than Llama's forward pass, a weight type it lacks)
//   cuda_out_of_memory         a GPU allocation failed
//   cuda_error                 any other CUDA failure (the message names it)
class DeviceError : public std::runtime_error {
 public:
  DeviceError(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

struct DeviceSpec {
  enum class Kind { Cpu, Cuda, Auto } kind = Kind::Cpu;
  int index = 0;  // cuda:N
};
// Parses "cpu" | "cuda" | "cuda:N" | "auto"; throws DeviceError(invalid_device).
DeviceSpec parse_device(const std::string& s);

// Which kernels a CUDA engine runs. The simple kernels (cuda/kernels.cu) are the reference: each
// faster variant is tested against them (or against the CPU) and can be switched on alone, so a
// benchmark can tell what each one gives.
struct CudaKernelSet {
  bool fused = false;              // RMSNorm + activation quantization, RoPE + KV store: one launch each (cuda/fused.cu)
  bool matvec = false;             // dp4a matvecs on repacked weights; Q/K/V and gate/up + SwiGLU in one launch
                                   // each, residual adds in the output projections (cuda/matvec_fast.cu)
  bool attention = false;          // decode attention reading each K/V tile once per GQA group (cuda/attention_fast.cu)
  bool prefill_attention = false;  // prefill attention on tensor cores (cuda/attention_fast.cu)
  bool gemm = false;               // GEMM on repacked weights with tiles that fill the GPU (cuda/gemm_fast.cu)
  bool fused_decode = false;       // fewer launches per decode step: matvecs that RMS-normalise and quantize their own
                                   // activations, the Q/K/V one applying RoPE and storing K/V (cuda/matvec_fast.cu),
                                   // attention writing its output when a step has one split (with `attention`); implies matvec
  bool pdl = false;                // fused-decode's matvecs launched with programmatic dependent launch: each starts while
                                   // the kernel before it ends, fetching its weights; implies fused-decode
  bool operator==(const CudaKernelSet& o) const {
    return fused == o.fused && matvec == o.matvec && attention == o.attention && prefill_attention == o.prefill_attention &&
           gemm == o.gemm && fused_decode == o.fused_decode && pdl == o.pdl;
  }
};
// Parses "simple" (none) or a comma list of fused, matvec, attention, prefill-attention, gemm,
// fused-decode, pdl and "fast": the variants that have passed every test on a GPU (all but
// fused-decode and pdl, which have not run on one yet). pdl brings fused-decode with it, and
// fused-decode matvec. Throws DeviceError(invalid_cuda_kernels).
CudaKernelSet parse_cuda_kernels(const std::string& s);
// The canonical spelling of a set: "simple", "fast", "fast," followed by what it adds, or the comma list.
std::string cuda_kernels_name(const CudaKernelSet& k);

// One sequence's KV cache in GPU memory: f16, per layer K then V, rows [token][kv_dim] (the CPU
// cache's logical addressing, kv_cache.h), `capacity` tokens reserved at creation.
class DeviceKv {
 public:
  virtual ~DeviceKv() = default;
  virtual size_t bytes_reserved() const = 0;
  // Frees the GPU memory now (Sequence release()); the next use allocates it again.
  virtual void release() = 0;
  // Copies rows [t0, t0 + n) of `layer` (K and V) between the GPU cache and the same rows of a
  // host KvCache (which then stages exportRows/importRows through the existing chunk code).
  virtual void download(KvCache& host, int layer, int t0, int n) const = 0;
  virtual void upload(const KvCache& host, int layer, int t0, int n) = 0;
};

// A GPU backend for one Engine: the weights uploaded once at creation, scratch for one micro-batch.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::string name() const = 0;         // "cuda:0"
  virtual std::string description() const = 0;  // "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90"
  virtual size_t weight_bytes() const = 0;      // device memory the weights take
  virtual std::unique_ptr<DeviceKv> create_kv(int capacity) = 0;
  // The CPU engine's forward() contract (engine.h): the batch is already validated.
  virtual void forward(const std::vector<BatchItem>& items) = 0;
};

// Whether this build has the CUDA backend.
bool cuda_compiled();
// Why CUDA device `index` cannot be used, as a DeviceError, or nothing when it can.
std::unique_ptr<DeviceError> cuda_unusable(int index);
// The backend on CUDA device `index`; throws DeviceError.
std::unique_ptr<DeviceBackend> make_cuda_backend(std::shared_ptr<const Model> model, const EngineOptions& opts, int index);

}  // namespace ctx
