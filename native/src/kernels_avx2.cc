// AVX2 + FMA + F16C build of kernels_x86.inc.
#define CTX_KERNEL_NS avx2
#define CTX_TABLE_NAME "avx2"
#include "kernels_x86.inc"

namespace ctx {
const KernelTable* avx2_kernels() { return &avx2::kTable; }
}  // namespace ctx
