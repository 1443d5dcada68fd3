// Device selection, and the CUDA entry points of a build without the CUDA backend.
#include "device.h"

#include <cstdlib>

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
