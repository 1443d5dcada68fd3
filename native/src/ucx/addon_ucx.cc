// The UCX addon (ctxbank_ucx.node, its own module next to ctxbank_native.node, linked to UCX;
// the engine's addon has no UCX): workerAddress(), expose(path, length, epoch) -> {id, token},
// unexpose(id), read(address, mapping, token, epoch, offset, into, readId) -> Promise<void>,
// cancel(readId). Loaded only by the process that uses the UCX transport
// (services/handoff/transport/ucx-addon.ts); CTXBANK_UCX (native/CMakeLists.txt) decides whether it
// is built.
#include <napi.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ucx/ucx_node.h"

namespace ctx {
namespace {

// One per process (the addon is loaded once per process in the services): created on first use.
std::unique_ptr<ucx::Node> node;
Napi::ThreadSafeFunction completions;
size_t pending = 0;  // reads whose promise has not settled; the completion function keeps the loop alive only then

ucx::Node& the_node(Napi::Env env) {
  if (!node) {
    try {
      node = std::make_unique<ucx::Node>();
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, e.what());
    }
    completions = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), "ucx-completions", 0, 1);
    completions.Unref(env);
    env.AddCleanupHook([] {
      node.reset();  // stops the progress thread; reads still in flight are dropped with the process
      completions.Release();
    });
  }
  return *node;
}

std::vector<uint8_t> bytes_of(const Napi::CallbackInfo& info, size_t i, const char* what, size_t max) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a Uint8Array");
  Napi::Uint8Array a = info[i].As<Napi::Uint8Array>();
  if (a.ByteLength() == 0 || a.ByteLength() > max)
    throw Napi::RangeError::New(info.Env(), std::string(what) + " must hold 1.." + std::to_string(max) + " bytes");
  return std::vector<uint8_t>(a.Data(), a.Data() + a.ByteLength());
}

uint64_t u64_of(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBigInt()) throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a bigint");
  bool lossless = false;
  const uint64_t v = info[i].As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) throw Napi::RangeError::New(info.Env(), std::string(what) + " must be a u64");
  return v;
}

// A JS number that is an integer in [0, max].
uint64_t integer_of(const Napi::CallbackInfo& info, size_t i, const char* what, double max) {
  if (info.Length() <= i || !info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a number");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (!(v >= 0 && v <= max && v == static_cast<double>(static_cast<uint64_t>(v))))
    throw Napi::RangeError::New(info.Env(),
                                std::string(what) + " must be an integer in [0, " + std::to_string(static_cast<uint64_t>(max)) + "]");
  return static_cast<uint64_t>(v);
}

constexpr double kMaxSafe = 9007199254740991.0;

// Registry bytes are validated in TypeScript first (services/handoff/transport/ucx-endpoint.ts);
// this cap only keeps a bad call from allocating much.
constexpr size_t kMaxAddress = 64 << 10;

Napi::Value WorkerAddress(const Napi::CallbackInfo& info) {
  const std::vector<uint8_t> a = the_node(info.Env()).worker_address();
  return Napi::Buffer<uint8_t>::Copy(info.Env(), a.data(), a.size());
}

Napi::Value Expose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 3 || !info[0].IsString()) throw Napi::TypeError::New(env, "expose(path, length, epoch)");
  const uint64_t length = integer_of(info, 1, "expose: length", kMaxSafe);
  const uint64_t epoch = integer_of(info, 2, "expose: epoch", 4294967295.0);
  if (length == 0 || epoch == 0) throw Napi::RangeError::New(env, "expose: length and epoch must be positive");
  uint64_t token = 0;
  uint64_t id;
  try {
    id = the_node(env).expose(info[0].As<Napi::String>().Utf8Value(), length, static_cast<uint32_t>(epoch), &token);
  } catch (const std::runtime_error& e) {
    throw Napi::Error::New(env, e.what());
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("id", Napi::BigInt::New(env, id));
  r.Set("token", Napi::BigInt::New(env, token));
  return r;
}

Napi::Value Unexpose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 1) throw Napi::TypeError::New(env, "unexpose(id)");
  const uint64_t id = u64_of(info, 0, "unexpose: id");
  if (node) node->unexpose(id);
  return env.Undefined();
}

struct Read {
  Napi::Promise::Deferred deferred;
  Napi::Reference<Napi::Uint8Array> into;  // keeps the destination alive until the read ends
  ucx::Outcome outcome;
};

Napi::Value ReadRange(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 7) throw Napi::TypeError::New(env, "read(address, mapping, token, epoch, offset, into: Uint8Array, readId)");
  std::vector<uint8_t> address = bytes_of(info, 0, "address", kMaxAddress);
  ucx::Range range;
  range.mapping = u64_of(info, 1, "mapping");
  range.token = u64_of(info, 2, "token");
  range.epoch = static_cast<uint32_t>(integer_of(info, 3, "epoch", 4294967295.0));
  range.offset = integer_of(info, 4, "offset", kMaxSafe);
  if (!info[5].IsTypedArray() || info[5].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "read: into must be a Uint8Array");
  const uint64_t id = integer_of(info, 6, "readId", kMaxSafe);
  Napi::Uint8Array into = info[5].As<Napi::Uint8Array>();
  if (into.ByteLength() == 0) throw Napi::RangeError::New(env, "read: into is empty");
  range.length = into.ByteLength();
  ucx::Node& n = the_node(env);
  auto* read = new Read{Napi::Promise::Deferred::New(env), Napi::Persistent(into), {}};
  if (pending++ == 0) completions.Ref(env);
  Napi::Promise promise = read->deferred.Promise();
  n.read(id, std::move(address), range, into.Data(), [read](ucx::Outcome o) {
    read->outcome = std::move(o);
    completions.NonBlockingCall(read, [](Napi::Env env, Napi::Function, Read* r) {
      if (--pending == 0) completions.Unref(env);
      if (r->outcome.code.empty()) {
        r->deferred.Resolve(env.Undefined());
      } else {
        Napi::Error e = Napi::Error::New(env, "UCX read failed: " + r->outcome.message);
        e.Set("code", Napi::String::New(env, r->outcome.code));
        r->deferred.Reject(e.Value());
      }
      delete r;
    });
  });
  return promise;
}

Napi::Value Cancel(const Napi::CallbackInfo& info) {
  const uint64_t id = integer_of(info, 0, "readId", kMaxSafe);
  if (node) node->cancel(id);
  return info.Env().Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("workerAddress", Napi::Function::New(env, WorkerAddress));
  exports.Set("expose", Napi::Function::New(env, Expose));
  exports.Set("unexpose", Napi::Function::New(env, Unexpose));
  exports.Set("read", Napi::Function::New(env, ReadRange));
  exports.Set("cancel", Napi::Function::New(env, Cancel));
  return exports;
}

}  // namespace
}  // namespace ctx

static Napi::Object InitUcxAddon(Napi::Env env, Napi::Object exports) { return ctx::Init(env, exports); }
NODE_API_MODULE(ctxbank_ucx, InitUcxAddon)
