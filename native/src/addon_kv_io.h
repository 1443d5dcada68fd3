// Bindings for moving KV bytes: argument parsing for a sequence's importRows/exportRows, and
// mapFile/unmapFile, which give JS a zero-copy view of a byte range of a shard file.
#pragma once
#include <napi.h>

#include <cstdint>

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

// Adds mapFile(path, offset, length) -> ArrayBuffer and unmapFile(buffer) to `exports`.
void init_file_map(Napi::Env env, Napi::Object exports);

}  // namespace ctx
