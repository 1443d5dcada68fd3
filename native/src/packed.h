// Quantized weights repacked for the kernels, still in their quantized form (same bits, new
// order). Rows go in groups of 8; for each group and 32-column block one packed block holds the
// 8 rows' scales and quants, with the quants interleaved in 4-byte runs: run g of every row sits
// side by side, so one 32-byte load feeds eight rows at once and an integer dot product
// accumulates each row in its own lane. (The same idea as ggml's and llamafile's repacking.)
//
// Q4 quants: byte 4g+i of row r holds that row's original qs[4g+i] (low nibble = weight 4g+i,
// high nibble = weight 16+4g+i), at offset (g*8 + r)*4 + i. Q8 quants: weight 4g+i of row r at
// offset (g*8 + r)*4 + i.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml_types.h"

namespace ctx {

constexpr int kRowGroup = 8;

struct PackedQ4_0 { uint16_t d[8]; uint8_t qs[128]; };
struct PackedQ4_1 { uint16_t d[8]; uint16_t m[8]; uint8_t qs[128]; };
// wsum: sum of each row's quants in the block, so a kernel may bias activations to unsigned.
struct PackedQ8_0 { uint16_t d[8]; int16_t wsum[8]; int8_t qs[256]; };
static_assert(sizeof(PackedQ4_0) == 144 && sizeof(PackedQ4_1) == 160 && sizeof(PackedQ8_0) == 288, "packed sizes");

bool is_packable(GgmlType t);
// Bytes of one row group (all its column blocks).
size_t packed_group_bytes(GgmlType t, int cols);
// Repacks a [rows][cols] matrix in ggml layout; a last group with fewer than 8 rows is padded
// with zero rows.
void pack_matrix(GgmlType t, const uint8_t* src, int rows, int cols, uint8_t* dst);

}  // namespace ctx
