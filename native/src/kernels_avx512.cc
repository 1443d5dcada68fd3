// AVX-512 (F, BW, VL, VNNI) build of kernels_x86.inc: the integer dot products use VPDPBUSD.
#define CTX_KERNEL_NS avx512
#define CTX_TABLE_NAME "avx512"
#include "kernels_x86.inc"

namespace ctx {
const KernelTable* avx512_kernels() { return &avx512::kTable; }
}  // namespace ctx
