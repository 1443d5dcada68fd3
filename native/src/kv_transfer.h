// Moves KV rows between a sequence's layer-major cache and a chunk payload, which is token-major:
// for each token, for each listed layer, K then V rows of kv_dim f16 values (docs/kv-format.md). This is
// the transpose that a KV import (decode) and export (prefill) need; done here with memcpy per row
// instead of in JS, and straight from a mapped shard file, so a same-host import copies once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv_cache.h"

namespace ctx {

struct ChunkRows {
  std::vector<int> layers;  // distinct, each in [0, n_layer)
  int token_start = 0;
  int token_count = 0;
};

// Bytes a payload of these rows holds for a cache of this shape.
size_t chunk_payload_bytes(const KvCache& kv, const ChunkRows& rows);

// Checks `rows` against the cache (layers, token range within capacity) and the payload size;
// throws std::invalid_argument naming what is wrong.
void check_chunk_rows(const KvCache& kv, const ChunkRows& rows, size_t payload_bytes);

// payload -> cache rows. Does not change the cache's size (the caller declares the length).
void import_chunk_rows(KvCache& kv, const ChunkRows& rows, const uint8_t* payload, size_t payload_bytes);

// A whole chunk (header + payload, docs/kv-format.md) -> cache rows, verifying its checksum in the
// same pass: CRC-32C of bytes [0, 8) and [12, header_bytes), then of each row of the payload as it
// is copied into the cache (crc32c_copy: one read of the payload, streaming stores into the cache).
// The caller has parsed the header (header_bytes, rows).
// Throws std::invalid_argument when the sizes or rows do not fit; otherwise writes the rows and
// returns the result (the rows are written whether or not the checksums match: the caller
// declares the length only for a chunk that verified).
struct ChunkImport {
  uint32_t stored;    // the checksum in the header, bytes [8, 12)
  uint32_t computed;  // the checksum of the bytes
  bool ok() const { return stored == computed; }
};
ChunkImport import_chunk_checked(KvCache& kv, const ChunkRows& rows, const uint8_t* chunk, size_t chunk_bytes, size_t header_bytes);

// cache rows -> payload.
void export_chunk_rows(const KvCache& kv, const ChunkRows& rows, uint8_t* payload, size_t payload_bytes);

}  // namespace ctx
