// KvCache: the documented layout (layer-major, K then V, [token][kv_dim] rows), no overlap
// between rows, size bounds and byte accounting.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "kv_cache.h"

namespace {

using ctx::KvCache;

TEST(KvCache, AddressesFollowTheDocumentedLayout) {
  const int L = 3, D = 24, C = 10;
  KvCache kv(L, D, C);
  EXPECT_EQ(kv.n_layer(), L);
  EXPECT_EQ(kv.kv_dim(), D);
  EXPECT_EQ(kv.capacity(), C);
  EXPECT_EQ(kv.row_elems(), static_cast<size_t>(D));
  const uint16_t* base = kv.k(0);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t) {
      // Layer l's K at element l*2*C*D, its V C*D later (the layout kvBuffer() exposes to JS).
      EXPECT_EQ(kv.k(l, t) - base, static_cast<ptrdiff_t>(l) * 2 * C * D + t * D);
      EXPECT_EQ(kv.v(l, t) - base, static_cast<ptrdiff_t>(l) * 2 * C * D + C * D + t * D);
      const KvCache& ckv = kv;
      EXPECT_EQ(ckv.k(l, t), kv.k(l, t));
      EXPECT_EQ(ckv.v(l, t), kv.v(l, t));
    }
}

TEST(KvCache, RowsAreDisjointAndStartZeroed) {
  const int L = 2, D = 16, C = 5;
  KvCache kv(L, D, C);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(kv.k(l, t)[i], 0);
        ASSERT_EQ(kv.v(l, t)[i], 0);
      }
  auto tag = [&](int l, int t, int which) { return static_cast<uint16_t>(1 + ((l * C + t) * 2 + which)); };
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        kv.k(l, t)[i] = tag(l, t, 0);
        kv.v(l, t)[i] = tag(l, t, 1);
      }
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(kv.k(l, t)[i], tag(l, t, 0));
        ASSERT_EQ(kv.v(l, t)[i], tag(l, t, 1));
      }
}

TEST(KvCache, SizeBoundsAndByteAccounting) {
  const int L = 30, D = 192, C = 100;
  KvCache kv(L, D, C);
  EXPECT_EQ(kv.size(), 0);
  EXPECT_EQ(kv.bytes_used(), 0u);
  EXPECT_EQ(kv.bytes_reserved(), static_cast<size_t>(L) * 2 * C * D * 2);
  EXPECT_EQ(kv.layer_bytes(), static_cast<size_t>(C) * D * 2);
  kv.set_size(7);
  EXPECT_EQ(kv.size(), 7);
  // 30 layers x (K + V) x 192 f16 = 22.5 KiB per token, as for SmolLM2-135M.
  EXPECT_EQ(kv.bytes_used(), 7u * 23040);
  kv.set_size(C);
  EXPECT_EQ(kv.bytes_used(), kv.bytes_reserved());
  EXPECT_THROW(kv.set_size(C + 1), std::out_of_range);
  EXPECT_THROW(kv.set_size(-1), std::out_of_range);
  EXPECT_EQ(kv.size(), C);  // unchanged by the refused calls
  kv.set_size(0);
  EXPECT_EQ(kv.bytes_used(), 0u);
}

TEST(KvCache, RefusesNonPositiveDimensions) {
  EXPECT_THROW(KvCache(0, 8, 8), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 0, 8), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 8, 0), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 8, -5), std::invalid_argument);
}

// The whole capacity is reserved up front without committing memory: a full 8192-token cache
// for SmolLM2 (180 MiB) is cheap until written.
TEST(KvCache, LargeReservationIsLazy) {
  KvCache kv(30, 192, 8192);
  EXPECT_EQ(kv.bytes_reserved(), 30u * 2 * 8192 * 192 * 2);
  kv.k(29, 8191)[191] = 0x3C00;
  kv.v(29, 8191)[191] = 0x3C00;
  EXPECT_EQ(kv.v(29, 8191) + 192, kv.k(0) + kv.bytes_reserved() / 2);  // last element ends the block
}

}  // namespace
