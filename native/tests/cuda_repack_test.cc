// The repacked weight layout the fast CUDA kernels read (cuda/repack.h): host code, so it runs in
// every CUDA build, GPU or not. Each element rebuilt from the repacked quants and (d, m) must equal
// the file layout's dequantized value, for every type the layout takes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/repack.h"
#include "dequant.h"
#include "fp16.h"
#include "gguf_writer.h"

namespace {

using namespace ctx;

float element(GgmlType t, const std::vector<uint8_t>& qs, const std::vector<uint16_t>& dm, int nb, int row, int col) {
  const size_t block = static_cast<size_t>(row) * nb + col / 32;
  const int j = col % 32;
  const float d = fp16_to_fp32(dm[2 * block]), m = fp16_to_fp32(dm[2 * block + 1]);
  if (t == GgmlType::Q8_0) return static_cast<float>(static_cast<int8_t>(qs[block * 32 + j])) * d;
  const uint8_t byte = qs[block * 16 + j % 16];
  const int q = j < 16 ? (byte & 0xF) : (byte >> 4);
  return t == GgmlType::Q4_1 ? static_cast<float>(q) * d + m : static_cast<float>(q - 8) * d;
}

TEST(CudaRepack, EveryElementDequantizesAsInTheFileLayout) {
  std::mt19937 rng(7);
  const int rows = 13, cols = 96, nb = cols / 32;
  for (uint32_t type : {ctxtest::kTQ4_0, ctxtest::kTQ4_1, ctxtest::kTQ8_0}) {
    const std::vector<float> f = ctxtest::random_floats(static_cast<size_t>(rows) * cols, rng, -1.f, 1.f);
    std::string bytes;
    for (int r = 0; r < rows; ++r) bytes += ctxtest::quantize_row(type, f.data() + static_cast<size_t>(r) * cols, cols);
    Weight w;
    w.type = static_cast<GgmlType>(type);
    w.data = reinterpret_cast<const uint8_t*>(bytes.data());
    w.rows = rows, w.cols = cols, w.row_bytes = bytes.size() / rows;
    ASSERT_TRUE(cuda::repackable(w.type));
    std::vector<uint8_t> qs(cuda::repacked_qs_bytes(w.type, rows, cols));
    std::vector<uint16_t> dm(2 * cuda::repacked_blocks(rows, cols));
    EXPECT_EQ(qs.size(), static_cast<size_t>(rows) * nb * (w.type == GgmlType::Q8_0 ? 32 : 16));
    cuda::repack_weight(w, qs.data(), dm.data());
    std::vector<float> want(cols);
    for (int r = 0; r < rows; ++r) {
      dequantize_row(w, r, want.data());
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(element(w.type, qs, dm, nb, r, c), want[c]) << "type " << type << " row " << r << " col " << c;
    }
  }
}

TEST(CudaRepack, RefusesOtherTypes) {
  Weight w;
  w.type = GgmlType::F16;
  w.rows = 1, w.cols = 32;
  EXPECT_FALSE(cuda::repackable(w.type));
  EXPECT_THROW(cuda::repack_weight(w, nullptr, nullptr), std::invalid_argument);
}

}  // namespace
