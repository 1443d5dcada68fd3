#include "packed.h"

#include <cstring>
#include <type_traits>

namespace ctx {

bool is_packable(GgmlType t) { return packed_block_cols(t) != 0; }

int packed_block_cols(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
      return kQuantBlock;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return kSuperBlock;
    default:
      return 0;
  }
}

size_t packed_group_bytes(GgmlType t, int cols) {
  const int bc = packed_block_cols(t);
  if (bc == 0) return 0;
  const size_t nb = static_cast<size_t>(cols) / bc;
  switch (t) {
    case GgmlType::Q4_0:
      return nb * sizeof(PackedQ4_0);
    case GgmlType::Q4_1:
      return nb * sizeof(PackedQ4_1);
    case GgmlType::Q5_0:
      return nb * sizeof(PackedQ5_0);
    case GgmlType::Q5_1:
      return nb * sizeof(PackedQ5_1);
    case GgmlType::Q8_0:
      return nb * sizeof(PackedQ8_0);
    case GgmlType::Q4_K:
      return nb * sizeof(PackedQ4_K);
    case GgmlType::Q5_K:
      return nb * sizeof(PackedQ5_K);
    case GgmlType::Q6_K:
      return nb * sizeof(PackedQ6_K);
    default:
      return 0;
  }
}

namespace {

template <typename Src, typename Dst, typename Fill>
void pack(const uint8_t* src, int rows, int nb, uint8_t* dst, Fill fill) {
  const size_t row_bytes = static_cast<size_t>(nb) * sizeof(Src);
  auto* out = reinterpret_cast<Dst*>(dst);
  for (int g0 = 0; g0 < rows; g0 += kRowGroup)
    for (int b = 0; b < nb; ++b) {
      Dst& p = *out++;
      std::memset(&p, 0, sizeof(Dst));
      for (int r = 0; r < kRowGroup && g0 + r < rows; ++r) fill(p, r, reinterpret_cast<const Src*>(src + (g0 + r) * row_bytes)[b]);
    }
}

// Row r's 32 quants (the low 4 bits of each) into a Q4 run (packed.h).
void put_q4(uint8_t* run, int r, const uint8_t q[32]) {
  for (int j = 0; j < 16; ++j) run[(j / 4 * 8 + r) * 4 + j % 4] = static_cast<uint8_t>((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
}
// Bit 4 of row r's 32 quants into a 32-byte high-bit vector (zeroed before).
void put_bit4(uint8_t* h, int r, const uint8_t q[32]) {
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < 4; ++i)
      h[r * 4 + i] |= static_cast<uint8_t>(((q[4 * g + i] >> 4) & 1) << g | ((q[16 + 4 * g + i] >> 4) & 1) << (4 + g));
}
// Bits 4-5 of row r's 32 quants into two 32-byte vectors (zeroed before).
void put_bits45(uint8_t* h, int r, const uint8_t q[32]) {
  for (int g = 0; g < 4; ++g)
    for (int i = 0; i < 4; ++i)
      h[32 * (g / 2) + r * 4 + i] |=
          static_cast<uint8_t>(((q[4 * g + i] >> 4) & 3) << (2 * (g % 2)) | ((q[16 + 4 * g + i] >> 4) & 3) << (4 + 2 * (g % 2)));
}

template <typename Src, typename Dst>
void fill_k4(Dst& p, int r, const Src& s, void (*quants)(const Src&, int, uint8_t*)) {
  p.d[r] = s.d;
  p.dmin[r] = s.dmin;
  for (int sb = 0; sb < 8; ++sb) {
    k_scale_min(s.scales, sb, &p.sc[sb][r], &p.m[sb][r]);
    uint8_t q[32];
    quants(s, sb, q);
    put_q4(p.qs[sb], r, q);
    if constexpr (std::is_same_v<Dst, PackedQ5_K>) put_bit4(p.qh[sb], r, q);
  }
}

}  // namespace

void pack_matrix(GgmlType t, const uint8_t* src, int rows, int cols, uint8_t* dst) {
  const int nb = cols / packed_block_cols(t);
  switch (t) {
    case GgmlType::Q4_0:
      pack<BlockQ4_0, PackedQ4_0>(src, rows, nb, dst, [](PackedQ4_0& p, int r, const BlockQ4_0& s) {
        p.d[r] = s.d;
        for (int g = 0; g < 4; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    case GgmlType::Q4_1:
      pack<BlockQ4_1, PackedQ4_1>(src, rows, nb, dst, [](PackedQ4_1& p, int r, const BlockQ4_1& s) {
        p.d[r] = s.d;
        p.m[r] = s.m;
        for (int g = 0; g < 4; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    case GgmlType::Q5_0:
      pack<BlockQ5_0, PackedQ5_0>(src, rows, nb, dst, [](PackedQ5_0& p, int r, const BlockQ5_0& s) {
        p.d[r] = s.d;
        uint8_t q[32];
        quants_q5(s.qh, s.qs, q);
        put_q4(p.qs, r, q);
        put_bit4(p.qh, r, q);
      });
      break;
    case GgmlType::Q5_1:
      pack<BlockQ5_1, PackedQ5_1>(src, rows, nb, dst, [](PackedQ5_1& p, int r, const BlockQ5_1& s) {
        p.d[r] = s.d;
        p.m[r] = s.m;
        uint8_t q[32];
        quants_q5(s.qh, s.qs, q);
        put_q4(p.qs, r, q);
        put_bit4(p.qh, r, q);
      });
      break;
    case GgmlType::Q8_0:
      pack<BlockQ8_0, PackedQ8_0>(src, rows, nb, dst, [](PackedQ8_0& p, int r, const BlockQ8_0& s) {
        p.d[r] = s.d;
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += s.qs[j];
        p.wsum[r] = static_cast<int16_t>(sum);
        for (int g = 0; g < 8; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    case GgmlType::Q4_K:
      pack<BlockQ4_K, PackedQ4_K>(src, rows, nb, dst, [](PackedQ4_K& p, int r, const BlockQ4_K& s) { fill_k4(p, r, s, quants_q4_k); });
      break;
    case GgmlType::Q5_K:
      pack<BlockQ5_K, PackedQ5_K>(src, rows, nb, dst, [](PackedQ5_K& p, int r, const BlockQ5_K& s) { fill_k4(p, r, s, quants_q5_k); });
      break;
    case GgmlType::Q6_K:
      pack<BlockQ6_K, PackedQ6_K>(src, rows, nb, dst, [](PackedQ6_K& p, int r, const BlockQ6_K& s) {
        p.d[r] = s.d;
        for (int g = 0; g < 16; ++g) p.sc[g][r] = s.scales[g];
        for (int sb = 0; sb < 8; ++sb) {
          uint8_t q[32];
          quants_q6_k(s, sb, q);
          put_q4(p.qs[sb], r, q);
          put_bits45(p.qh[sb], r, q);
        }
      });
      break;
    default:
      break;
  }
}

}  // namespace ctx
