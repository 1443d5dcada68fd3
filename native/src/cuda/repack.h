// Quantized weights in the layout the fast CUDA kernels read (DevQWeight in kernels.cuh). The file
// layout interleaves 2-byte scales with the quants (blocks of 18, 20 or 34 bytes), so a block's
// quants are only 2-byte aligned and cannot be read with 16-byte loads. Repacked, per row:
//   qs  every 32-element block's quants, contiguous: Q4_0/Q4_1 16 bytes per block (byte j holds
//       element j in its low nibble and element j + 16 in its high nibble, as in the file), Q8_0
//       32 bytes per block (int8). A row is cols/32 blocks; rows follow each other, so with cols a
//       multiple of 32 every block starts on a 16-byte boundary.
//   dm  one (d, m) pair of f16 bits per block: the block's scale and, for Q4_1, its minimum
//       (0 for Q4_0 and Q8_0). Element = q * d + m (Q4_1), (q - 8) * d (Q4_0), q * d (Q8_0).
// Plain host code (no CUDA types), so the CPU-side tests can build and check it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model.h"

namespace ctx::cuda {

// Whether the fast kernels take this type (Q4_0, Q4_1, Q8_0).
bool repackable(GgmlType t);
// Bytes of qs for a [rows][cols] weight of type t (cols a multiple of 32).
size_t repacked_qs_bytes(GgmlType t, int rows, int cols);
// Number of (d, m) pairs: rows * cols / 32 (each pair is two uint16_t).
size_t repacked_blocks(int rows, int cols);
// Writes w's quants into qs (repacked_qs_bytes) and its scales into dm (2 * repacked_blocks uint16_t).
void repack_weight(const Weight& w, uint8_t* qs, uint16_t* dm);

}  // namespace ctx::cuda
