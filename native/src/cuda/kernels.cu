// The CUDA backend's kernels (declared in kernels.cuh). Written to be obviously correct first:
// one clear mapping of threads to work per kernel, the CPU engine's numerics where they matter
// (activation quantization, RMSNorm's double sum, RoPE without fused multiply-adds), and a scalar
// CPU reference for each in the tests.
#include <mma.h>

#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/kernels.cuh"

namespace ctx::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Quant j (0..31) of a Q5_0/Q5_1 block: its nibble in qs, bit 4 from the little-endian qh.
__device__ __forceinline__ int q5_quant(const uint8_t* qh, const uint8_t* qs, int j) {
  const int low = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
  return low | ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

// Element (row, col) of a weight in its file layout, as dequant.cc computes it.
__device__ float load_weight(const DevWeight& w, int row, int col) {
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  switch (w.type) {
    case GgmlType::F32:
      return reinterpret_cast<const float*>(p)[col];
    case GgmlType::F16:
      return half_at(p + 2 * static_cast<size_t>(col));
    case GgmlType::BF16:
      return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[col]) << 16);
    case GgmlType::Q4_0: {
      const uint8_t* b = p + static_cast<size_t>(col / 32) * sizeof(BlockQ4_0);
      const int j = col % 32;
      const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
      return static_cast<float>(q - 8) * half_at(b);
    }
    case GgmlType::Q4_1: {
      const uint8_t* b = p + static_cast<size_t>(col / 32) * sizeof(BlockQ4_1);
      const int j = col % 32;
      const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
      return static_cast<float>(q) * half_at(b) + half_at(b + 2);
    }
    case GgmlType::Q8_0: {
      const uint8_t* b = p + static_cast<size_t>(col / 32) * sizeof(BlockQ8_0);
      return static_cast<float>(reinterpret_cast<const int8_t*>(b + 2)[col % 32]) * half_at(b);
    }
    // The types below (ggml_types.h has their layouts) round as dequant.cc does: no fused
    // multiply-adds, so an embedding row is bit for bit the CPU's.
    case GgmlType::Q5_0: {
      const uint8_t* b = p + static_cast<size_t>(col / 32) * sizeof(BlockQ5_0);
      return __fmul_rn(static_cast<float>(q5_quant(b + 2, b + 6, col % 32) - 16), half_at(b));
    }
    case GgmlType::Q5_1: {
      const uint8_t* b = p + static_cast<size_t>(col / 32) * sizeof(BlockQ5_1);
      return __fadd_rn(__fmul_rn(static_cast<float>(q5_quant(b + 4, b + 8, col % 32)), half_at(b)), half_at(b + 2));
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool q5 = w.type == GgmlType::Q5_K;
      const uint8_t* b = p + static_cast<size_t>(col / 256) * (q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
      const int e = col % 256, s = e / 32, l = e % 32;
      const uint8_t* scales = b + 4;
      int sc, m;
      if (s < 4) {
        sc = scales[s] & 63;
        m = scales[s + 4] & 63;
      } else {
        sc = (scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4);
        m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
      }
      const uint8_t* qs = b + (q5 ? 48 : 16) + 32 * (s / 2);
      int q = s % 2 ? qs[l] >> 4 : qs[l] & 0xF;
      if (q5) q |= ((b[16 + l] >> s) & 1) << 4;
      return __fsub_rn(__fmul_rn(__fmul_rn(half_at(b), static_cast<float>(sc)), static_cast<float>(q)),
                       __fmul_rn(half_at(b + 2), static_cast<float>(m)));
    }
    case GgmlType::Q6_K: {
      const uint8_t* b = p + static_cast<size_t>(col / 256) * sizeof(BlockQ6_K);
      const int e = col % 256, h = e / 128, a = (e % 128) / 32, l = e % 32;
      const uint8_t ql = b[64 * h + 32 * (a % 2) + l];
      const int q = (a < 2 ? ql & 0xF : ql >> 4) | ((b[128 + 32 * h + l] >> (2 * a)) & 3) << 4;
      const float sc = static_cast<float>(reinterpret_cast<const int8_t*>(b + 192)[e / 16]);
      return __fmul_rn(__fmul_rn(half_at(b + 208), sc), static_cast<float>(q - 32));
    }
    default:
      return 0.f;  // the backend refuses other types at load
  }
}

__global__ void embed_kernel(DevWeight w, const int32_t* tokens, int n, float* x) {
  const int t = blockIdx.x;
  for (int c = threadIdx.x; c < w.cols; c += blockDim.x) x[static_cast<size_t>(t) * w.cols + c] = load_weight(w, tokens[t], c);
}

// One block per token: ggml's rms_norm (the squares summed in double), then the weight.
__global__ void rms_norm_kernel(const float* x, const float* weight, float* out, int e, float eps) {
  __shared__ double partial[256];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * e;
  float* o = out + static_cast<size_t>(blockIdx.x) * e;
  double sum = 0;
  for (int i = threadIdx.x; i < e; i += blockDim.x) sum += static_cast<double>(xr[i] * xr[i]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float mean = static_cast<float>(partial[0] / e);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int i = threadIdx.x; i < e; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(xr[i], scale), weight[i]);
}

// One thread per (token, head, pair); no fused multiply-add, like the CPU.
__global__ void rope_kernel(float* x, int n, int n_heads, int head_dim, const int* pos, const float* cos_t, const float* sin_t) {
  const int pairs = head_dim / 2;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * n_heads * pairs) return;
  const int pair = static_cast<int>(i % pairs);
  const int t = static_cast<int>(i / (static_cast<size_t>(pairs) * n_heads));
  float* v = x + (i / pairs) * head_dim;  // (t, h) rows are consecutive
  const float c = cos_t[static_cast<size_t>(pos[t]) * pairs + pair];
  const float s = sin_t[static_cast<size_t>(pos[t]) * pairs + pair];
  const float x0 = v[2 * pair], x1 = v[2 * pair + 1];
  v[2 * pair] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  v[2 * pair + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// One warp per (token, 32-element block): kernels_scalar.cc quantize_q8.
__global__ void quantize_q8_kernel(const float* x, int n, int k, DevActQ8 a) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int nb = k / 32;
  if (warp >= n * nb) return;
  const int t = warp / nb, b = warp % nb;
  const size_t quant0 = static_cast<size_t>(t) * k + b * 32;
  quantize_q8_block(x[quant0 + lane], lane, a, quant0, static_cast<size_t>(t) * nb + b);
}

// Quantized weights x 8-bit activations, one warp per weight row, up to kMatvecTokens tokens
// (blockIdx.y picks the group): each lane takes whole 32-element blocks, integer dot products
// per block, the CPU's block term (kernels_scalar.cc gemm_q4_0/q4_1/q8_0), then a warp sum.
template <GgmlType T>
__global__ void matvec_q_kernel(DevWeight w, DevActQ8 a, int n, float* y, int ldy) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= w.rows) return;
  const int t0 = blockIdx.y * kMatvecTokens;
  const int nt = min(kMatvecTokens, n - t0);
  const int nb = w.cols / 32;
  float acc[kMatvecTokens] = {};
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  for (int b = lane; b < nb; b += 32) {
    int8_t wq[32];
    float wd, wm = 0.f;
    if (T == GgmlType::Q8_0) {
      const uint8_t* blk = p + static_cast<size_t>(b) * sizeof(BlockQ8_0);
      wd = half_at(blk);
      for (int j = 0; j < 32; ++j) wq[j] = reinterpret_cast<const int8_t*>(blk + 2)[j];
    } else {
      const size_t bytes = T == GgmlType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ4_1);
      const uint8_t* blk = p + b * bytes;
      const uint8_t* qs = blk + (T == GgmlType::Q4_0 ? 2 : 4);
      wd = half_at(blk);
      if (T == GgmlType::Q4_1) wm = half_at(blk + 2);
      for (int j = 0; j < 16; ++j) {
        wq[j] = static_cast<int8_t>(qs[j] & 0xF);
        wq[j + 16] = static_cast<int8_t>(qs[j] >> 4);
      }
    }
#pragma unroll
    for (int t = 0; t < kMatvecTokens; ++t) {
      if (t >= nt) break;
      const size_t row_t = static_cast<size_t>(t0 + t);
      const int8_t* xq = a.qs + row_t * a.k + b * 32;
      int sumi = 0;
      for (int j = 0; j < 32; ++j) sumi += wq[j] * xq[j];
      const float xd = a.d[row_t * nb + b];
      if (T == GgmlType::Q4_0)
        acc[t] += wd * xd * static_cast<float>(sumi - 8 * a.isum[row_t * nb + b]);
      else if (T == GgmlType::Q4_1)
        acc[t] += wd * xd * static_cast<float>(sumi) + wm * a.s[row_t * nb + b];
      else
        acc[t] += wd * xd * static_cast<float>(sumi);
    }
  }
#pragma unroll
  for (int t = 0; t < kMatvecTokens; ++t) {
    if (t >= nt) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) y[static_cast<size_t>(t0 + t) * ldy + row] = v;
  }
}

// Float weights (F32/F16/BF16) x f32 activations, one warp per row, lanes over columns.
__global__ void matvec_f_kernel(DevWeight w, const float* x, int n, float* y, int ldy) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= w.rows) return;
  const int t0 = blockIdx.y * kMatvecTokens;
  const int nt = min(kMatvecTokens, n - t0);
  float acc[kMatvecTokens] = {};
  for (int c = lane; c < w.cols; c += 32) {
    const float wv = load_weight(w, row, c);
#pragma unroll
    for (int t = 0; t < kMatvecTokens; ++t)
      if (t < nt) acc[t] += wv * x[static_cast<size_t>(t0 + t) * w.cols + c];
  }
#pragma unroll
  for (int t = 0; t < kMatvecTokens; ++t) {
    if (t >= nt) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) y[static_cast<size_t>(t0 + t) * ldy + row] = v;
  }
}

// Tensor-core GEMM: a 64-token x 64-row output tile per block of 4 warps (2 x 2, 32 x 32 each),
// K in steps of 32. Activations and weights are rounded to f16 into shared memory (weights
// dequantized from their blocks), products summed in f32 by WMMA.
constexpr int kTile = 64, kTileK = 32, kLdh = kTileK + 8, kLdc = kTile + 4;
__global__ void gemm_kernel(DevWeight w, const float* x, int n, float* y, int ldy) {
  using namespace nvcuda;
  __shared__ __align__(32) __half as[kTile * kLdh];
  __shared__ __align__(32) __half bs[kTile * kLdh];
  __shared__ __align__(32) float cs[kTile * kLdc];
  const int m0 = blockIdx.y * kTile;  // tokens
  const int n0 = blockIdx.x * kTile;  // weight rows
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  const int K = w.cols;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += blockDim.x) {
      const int r = i / kTileK, c = i % kTileK, k = k0 + c;
      const int t = m0 + r, row = n0 + r;
      as[r * kLdh + c] = __float2half_rn(t < n && k < K ? x[static_cast<size_t>(t) * K + k] : 0.f);
      bs[r * kLdh + c] = __float2half_rn(row < w.rows && k < K ? load_weight(w, row, k) : 0.f);
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], as + (wm * 32 + i * 16) * kLdh + kk, kLdh);
      // matrix_b (k, r) = weight row r, column k: bs is [row][k], i.e. column-major K x N.
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], bs + (wn * 32 + j * 16) * kLdh + kk, kLdh);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wm * 32 + i * 16) * kLdc + wn * 32 + j * 16, acc[i][j], kLdc, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    const int r = i / kTile, c = i % kTile;
    if (m0 + r < n && n0 + c < w.rows) y[static_cast<size_t>(m0 + r) * ldy + n0 + c] = cs[r * kLdc + c];
  }
}

__global__ void store_kv_kernel(const float* k, const float* v, const TokenKv* tokens, int n, int kv_dim, int layer) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * kv_dim) return;
  const int t = static_cast<int>(i / kv_dim), c = static_cast<int>(i % kv_dim);
  const TokenKv tk = tokens[t];
  __half* kr = token_k_row(tk, layer, kv_dim);
  kr[c] = __float2half_rn(k[i]);
  kr[static_cast<size_t>(tk.cap) * kv_dim + c] = __float2half_rn(v[i]);
}

// Flash-style attention for one work item and one query head: K/V tiles of kAttnKeys keys in
// shared memory, shared by the item's queries; each warp owns queries warp, warp + 4, ... and
// keeps their running max m, sum l and unnormalised output o (lane owns dims lane + 32c).
// Scores are dot(q, k) * scale like the CPU (kernels_scalar.cc attn_scores).
__global__ void attention_kernel(const float* q, const AttnWork* works, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                                 float* part_o, float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnWork w = works[blockIdx.x];
  const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  const int d = head_dim, ldk = d + 2, kv_dim = n_head_kv * d, dc = d / 32;
  float* qs = reinterpret_cast<float*>(smem);                     // [kAttnQueries][d]
  __half* ks = reinterpret_cast<__half*>(qs + kAttnQueries * d);  // [kAttnKeys][d + 2]
  __half* vs = ks + kAttnKeys * ldk;                              // [kAttnKeys][d + 2]
  const size_t layer_off = static_cast<size_t>(layer) * 2 * w.cap * kv_dim;
  const __half* kbase = w.base + layer_off + kvh * d;
  const __half* vbase = kbase + static_cast<size_t>(w.cap) * kv_dim;

  for (int i = threadIdx.x; i < w.nq * d; i += blockDim.x) qs[i] = q[static_cast<size_t>(w.q0 + i / d) * n_head * d + h * d + i % d];

  constexpr int kPerWarp = kAttnQueries / 4;  // blockDim.x is 128
  float m[kPerWarp], l[kPerWarp], o[kPerWarp][kMaxHeadDimGpu / 32];
  for (int a = 0; a < kPerWarp; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.f;
    for (int c = 0; c < kMaxHeadDimGpu / 32; ++c) o[a][c] = 0.f;
  }
  const int key_end = min(w.key_end, w.pos0 + w.nq);  // no query sees past its own position
  for (int kt = w.key_begin; kt < key_end; kt += kAttnKeys) {
    const int nk = min(kAttnKeys, key_end - kt);
    __syncthreads();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < nk * d; i += blockDim.x) {
      const int j = i / d, c = i % d;
      const int key = w.keys ? w.keys[static_cast<size_t>(layer) * w.list_stride + (kt - w.key_begin) + j] : kt + j;
      ks[j * ldk + c] = kbase[static_cast<size_t>(key) * kv_dim + c];
      vs[j * ldk + c] = vbase[static_cast<size_t>(key) * kv_dim + c];
    }
    __syncthreads();
    for (int a = 0; a < kPerWarp; ++a) {
      const int qi = warp + a * n_warps;
      if (qi >= w.nq) break;
      const int pos = w.pos0 + qi;
      const float* qr = qs + qi * d;
      float s[2];
      for (int hi = 0; hi < 2; ++hi) {
        const int j = lane + 32 * hi;
        const int key = j < nk ? (w.keys ? w.keys[static_cast<size_t>(layer) * w.list_stride + (kt - w.key_begin) + j] : kt + j) : 0;
        s[hi] = -INFINITY;
        if (j < nk && key <= pos) {
          float dot = 0.f;
          for (int c = 0; c < d; ++c) dot += qr[c] * __half2float(ks[j * ldk + c]);
          s[hi] = dot * scale;
        }
      }
      const float tmax = warp_max(fmaxf(s[0], s[1]));
      if (tmax == -INFINITY) continue;  // every key of this tile is in this query's future
      const float m_new = fmaxf(m[a], tmax);
      const float corr = expf(m[a] - m_new);  // 0 when m was -inf
      const float p0 = expf(s[0] - m_new), p1 = expf(s[1] - m_new);
      l[a] = l[a] * corr + warp_sum(p0 + p1);
      for (int c = 0; c < dc; ++c) o[a][c] *= corr;
      for (int j = 0; j < nk; ++j) {
        const float pj = __shfl_sync(kFull, j < 32 ? p0 : p1, j & 31);
        for (int c = 0; c < dc; ++c) o[a][c] += pj * __half2float(vs[j * ldk + lane + 32 * c]);
      }
      m[a] = m_new;
    }
  }
  for (int a = 0; a < kPerWarp; ++a) {
    const int qi = warp + a * n_warps;
    if (qi >= w.nq) break;
    const size_t row = static_cast<size_t>(w.part0 + qi) * n_head + h;
    for (int c = 0; c < dc; ++c) part_o[row * d + lane + 32 * c] = o[a][c];
    if (lane == 0) {
      part_ml[row * 2] = m[a];
      part_ml[row * 2 + 1] = l[a];
    }
  }
}

// One warp per (token, head): merges the token's split partials (flash-decoding's reduction).
__global__ void attention_combine_kernel(const float* part_o, const float* part_ml, const AttnCombine* comb, int n_head, int head_dim,
                                         float* out) {
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const AttnCombine cb = comb[t];
  float m_star = -INFINITY;
  for (int s = 0; s < cb.n_splits; ++s) m_star = fmaxf(m_star, part_ml[(static_cast<size_t>(cb.part0 + s * cb.stride) * n_head + h) * 2]);
  float l = 0.f;
  float o[kMaxHeadDimGpu / 32] = {};
  const int dc = head_dim / 32;
  for (int s = 0; s < cb.n_splits; ++s) {
    const size_t row = static_cast<size_t>(cb.part0 + s * cb.stride) * n_head + h;
    const float ms = part_ml[row * 2];
    if (ms == -INFINITY) continue;  // a split with no key this token may see
    const float wgt = expf(ms - m_star);
    l += part_ml[row * 2 + 1] * wgt;
    for (int c = 0; c < dc; ++c) o[c] += part_o[row * head_dim + lane + 32 * c] * wgt;
  }
  for (int c = 0; c < dc; ++c) out[(static_cast<size_t>(t) * n_head + h) * head_dim + lane + 32 * c] = o[c] / l;
}

__global__ void swiglu_kernel(float* g, const float* u, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void add_kernel(float* x, const float* y, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] += y[i];
}

__global__ void gather_rows_kernel(const float* x, const int* rows, int width, float* out) {
  for (int c = threadIdx.x; c < width; c += blockDim.x)
    out[static_cast<size_t>(blockIdx.x) * width + c] = x[static_cast<size_t>(rows[blockIdx.x]) * width + c];
}

// Argmax in two launches, so a row is read by many blocks: one per kArgmaxChunk elements writes
// its chunk's best (value, index) to the scratch, then one warp per row picks among the chunks.
// The order is (value higher, index lower), a total order on what is kept: NaN never compares
// greater, so it is never kept, and neither is -inf (not greater than the starting -inf). Any
// grouping of the elements then gives the answer of one pass over the row in index order. A row
// with nothing kept (all -inf or NaN) keeps the sentinel index n_vocab and answers 0.
constexpr int kArgmaxThreads = 256;
static_assert(kArgmaxChunk % kArgmaxThreads == 0, "each thread takes the same number of elements of a chunk");

__device__ __forceinline__ void keep_better(float& bv, int& bi, float ov, int oi) {
  if (ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) keep_better(bv, bi, __shfl_xor_sync(kFull, bv, o), __shfl_xor_sync(kFull, bi, o));
}

// Grid (chunks, rows): block (c, r) takes elements [c * kArgmaxChunk, (c + 1) * kArgmaxChunk) of row r.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_chunks_kernel(const float* logits, int n_vocab, ArgmaxPartial* part) {
  __shared__ float warp_v[kArgmaxThreads / 32];
  __shared__ int warp_i[kArgmaxThreads / 32];
  const float* row = logits + static_cast<size_t>(blockIdx.y) * n_vocab;
  const int begin = blockIdx.x * kArgmaxChunk + threadIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Every load first, then the compares: the loads are in flight together. Past the row's end,
  // -inf, which is never kept.
  constexpr int kPerThread = kArgmaxChunk / kArgmaxThreads;
  float v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) v[j] = begin + j * kArgmaxThreads < n_vocab ? row[begin + j * kArgmaxThreads] : -INFINITY;
  float bv = -INFINITY;
  int bi = n_vocab;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    if (v[j] > bv) {
      bv = v[j];
      bi = begin + j * kArgmaxThreads;
    }
  warp_argmax(bv, bi);
  if (lane == 0) {
    warp_v[warp] = bv;
    warp_i[warp] = bi;
  }
  __syncthreads();
  if (warp != 0) return;
  bv = lane < kArgmaxThreads / 32 ? warp_v[lane] : -INFINITY;
  bi = lane < kArgmaxThreads / 32 ? warp_i[lane] : n_vocab;
  warp_argmax(bv, bi);
  if (lane == 0) part[static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x] = {bv, bi};
}

// One warp per row over its `chunks` partials.
__global__ void argmax_merge_kernel(const ArgmaxPartial* part, int chunks, int n_vocab, int32_t* out) {
  const ArgmaxPartial* p = part + static_cast<size_t>(blockIdx.x) * chunks;
  float bv = -INFINITY;
  int bi = n_vocab;
  for (int c = threadIdx.x; c < chunks; c += 32) keep_better(bv, bi, p[c].value, p[c].index);
  warp_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi < n_vocab ? bi : 0;
}

unsigned blocks_for(size_t count, unsigned threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

void embed(const DevWeight& w, const int32_t* tokens, int n, float* x, cudaStream_t st) {
  embed_kernel<<<n, 256, 0, st>>>(w, tokens, n, x);
  CTX_CUDA_LAUNCHED("embed");
}

void rms_norm(const float* x, const float* weight, float* out, int n, int e, float eps, cudaStream_t st) {
  rms_norm_kernel<<<n, 256, 0, st>>>(x, weight, out, e, eps);
  CTX_CUDA_LAUNCHED("rms_norm");
}

void rope(float* x, int n, int n_heads, int head_dim, const int* pos, const float* cos_t, const float* sin_t, cudaStream_t st) {
  const size_t count = static_cast<size_t>(n) * n_heads * (head_dim / 2);
  rope_kernel<<<blocks_for(count, 256), 256, 0, st>>>(x, n, n_heads, head_dim, pos, cos_t, sin_t);
  CTX_CUDA_LAUNCHED("rope");
}

void quantize_q8(const float* x, int n, int k, const DevActQ8& a, cudaStream_t st) {
  const size_t warps = static_cast<size_t>(n) * (k / 32);
  quantize_q8_kernel<<<blocks_for(warps * 32, 256), 256, 0, st>>>(x, n, k, a);
  CTX_CUDA_LAUNCHED("quantize_q8");
}

void matvec(const DevWeight& w, const float* x, const DevActQ8* act, int n, float* y, int ldy, cudaStream_t st) {
  const dim3 grid((w.rows + 3) / 4, (n + kMatvecTokens - 1) / kMatvecTokens);
  switch (w.type) {
    case GgmlType::Q4_0:
      matvec_q_kernel<GgmlType::Q4_0><<<grid, 128, 0, st>>>(w, *act, n, y, ldy);
      break;
    case GgmlType::Q4_1:
      matvec_q_kernel<GgmlType::Q4_1><<<grid, 128, 0, st>>>(w, *act, n, y, ldy);
      break;
    case GgmlType::Q8_0:
      matvec_q_kernel<GgmlType::Q8_0><<<grid, 128, 0, st>>>(w, *act, n, y, ldy);
      break;
    default:
      matvec_f_kernel<<<grid, 128, 0, st>>>(w, x, n, y, ldy);
      break;
  }
  CTX_CUDA_LAUNCHED("matvec");
}

void gemm(const DevWeight& w, const float* x, int n, float* y, int ldy, cudaStream_t st) {
  const dim3 grid((w.rows + kTile - 1) / kTile, (n + kTile - 1) / kTile);
  gemm_kernel<<<grid, 128, 0, st>>>(w, x, n, y, ldy);
  CTX_CUDA_LAUNCHED("gemm");
}

void store_kv(const float* k, const float* v, const TokenKv* tokens, int n, int kv_dim, int layer, cudaStream_t st) {
  store_kv_kernel<<<blocks_for(static_cast<size_t>(n) * kv_dim, 256), 256, 0, st>>>(k, v, tokens, n, kv_dim, layer);
  CTX_CUDA_LAUNCHED("store_kv");
}

static size_t attention_smem_bytes(int head_dim) {
  return kAttnQueries * head_dim * sizeof(float) + 2 * kAttnKeys * (head_dim + 2) * sizeof(__half);
}

void attention(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
               float* part_o, float* part_ml, cudaStream_t st) {
  const dim3 grid(n_work, n_head);
  attention_kernel<<<grid, 128, attention_smem_bytes(head_dim), st>>>(q, work, n_head, n_head_kv, head_dim, layer, scale, part_o, part_ml);
  CTX_CUDA_LAUNCHED("attention");
}

void attention_combine(const float* part_o, const float* part_ml, const AttnCombine* comb, int n, int n_head, int head_dim, float* out,
                       cudaStream_t st) {
  attention_combine_kernel<<<dim3(n, n_head), 32, 0, st>>>(part_o, part_ml, comb, n_head, head_dim, out);
  CTX_CUDA_LAUNCHED("attention_combine");
}

void swiglu(float* gate, const float* up, size_t count, cudaStream_t st) {
  swiglu_kernel<<<blocks_for(count, 256), 256, 0, st>>>(gate, up, count);
  CTX_CUDA_LAUNCHED("swiglu");
}

void add(float* x, const float* y, size_t count, cudaStream_t st) {
  add_kernel<<<blocks_for(count, 256), 256, 0, st>>>(x, y, count);
  CTX_CUDA_LAUNCHED("add");
}

void gather_rows(const float* x, const int* rows, int n, int width, float* out, cudaStream_t st) {
  gather_rows_kernel<<<n, 256, 0, st>>>(x, rows, width, out);
  CTX_CUDA_LAUNCHED("gather_rows");
}

void argmax(const float* logits, int rows, int n_vocab, ArgmaxPartial* scratch, int32_t* out, cudaStream_t st) {
  const int chunks = argmax_chunks(n_vocab);
  argmax_chunks_kernel<<<dim3(chunks, rows), kArgmaxThreads, 0, st>>>(logits, n_vocab, scratch);
  CTX_CUDA_LAUNCHED("argmax_chunks");
  argmax_merge_kernel<<<rows, 32, 0, st>>>(scratch, chunks, n_vocab, out);
  CTX_CUDA_LAUNCHED("argmax_merge");
}

}  // namespace ctx::cuda
