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

}  // namespace ctx
