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

// cache rows -> payload.
void export_chunk_rows(const KvCache& kv, const ChunkRows& rows, uint8_t* payload, size_t payload_bytes);

}  // namespace ctx
