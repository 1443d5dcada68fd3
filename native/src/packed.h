// Quantized weights repacked for the kernels, still in their quantized form (same bits, new
// order). Rows go in groups of 8; for each group and block (32 columns; 256 for the K-quants) one
// packed block holds the 8 rows' scales and quants, with the quants interleaved in 4-byte runs:
// run g of every row sits side by side, so one 32-byte load feeds eight rows at once and an
// integer dot product accumulates each row in its own lane. (The same idea as ggml's and
// llamafile's repacking.)
//
// A Q4 run (128 bytes: 8 rows x 32 weights): byte (g*8 + r)*4 + i holds row r's weight 4g+i in its
// low nibble and weight 16+4g+i in its high nibble (g = 0..3). Q8 quants: weight 4g+i of row r at
// offset (g*8 + r)*4 + i (g = 0..7).
// Bit 4 of 5-bit quants (Q5_0, Q5_1, Q5_K; 32 bytes per 32 weights): byte r*4 + i holds, in bit g,
// that of weight 4g+i and, in bit 4+g, that of weight 16+4g+i: the weights whose low nibbles
// share that byte position in the Q4 run, so a shift and a mask put it in place.
// Bits 4-5 of 6-bit quants (Q6_K; 64 bytes per 32 weights): two such 32-byte vectors; vector g/2,
// byte r*4 + i holds those of weight 4g+i in bits 2(g%2)..2(g%2)+1 and of weight 16+4g+i in bits
// 4+2(g%2)..5+2(g%2).
// K-quants keep one Q4 run (and high bits) per 32-weight sub-block; their 6-bit scales and mins
// are unpacked to a byte each, sub-block major: sc[s][r].
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml_types.h"

namespace ctx {

constexpr int kRowGroup = 8;

struct PackedQ4_0 {
  uint16_t d[8];
  uint8_t qs[128];
};
struct PackedQ4_1 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qs[128];
};
struct PackedQ5_0 {
  uint16_t d[8];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct PackedQ5_1 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qh[32];
  uint8_t qs[128];
};
// wsum: sum of each row's quants in the block, so a kernel may bias activations to unsigned.
struct PackedQ8_0 {
  uint16_t d[8];
  int16_t wsum[8];
  int8_t qs[256];
};
struct PackedQ4_K {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t sc[8][8];
  uint8_t m[8][8];
  uint8_t qs[8][128];
};
struct PackedQ5_K {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t sc[8][8];
  uint8_t m[8][8];
  uint8_t qh[8][32];
  uint8_t qs[8][128];
};
// sc[g][r]: row r's scale of 16-weight group g (two per sub-block).
struct PackedQ6_K {
  uint16_t d[8];
  int8_t sc[16][8];
  uint8_t qh[8][64];
  uint8_t qs[8][128];
};
static_assert(sizeof(PackedQ4_0) == 144 && sizeof(PackedQ4_1) == 160 && sizeof(PackedQ8_0) == 288, "packed sizes");
// Q5_0, Q5_1 and Q6_K take exactly the bytes of their 8 source blocks; Q4_K and Q5_K 32 more
// (their unpacked scales and mins: +2.8% and +2.3%).
static_assert(sizeof(PackedQ5_0) == 8 * sizeof(BlockQ5_0) && sizeof(PackedQ5_1) == 8 * sizeof(BlockQ5_1) &&
                  sizeof(PackedQ6_K) == 8 * sizeof(BlockQ6_K),
              "packed sizes");
static_assert(sizeof(PackedQ4_K) == 8 * sizeof(BlockQ4_K) + 32 && sizeof(PackedQ5_K) == 8 * sizeof(BlockQ5_K) + 32, "packed sizes");

bool is_packable(GgmlType t);
// Columns one packed block covers: 32, or 256 for the K-quants.
int packed_block_cols(GgmlType t);
// Bytes of one row group (all its column blocks).
size_t packed_group_bytes(GgmlType t, int cols);
// Repacks a [rows][cols] matrix in ggml layout; a last group with fewer than 8 rows is padded
// with zero rows.
void pack_matrix(GgmlType t, const uint8_t* src, int rows, int cols, uint8_t* dst);

}  // namespace ctx
