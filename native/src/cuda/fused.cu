// Fused small kernels (fused.cuh). Each repeats the arithmetic of the kernels it replaces
// (kernels.cu) operation for operation, so its results are the same bits.
#include "cuda/common.cuh"
#include "cuda/fused.cuh"

namespace ctx::cuda {
namespace {

constexpr int kNormThreads = 256;  // as rms_norm_kernel: the double sum is reduced in the same order

// One block of 256 threads per token. First rms_norm_kernel's steps (strided double sum, tree
// reduction, the same products), the normalised row kept in shared memory; then each warp
// quantizes 32-element blocks as quantize_q8_kernel does (lane = element of the block).
__global__ void rms_norm_quantize_kernel(const float* x, const float* weight, float* out, int e, float eps, DevActQ8 a) {
  extern __shared__ float row[];  // [e]
  __shared__ double partial[kNormThreads];
  const int t = blockIdx.x;
  const float* xr = x + static_cast<size_t>(t) * e;
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
  for (int i = threadIdx.x; i < e; i += blockDim.x) {
    const float o = __fmul_rn(__fmul_rn(xr[i], scale), weight[i]);
    row[i] = o;
    if (out) out[static_cast<size_t>(t) * e + i] = o;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nb = e / 32;
  for (int b = warp; b < nb; b += blockDim.x / 32)
    quantize_q8_block(row[b * 32 + lane], lane, a, static_cast<size_t>(t) * e + b * 32, static_cast<size_t>(t) * nb + b);
}

// One thread per (token, pair of a head): the first n_head * pairs threads of a token rotate q,
// the next n_head_kv * pairs rotate a pair of k and store it, the last n_head_kv * pairs store a
// pair of v (rope_kernel's products, store_kv_kernel's conversions).
__global__ void rope_store_kv_kernel(float* q, const float* k, const float* v, int n, int n_head, int n_head_kv, int head_dim,
                                     const int* pos, const float* cos_t, const float* sin_t, const TokenKv* tokens, int layer) {
  const int pairs = head_dim / 2, kv_dim = n_head_kv * head_dim;
  const int per_token = (n_head + 2 * n_head_kv) * pairs;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * per_token) return;
  const int t = static_cast<int>(i / per_token);
  int j = static_cast<int>(i % per_token);
  const int pair = j % pairs;
  const float c = cos_t[static_cast<size_t>(pos[t]) * pairs + pair];
  const float s = sin_t[static_cast<size_t>(pos[t]) * pairs + pair];
  if (j < n_head * pairs) {
    float* x = q + static_cast<size_t>(t) * n_head * head_dim + (j / pairs) * head_dim;
    const float x0 = x[2 * pair], x1 = x[2 * pair + 1];
    x[2 * pair] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[2 * pair + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    return;
  }
  j -= n_head * pairs;
  const TokenKv tk = tokens[t];
  __half* krow = token_k_row(tk, layer, kv_dim);
  if (j < n_head_kv * pairs) {
    const int col = (j / pairs) * head_dim + 2 * pair;
    const float* x = k + static_cast<size_t>(t) * kv_dim + col;
    const float x0 = x[0], x1 = x[1];
    krow[col] = __float2half_rn(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    krow[col + 1] = __float2half_rn(__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
    return;
  }
  j -= n_head_kv * pairs;
  const int col = 2 * j;
  __half* vrow = krow + static_cast<size_t>(tk.cap) * kv_dim;
  vrow[col] = __float2half_rn(v[static_cast<size_t>(t) * kv_dim + col]);
  vrow[col + 1] = __float2half_rn(v[static_cast<size_t>(t) * kv_dim + col + 1]);
}

}  // namespace

void rms_norm_quantize(const float* x, const float* weight, float* out, int n, int e, float eps, const DevActQ8& a, cudaStream_t st) {
  rms_norm_quantize_kernel<<<n, kNormThreads, e * sizeof(float), st>>>(x, weight, out, e, eps, a);
  CTX_CUDA_LAUNCHED("rms_norm_quantize");
}

void rope_store_kv(float* q, const float* k, const float* v, int n, int n_head, int n_head_kv, int head_dim, const int* pos,
                   const float* cos_t, const float* sin_t, const TokenKv* tokens, int layer, cudaStream_t st) {
  const size_t count = static_cast<size_t>(n) * (n_head + 2 * n_head_kv) * (head_dim / 2);
  rope_store_kv_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, st>>>(q, k, v, n, n_head, n_head_kv, head_dim, pos, cos_t,
                                                                                   sin_t, tokens, layer);
  CTX_CUDA_LAUNCHED("rope_store_kv");
}

}  // namespace ctx::cuda
