// CRC-32C (Castagnoli), the checksum of KV chunks: hardware-accelerated with SSE4.2's crc32
// instruction where the CPU has it (its speed against zlib's crc32: bench/checksum/README.md), a table
// otherwise; both give the standard values (crc32c("123456789") = 0xE3069283).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ctx {

// Continues the CRC `prev` (the value a previous call returned, 0 to start) over `n` bytes, like
// zlib's crc32(prev, p, n): crc32c(crc32c(0, a), b) == crc32c(0, a || b).
uint32_t crc32c(uint32_t prev, const uint8_t* p, size_t n);
uint32_t crc32c_portable(uint32_t prev, const uint8_t* p, size_t n);  // the table path, for tests

// Copies n bytes from src to dst (not overlapping) and continues the CRC `prev` over them, in one
// pass over src. The stores are non-temporal where the CPU has SSE4.2: for bulk moves whose
// destination is not read again soon (a KV import), they skip reading dst's lines into the cache
// first. Call crc32c_copy_fence() after the last copy, before another thread reads dst.
uint32_t crc32c_copy(uint32_t prev, uint8_t* dst, const uint8_t* src, size_t n);
void crc32c_copy_fence();

}  // namespace ctx
