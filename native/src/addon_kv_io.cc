#include "addon_kv_io.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "crc32c.h"
#include "file_map.h"

namespace ctx {

BytesArg bytes_arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a Uint8Array");
  Napi::Uint8Array a = info[i].As<Napi::Uint8Array>();
  return {a.Data(), a.ByteLength()};
}

namespace {
int int_arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a number");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (v != static_cast<double>(static_cast<int>(v)))
    throw Napi::RangeError::New(info.Env(), std::string(what) + " must be an integer in the int32 range");
  return static_cast<int>(v);
}
}  // namespace

ChunkRows chunk_rows_arg(const Napi::CallbackInfo& info, size_t i) {
  Napi::Env env = info.Env();
  ChunkRows rows;
  if (info.Length() > i && info[i].IsArray()) {
    Napi::Array a = info[i].As<Napi::Array>();
    for (uint32_t j = 0; j < a.Length(); ++j) {
      Napi::Value v = a.Get(j);
      if (!v.IsNumber()) throw Napi::TypeError::New(env, "layerIds must hold numbers");
      const double d = v.As<Napi::Number>().DoubleValue();
      if (d != static_cast<double>(static_cast<int>(d))) throw Napi::RangeError::New(env, "layerIds must be integers");
      rows.layers.push_back(static_cast<int>(d));
    }
  } else if (info.Length() > i && info[i].IsTypedArray() && info[i].As<Napi::TypedArray>().TypedArrayType() == napi_int32_array) {
    Napi::Int32Array a = info[i].As<Napi::Int32Array>();
    rows.layers.assign(a.Data(), a.Data() + a.ElementLength());
  } else {
    throw Napi::TypeError::New(env, "layerIds must be an array of layer numbers or an Int32Array");
  }
  rows.token_start = int_arg(info, i + 1, "tokenStart");
  rows.token_count = int_arg(info, i + 2, "tokenCount");
  return rows;
}

namespace {

// Live mappings by the address JS sees, so unmapFile(buffer) can find its mapping. The finalizer
// (at garbage collection) and unmapFile both run on JS threads; the lock covers worker threads.
std::mutex maps_mutex;
std::unordered_map<const void*, std::shared_ptr<FileMap>> live_maps;

Napi::Value MapFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || info.Length() > 5 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsNumber() ||
      (info.Length() >= 4 && !info[3].IsString() && !info[3].IsUndefined()) ||
      (info.Length() == 5 && !info[4].IsBoolean() && !info[4].IsUndefined()))
    throw Napi::TypeError::New(
        env, "mapFile(path, offset, length, expectId?, populate?) needs a string, two numbers, an optional string and an optional boolean");
  const std::string expect_id = info.Length() >= 4 && info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "";
  const bool populate = !(info.Length() == 5 && info[4].IsBoolean() && !info[4].As<Napi::Boolean>().Value());
  const double offset = info[1].As<Napi::Number>().DoubleValue();
  const double length = info[2].As<Napi::Number>().DoubleValue();
  constexpr double kMaxSafe = 9007199254740991.0;
  if (!(offset >= 0 && offset <= kMaxSafe && offset == static_cast<double>(static_cast<uint64_t>(offset))) ||
      !(length > 0 && length <= kMaxSafe && length == static_cast<double>(static_cast<uint64_t>(length))))
    throw Napi::RangeError::New(env, "mapFile: offset must be a non-negative integer and length a positive integer");
  std::shared_ptr<FileMap> map;
  try {
    map = std::make_shared<FileMap>(info[0].As<Napi::String>().Utf8Value(), static_cast<uint64_t>(offset), static_cast<uint64_t>(length),
                                    expect_id, populate);
  } catch (const FileMapError& e) {
    Napi::Error err = Napi::Error::New(env, e.what());
    err.Set("code", Napi::String::New(env, e.code));
    throw err;
  }
  {
    std::lock_guard<std::mutex> lock(maps_mutex);
    live_maps[map->data()] = map;
  }
  auto* hold = new std::shared_ptr<FileMap>(map);
  return Napi::ArrayBuffer::New(
      env, map->data(), map->size(),
      [](Napi::Env, void* data, std::shared_ptr<FileMap>* h) {
        {
          std::lock_guard<std::mutex> lock(maps_mutex);
          auto it = live_maps.find(data);
          if (it != live_maps.end() && it->second == *h) live_maps.erase(it);
        }
        delete h;  // the last owner unmaps
      },
      hold);
}

// unmapFile(buffer): detaches the ArrayBuffer (every view of it becomes empty, so no JS code can
// touch the pages afterwards) and unmaps it now rather than at some later garbage collection.
Napi::Value UnmapFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 1 || !info[0].IsArrayBuffer()) throw Napi::TypeError::New(env, "unmapFile(buffer) needs an ArrayBuffer");
  Napi::ArrayBuffer ab = info[0].As<Napi::ArrayBuffer>();
  const void* data = ab.Data();
  std::shared_ptr<FileMap> map;
  {
    std::lock_guard<std::mutex> lock(maps_mutex);
    auto it = live_maps.find(data);
    if (data == nullptr || it == live_maps.end()) throw Napi::Error::New(env, "unmapFile: the buffer is not a live mapping from mapFile()");
    map = it->second;
    live_maps.erase(it);
  }
  ab.Detach();
  map->unmap();
  return env.Undefined();
}

// Maps in a range of a mapping's pages on a libuv worker thread, so a reader can import one chunk
// while the next one's pages are mapped in. Holds the mapping; an unmapFile() meanwhile is the
// caller's mistake and only makes the madvise fail (ShmTransport unmaps only when no view is out).
class PopulateWorker : public Napi::AsyncWorker {
 public:
  PopulateWorker(Napi::Env env, std::shared_ptr<FileMap> map, size_t offset, size_t length)
      : Napi::AsyncWorker(env), map_(std::move(map)), offset_(offset), length_(length), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }
  void Execute() override { map_->populate(offset_, length_); }
  void OnOK() override { deferred_.Resolve(Env().Undefined()); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::shared_ptr<FileMap> map_;
  size_t offset_, length_;
  Napi::Promise::Deferred deferred_;
};

// The worker behind prefault_rows: the spans are taken here, on the JS thread that owns the
// cache's layout; the worker only touches their pages (kv_cache.h: prefault).
class PrefaultWorker : public Napi::AsyncWorker {
 public:
  PrefaultWorker(Napi::Env env, std::shared_ptr<const KvCache> kv, int from, int to)
      : Napi::AsyncWorker(env),
        kv_(std::move(kv)),
        spans_(kv_->row_spans()),
        gen_(kv_->generation()),
        from_(from),
        to_(to),
        deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }
  void Execute() override { done_ = kv_->prefault(spans_, from_, to_, gen_); }
  void OnOK() override { deferred_.Resolve(Napi::Boolean::New(Env(), done_)); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::shared_ptr<const KvCache> kv_;
  std::vector<KvCache::RowSpan> spans_;
  uint32_t gen_;
  int from_, to_;
  bool done_ = false;
  Napi::Promise::Deferred deferred_;
};

// populateMapped(buffer, offset, length) -> Promise<void>: maps in the pages behind bytes
// [offset, offset + length) of a live mapFile(..., populate = false) buffer, off the JS thread.
Napi::Value PopulateMapped(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 3 || !info[0].IsArrayBuffer() || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "populateMapped(buffer, offset, length) needs an ArrayBuffer and two numbers");
  const void* data = info[0].As<Napi::ArrayBuffer>().Data();
  const double offset = info[1].As<Napi::Number>().DoubleValue();
  const double length = info[2].As<Napi::Number>().DoubleValue();
  std::shared_ptr<FileMap> map;
  {
    std::lock_guard<std::mutex> lock(maps_mutex);
    auto it = live_maps.find(data);
    if (data == nullptr || it == live_maps.end())
      throw Napi::Error::New(env, "populateMapped: the buffer is not a live mapping from mapFile()");
    map = it->second;
  }
  const double size = static_cast<double>(map->size());
  if (!(offset >= 0 && length >= 0 && offset == static_cast<double>(static_cast<uint64_t>(offset)) &&
        length == static_cast<double>(static_cast<uint64_t>(length)) && offset + length <= size))
    throw Napi::RangeError::New(env, "populateMapped: the range must be whole numbers inside the mapping");
  auto* worker = new PopulateWorker(env, std::move(map), static_cast<size_t>(offset), static_cast<size_t>(length));
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// crc32c(bytes, prev = 0): continues a CRC-32C over bytes (chunk checksums).
Napi::Value Crc32c(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const BytesArg bytes = bytes_arg(info, 0, "bytes");
  uint32_t prev = 0;
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsNumber()) throw Napi::TypeError::New(env, "crc32c: prev must be a number");
    const double d = info[1].As<Napi::Number>().DoubleValue();
    if (!(d >= 0 && d <= 4294967295.0 && d == static_cast<double>(static_cast<uint32_t>(d))))
      throw Napi::RangeError::New(env, "crc32c: prev must be a u32");
    prev = static_cast<uint32_t>(d);
  }
  return Napi::Number::New(env, crc32c(prev, bytes.data, bytes.size));
}

// punchHole(fd, offset, length) -> boolean: returns the whole pages inside the range of the open
// file to the system (a shard's freed chunk range on tmpfs). false where the file system cannot
// punch holes; throws on any other failure (a bad descriptor, say).
Napi::Value PunchHole(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 3 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "punchHole(fd, offset, length) needs three numbers");
  const double fd = info[0].As<Napi::Number>().DoubleValue();
  const double offset = info[1].As<Napi::Number>().DoubleValue();
  const double length = info[2].As<Napi::Number>().DoubleValue();
  constexpr double kMaxSafe = 9007199254740991.0;
  auto is_count = [&](double v) { return v >= 0 && v <= kMaxSafe && v == static_cast<double>(static_cast<uint64_t>(v)); };
  if (!(fd >= 0 && fd <= 2147483647.0 && fd == static_cast<double>(static_cast<int>(fd))) || !is_count(offset) || !is_count(length))
    throw Napi::RangeError::New(env, "punchHole: fd, offset and length must be non-negative integers");
  const int err = punch_hole(static_cast<int>(fd), static_cast<uint64_t>(offset), static_cast<uint64_t>(length));
  if (err == EOPNOTSUPP) return Napi::Boolean::New(env, false);
  if (err != 0) {
    Napi::Error e = Napi::Error::New(env, std::string("punchHole: ") + std::strerror(err));
    e.Set("errno", Napi::Number::New(env, err));
    throw e;
  }
  return Napi::Boolean::New(env, true);
}

}  // namespace

Napi::Promise prefault_rows(Napi::Env env, std::shared_ptr<const KvCache> kv, int from, int to) {
  auto* worker = new PrefaultWorker(env, std::move(kv), from, to);
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

void init_kv_io(Napi::Env env, Napi::Object exports) {
  exports.Set("mapFile", Napi::Function::New(env, MapFile));
  exports.Set("unmapFile", Napi::Function::New(env, UnmapFile));
  exports.Set("populateMapped", Napi::Function::New(env, PopulateMapped));
  exports.Set("crc32c", Napi::Function::New(env, Crc32c));
  exports.Set("punchHole", Napi::Function::New(env, PunchHole));
}

}  // namespace ctx
