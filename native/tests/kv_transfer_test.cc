// Chunk row transfer: the token-major payload layout ([token][layer][K|V][kv_dim]) against an
// index-by-index reference, export/import round trips, and every refusal.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kv_transfer.h"

namespace {

using ctx::ChunkRows;
using ctx::KvCache;

// A value that names its place: layer, K or V, token, element.
uint16_t tag(int l, int kv, int t, int i) { return static_cast<uint16_t>(l * 10000 + kv * 5000 + t * 100 + i); }

void fill(KvCache& kv) {
  for (int l = 0; l < kv.n_layer(); ++l)
    for (int t = 0; t < kv.capacity(); ++t)
      for (int i = 0; i < kv.kv_dim(); ++i) {
        kv.k(l, t)[i] = tag(l, 0, t, i);
        kv.v(l, t)[i] = tag(l, 1, t, i);
      }
}

TEST(KvTransfer, ExportWritesTokenMajorRowsInListedLayerOrder) {
  const int L = 4, D = 6, C = 12;
  KvCache kv(L, D, C);
  fill(kv);
  const ChunkRows rows{{3, 0, 2}, 5, 4};
  std::vector<uint16_t> payload(ctx::chunk_payload_bytes(kv, rows) / 2);
  ctx::export_chunk_rows(kv, rows, reinterpret_cast<uint8_t*>(payload.data()), payload.size() * 2);
  size_t at = 0;
  for (int t = 5; t < 9; ++t)
    for (int l : rows.layers)
      for (int which = 0; which < 2; ++which)
        for (int i = 0; i < D; ++i) ASSERT_EQ(payload[at++], tag(l, which, t, i)) << "t=" << t << " l=" << l;
  EXPECT_EQ(at, payload.size());
}

TEST(KvTransfer, ImportRestoresExactlyTheListedRows) {
  const int L = 3, D = 8, C = 10;
  KvCache src(L, D, C), dst(L, D, C);
  fill(src);
  const ChunkRows rows{{0, 2}, 2, 6};
  std::vector<uint8_t> payload(ctx::chunk_payload_bytes(src, rows));
  ctx::export_chunk_rows(src, rows, payload.data(), payload.size());
  ctx::import_chunk_rows(dst, rows, payload.data(), payload.size());
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t) {
      const bool inside = l != 1 && t >= 2 && t < 8;
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(dst.k(l, t)[i], inside ? tag(l, 0, t, i) : 0);
        ASSERT_EQ(dst.v(l, t)[i], inside ? tag(l, 1, t, i) : 0);
      }
    }
  EXPECT_EQ(dst.size(), 0);  // the caller declares the length
}

TEST(KvTransfer, RefusesBadRowsAndSizes) {
  KvCache kv(2, 4, 8);
  std::vector<uint8_t> buf(4096);
  auto import = [&](ChunkRows rows, size_t bytes) { ctx::import_chunk_rows(kv, rows, buf.data(), bytes); };
  const size_t one = 2 * 4 * 2;  // one token of one layer: K and V rows
  EXPECT_THROW(import({{}, 0, 1}, 0), std::invalid_argument);
  EXPECT_THROW(import({{2}, 0, 1}, one), std::invalid_argument);
  EXPECT_THROW(import({{-1}, 0, 1}, one), std::invalid_argument);
  EXPECT_THROW(import({{0, 0}, 0, 1}, 2 * one), std::invalid_argument);
  EXPECT_THROW(import({{0}, 7, 2}, 2 * one), std::invalid_argument);
  EXPECT_THROW(import({{0}, -1, 1}, one), std::invalid_argument);
  EXPECT_THROW(import({{0}, 0, 0}, 0), std::invalid_argument);
  EXPECT_THROW(import({{0}, 0, 2}, one), std::invalid_argument);
  EXPECT_NO_THROW(import({{0, 1}, 6, 2}, 4 * one));
  try {
    import({{0}, 0, 2}, one);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("payload has 16 bytes, the rows need 32"), std::string::npos) << e.what();
  }
}

}  // namespace
