#include "packed.h"

#include <cstring>

namespace ctx {

bool is_packable(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0; }

size_t packed_group_bytes(GgmlType t, int cols) {
  const size_t nb = static_cast<size_t>(cols) / kQuantBlock;
  switch (t) {
    case GgmlType::Q4_0: return nb * sizeof(PackedQ4_0);
    case GgmlType::Q4_1: return nb * sizeof(PackedQ4_1);
    case GgmlType::Q8_0: return nb * sizeof(PackedQ8_0);
    default: return 0;
  }
}

namespace {

template <typename Src, typename Dst, typename Fill>
void pack(const uint8_t* src, int rows, int cols, uint8_t* dst, Fill fill) {
  const int nb = cols / kQuantBlock;
  const size_t row_bytes = static_cast<size_t>(nb) * sizeof(Src);
  auto* out = reinterpret_cast<Dst*>(dst);
  for (int g0 = 0; g0 < rows; g0 += kRowGroup)
    for (int b = 0; b < nb; ++b) {
      Dst& p = *out++;
      std::memset(&p, 0, sizeof(Dst));
      for (int r = 0; r < kRowGroup && g0 + r < rows; ++r)
        fill(p, r, reinterpret_cast<const Src*>(src + (g0 + r) * row_bytes)[b]);
    }
}

}  // namespace

void pack_matrix(GgmlType t, const uint8_t* src, int rows, int cols, uint8_t* dst) {
  switch (t) {
    case GgmlType::Q4_0:
      pack<BlockQ4_0, PackedQ4_0>(src, rows, cols, dst, [](PackedQ4_0& p, int r, const BlockQ4_0& s) {
        p.d[r] = s.d;
        for (int g = 0; g < 4; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    case GgmlType::Q4_1:
      pack<BlockQ4_1, PackedQ4_1>(src, rows, cols, dst, [](PackedQ4_1& p, int r, const BlockQ4_1& s) {
        p.d[r] = s.d;
        p.m[r] = s.m;
        for (int g = 0; g < 4; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    case GgmlType::Q8_0:
      pack<BlockQ8_0, PackedQ8_0>(src, rows, cols, dst, [](PackedQ8_0& p, int r, const BlockQ8_0& s) {
        p.d[r] = s.d;
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += s.qs[j];
        p.wsum[r] = static_cast<int16_t>(sum);
        for (int g = 0; g < 8; ++g) std::memcpy(&p.qs[(g * 8 + r) * 4], &s.qs[g * 4], 4);
      });
      break;
    default:
      break;
  }
}

}  // namespace ctx
