// The quant types Q5_0, Q5_1, Q4_K, Q5_K and Q6_K against llama.cpp's own reference, gguf-py:
// tools/quant-reference.py wrote random blocks of each type and gguf-py's dequantization of them
// into tests/fixtures/quant-reference.bin (read here; no Python at test time). Our dequantization
// must match it bit for bit, and every kernel table's dot products must match a double-precision
// product of gguf-py's values with the 8-bit activations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dequant.h"
#include "ggml_types.h"
#include "kernels.h"
#include "model.h"
#include "packed.h"
#include "quant_test_util.h"

namespace {

using namespace ctx;

struct Entry {
  GgmlType type;
  int rows = 0, cols = 0;
  std::vector<uint8_t> blocks;  // rows x cols in ggml's layout
  std::vector<float> values;    // gguf-py's dequantization, rows x cols
  Weight weight() const {
    const GgmlTypeTraits& tr = *ggml_type_traits(static_cast<uint32_t>(type));
    return {type, blocks.data(), cols, rows, static_cast<size_t>(cols) / tr.block_size * tr.type_size};
  }
};

struct Fixture {
  std::string note;
  std::map<GgmlType, Entry> entries;
};

// Reads the file tools/quant-reference.py writes (its docstring has the format).
Fixture read_fixture() {
  const std::string path = std::string(CTXBANK_TEST_FIXTURES) + "/quant-reference.bin";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path + " (written by tools/quant-reference.py)");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](size_t n) {
    if (pos + n > bytes.size()) throw std::runtime_error(path + " is truncated");
    const char* p = bytes.data() + pos;
    pos += n;
    return p;
  };
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, take(4), 4);
    return v;
  };
  if (std::string(take(8), 8) != "CTXQREF1") throw std::runtime_error(path + ": bad magic");
  Fixture fx;
  const uint32_t note_len = u32();
  fx.note.assign(take(note_len), note_len);
  for (uint32_t n = u32(); n > 0; --n) {
    Entry e;
    e.type = static_cast<GgmlType>(u32());
    e.rows = static_cast<int>(u32());
    e.cols = static_cast<int>(u32());
    const uint32_t nbytes = u32();
    const char* blocks = take(nbytes);
    e.blocks.assign(blocks, blocks + nbytes);
    e.values.resize(static_cast<size_t>(e.rows) * e.cols);
    std::memcpy(e.values.data(), take(e.values.size() * sizeof(float)), e.values.size() * sizeof(float));
    fx.entries[e.type] = std::move(e);
  }
  if (pos != bytes.size()) throw std::runtime_error(path + " has trailing bytes");
  return fx;
}

const Fixture& fixture() {
  static const Fixture fx = read_fixture();
  return fx;
}

const GgmlType kNewTypes[] = {GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

const Entry& entry(GgmlType t) {
  const auto it = fixture().entries.find(t);
  if (it == fixture().entries.end()) throw std::runtime_error("the fixture has no " + ggml_type_name(static_cast<uint32_t>(t)));
  return it->second;
}

// Every new type is in the fixture, with gguf-py's block size equal to our traits' (the byte
// count of rows x cols follows from them), and with full and partial row groups.
TEST(QuantOracle, FixtureHasEveryNewType) {
  RecordProperty("fixture", fixture().note);
  for (GgmlType t : kNewTypes) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(t)));
    const Entry& e = entry(t);
    const GgmlTypeTraits& tr = *ggml_type_traits(static_cast<uint32_t>(t));
    EXPECT_EQ(e.blocks.size(), static_cast<size_t>(e.rows) * (e.cols / tr.block_size) * tr.type_size);
    EXPECT_EQ(e.cols % tr.block_size, 0);
    EXPECT_GT(e.rows, kRowGroup);
    EXPECT_NE(e.rows % kRowGroup, 0);
  }
}

TEST(QuantOracle, DequantizationIsBitExact) {
  for (GgmlType t : kNewTypes) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(t)));
    const Entry& e = entry(t);
    const Weight w = e.weight();
    std::vector<float> row(e.cols);
    int mismatches = 0;
    for (int r = 0; r < e.rows; ++r) {
      dequantize_row(w, r, row.data());
      for (int j = 0; j < e.cols && mismatches < 10; ++j) {
        const float want = e.values[static_cast<size_t>(r) * e.cols + j];
        if (fp32_to_bits(row[j]) != fp32_to_bits(want)) {
          ++mismatches;
          ADD_FAILURE() << "row " << r << " element " << j << ": ours " << row[j] << ", gguf-py " << want;
        }
      }
    }
  }
}

// The fixture's blocks hold finite scales only (non-finite ones are refused at load).
TEST(QuantOracle, FixtureScalesAreFinite) {
  for (GgmlType t : kNewTypes) EXPECT_EQ(first_nonfinite_scale(entry(t).weight()), -1) << ggml_type_name(static_cast<uint32_t>(t));
}

class QuantOracleKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string t = GetParam();
    if (t == "scalar") kt_ = &scalar_kernels();
    if (t == "avx2" && cpu_has_avx2()) kt_ = avx2_kernels();
    if (t == "avx512" && cpu_has_avx512()) kt_ = avx512_kernels();
    if (!kt_) GTEST_SKIP() << t << " is not available on this CPU/build";
  }
  const KernelTable* kt_ = nullptr;
};

// Activations exactly representable in 8 bits (so quantizing loses nothing), then y = W x by the
// table's GEMM against sum_j gguf_py(w_j) * x_j in double.
//
// Tolerance, derived: every kernel computes each output as a sum of float terms, products of
// exact integers (|sc * dot| < 2^24) and f16 scales, with at most 2 * (k / 32) + 4 roundings on
// any term's way into the result (per 32-block a product and an accumulation, then a super-block's
// scale and sum; the SIMD tables fuse them). The sum of the terms' absolute values is at most
// sum_j (|w_j| + |offset_j|) |x_j| (the offsets the kernels fold in apart: quant_test_util.h).
// gguf-py's w_j is itself rounded (two or three roundings of terms up to |w_j| + 2|offset_j|).
// So |y - want| <= (2 k / 32 + 8) * 2^-24 * sum_j (|w_j| + 2 |offset_j|) |x_j|, plus for Q5_1
// the f16 rounding of ggml's Q8_1 sum s that its m term reads. A wrong quant, scale or offset is
// off by a whole weight times an activation: far more.
TEST_P(QuantOracleKernels, DotProductsMatchDoublePrecision) {
  std::mt19937 rng(41);
  for (GgmlType t : kNewTypes)
    for (int n_tok : {1, 3, 4, 5}) {  // the SIMD tables take tokens 4 at a time, then one by one
      SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(t)) + " tokens " + std::to_string(n_tok));
      const Entry& e = entry(t);
      const Weight w = e.weight();
      const int k = e.cols, rows = e.rows;
      std::vector<uint8_t> packed(packed_group_bytes(t, k) * ((rows + kRowGroup - 1) / kRowGroup));
      pack_matrix(t, e.blocks.data(), rows, k, packed.data());

      const quanttest::ExactAct ex = quanttest::exact_activations(rng, n_tok, k);
      const quanttest::Act act = quanttest::quantize_all(*kt_, ex.x, n_tok, k);
      for (size_t i = 0; i < ex.q.size(); ++i) ASSERT_EQ(act.qs[i], ex.q[i]) << "activation " << i;
      for (size_t b = 0; b < ex.d.size(); ++b) ASSERT_EQ(act.d[b], ex.d[b]) << "activation block " << b;

      std::vector<float> y(static_cast<size_t>(n_tok) * rows);
      gemm_q8_for(*kt_, t)({packed.data(), packed_group_bytes(t, k), rows, &act.a, 0, n_tok, y.data(), rows});
      const double kRounding = (2.0 * k / 32 + 8) * std::ldexp(1.0, -24);
      for (int r = 0; r < rows; ++r) {
        const std::vector<float> wr(e.values.begin() + static_cast<size_t>(r) * k, e.values.begin() + static_cast<size_t>(r + 1) * k);
        for (int tok = 0; tok < n_tok; ++tok) {
          double want = 0;
          for (int j = 0; j < k; ++j) want += static_cast<double>(wr[j]) * ex.x[static_cast<size_t>(tok) * k + j];
          const double tol = kRounding * quanttest::gemm_magnitude(w, r, wr, act.a, tok) + quanttest::s_rounding_error(w, r, act.a, tok);
          const double got = y[static_cast<size_t>(tok) * rows + r];
          EXPECT_LE(std::fabs(got - want), tol) << "row " << r << " token " << tok << ": " << got << " vs " << want;
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Tables, QuantOracleKernels, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
