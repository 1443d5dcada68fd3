#include "dequant.h"

#include <array>

#include "fp16.h"

namespace ctx {

namespace {
// Q4_K and Q5_K: (d * sc) * q - dmin * m, ggml's order, each product rounded (this file is
// compiled with -ffp-contract=off: a fused multiply-add would round differently).
template <typename B>
void dequantize_k4(const uint8_t* p, int n_super, float* out, void (*quants)(const B&, int, uint8_t*)) {
  for (int b = 0; b < n_super; ++b) {
    const B& blk = reinterpret_cast<const B*>(p)[b];
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m, q[32];
      k_scale_min(blk.scales, s, &sc, &m);
      quants(blk, s, q);
      const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) out[b * kSuperBlock + 32 * s + l] = ds * static_cast<float>(q[l]) - dm;
    }
  }
}
}  // namespace

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
    case GgmlType::Q5_0:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ5_0*>(p)[b];
        const float d = fp16_to_fp32(blk.d);
        uint8_t q[32];
        quants_q5(blk.qh, blk.qs, q);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = static_cast<float>(q[j] - 16) * d;
      }
      break;
    case GgmlType::Q5_1:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ5_1*>(p)[b];
        const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
        uint8_t q[32];
        quants_q5(blk.qh, blk.qs, q);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = static_cast<float>(q[j]) * d + m;
      }
      break;
    case GgmlType::Q8_0:
      for (int b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(p)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = blk.qs[j] * d;
      }
      break;
    case GgmlType::Q4_K:
      dequantize_k4<BlockQ4_K>(p, w.cols / kSuperBlock, out, quants_q4_k);
      break;
    case GgmlType::Q5_K:
      dequantize_k4<BlockQ5_K>(p, w.cols / kSuperBlock, out, quants_q5_k);
      break;
    case GgmlType::Q6_K:
      for (int b = 0; b < w.cols / kSuperBlock; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(p)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; ++s) {
          uint8_t q[32];
          quants_q6_k(blk, s, q);
          for (int l = 0; l < 32; ++l) {
            const int e = 32 * s + l;
            out[b * kSuperBlock + e] = d * static_cast<float>(blk.scales[e / 16]) * static_cast<float>(q[l] - 32);
          }
        }
      }
      break;
    default:
      break;  // unreachable: Model::load refuses other types
  }
}

namespace {
bool nonfinite(uint16_t h) { return (h & 0x7C00) == 0x7C00; }

// Scans blocks of type B, `count` of them, for a non-finite scale among `fields`.
template <typename B, typename Fields>
int64_t scan(const uint8_t* data, int64_t count, Fields fields) {
  const auto* blocks = reinterpret_cast<const B*>(data);
  for (int64_t i = 0; i < count; ++i)
    for (uint16_t h : fields(blocks[i]))
      if (nonfinite(h)) return i;
  return -1;
}
}  // namespace

int64_t first_nonfinite_scale(const Weight& w) {
  const GgmlTypeTraits* tr = ggml_type_traits(static_cast<uint32_t>(w.type));
  if (!tr || tr->block_size == 1) return -1;
  // Rows are whole blocks laid end to end, so the matrix is one run of blocks.
  const int64_t n = static_cast<int64_t>(w.rows) * (w.cols / tr->block_size);
  using Two = std::array<uint16_t, 2>;
  using One = std::array<uint16_t, 1>;
  switch (w.type) {
    case GgmlType::Q4_0:
      return scan<BlockQ4_0>(w.data, n, [](const BlockQ4_0& b) { return One{b.d}; });
    case GgmlType::Q4_1:
      return scan<BlockQ4_1>(w.data, n, [](const BlockQ4_1& b) { return Two{b.d, b.m}; });
    case GgmlType::Q5_0:
      return scan<BlockQ5_0>(w.data, n, [](const BlockQ5_0& b) { return One{b.d}; });
    case GgmlType::Q5_1:
      return scan<BlockQ5_1>(w.data, n, [](const BlockQ5_1& b) { return Two{b.d, b.m}; });
    case GgmlType::Q8_0:
      return scan<BlockQ8_0>(w.data, n, [](const BlockQ8_0& b) { return One{b.d}; });
    case GgmlType::Q4_K:
      return scan<BlockQ4_K>(w.data, n, [](const BlockQ4_K& b) { return Two{b.d, b.dmin}; });
    case GgmlType::Q5_K:
      return scan<BlockQ5_K>(w.data, n, [](const BlockQ5_K& b) { return Two{b.d, b.dmin}; });
    case GgmlType::Q6_K:
      return scan<BlockQ6_K>(w.data, n, [](const BlockQ6_K& b) { return One{b.d}; });
    default:
      return -1;
  }
}

}  // namespace ctx
