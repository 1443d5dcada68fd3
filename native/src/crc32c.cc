#include "crc32c.h"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <nmmintrin.h>
#include <smmintrin.h>
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

// crc32c_sse42 fused with a copy: 16 bytes at a time into dst with streaming stores (once dst is
// 16-byte aligned), each checksummed as two 8-byte words from the register it was loaded into.
__attribute__((target("sse4.2"))) uint32_t crc32c_copy_sse42(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
  uint32_t c32 = crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(dst) & 15) != 0) {
    c32 = _mm_crc32_u8(c32, *src);
    *dst++ = *src++;
    --n;
  }
  uint64_t c = c32;
  while (n >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_cvtsi128_si64(v)));
    c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(v, 1)));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
    src += 16;
    dst += 16;
    n -= 16;
  }
  c32 = static_cast<uint32_t>(c);
  while (n--) {
    c32 = _mm_crc32_u8(c32, *src);
    *dst++ = *src++;
  }
  return c32;
}

// The CRC register after `len` zero bytes, as a linear map of the register before them (tables
// of its values by byte): what joins the CRCs of pieces checksummed side by side.
struct ZerosShift {
  size_t len = SIZE_MAX;
  uint32_t t[4][256];
  __attribute__((target("sse4.2"))) void build(size_t n) {
    uint32_t basis[32];
    for (int j = 0; j < 32; ++j) {
      uint64_t c = 1u << j;
      for (size_t i = 0; i < n / 8; ++i) c = _mm_crc32_u64(c, 0);
      uint32_t c32 = static_cast<uint32_t>(c);
      for (size_t i = 0; i < n % 8; ++i) c32 = _mm_crc32_u8(c32, 0);
      basis[j] = c32;
    }
    for (int k = 0; k < 4; ++k)
      for (int b = 0; b < 256; ++b) {
        uint32_t x = 0;
        for (int i = 0; i < 8; ++i)
          if ((b >> i) & 1) x ^= basis[8 * k + i];
        t[k][b] = x;
      }
    len = n;
  }
  uint32_t apply(uint32_t v) const { return t[0][v & 255] ^ t[1][(v >> 8) & 255] ^ t[2][(v >> 16) & 255] ^ t[3][v >> 24]; }
};

// The shift for `n` bytes, built once per thread for the last four lengths asked (a KV import asks
// the same two, row after row; crc32c_copy's blocks two more). Valid until the next call.
const ZerosShift& shift_for(size_t n) {
  thread_local ZerosShift cache[4];
  thread_local int next = 0;
  for (const ZerosShift& s : cache)
    if (s.len == n) return s;
  ZerosShift& s = cache[next];
  next = (next + 1) % 4;
  s.build(n);
  return s;
}

// crc32c_copy_sse42 over three pieces at once: one crc32 chain waits on the previous result (3
// cycles), three chains keep the unit busy every cycle. Pieces of m, m and n - 2m bytes (m a
// multiple of 16, so dst stays aligned), their CRCs joined with ZerosShift. dst 16-byte aligned.
__attribute__((target("sse4.2"))) uint32_t crc32c_copy3_sse42(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t m = (n / 3) & ~size_t{15};
  uint64_t c0 = crc, c1 = 0, c2 = 0;
  for (size_t i = 0; i < m; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + m + i));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * m + i));
    c0 = _mm_crc32_u64(c0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
    c1 = _mm_crc32_u64(c1, static_cast<uint64_t>(_mm_cvtsi128_si64(b)));
    c2 = _mm_crc32_u64(c2, static_cast<uint64_t>(_mm_cvtsi128_si64(c)));
    c0 = _mm_crc32_u64(c0, static_cast<uint64_t>(_mm_extract_epi64(a, 1)));
    c1 = _mm_crc32_u64(c1, static_cast<uint64_t>(_mm_extract_epi64(b, 1)));
    c2 = _mm_crc32_u64(c2, static_cast<uint64_t>(_mm_extract_epi64(c, 1)));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + m + i), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 2 * m + i), c);
  }
  // The rest of the third piece, one chain on.
  const uint32_t third = crc32c_copy_sse42(static_cast<uint32_t>(c2), dst + 3 * m, src + 3 * m, n - 3 * m);
  const uint32_t first_two = shift_for(m).apply(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
  return shift_for(n - 2 * m).apply(first_two) ^ third;
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

uint32_t crc32c_copy(uint32_t prev, uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (has_sse42()) {
    constexpr size_t kThreeWayMin = 96;  // below it the join costs more than the chains save
    constexpr size_t kBlock = 3 * 4096;  // longer copies go by blocks, so the shifts have few lengths
    if (n < kThreeWayMin || (reinterpret_cast<uintptr_t>(dst) & 15) != 0) return ~crc32c_copy_sse42(~prev, dst, src, n);
    uint32_t c = ~prev;
    for (; n > kBlock; n -= kBlock, dst += kBlock, src += kBlock) c = crc32c_copy3_sse42(c, dst, src, kBlock);
    return ~(n >= kThreeWayMin ? crc32c_copy3_sse42(c, dst, src, n) : crc32c_copy_sse42(c, dst, src, n));
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
  return crc32c(prev, src, n);
}

void crc32c_copy_fence() {
#if defined(__x86_64__)
  _mm_sfence();  // streaming stores are weakly ordered
#endif
}

}  // namespace ctx
