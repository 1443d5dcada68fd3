#include "crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ctx {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t prev, const uint8_t* p, size_t n) {
  uint32_t c = ~prev;
  while (n--) c = kTable[(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(uint32_t prev, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_sse42(~prev, p, n);
#endif
  return crc32c_portable(prev, p, n);
}

}  // namespace ctx
