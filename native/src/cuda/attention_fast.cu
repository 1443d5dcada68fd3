// Faster attention kernels (attention_fast.cuh): one tensor-core kernel, attention_tc_kernel, in a
// decode configuration (f32-level precision) and a prefill one (f16 q and P). A block takes one
// work item and up to kMaxGroupHeads query heads of one KV head, so each K/V tile is read from
// global memory once for all of them, and writes the partial format of attention() (kernels.cu).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/attention_fast.cuh"
#include "cuda/common.cuh"

namespace ctx::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kTileKeys = 64;      // keys per shared-memory tile
constexpr int kPad = 8;            // halves after each tile row: rows 16 bytes apart modulo 128, so the 8
                                   // rows a 16-byte load or ldmatrix phase reads at one column are in
                                   // distinct banks, and every row start stays 16-byte aligned
constexpr int kMaxGroupHeads = 4;  // query heads per block; a larger GQA group takes several blocks
constexpr int kNoKey = INT_MAX;    // key index of a tile row past the end: masked for every query

// 16 bytes global -> shared without passing through registers; with `valid` false nothing is
// read and the 16 bytes are zero-filled (a tile's rows past the end of its range).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// What one block works on: a work item, and the query heads h0 .. h0 + n_heads - 1, all of KV
// head kvh. Key offsets o < n_keys name key key_begin + o of the range, or list[o] of a sparse list.
struct BlockWork {
  int q0, nq, pos0, part0;
  int h0, n_heads;
  int key_begin, n_keys;
  const int32_t* list;  // the layer's key list, or nullptr for the range
  const __half* k;      // head kvh's K at this layer: key j's row at k + j * kv_dim
  const __half* v;
  int kv_dim;
};

// Blocks are numbered head_block = kvh * blocks_per_kv + c, where block c of a KV head takes
// query heads c * heads_per_block .. of its group (the launchers size the grid the same way).
__device__ BlockWork block_work(const AttnWork& w, int head_block, int group, int heads_per_block, int n_head_kv, int head_dim, int layer) {
  const int blocks_per_kv = (group + heads_per_block - 1) / heads_per_block;
  const int kvh = head_block / blocks_per_kv, first = (head_block % blocks_per_kv) * heads_per_block;
  BlockWork b;
  b.q0 = w.q0;
  b.nq = w.nq;
  b.pos0 = w.pos0;
  b.part0 = w.part0;
  b.h0 = kvh * group + first;
  b.n_heads = min(heads_per_block, group - first);
  b.key_begin = w.key_begin;
  b.n_keys = max(0, min(w.key_end, w.pos0 + w.nq) - w.key_begin);  // no query sees past its own position
  b.list = w.keys ? w.keys + static_cast<size_t>(layer) * w.list_stride : nullptr;
  b.kv_dim = n_head_kv * head_dim;
  b.k = w.base + static_cast<size_t>(layer) * 2 * w.cap * b.kv_dim + static_cast<size_t>(kvh) * head_dim;
  b.v = b.k + static_cast<size_t>(w.cap) * b.kv_dim;
  return b;
}

__device__ __forceinline__ int key_at(const BlockWork& b, int offset) { return b.list ? b.list[offset] : b.key_begin + offset; }

// Starts the copy of the tile at key offset `kt` (kTileKeys keys) into ks and vs ([kTileKeys][D +
// kPad] halves) and writes its key indices to kidx; rows past the end are zeros with index kNoKey.
// Every thread of the block takes part (16-byte chunks, consecutive threads along a row).
template <int D>
__device__ void load_tile(const BlockWork& b, int kt, __half* ks, __half* vs, int* kidx) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const int nk = min(kTileKeys, b.n_keys - kt);
  for (int i = threadIdx.x; i < 2 * kTileKeys * kChunks; i += blockDim.x) {
    const bool is_v = i >= kTileKeys * kChunks;
    const int j = (i / kChunks) % kTileKeys, c = i % kChunks;
    const bool valid = j < nk;
    const size_t key = valid ? static_cast<size_t>(key_at(b, kt + j)) : 0;
    const __half* src = (is_v ? b.v : b.k) + key * b.kv_dim + c * 8;
    cp_async16((is_v ? vs : ks) + j * (D + kPad) + c * 8, src, valid);
  }
  for (int j = threadIdx.x; j < kTileKeys; j += blockDim.x) kidx[j] = j < nk ? key_at(b, kt + j) : kNoKey;
}

// ---------------------------------------------------------------------------------------------
// Tensor cores: mma.sync.m16n8k16, f16 x f16 -> f32.

// A pair of floats as f16x2 bits; lo in the low 16 bits (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// x as a pair of f16x2 (hi, lo) with hi + lo = x to about 2^-22 relative (2^-25 absolute once
// lo is below f16's normal range): hi = f16(x), lo = f16(x - hi), x - hi exact in f32.
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 hf = __half22float2(h);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = pack_half2(x0 - hf.x, x1 - hf.y);
}

// c += a (16 x 16, row-major fragment) * b (16 x 8, column fragment), f32 accumulators. Fragment
// layouts (PTX ISA, mma.m16n8k16 .f16), with g = lane / 4 and t = lane % 4:
//   a[0]: (row g, cols 2t, 2t+1)  a[1]: (row g+8, cols 2t, 2t+1)  a[2], a[3]: the same at cols + 8
//   b0: (rows 2t, 2t+1, col g)    b1: (rows 2t+8, 2t+9, col g)
//   c[0], c[1]: (row g, cols 2t, 2t+1)    c[2], c[3]: (row g+8, cols 2t, 2t+1)
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8 x 8 matrices of halves; lanes 8i .. 8i + 7 give the row addresses of matrix i. Plain:
// lane gets (row g, cols 2t, 2t+1) of each; .trans: (rows 2t, 2t+1, col g).
__device__ __forceinline__ void ldmatrix_x4(const __half* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(const __half* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

// The two uses of attention_tc_kernel. Slabs: warps of 16 rows each; key groups: warps splitting
// each tile's keys, each with its own softmax state, merged at the end.
struct DecodeConfig {                   // attention_gqa
  static constexpr bool kSplit = true;  // q and P as f16 pairs (hi + lo): f32-level results
  static constexpr int kKeyGroups = 4;  // 16 keys of each tile per warp
  static constexpr int kMaxSlabs = 1;   // 16 rows per pass: up to 4 queries of 4 heads
  template <int D>
  __host__ __device__ static constexpr int stages() {
    return D <= 64 ? 4 : 3;
  }  // 3 (2) tiles in flight per block
};
struct PrefillConfig {                              // attention_prefill_tc
  static constexpr bool kSplit = false;             // q and P rounded to f16
  static constexpr int kKeyGroups = 2;              // 32 keys of each tile per warp
  static constexpr int kMaxSlabs = kMaxGroupHeads;  // one slab per query head: 16 queries
  template <int D>
  __host__ __device__ static constexpr int stages() {
    return 2;
  }
};
static_assert(16 * DecodeConfig::kMaxSlabs >= kSplitTokens * kMaxGroupHeads, "a decode work item fits one pass");

// Shared memory of attention_tc_kernel with `slabs` slabs: the K/V ring and its key indices, or,
// at the end of a pass, the key groups' results (o rows kMergeLd floats apart, then (m, l) per row).
template <int D, typename Config>
constexpr size_t tc_smem_bytes(int slabs) {
  const size_t ring = Config::template stages<D>() * (2 * kTileKeys * (D + kPad) * sizeof(__half) + kTileKeys * sizeof(int));
  const size_t merge = static_cast<size_t>(Config::kKeyGroups) * 16 * slabs * (D + 4 + 2) * sizeof(float);
  return ring > merge ? ring : merge;
}

// Attention on tensor cores, FlashAttention-2 style, for decode splits (Config = DecodeConfig) and
// prefill tiles (PrefillConfig). Block: one work item (taken last first, so a prefill's tiles with
// the most keys start first) and up to kMaxGroupHeads query heads of one KV head, so each K/V tile
// is read from global memory once for the whole GQA group. Its rows are r = query * n_heads +
// head (a 16-query tile of a group of 3: 48 rows), 16 per slab; rows past the work item's are
// zeros and masked. Warp w takes slab w % slabs and, of each 64-key tile, the keys of its key group
// w / slabs. K/V tiles stream through a cp.async ring shared by all warps: one barrier per tile, no
// other exchange until the end. Per warp and tile:
//   S = Q K^T: Q fragments stay in registers for the whole key range; K via ldmatrix (its
//              [key][dim] rows are the column operand as stored); S in accumulators;
//   softmax:   each thread holds rows g and g + 8 of its slab, 2 columns per 8-key tile; row max
//              over the quad of threads sharing a row; l sums the f32 weights;
//   O += P V:  P's accumulators become the A fragments directly, V via ldmatrix.trans.
// Precision: with kSplit, q and P enter as f16 pairs hi + lo (two MMAs each; P scaled by 2^12
// first so that its lo part stays in f16's normal range, undone at the end), scores in natural
// units with expf: f32-level results like attention(). Without, q and P are rounded to f16
// (relative error 2^-11 each) and scores are in log2 units with exp2f; m is written as m2 * ln 2.
// At the end each slab's key groups merge through shared memory: m = max of theirs, o and l
// summed with weights exp(m_group - m). A row whose keys of a tile are all masked keeps its state
// (max -inf: rescale 1, weights 0); exponents use 0 while its max is still -inf (no inf - inf).
template <int D, typename Config>
__global__ void __launch_bounds__(32 * Config::kKeyGroups * Config::kMaxSlabs)
    attention_tc_kernel(const float* q, const AttnWork* works, int n_head, int n_head_kv, int heads_per_block, int layer, float scale,
                        float* part_o, float* part_ml) {
  constexpr bool kSplit = Config::kSplit;
  constexpr int kStages = Config::template stages<D>(), kKeyGroups = Config::kKeyGroups;
  constexpr int kLd = D + kPad, kTileHalves = kTileKeys * kLd;
  constexpr int kWarpKeys = kTileKeys / kKeyGroups;  // keys of each tile per warp
  constexpr int kKChunks = D / 16;                   // k steps of S = Q K^T
  constexpr int kSTiles = kWarpKeys / 8;             // n tiles of S
  constexpr int kOTiles = D / 8;                     // n tiles of O
  constexpr int kMergeLd = D + 4;
  constexpr float kPScale = kSplit ? 4096.f : 1.f;
  extern __shared__ __align__(16) unsigned char smem[];
  __half* tiles = reinterpret_cast<__half*>(smem);                        // [kStages][K, V][kTileKeys][kLd]
  int* kidx = reinterpret_cast<int*>(tiles + kStages * 2 * kTileHalves);  // [kStages][kTileKeys]

  const BlockWork b = block_work(works[gridDim.y - 1 - blockIdx.y], blockIdx.x, n_head / n_head_kv, heads_per_block, n_head_kv, D, layer);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int slabs = blockDim.x / (32 * kKeyGroups), slab = warp % slabs, key_group = warp / slabs;
  const int key0 = key_group * kWarpKeys;  // this warp's keys in each tile
  const int rows_per_pass = 16 * slabs, queries_per_pass = rows_per_pass / b.n_heads;
  const int n_tiles = (b.n_keys + kTileKeys - 1) / kTileKeys;
  const float score_scale = kSplit ? scale : scale * 1.4426950408889634f;  // log2(e)
  auto exp_scores = [](float x) { return kSplit ? expf(x) : exp2f(x); };
  auto k_tile = [&](int s) { return tiles + s * 2 * kTileHalves; };
  auto v_tile = [&](int s) { return tiles + s * 2 * kTileHalves + kTileHalves; };
  float* merge_o = reinterpret_cast<float*>(smem);                    // [kKeyGroups][rows_per_pass][kMergeLd]
  float* merge_ml = merge_o + kKeyGroups * rows_per_pass * kMergeLd;  // [kKeyGroups][rows_per_pass][2]

  for (int qa = 0; qa < b.nq; qa += queries_per_pass) {
    const int rows = min(queries_per_pass, b.nq - qa) * b.n_heads;
    const bool active = slab * 16 < rows;  // warp-uniform
    const int r_lo = slab * 16 + g, r_hi = r_lo + 8;
    // Positions of this thread's rows (-1 for padding rows: every key masked).
    const int pos_lo = r_lo < rows ? b.pos0 + qa + r_lo / b.n_heads : -1;
    const int pos_hi = r_hi < rows ? b.pos0 + qa + r_hi / b.n_heads : -1;
    uint32_t qf[kKChunks][4], qf_lo[kSplit ? kKChunks : 1][4];  // A fragments of Q (and of its lo part)
#pragma unroll
    for (int kc = 0; kc < kKChunks; ++kc)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e & 1 ? r_hi : r_lo, c = 16 * kc + 2 * t4 + (e & 2 ? 8 : 0);
        float2 x = make_float2(0.f, 0.f);
        if (r < rows)
          x = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(b.q0 + qa + r / b.n_heads) * n_head + b.h0 + r % b.n_heads) * D +
                                               c);
        if constexpr (kSplit)
          split_half2(x.x, x.y, qf[kc][e], qf_lo[kc][e]);
        else
          qf[kc][e] = pack_half2(x.x, x.y);
      }
    float o[kOTiles][4];
#pragma unroll
    for (int dn = 0; dn < kOTiles; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: this thread's columns only

    __syncthreads();  // the previous pass no longer reads the shared memory
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load_tile<D>(b, s * kTileKeys, k_tile(s), v_tile(s), kidx + s * kTileKeys);
      cp_async_commit();
    }
    for (int t = 0; t < n_tiles; ++t) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile t is in shared memory for every thread; tile t - 1 is no longer read
      const int next = t + kStages - 1;
      if (next < n_tiles)
        load_tile<D>(b, next * kTileKeys, k_tile(next % kStages), v_tile(next % kStages), kidx + (next % kStages) * kTileKeys);
      cp_async_commit();  // possibly empty: keeps one group per tile for the wait above
      if (!active) continue;
      const int st = t % kStages;
      const __half* ks = k_tile(st);
      const __half* vs = v_tile(st);
      const int* ki = kidx + st * kTileKeys;

      float s[kSTiles][4];
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int kc2 = 0; kc2 < kKChunks / 2; ++kc2) {
          // Matrices: keys key0 + 8nt .. + 7 by dims 32kc2 + 8i .. + 7, i = 0..3: (b0, b1) of k
          // chunks 2kc2 and 2kc2 + 1.
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(ks + (key0 + 8 * nt + (lane & 7)) * kLd + 32 * kc2 + 8 * (lane >> 3), b0, b1, b2, b3);
          mma_16816(s[nt], qf[2 * kc2], b0, b1);
          mma_16816(s[nt], qf[2 * kc2 + 1], b2, b3);
          if constexpr (kSplit) {
            mma_16816(s[nt], qf_lo[2 * kc2], b0, b1);
            mma_16816(s[nt], qf_lo[2 * kc2 + 1], b2, b3);
          }
        }
      }

      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = ki[key0 + 8 * nt + 2 * t4 + e];
          s[nt][e] = key <= pos_lo ? s[nt][e] * score_scale : -INFINITY;
          s[nt][e + 2] = key <= pos_hi ? s[nt][e + 2] * score_scale : -INFINITY;
          mx_lo = fmaxf(mx_lo, s[nt][e]);
          mx_hi = fmaxf(mx_hi, s[nt][e + 2]);
        }
      // The quad (lanes 4g .. 4g + 3) holds the row's columns.
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFull, mx_lo, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFull, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFull, mx_hi, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFull, mx_hi, 2));
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
      const float c_lo = exp_scores(m_lo - mu_lo), c_hi = exp_scores(m_hi - mu_hi);  // 0 while m was -inf
      m_lo = mn_lo;
      m_hi = mn_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[nt][e] = exp_scores(s[nt][e] - mu_lo);
          s[nt][e + 2] = exp_scores(s[nt][e + 2] - mu_hi);
          sum_lo += s[nt][e];
          sum_hi += s[nt][e + 2];
        }
      l_lo = l_lo * c_lo + sum_lo;
      l_hi = l_hi * c_hi + sum_hi;
#pragma unroll
      for (int dn = 0; dn < kOTiles; ++dn) {
        o[dn][0] *= c_lo;
        o[dn][1] *= c_lo;
        o[dn][2] *= c_hi;
        o[dn][3] *= c_hi;
      }

#pragma unroll
      for (int kc = 0; kc < kWarpKeys / 16; ++kc) {
        // P's 16 x 16 block of the warp's keys 16kc .. 16kc + 15: S tiles 2kc and 2kc + 1.
        uint32_t pa[4], pa_lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float* sv = s[2 * kc + (e >> 1)] + 2 * (e & 1);
          if constexpr (kSplit)
            split_half2(sv[0] * kPScale, sv[1] * kPScale, pa[e], pa_lo[e]);
          else
            pa[e] = pack_half2(sv[0], sv[1]);
        }
#pragma unroll
        for (int dn2 = 0; dn2 < kOTiles / 2; ++dn2) {
          // Matrices (transposed): keys key0 + 16kc + 8(i & 1) .. + 7 by dims 8(2dn2 + i / 2) .. + 7:
          // (b0, b1) of O tiles 2dn2 and 2dn2 + 1.
          const int i = lane >> 3;
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(vs + (key0 + 16 * kc + 8 * (i & 1) + (lane & 7)) * kLd + 8 * (2 * dn2 + (i >> 1)), b0, b1, b2, b3);
          mma_16816(o[2 * dn2], pa, b0, b1);
          mma_16816(o[2 * dn2 + 1], pa, b2, b3);
          if constexpr (kSplit) {
            mma_16816(o[2 * dn2], pa_lo, b0, b1);
            mma_16816(o[2 * dn2 + 1], pa_lo, b2, b3);
          }
        }
      }
    }

    cp_async_wait<0>();  // only empty groups can remain; none may land in the merge buffers
    __syncthreads();     // every warp is done with the tiles
    if (active) {
      l_lo += __shfl_xor_sync(kFull, l_lo, 1);
      l_lo += __shfl_xor_sync(kFull, l_lo, 2);
      l_hi += __shfl_xor_sync(kFull, l_hi, 1);
      l_hi += __shfl_xor_sync(kFull, l_hi, 2);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = half ? r_hi : r_lo;
        if (r >= rows) continue;
        float* dst = merge_o + (key_group * rows_per_pass + r) * kMergeLd;
#pragma unroll
        for (int dn = 0; dn < kOTiles; ++dn)
          *reinterpret_cast<float2*>(dst + 8 * dn + 2 * t4) = make_float2(o[dn][2 * half], o[dn][2 * half + 1]);
        if (t4 == 0) {
          merge_ml[(key_group * rows_per_pass + r) * 2] = half ? m_hi : m_lo;
          merge_ml[(key_group * rows_per_pass + r) * 2 + 1] = half ? l_hi : l_lo;
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      float m = -INFINITY;
#pragma unroll
      for (int k = 0; k < kKeyGroups; ++k) m = fmaxf(m, merge_ml[(k * rows_per_pass + r) * 2]);
      float sum_o = 0.f, sum_l = 0.f;
      if (m != -INFINITY)  // else no key of this row in the work item: o = 0, l = 0
#pragma unroll
        for (int k = 0; k < kKeyGroups; ++k) {
          const float w = exp_scores(merge_ml[(k * rows_per_pass + r) * 2] - m);  // 0 for a group without keys
          sum_o += merge_o[(k * rows_per_pass + r) * kMergeLd + c] * w;
          sum_l += merge_ml[(k * rows_per_pass + r) * 2 + 1] * w;
        }
      const size_t row = static_cast<size_t>(b.part0 + qa + r / b.n_heads) * n_head + b.h0 + r % b.n_heads;
      if constexpr (kSplit) {      // decode only (attention_gqa), so the prefill kernel's registers stay as they were
        if (part_ml == nullptr) {  // the only work of its queries: the merge's o / l, as the output
          part_o[row * D + c] = sum_o / kPScale / sum_l;
          continue;
        }
      }
      part_o[row * D + c] = sum_o / kPScale;
      if (c == 0) {
        part_ml[row * 2] = kSplit ? m : m * 0.6931471805599453f;  // natural units (ln 2); -inf stays -inf
        part_ml[row * 2 + 1] = sum_l;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers.

// Query heads per block: the group split into as few blocks of at most kMaxGroupHeads as
// possible, evenly (a group of 6: 2 blocks of 3).
int heads_per_block(int group) {
  const int blocks = (group + kMaxGroupHeads - 1) / kMaxGroupHeads;
  return (group + blocks - 1) / blocks;
}

using AttnKernel = void (*)(const float*, const AttnWork*, int, int, int, int, float, float*, float*);

// Sets a kernel's shared-memory attributes once per device (`configured`: a bit per device index):
// the most dynamic shared memory it may use (`max_smem`), when above the 48 KB default, and the
// carveout preference all-shared, so an SM holds as many blocks as the kernel's other limits
// allow rather than what a carveout the driver picked leaves room for (K/V bypass L1: cp.async.cg).
void configure_once(AttnKernel kernel, size_t max_smem, std::atomic<uint64_t>& configured) {
  int device = 0;
  CTX_CUDA(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (configured.load(std::memory_order_acquire) & bit) return;
  if (max_smem > 48 * 1024) CTX_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_smem)));
  CTX_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  configured.fetch_or(bit, std::memory_order_release);
}

// Launches attention_tc_kernel<D, Config> over the work list, grid (KV heads x blocks per head,
// work items): at most 65535 work items per launch (the grid's y limit).
template <int D, typename Config>
void launch_tc(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int layer, float scale, float* part_o,
               float* part_ml, cudaStream_t st) {
  static std::atomic<uint64_t> configured{0};
  const AttnKernel kernel = attention_tc_kernel<D, Config>;
  configure_once(kernel, tc_smem_bytes<D, Config>(Config::kMaxSlabs), configured);
  const int group = n_head / n_head_kv, hpb = heads_per_block(group);
  const int slabs = Config::kMaxSlabs == 1 ? 1 : hpb;
  const size_t smem = tc_smem_bytes<D, Config>(slabs);
  const unsigned head_blocks = static_cast<unsigned>(n_head_kv * ((group + hpb - 1) / hpb));
  for (int first = 0; first < n_work; first += 65535) {
    const unsigned count = static_cast<unsigned>(std::min(65535, n_work - first));
    kernel<<<dim3(head_blocks, count), 32 * Config::kKeyGroups * slabs, smem, st>>>(q, work + first, n_head, n_head_kv, hpb, layer, scale,
                                                                                    part_o, part_ml);
    CTX_CUDA_LAUNCHED("attention_fast");
  }
}

template <typename Config>
void attention_tc(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                  float* part_o, float* part_ml, cudaStream_t st) {
  if (n_work <= 0) return;
  switch (head_dim) {
    case 32:
      return launch_tc<32, Config>(q, work, n_work, n_head, n_head_kv, layer, scale, part_o, part_ml, st);
    case 64:
      return launch_tc<64, Config>(q, work, n_work, n_head, n_head_kv, layer, scale, part_o, part_ml, st);
    case 96:
      return launch_tc<96, Config>(q, work, n_work, n_head, n_head_kv, layer, scale, part_o, part_ml, st);
    case 128:
      return launch_tc<128, Config>(q, work, n_work, n_head, n_head_kv, layer, scale, part_o, part_ml, st);
    default:
      if (part_ml == nullptr)
        throw std::invalid_argument("attention_gqa: no output without partials at head_dim " + std::to_string(head_dim));
      return attention(q, work, n_work, n_head, n_head_kv, head_dim, layer, scale, part_o, part_ml, st);
  }
}

}  // namespace

void attention_gqa(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                   float* part_o, float* part_ml, cudaStream_t st) {
  attention_tc<DecodeConfig>(q, work, n_work, n_head, n_head_kv, head_dim, layer, scale, part_o, part_ml, st);
}

void attention_prefill_tc(const float* q, const AttnWork* work, int n_work, int n_head, int n_head_kv, int head_dim, int layer, float scale,
                          float* part_o, float* part_ml, cudaStream_t st) {
  attention_tc<PrefillConfig>(q, work, n_work, n_head, n_head_kv, head_dim, layer, scale, part_o, part_ml, st);
}

namespace {

constexpr int kCombineThreads = 128;

// One block per (token, head). Every thread takes splits tid, tid + 128, ... for the maximum m*
// and the sum l (block reductions in shared memory); then the threads form `groups` groups of
// head_dim (thread tid: dimension tid % head_dim of group tid / head_dim), group g summing the
// output rows of splits g, g + groups, ...; the groups' sums are added in shared memory.
__global__ void attention_combine_wide_kernel(const float* part_o, const float* part_ml, const AttnCombine* comb, int n_head, int head_dim,
                                              float* out) {
  __shared__ float red[kCombineThreads];
  __shared__ float sums[kCombineThreads];
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const AttnCombine cb = comb[t];
  auto ml = [&](int s) { return part_ml + (static_cast<size_t>(cb.part0 + s * cb.stride) * n_head + h) * 2; };

  float m = -INFINITY;
  for (int s = tid; s < cb.n_splits; s += kCombineThreads) m = fmaxf(m, ml(s)[0]);
  red[tid] = m;
  __syncthreads();
  for (int w = kCombineThreads / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] = fmaxf(red[tid], red[tid + w]);
    __syncthreads();
  }
  const float m_star = red[0];
  __syncthreads();  // red is reused below

  float l = 0.f;
  for (int s = tid; s < cb.n_splits; s += kCombineThreads) {
    const float ms = ml(s)[0];
    if (ms != -INFINITY) l += ml(s)[1] * expf(ms - m_star);  // a split with no key this token may see adds nothing
  }
  red[tid] = l;
  __syncthreads();
  for (int w = kCombineThreads / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  const float l_sum = red[0];

  const int groups = kCombineThreads / head_dim;  // head_dim <= kMaxHeadDimGpu = 128
  const int g = tid / head_dim, c = tid % head_dim;
  float o = 0.f;
  if (g < groups) {
    for (int s = g; s < cb.n_splits; s += groups) {
      const float ms = ml(s)[0];
      if (ms == -INFINITY) continue;
      const size_t row = static_cast<size_t>(cb.part0 + s * cb.stride) * n_head + h;
      o += part_o[row * head_dim + c] * expf(ms - m_star);
    }
  }
  sums[tid] = o;
  __syncthreads();
  if (g == 0) {
    for (int k = 1; k < groups; ++k) o += sums[k * head_dim + c];
    out[(static_cast<size_t>(t) * n_head + h) * head_dim + c] = o / l_sum;
  }
}

}  // namespace

void attention_combine_wide(const float* part_o, const float* part_ml, const AttnCombine* comb, int n, int n_head, int head_dim, float* out,
                            cudaStream_t st) {
  if (head_dim > kMaxHeadDimGpu || head_dim % 32 != 0) {
    attention_combine(part_o, part_ml, comb, n, n_head, head_dim, out, st);
    return;
  }
  attention_combine_wide_kernel<<<dim3(n, n_head), kCombineThreads, 0, st>>>(part_o, part_ml, comb, n_head, head_dim, out);
  CTX_CUDA_LAUNCHED("attention_combine_wide");
}

}  // namespace ctx::cuda
