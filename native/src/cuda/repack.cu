// The repacked weight layout (repack.h): host code only.
#include "cuda/repack.h"

#include <cstring>
#include <stdexcept>

namespace ctx::cuda {

bool repackable(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0; }

size_t repacked_qs_bytes(GgmlType t, int rows, int cols) {
  const size_t per_block = t == GgmlType::Q8_0 ? 32 : 16;
  return repacked_blocks(rows, cols) * per_block;
}

size_t repacked_blocks(int rows, int cols) { return static_cast<size_t>(rows) * (cols / kQuantBlock); }

void repack_weight(const Weight& w, uint8_t* qs, uint16_t* dm) {
  if (!repackable(w.type) || w.cols % kQuantBlock != 0) throw std::invalid_argument("repack_weight: not a Q4_0/Q4_1/Q8_0 weight");
  const int nb = w.cols / kQuantBlock;
  for (int r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
    for (int b = 0; b < nb; ++b) {
      const size_t i = static_cast<size_t>(r) * nb + b;
      if (w.type == GgmlType::Q8_0) {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
        std::memcpy(qs + i * 32, blk->qs, 32);
        dm[2 * i] = blk->d, dm[2 * i + 1] = 0;
      } else if (w.type == GgmlType::Q4_1) {
        const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
        std::memcpy(qs + i * 16, blk->qs, 16);
        dm[2 * i] = blk->d, dm[2 * i + 1] = blk->m;
      } else {
        const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
        std::memcpy(qs + i * 16, blk->qs, 16);
        dm[2 * i] = blk->d, dm[2 * i + 1] = 0;
      }
    }
  }
}

}  // namespace ctx::cuda
