#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace ctx {

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"); }

bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

GemmQ8Fn gemm_q8_for(const KernelTable& k, GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
      return k.gemm_q4_0;
    case GgmlType::Q4_1:
      return k.gemm_q4_1;
    case GgmlType::Q5_0:
      return k.gemm_q5_0;
    case GgmlType::Q5_1:
      return k.gemm_q5_1;
    case GgmlType::Q8_0:
      return k.gemm_q8_0;
    case GgmlType::Q4_K:
      return k.gemm_q4_k;
    case GgmlType::Q5_K:
      return k.gemm_q5_k;
    case GgmlType::Q6_K:
      return k.gemm_q6_k;
    default:
      return nullptr;
  }
}

namespace {
const KernelTable& pick() {
  const char* want = std::getenv("CTXBANK_KERNELS");
  const KernelTable* a512 = cpu_has_avx512() ? avx512_kernels() : nullptr;
  const KernelTable* a2 = cpu_has_avx2() ? avx2_kernels() : nullptr;
  if (want && *want) {
    if (!std::strcmp(want, "scalar")) return scalar_kernels();
    if (!std::strcmp(want, "avx2") && a2) return *a2;
    if (!std::strcmp(want, "avx512") && a512) return *a512;
    std::fprintf(stderr, "ctxbank: CTXBANK_KERNELS=%s is not available on this CPU/build; using the best available\n", want);
  }
  if (a512) return *a512;
  if (a2) return *a2;
  return scalar_kernels();
}
}  // namespace

const KernelTable& select_kernels() {
  static const KernelTable& table = pick();
  return table;
}

}  // namespace ctx
