// Bindings for moving KV bytes: argument parsing for a sequence's importRows/exportRows,
// mapFile/unmapFile (a zero-copy view of a byte range of a shard file), crc32c (checksums) and
// punchHole (returning a freed shard range's pages).
#pragma once
#include <napi.h>

#include <cstdint>
#include <memory>

#include "kv_cache.h"
#include "kv_transfer.h"

namespace ctx {

struct BytesArg {
  uint8_t* data;
  size_t size;
};

// info[i] as a Uint8Array (or Buffer); TypeError otherwise.
BytesArg bytes_arg(const Napi::CallbackInfo& info, size_t i, const char* what);
// (layerIds: number[] | Int32Array, tokenStart: number, tokenCount: number) from info[i..i+2].
ChunkRows chunk_rows_arg(const Napi::CallbackInfo& info, size_t i);

// A promise for KvCache::prefault of rows [from, to) on a libuv worker; resolves to false where
// the kernel cannot prefault. Holds `kv` (aliasing its sequence) until done.
Napi::Promise prefault_rows(Napi::Env env, std::shared_ptr<const KvCache> kv, int from, int to);

// Adds mapFile(path, offset, length, expectId?, populate?) -> ArrayBuffer, unmapFile(buffer),
// populateMapped(buffer, offset, length) -> Promise<void>,
// crc32c(bytes, prev?) -> number and punchHole(fd, offset, length) -> boolean to `exports`.
void init_kv_io(Napi::Env env, Napi::Object exports);

}  // namespace ctx
