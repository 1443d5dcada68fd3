// Chunk row transfer: the token-major payload layout ([token][layer][K|V][kv_dim]) against an
// index-by-index reference, export/import round trips, the checksummed import of a whole chunk
// against a separate CRC-32C + import, and every refusal.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "crc32c.h"
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

// A chunk as import_chunk_checked reads it: `header` bytes (any content; the checksum at [8, 12))
// then the export of `rows`, sealed like chunk.ts sealChunk: CRC-32C of [0, 8) then [12, end).
std::vector<uint8_t> sealed_chunk(const KvCache& src, const ChunkRows& rows, size_t header) {
  std::vector<uint8_t> chunk(header + ctx::chunk_payload_bytes(src, rows));
  for (size_t i = 0; i < header; ++i) chunk[i] = static_cast<uint8_t>(i * 7 + 1);
  ctx::export_chunk_rows(src, rows, chunk.data() + header, chunk.size() - header);
  const uint32_t sum = ctx::crc32c(ctx::crc32c(0, chunk.data(), 8), chunk.data() + 12, chunk.size() - 12);
  std::memcpy(chunk.data() + 8, &sum, 4);
  return chunk;
}

bool same_cache(const KvCache& a, const KvCache& b) {
  for (int l = 0; l < a.n_layer(); ++l)
    for (int t = 0; t < a.capacity(); ++t)
      if (std::memcmp(a.k(l, t), b.k(l, t), a.row_elems() * 2) != 0 || std::memcmp(a.v(l, t), b.v(l, t), a.row_elems() * 2) != 0)
        return false;
  return true;
}

TEST(KvTransfer, CheckedImportMatchesASeparateChecksumAndImport) {
  const int L = 4, D = 200, C = 40;  // 400-byte rows: crc32c_copy's three-chain path
  KvCache src(L, D, C), fused(L, D, C), separate(L, D, C);
  fill(src);
  const ChunkRows rows{{1, 3}, 5, 30};
  const size_t header = 128;
  const std::vector<uint8_t> chunk = sealed_chunk(src, rows, header);
  const ctx::ChunkImport r = ctx::import_chunk_checked(fused, rows, chunk.data(), chunk.size(), header);
  uint32_t stored;
  std::memcpy(&stored, chunk.data() + 8, 4);
  EXPECT_EQ(r.stored, stored);
  EXPECT_EQ(r.computed, ctx::crc32c(ctx::crc32c(0, chunk.data(), 8), chunk.data() + 12, chunk.size() - 12));
  EXPECT_TRUE(r.ok());
  ctx::import_chunk_rows(separate, rows, chunk.data() + header, chunk.size() - header);
  EXPECT_TRUE(same_cache(fused, separate));
  EXPECT_EQ(fused.size(), 0);  // the caller declares the length
}

TEST(KvTransfer, CheckedImportCatchesEveryCorruptByte) {
  const int L = 2, D = 56, C = 6;
  KvCache src(L, D, C), dst(L, D, C);
  fill(src);
  const ChunkRows rows{{0, 1}, 1, 3};
  const size_t header = 64;
  const std::vector<uint8_t> good = sealed_chunk(src, rows, header);
  ASSERT_TRUE(ctx::import_chunk_checked(dst, rows, good.data(), good.size(), header).ok());
  for (size_t at = 0; at < good.size(); ++at) {  // header, checksum field and payload alike
    std::vector<uint8_t> bad = good;
    bad[at] ^= 0x10;
    EXPECT_FALSE(ctx::import_chunk_checked(dst, rows, bad.data(), bad.size(), header).ok()) << "byte " << at;
  }
}

TEST(KvTransfer, CheckedImportRefusesShortChunksAndBadHeaders) {
  KvCache src(2, 4, 8), dst(2, 4, 8);
  fill(src);
  const ChunkRows rows{{0}, 2, 3};
  const size_t header = 64;
  const std::vector<uint8_t> chunk = sealed_chunk(src, rows, header);
  auto import = [&](size_t bytes, size_t header_bytes) { return ctx::import_chunk_checked(dst, rows, chunk.data(), bytes, header_bytes); };
  EXPECT_THROW(import(0, header), std::invalid_argument);                 // zero-length
  EXPECT_THROW(import(0, 0), std::invalid_argument);                      // no room for the checksum
  EXPECT_THROW(import(header - 1, header), std::invalid_argument);        // shorter than its header
  EXPECT_THROW(import(header, header), std::invalid_argument);            // a header and no payload
  EXPECT_THROW(import(chunk.size() - 1, header), std::invalid_argument);  // payload truncated
  EXPECT_THROW(import(chunk.size(), header + 2), std::invalid_argument);  // header size wrong
  EXPECT_THROW(ctx::import_chunk_checked(dst, {{0}, 7, 3}, chunk.data(), chunk.size(), header),
               std::invalid_argument);             // rows off the cache
  EXPECT_TRUE(same_cache(dst, KvCache(2, 4, 8)));  // nothing was written
  EXPECT_TRUE(import(chunk.size(), header).ok());
}

}  // namespace
