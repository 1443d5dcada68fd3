// Helpers shared by the quantized-kernel tests (kernels_test.cc, quants_test.cc): 8-bit
// activations as the engine holds them, activations the Q8 format represents exactly, and the
// magnitudes that bound a quantized dot product's float rounding.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dequant.h"
#include "fp16.h"
#include "ggml_types.h"
#include "kernels.h"
#include "model.h"

namespace quanttest {

using ctx::ActQ8;
using ctx::GgmlType;
using ctx::Weight;

struct Act {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> isum;
  ActQ8 a;
  Act(int rows, int k) : qs(static_cast<size_t>(rows) * k), d(rows * k / 32), s(rows * k / 32), isum(rows * k / 32) {
    a = {qs.data(), d.data(), s.data(), isum.data(), k};
  }
  // `a` points into the vectors: a move keeps their buffers, a copy would not.
  Act(const Act&) = delete;
  Act(Act&&) = default;
};

inline Act quantize_all(const ctx::KernelTable& kt, const std::vector<float>& x, int rows, int k) {
  Act act(rows, k);
  const int nb = k / 32;
  for (int r = 0; r < rows; ++r)
    kt.quantize_q8(&x[static_cast<size_t>(r) * k], k, &act.qs[static_cast<size_t>(r) * k], &act.d[r * nb], &act.s[r * nb],
                   &act.isum[r * nb]);
  return act;
}

// Activations the Q8 format holds exactly: per 32-block a half scale d and integers q in
// [-127, 127] with |q| = 127 somewhere, x = q * d. Quantizing them gives back exactly q and d,
// so a GEMM's exact result is the weights times x.
struct ExactAct {
  std::vector<int> q;
  std::vector<float> d, x;
};
inline ExactAct exact_activations(std::mt19937& rng, int n_tok, int k) {
  std::uniform_int_distribution<int> qdist(-127, 127);
  std::uniform_real_distribution<float> ddist(0.01f, 0.1f);
  ExactAct e;
  e.q.resize(static_cast<size_t>(n_tok) * k);
  e.d.resize(e.q.size() / 32);
  e.x.resize(e.q.size());
  for (size_t b = 0; b < e.d.size(); ++b) {
    e.d[b] = ctx::round_fp16(ddist(rng));
    for (int j = 0; j < 32; ++j) e.q[b * 32 + j] = qdist(rng);
    e.q[b * 32 + b % 32] = b % 2 ? 127 : -127;
    for (int j = 0; j < 32; ++j) e.x[b * 32 + j] = static_cast<float>(e.q[b * 32 + j]) * e.d[b];
  }
  return e;
}

// Per element of a weight row: the magnitude of the offset the kernels fold in apart from the
// quants' products (8d for Q4_0, 16d Q5_0, |m| Q4_1/Q5_1, |dmin m| Q4_K/Q5_K, 32|d sc| Q6_K; none
// for Q8_0 and float types). The kernels' float terms are products of |w| + |offset| at most.
inline std::vector<double> offset_magnitudes(const Weight& w, int row) {
  std::vector<double> off(w.cols, 0.0);
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  auto h = [](uint16_t v) { return std::fabs(static_cast<double>(ctx::fp16_to_fp32(v))); };
  for (int j = 0; j < w.cols; ++j) {
    const int b = j / 32, sb = j / 256, s = (j % 256) / 32;
    switch (w.type) {
      case GgmlType::Q4_0:
        off[j] = 8 * h(reinterpret_cast<const ctx::BlockQ4_0*>(p)[b].d);
        break;
      case GgmlType::Q5_0:
        off[j] = 16 * h(reinterpret_cast<const ctx::BlockQ5_0*>(p)[b].d);
        break;
      case GgmlType::Q4_1:
        off[j] = h(reinterpret_cast<const ctx::BlockQ4_1*>(p)[b].m);
        break;
      case GgmlType::Q5_1:
        off[j] = h(reinterpret_cast<const ctx::BlockQ5_1*>(p)[b].m);
        break;
      case GgmlType::Q4_K:
      case GgmlType::Q5_K: {
        const bool q5 = w.type == GgmlType::Q5_K;
        const uint8_t* blk = p + static_cast<size_t>(sb) * (q5 ? sizeof(ctx::BlockQ5_K) : sizeof(ctx::BlockQ4_K));
        uint16_t dmin;
        std::memcpy(&dmin, blk + 2, 2);
        uint8_t sc, m;
        ctx::k_scale_min(blk + 4, s, &sc, &m);
        off[j] = h(dmin) * m;
        break;
      }
      case GgmlType::Q6_K: {
        const auto& blk = reinterpret_cast<const ctx::BlockQ6_K*>(p)[sb];
        off[j] = 32 * h(blk.d) * std::fabs(static_cast<double>(blk.scales[(j % 256) / 16]));
        break;
      }
      default:
        break;
    }
  }
  return off;
}

// sum_j (|w_j| + 2 |offset_j|) * |x_j| for a dequantized row `wr` and activation row `tok` of x:
// bounds the absolute values of every float term a kernel adds for this output (|w| + |offset|)
// and of the rounding in the dequantized reference itself (w = d*sc*q - offset rounded, at most
// |w| + 2|offset| in size before rounding).
inline double gemm_magnitude(const Weight& w, int row, const std::vector<float>& wr, const ActQ8& x, int tok) {
  const std::vector<double> off = offset_magnitudes(w, row);
  double mag = 0;
  for (int j = 0; j < w.cols; ++j) {
    const double xv = static_cast<double>(x.qs[static_cast<size_t>(tok) * x.k + j]) * x.d[tok * x.blocks() + j / 32];
    mag += (std::fabs(wr[j]) + 2 * off[j]) * std::fabs(xv);
  }
  return mag;
}

// Q4_1/Q5_1 read ggml's Q8_1 s = f16(d * isum) for their m term: the error that rounding adds,
// sum over blocks |m| * |s - d * isum|. 0 for other types.
inline double s_rounding_error(const Weight& w, int row, const ActQ8& x, int tok) {
  if (w.type != GgmlType::Q4_1 && w.type != GgmlType::Q5_1) return 0;
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  double err = 0;
  for (int b = 0; b < w.cols / 32; ++b) {
    const size_t blk = static_cast<size_t>(tok) * x.blocks() + b;
    const uint16_t mh =
        w.type == GgmlType::Q4_1 ? reinterpret_cast<const ctx::BlockQ4_1*>(p)[b].m : reinterpret_cast<const ctx::BlockQ5_1*>(p)[b].m;
    err += std::fabs(ctx::fp16_to_fp32(mh) * (static_cast<double>(x.s[blk]) - static_cast<double>(x.d[blk]) * x.isum[blk]));
  }
  return err;
}

}  // namespace quanttest
