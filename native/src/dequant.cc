#include "dequant.h"

#include "fp16.h"

namespace ctx {

void dequantize_row(const Weight& w, int row, float* out) {
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  const int nb = w.cols / kQuantBlock;
  switch (w.type) {
    case GgmlType::F32:
      for (int j = 0; j < w.cols; ++j) out[j] = reinterpret_cast<const float*>(p)[j];
      break;
    case GgmlType::F16:
      for (int j = 0; j < w.cols; ++j) out[j] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(p)[j]);
      break;
    case GgmlType::BF16:
      for (int j = 0; j < w.cols; ++j) out[j] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(p)[j]);
      break;
    case GgmlType::Q4_0:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(p)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = ((blk.qs[j] & 0xF) - 8) * d;
          out[b * 32 + j + 16] = ((blk.qs[j] >> 4) - 8) * d;
        }
      }
      break;
    case GgmlType::Q4_1:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_1*>(p)[b];
        const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = (blk.qs[j] & 0xF) * d + m;
          out[b * 32 + j + 16] = (blk.qs[j] >> 4) * d + m;
        }
      }
      break;
    case GgmlType::Q8_0:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(p)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = blk.qs[j] * d;
      }
      break;
    default:
      break;  // unreachable: Model::load refuses other types
  }
}

}  // namespace ctx
