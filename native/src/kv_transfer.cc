#include "kv_transfer.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "crc32c.h"

namespace ctx {

size_t chunk_payload_bytes(const KvCache& kv, const ChunkRows& rows) {
  return static_cast<size_t>(rows.token_count) * rows.layers.size() * 2 * kv.row_elems() * sizeof(uint16_t);
}

void check_chunk_rows(const KvCache& kv, const ChunkRows& rows, size_t payload_bytes) {
  if (rows.layers.empty()) throw std::invalid_argument("a chunk needs at least one layer");
  std::vector<bool> seen(kv.n_layer(), false);
  for (int l : rows.layers) {
    if (l < 0 || l >= kv.n_layer())
      throw std::invalid_argument("layer " + std::to_string(l) + " is not in the model's " + std::to_string(kv.n_layer()) + " layers");
    if (seen[l]) throw std::invalid_argument("layer " + std::to_string(l) + " is listed twice");
    seen[l] = true;
  }
  if (rows.token_start < 0 || rows.token_count <= 0 || static_cast<long long>(rows.token_start) + rows.token_count > kv.capacity())
    throw std::invalid_argument("tokens " + std::to_string(rows.token_start) + "+" + std::to_string(rows.token_count) +
                                " exceed the sequence capacity " + std::to_string(kv.capacity()));
  const size_t need = chunk_payload_bytes(kv, rows);
  if (payload_bytes != need)
    throw std::invalid_argument("payload has " + std::to_string(payload_bytes) + " bytes, the rows need " + std::to_string(need));
}

namespace {
// Calls f(offset in payload, layer, token) for every (token, layer) pair in payload order, so the
// payload is walked sequentially; each pair is a K row then a V row of row_bytes each.
template <typename F>
void for_each_row_pair(const KvCache& kv, const ChunkRows& rows, F f) {
  const size_t pair_bytes = 2 * kv.row_elems() * sizeof(uint16_t);
  size_t at = 0;
  for (int t = rows.token_start; t < rows.token_start + rows.token_count; ++t)
    for (int l : rows.layers) {
      f(at, l, t);
      at += pair_bytes;
    }
}
}  // namespace

// A sliding-window layer's ring row takes position t only over an older one (kv_cache.h), so
// chunks may come in any order and the ring ends up holding the newest positions.
void import_chunk_rows(KvCache& kv, const ChunkRows& rows, const uint8_t* payload, size_t payload_bytes) {
  check_chunk_rows(kv, rows, payload_bytes);
  const size_t rb = kv.row_elems() * sizeof(uint16_t);
  for_each_row_pair(kv, rows, [&](size_t at, int l, int t) {
    if (!kv.may_write(l, t)) return;
    std::memcpy(kv.k(l, t), payload + at, rb);
    std::memcpy(kv.v(l, t), payload + at + rb, rb);
    kv.imported(l, t);
  });
}

ChunkImport import_chunk_checked(KvCache& kv, const ChunkRows& rows, const uint8_t* chunk, size_t chunk_bytes, size_t header_bytes) {
  constexpr size_t kSumAt = 8, kSumEnd = 12;  // the checksum field, left out of its own sum
  if (header_bytes < kSumEnd || header_bytes > chunk_bytes)
    throw std::invalid_argument("a chunk of " + std::to_string(chunk_bytes) + " bytes cannot hold a header of " +
                                std::to_string(header_bytes));
  const uint8_t* payload = chunk + header_bytes;
  check_chunk_rows(kv, rows, chunk_bytes - header_bytes);
  ChunkImport r{};
  std::memcpy(&r.stored, chunk + kSumAt, sizeof r.stored);  // little-endian, as x86 and arm64 are
  uint32_t crc = crc32c(0, chunk, kSumAt);
  crc = crc32c(crc, chunk + kSumEnd, header_bytes - kSumEnd);
  const size_t rb = kv.row_elems() * sizeof(uint16_t);
  for_each_row_pair(kv, rows, [&](size_t at, int l, int t) {
    if (!kv.may_write(l, t)) {  // a ring row holding a newer position: checked, not copied
      crc = crc32c(crc, payload + at, 2 * rb);
      return;
    }
    crc = crc32c_copy(crc, reinterpret_cast<uint8_t*>(kv.k(l, t)), payload + at, rb);
    crc = crc32c_copy(crc, reinterpret_cast<uint8_t*>(kv.v(l, t)), payload + at + rb, rb);
    kv.imported(l, t);
  });
  crc32c_copy_fence();
  r.computed = crc;
  return r;
}

void export_chunk_rows(const KvCache& kv, const ChunkRows& rows, uint8_t* payload, size_t payload_bytes) {
  check_chunk_rows(kv, rows, payload_bytes);
  for (int l : rows.layers) {
    if (!kv.in_ring(l)) continue;
    for (int t = rows.token_start; t < rows.token_start + rows.token_count; ++t)
      if (!kv.holds(l, t))
        throw std::invalid_argument("sliding-window layer " + std::to_string(l) + " does not hold token " + std::to_string(t) + " of " +
                                    std::to_string(rows.token_start) + "+" + std::to_string(rows.token_count) +
                                    " (its ring keeps the last " + std::to_string(kv.ring_rows()) + " positions)");
  }
  const size_t rb = kv.row_elems() * sizeof(uint16_t);
  for_each_row_pair(kv, rows, [&](size_t at, int l, int t) {
    std::memcpy(payload + at, kv.k(l, t), rb);
    std::memcpy(payload + at + rb, kv.v(l, t), rb);
  });
}

}  // namespace ctx
