// CRC-32C: the standard check value, the published iSCSI vectors (RFC 3720 B.4), chaining, and
// the hardware path equal to the table path at every length and alignment, and the fused
// copy + CRC equal to a memcpy and a CRC.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "crc32c.h"

namespace {

uint32_t of(const std::vector<uint8_t>& v) { return ctx::crc32c(0, v.data(), v.size()); }

TEST(Crc32c, MatchesPublishedVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(ctx::crc32c(0, reinterpret_cast<const uint8_t*>(check.data()), check.size()), 0xE3069283u);
  EXPECT_EQ(of(std::vector<uint8_t>(32, 0x00)), 0x8A9136AAu);
  EXPECT_EQ(of(std::vector<uint8_t>(32, 0xff)), 0x62A8AB43u);
  std::vector<uint8_t> inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i), dec[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(of(inc), 0x46DD794Eu);
  EXPECT_EQ(of(dec), 0x113FDB5Cu);
  EXPECT_EQ(ctx::crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32c, HardwareEqualsTableAtEveryLengthAndOffsetAndChains) {
  std::vector<uint8_t> buf(1100);
  uint32_t x = 12345;
  for (auto& b : buf) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; n + off <= buf.size(); n += 37) {
      ASSERT_EQ(ctx::crc32c(0, buf.data() + off, n), ctx::crc32c_portable(0, buf.data() + off, n)) << off << "+" << n;
    }
  const uint32_t whole = ctx::crc32c(0, buf.data(), buf.size());
  EXPECT_EQ(ctx::crc32c(ctx::crc32c(0, buf.data(), 500), buf.data() + 500, buf.size() - 500), whole);
}

TEST(Crc32c, CopyEqualsMemcpyAndCrcAtEveryAlignment) {
  std::vector<uint8_t> src(700), dst(760);
  uint32_t x = 777;
  for (auto& b : src) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t s_off = 0; s_off < 5; ++s_off)
    for (size_t d_off = 0; d_off < 17; ++d_off)
      for (size_t n : {0u, 1u, 15u, 16u, 17u, 31u, 64u, 95u, 96u, 97u, 111u, 112u, 333u, 384u, 500u, 690u, 695u}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        const uint32_t prev = static_cast<uint32_t>(n * 2654435761u);
        const uint32_t got = ctx::crc32c_copy(prev, dst.data() + d_off, src.data() + s_off, n);
        ctx::crc32c_copy_fence();
        ASSERT_EQ(got, ctx::crc32c_portable(prev, src.data() + s_off, n)) << s_off << "/" << d_off << "+" << n;
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + s_off, n), 0) << s_off << "/" << d_off << "+" << n;
        for (size_t i = 0; i < dst.size(); ++i)  // not a byte outside [d_off, d_off + n)
          if (i < d_off || i >= d_off + n) ASSERT_EQ(dst[i], 0xEE) << "byte " << i;
      }
  std::vector<uint8_t> big(100000), out(100000);  // several blocks and a short last one
  for (auto& b : big) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t n : {12288u, 12289u, 12288u + 95u, 12288u + 96u, 99999u}) {
    EXPECT_EQ(ctx::crc32c_copy(7, out.data(), big.data(), n), ctx::crc32c_portable(7, big.data(), n)) << n;
    EXPECT_EQ(std::memcmp(out.data(), big.data(), n), 0) << n;
  }
}

}  // namespace
