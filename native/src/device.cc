// Device selection, and the CUDA entry points of a build without the CUDA backend.
#include "device.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace ctx {

DeviceSpec parse_device(const std::string& s) {
  if (s == "cpu") return {DeviceSpec::Kind::Cpu, 0};
  if (s == "auto") return {DeviceSpec::Kind::Auto, 0};
  if (s == "cuda") return {DeviceSpec::Kind::Cuda, 0};
  if (s.size() > 5 && s.size() <= 8 && s.compare(0, 5, "cuda:") == 0) {
    int index = 0;
    for (size_t i = 5; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') index = -1;
      if (index >= 0) index = index * 10 + (s[i] - '0');
    }
    if (index >= 0 && !(s[5] == '0' && s.size() > 6)) return {DeviceSpec::Kind::Cuda, index};
  }
  throw DeviceError("invalid_device", "device must be cpu, cuda, cuda:N or auto (got \"" + s.substr(0, 32) + "\")");
}

namespace {
struct Variant {
  const char* name;
  bool CudaKernelSet::*flag;
  bool in_fast;  // passed every CUDA test on a GPU, so "fast" turns it on
};
constexpr Variant kVariants[] = {
    {"fused", &CudaKernelSet::fused, true},
    {"matvec", &CudaKernelSet::matvec, true},
    {"attention", &CudaKernelSet::attention, true},
    {"prefill-attention", &CudaKernelSet::prefill_attention, true},
    {"gemm", &CudaKernelSet::gemm, true},
    {"fused-decode", &CudaKernelSet::fused_decode, false},
    {"pdl", &CudaKernelSet::pdl, false},
};
}  // namespace

CudaKernelSet parse_cuda_kernels(const std::string& s) {
  CudaKernelSet k;
  if (s == "simple") return k;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string name = s.substr(start, end - start);
    bool known = false;
    for (const Variant& v : kVariants)
      if (name == v.name || (name == "fast" && v.in_fast)) k.*v.flag = known = true;
    if (!known)
      throw DeviceError("invalid_cuda_kernels",
                        "cuda kernels must be simple or a comma list of fast, fused, matvec, attention, prefill-attention, gemm, "
                        "fused-decode, pdl (got \"" +
                            s.substr(0, 64) + "\")");
    start = end + 1;
  }
  if (k.pdl) k.fused_decode = true;     // it launches fused-decode's kernels
  if (k.fused_decode) k.matvec = true;  // its kernels are matvec's, with the steps around them inside
  return k;
}

std::string cuda_kernels_name(const CudaKernelSet& k) {
  bool all_fast = true;
  for (const Variant& v : kVariants) all_fast &= !v.in_fast || k.*v.flag;
  std::string list;
  for (const Variant& v : kVariants)
    if (k.*v.flag && !(all_fast && v.in_fast)) list += (list.empty() ? "" : ",") + std::string(v.name);
  if (all_fast) return list.empty() ? "fast" : "fast," + list;
  return list.empty() ? "simple" : list;
}

#ifndef CTXBANK_WITH_CUDA
bool cuda_compiled() { return false; }

std::unique_ptr<DeviceError> cuda_unusable(int) {
  return std::make_unique<DeviceError>(
      "cuda_unavailable_in_build",
      "this build of the native engine has no CUDA backend (rebuild with a CUDA compiler: native/cuda/install-nvcc.sh, then "
      "CTXBANK_CUDA=ON npm run build:native)");
}

std::unique_ptr<DeviceBackend> make_cuda_backend(std::shared_ptr<const Model>, const EngineOptions&, int index) {
  throw *cuda_unusable(index);
}
#endif

}  // namespace ctx
