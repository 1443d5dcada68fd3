// The UCX addon (ctxbank_ucx.node, its own module next to ctxbank_native.node, linked to UCX;
// the engine's addon has no UCX): workerAddress(), expose(path, length, epoch) ->
// {id, rkey, base, fence, fenceRkey}, unexpose(id), get(address, rkey, remote, into, readId)
// -> Promise<void>, cancel(readId). Loaded only by the process that uses the UCX transport
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

uint64_t read_id_of(const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || !info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), "readId must be a number");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (!(v >= 0 && v <= 9007199254740991.0 && v == static_cast<double>(static_cast<uint64_t>(v))))
    throw Napi::RangeError::New(info.Env(), "readId must be a non-negative integer");
  return static_cast<uint64_t>(v);
}

// Registry bytes are validated in TypeScript first (services/handoff/transport/ucx-endpoint.ts);
// these caps only keep a bad call from allocating much.
constexpr size_t kMaxAddress = 64 << 10;
constexpr size_t kMaxRkey = 64 << 10;

Napi::Value WorkerAddress(const Napi::CallbackInfo& info) {
  const std::vector<uint8_t> a = the_node(info.Env()).worker_address();
  return Napi::Buffer<uint8_t>::Copy(info.Env(), a.data(), a.size());
}

Napi::Value Expose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 3 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "expose(path, length, epoch)");
  const double epoch = info[2].As<Napi::Number>().DoubleValue();
  if (!(epoch >= 1 && epoch <= 4294967295.0 && epoch == static_cast<double>(static_cast<uint32_t>(epoch))))
    throw Napi::RangeError::New(env, "expose: epoch must be a positive u32");
  const double length = info[1].As<Napi::Number>().DoubleValue();
  if (!(length >= 1 && length <= 9007199254740991.0 && length == static_cast<double>(static_cast<uint64_t>(length))))
    throw Napi::RangeError::New(env, "expose: length must be a positive integer");
  ucx::Exposed out;
  uint64_t id;
  try {
    id = the_node(env).expose(info[0].As<Napi::String>().Utf8Value(), static_cast<uint64_t>(length), static_cast<uint64_t>(epoch), &out);
  } catch (const std::runtime_error& e) {
    throw Napi::Error::New(env, e.what());
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("id", Napi::Number::New(env, static_cast<double>(id)));
  r.Set("rkey", Napi::Buffer<uint8_t>::Copy(env, out.rkey.data(), out.rkey.size()));
  r.Set("base", Napi::BigInt::New(env, out.base));
  r.Set("fence", Napi::BigInt::New(env, out.fence));
  r.Set("fenceRkey", Napi::Buffer<uint8_t>::Copy(env, out.fence_rkey.data(), out.fence_rkey.size()));
  return r;
}

Napi::Value Unexpose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "unexpose(id)");
  if (node) node->unexpose(static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value()));
  return env.Undefined();
}

struct Read {
  Napi::Promise::Deferred deferred;
  Napi::Reference<Napi::Uint8Array> into;  // keeps the destination alive until the read ends
  ucx::Outcome outcome;
};

Napi::Value Get(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::vector<uint8_t> address = bytes_of(info, 0, "address", kMaxAddress);
  std::vector<uint8_t> rkey = bytes_of(info, 1, "rkey", kMaxRkey);
  const uint64_t remote = u64_of(info, 2, "remote");
  if (info.Length() != 5 || !info[3].IsTypedArray() || info[3].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "get(address, rkey, remote, into: Uint8Array, readId)");
  const uint64_t id = read_id_of(info, 4);
  Napi::Uint8Array into = info[3].As<Napi::Uint8Array>();
  if (into.ByteLength() == 0) throw Napi::RangeError::New(env, "get: into is empty");
  ucx::Node& n = the_node(env);
  auto* read = new Read{Napi::Promise::Deferred::New(env), Napi::Persistent(into), {}};
  if (pending++ == 0) completions.Ref(env);
  Napi::Promise promise = read->deferred.Promise();
  n.get(id, std::move(address), std::move(rkey), remote, into.Data(), into.ByteLength(), [read](ucx::Outcome o) {
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
  const uint64_t id = read_id_of(info, 0);
  if (node) node->cancel(id);
  return info.Env().Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("workerAddress", Napi::Function::New(env, WorkerAddress));
  exports.Set("expose", Napi::Function::New(env, Expose));
  exports.Set("unexpose", Napi::Function::New(env, Unexpose));
  exports.Set("get", Napi::Function::New(env, Get));
  exports.Set("cancel", Napi::Function::New(env, Cancel));
  return exports;
}

}  // namespace
}  // namespace ctx

static Napi::Object InitUcxAddon(Napi::Env env, Napi::Object exports) { return ctx::Init(env, exports); }
NODE_API_MODULE(ctxbank_ucx, InitUcxAddon)
