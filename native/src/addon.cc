// The N-API binding: a thin layer that converts arguments, validates what crosses from JS, and
// hands heavy work to the engine's worker thread. No math here.
#include <napi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "addon_kv_io.h"
#include "addon_policy.h"
#include "prompt_state.h"
#include "engine_worker.h"
#include "gguf.h"
#include "kv_pool.h"
#include "membw.h"
#include "model.h"

namespace ctx {
namespace {

Napi::Value to_js(Napi::Env env, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::STRING:
      return Napi::String::New(env, v.str);
    case GgufValueType::BOOL:
      return Napi::Boolean::New(env, v.u != 0);
    case GgufValueType::F32:
    case GgufValueType::F64:
      return Napi::Number::New(env, v.f);
    case GgufValueType::ARRAY: {
      Napi::Array a = Napi::Array::New(env, v.arr.size());
      for (size_t i = 0; i < v.arr.size(); ++i) a.Set(static_cast<uint32_t>(i), to_js(env, v.arr[i]));
      return a;
    }
    case GgufValueType::I8:
    case GgufValueType::I16:
    case GgufValueType::I32:
    case GgufValueType::I64:
      if (v.i > (1ll << 53) || v.i < -(1ll << 53)) return Napi::BigInt::New(env, static_cast<int64_t>(v.i));
      return Napi::Number::New(env, static_cast<double>(v.i));
    default:
      if (v.u > (1ull << 53)) return Napi::BigInt::New(env, static_cast<uint64_t>(v.u));
      return Napi::Number::New(env, static_cast<double>(v.u));
  }
}

std::string string_arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsString()) throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

// A JS Error carrying the device error's code (err.code), for the services' error shape.
Napi::Error device_error(Napi::Env env, const DeviceError& e) {
  Napi::Error err = Napi::Error::New(env, e.what());
  err.Set("code", Napi::String::New(env, e.code()));
  return err;
}

int int_option(Napi::Object o, const char* key, int fallback, int lo, int hi) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber()) throw Napi::TypeError::New(o.Env(), std::string(key) + " must be a number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (d != static_cast<int>(d) || d < lo || d > hi)
    throw Napi::RangeError::New(o.Env(),
                                std::string(key) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(d);
}

// readGgufMetadata(path): every metadata key as a JS value.
Napi::Value ReadGgufMetadata(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = string_arg(info, 0, "path");
  try {
    auto f = GgufFile::open(path);
    Napi::Object out = Napi::Object::New(env);
    for (const auto& [k, v] : f->metadata()) out.Set(k, to_js(env, v));
    return out;
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

// ggufInfo(path): header facts and the tensor table.
Napi::Value GgufInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = string_arg(info, 0, "path");
  try {
    auto f = GgufFile::open(path);
    Napi::Object out = Napi::Object::New(env);
    out.Set("version", f->version());
    out.Set("fileSize", static_cast<double>(f->file_size()));
    out.Set("headerBytes", static_cast<double>(f->header_bytes()));
    out.Set("alignment", f->alignment());
    Napi::Array tensors = Napi::Array::New(env, f->tensors().size());
    uint32_t i = 0;
    for (const auto& t : f->tensors()) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", t.name);
      o.Set("type", ggml_type_name(t.type));
      Napi::Array shape = Napi::Array::New(env, t.n_dims);
      for (uint32_t d = 0; d < t.n_dims; ++d) shape.Set(d, static_cast<double>(t.ne[d]));
      o.Set("shape", shape);
      o.Set("offset", static_cast<double>(t.offset));
      o.Set("nBytes", static_cast<double>(t.n_bytes));
      tensors.Set(i++, o);
    }
    out.Set("tensors", tensors);
    return out;
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

// cudaStatus(): { compiled, usable, code?, message? } for CUDA device 0.
Napi::Value CudaStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("compiled", cuda_compiled());
  const std::unique_ptr<DeviceError> why = cuda_unusable(0);
  o.Set("usable", !why);
  if (why) {
    o.Set("code", why->code());
    o.Set("message", why->what());
  }
  return o;
}

// kvPool(limitBytes?): sets the KV memory pool's limit when given (0 turns it off), and returns
// { limitBytes, readyRegions, readyBytes, takes, misses } (native/src/kv_pool.h).
Napi::Value KvPoolStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    const double limit = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (!(limit >= 0 && limit <= 9007199254740991.0 && limit == static_cast<double>(static_cast<uint64_t>(limit))))
      throw Napi::RangeError::New(env, "kvPool: limitBytes must be a non-negative integer");
    KvPool::instance().set_limit(static_cast<size_t>(limit));
  }
  const KvPool::Stats s = KvPool::instance().stats();
  Napi::Object o = Napi::Object::New(env);
  o.Set("limitBytes", static_cast<double>(s.limit));
  o.Set("readyRegions", static_cast<double>(s.ready_regions));
  o.Set("readyBytes", static_cast<double>(s.ready_resident_bytes));
  o.Set("takes", static_cast<double>(s.takes));
  o.Set("misses", static_cast<double>(s.misses));
  return o;
}

// ---------------------------------------------------------------------------------------------

class NativeModel : public Napi::ObjectWrap<NativeModel> {
 public:
  static Napi::FunctionReference ctor;
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f =
        DefineClass(env, "NativeModel",
                    {InstanceAccessor<&NativeModel::Config>("config"), InstanceAccessor<&NativeModel::WeightsCrc32c>("weightsCrc32c")});
    ctor = Napi::Persistent(f);
    exports.Set("NativeModel", f);
  }
  explicit NativeModel(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeModel>(info) {
    if (info.Length() != 1 || !info[0].IsExternal()) throw Napi::TypeError::New(info.Env(), "NativeModel is created by loadModel()");
    model_ = *info[0].As<Napi::External<std::shared_ptr<Model>>>().Data();
  }
  std::shared_ptr<Model> model() const { return model_; }

 private:
  Napi::Value WeightsCrc32c(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), model_->weights_crc32c()); }
  Napi::Value Config(const Napi::CallbackInfo& info) {
    const ModelConfig& c = model_->config();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("architecture", c.architecture);
    o.Set("name", c.name);
    o.Set("nLayer", c.n_layer);
    o.Set("nEmbd", c.n_embd);
    o.Set("nHead", c.n_head);
    o.Set("nHeadKv", c.n_head_kv);
    o.Set("headDim", c.head_dim);
    o.Set("nFf", c.n_ff);
    o.Set("nVocab", c.n_vocab);
    o.Set("nCtxTrain", c.n_ctx_train);
    o.Set("ropeBase", c.rope.base);
    o.Set("rmsEps", c.rms_eps);
    o.Set("tiedOutput", c.tied_output);
    o.Set("kvBytesPerToken", static_cast<double>(c.kv_bytes_per_token()));
    o.Set("slidingWindow", c.any_layer_slides() ? c.sliding_window : 0);
    Napi::Array sliding = Napi::Array::New(info.Env());
    for (int l = 0; l < c.n_layer; ++l)
      if (c.layer_slides(l)) sliding.Set(sliding.Length(), l);
    o.Set("slidingLayers", sliding);
    return o;
  }
  std::shared_ptr<Model> model_;
};
Napi::FunctionReference NativeModel::ctor;

class LoadModelWorker : public Napi::AsyncWorker {
 public:
  LoadModelWorker(Napi::Env env, std::string path)
      : Napi::AsyncWorker(env), path_(std::move(path)), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override {
    try {
      model_ = Model::load(path_);
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    Napi::Env env = Env();
    auto ext = Napi::External<std::shared_ptr<Model>>::New(env, &model_);
    deferred_.Resolve(NativeModel::ctor.New({ext}));
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::string path_;
  std::shared_ptr<Model> model_;
  Napi::Promise::Deferred deferred_;
};

Napi::Value LoadModel(const Napi::CallbackInfo& info) {
  auto* w = new LoadModelWorker(info.Env(), string_arg(info, 0, "path"));
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// measureReadBandwidth(threads, mib, passes) -> Promise<{ gbPerS, bytes, passes, threads }>:
// membw.h, on a worker thread (it reads mib MiB `passes` times).
class ReadBandwidthWorker : public Napi::AsyncWorker {
 public:
  ReadBandwidthWorker(Napi::Env env, int threads, size_t bytes, int passes)
      : Napi::AsyncWorker(env), threads_(threads), bytes_(bytes), passes_(passes), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override {
    try {
      result_ = measure_read_bandwidth(threads_, bytes_, passes_);
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    Napi::Object o = Napi::Object::New(Env());
    o.Set("gbPerS", result_.gb_per_s);
    o.Set("bytes", static_cast<double>(result_.bytes));
    o.Set("passes", result_.passes);
    o.Set("threads", result_.threads);
    deferred_.Resolve(o);
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  int threads_;
  size_t bytes_;
  int passes_;
  ReadBandwidth result_{};
  Napi::Promise::Deferred deferred_;
};

Napi::Value MeasureReadBandwidth(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto count = [&](size_t i, int lo, int hi, const char* what) {
    const double v = info.Length() > i && info[i].IsNumber() ? info[i].As<Napi::Number>().DoubleValue() : -1;
    if (!(v >= lo && v <= hi && v == static_cast<double>(static_cast<int>(v))))
      throw Napi::RangeError::New(
          env, std::string("measureReadBandwidth: ") + what + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
    return static_cast<int>(v);
  };
  const int threads = count(0, 1, 256, "threads"), mib = count(1, 1, 65536, "mib"), passes = count(2, 1, 1000, "passes");
  auto* w = new ReadBandwidthWorker(env, threads, static_cast<size_t>(mib) << 20, passes);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// ---------------------------------------------------------------------------------------------

class NativeSequence : public Napi::ObjectWrap<NativeSequence> {
 public:
  static Napi::FunctionReference ctor;
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f = DefineClass(env, "NativeSequence",
                                   {InstanceAccessor<&NativeSequence::NPast>("nPast"),
                                    InstanceAccessor<&NativeSequence::Capacity>("capacity"),
                                    InstanceAccessor<&NativeSequence::BytesUsed>("kvBytesUsed"),
                                    InstanceAccessor<&NativeSequence::DeviceBytes>("deviceBytesUsed"),
                                    InstanceAccessor<&NativeSequence::HostBytes>("hostBytesUsed"),
                                    InstanceMethod<&NativeSequence::Truncate>("truncate"),
                                    InstanceMethod<&NativeSequence::Release>("release"),
                                    InstanceMethod<&NativeSequence::Prefault>("prefault"),
                                    InstanceMethod<&NativeSequence::SetLength>("setLength"),
                                    InstanceMethod<&NativeSequence::SetPolicy>("setCompletePolicy"),
                                    InstanceAccessor<&NativeSequence::PolicyStats>("policyStats"),
                                    InstanceAccessor<&NativeSequence::RowsMoved>("rowsMoved"),
                                    InstanceMethod<&NativeSequence::PreparePromptStateExport>("preparePromptStateExport"),
                                    InstanceMethod<&NativeSequence::SetRoundPick>("setRoundPick"),
                                    InstanceMethod<&NativeSequence::ExportPromptState>("exportPromptState"),
                                    InstanceMethod<&NativeSequence::ImportPromptState>("importPromptState"),
                                    InstanceMethod<&NativeSequence::ImportRows>("importRows"),
                                    InstanceMethod<&NativeSequence::ExportRows>("exportRows"),
                                    InstanceMethod<&NativeSequence::ImportChunk>("importChunk"),
                                    InstanceMethod<&NativeSequence::Kv>("kvBuffer")});
    ctor = Napi::Persistent(f);
    exports.Set("NativeSequence", f);
  }
  explicit NativeSequence(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeSequence>(info) {
    if (info.Length() != 1 || !info[0].IsExternal())
      throw Napi::TypeError::New(info.Env(), "NativeSequence is created by engine.createSequence()");
    auto* init = info[0].As<Napi::External<SequenceInit>>().Data();
    seq_ = init->seq;
    model_ = init->model;
  }
  struct SequenceInit {
    std::shared_ptr<Sequence> seq;
    std::shared_ptr<const Model> model;
  };
  const std::shared_ptr<Sequence>& seq() const { return seq_; }
  bool busy = false;  // inside an in-flight forward(); JS thread only

 private:
  Napi::Value NPast(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), seq_->n_past()); }
  Napi::Value Capacity(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), seq_->kv.capacity()); }
  Napi::Value BytesUsed(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(seq_->kv.bytes_used()));
  }
  // The two tiers: the device arena (device-tier KV + packed buffers at full budget) and the host bank.
  Napi::Value DeviceBytes(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(seq_->device_bytes(seq_->n_past())));
  }
  Napi::Value HostBytes(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(seq_->kv.host_bytes_used()));
  }
  // rowsMoved: a reclaiming policy reused evicted tokens' rows (Sequence::rows_moved), so the
  // rows can no longer be moved, truncated or extended by a prompt by position.
  Napi::Value RowsMoved(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), seq_->rows_moved()); }
  // RangeError (code "rows_moved") for what addresses the cache by position once rows moved.
  void refuse_moved_rows(Napi::Env env, const char* what) {
    if (!seq_->rows_moved()) return;
    Napi::Error err = Napi::RangeError::New(
        env, std::string(what) + ": this sequence reclaimed evicted KV rows (policy reclaim), so its tokens no longer sit by position");
    err.Set("code", Napi::String::New(env, "rows_moved"));
    throw err;
  }
  // The cache's length, or a RangeError when a sliding-window layer's ring lacks the rows the
  // next token's window needs (code "window_not_held": rolled back too far, or an import that did
  // not cover each sliding layer's last window).
  void set_size(Napi::Env env, const char* what, int n) {
    refuse_moved_rows(env, what);
    try {
      seq_->set_size(n);
    } catch (const std::invalid_argument& e) {
      Napi::Error err = Napi::RangeError::New(env, std::string(what) + ": " + e.what());
      err.Set("code", Napi::String::New(env, "window_not_held"));
      throw err;
    }
  }
  // truncate(n): forget every token from n on (rollback, or reuse of a shared prefix).
  Napi::Value Truncate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    if (info.Length() != 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "truncate(n) needs a number");
    const double n = info[0].As<Napi::Number>().DoubleValue();
    if (n != static_cast<int>(n) || n < 0 || n > seq_->n_past())
      throw Napi::RangeError::New(env, "truncate: n must be an integer in [0, nPast]");
    set_size(env, "truncate", static_cast<int>(n));
    seq_->reset_policy_state();
    return env.Undefined();
  }
  // setLength(n): declares that the first n tokens' K/V have been written into kvBuffer() (a KV
  // import from another process); decoding continues from position n.
  Napi::Value SetLength(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    if (info.Length() != 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "setLength(n) needs a number");
    const double n = info[0].As<Napi::Number>().DoubleValue();
    if (n != static_cast<int>(n) || n < 0 || n > seq_->kv.capacity())
      throw Napi::RangeError::New(env, "setLength: n must be an integer in [0, capacity]");
    set_size(env, "setLength", static_cast<int>(n));
    seq_->reset_policy_state();
    return env.Undefined();
  }
  // setPolicy({ kind: "full" | "omnikv" | "scope" | "omnikv+scope" | "streaming" | "h2o" | "rounds",
  // <the kind's sub-objects, every field present: addon_policy.cc> }): how this sequence's decode
  // steps attend. Validated against the model; RangeError with the reason.
  Napi::Value SetPolicy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    if (info.Length() != 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "setPolicy(policy) needs an object");
    refuse_moved_rows(env, "setPolicy");
    Napi::Object o = info[0].As<Napi::Object>();
    AttentionPolicy policy = policy_from_js(o, model_->config());
    try {
      seq_->set_policy(policy);
    } catch (const std::invalid_argument& e) {
      throw Napi::RangeError::New(env, e.what());
    }
    return env.Undefined();
  }
  Napi::Value PolicyStats(const Napi::CallbackInfo& info) { return policy_stats_to_js(info.Env(), *seq_); }
  // exportPromptState(): what the policy remembers of the prompt's queries (prompt_state.h), as a
  // Uint8Array; null when it remembers none. importPromptState(bytes): loads one after the KV
  // import (setLength); false when it was made for a policy that remembers other windows;
  // RangeError when it is malformed.
  // preparePromptStateExport(): after setPolicy, before the prompt: the policy derives its prompt
  // state as the prompt is cached (SCOPE's kept lists), so exportPromptState ships that.
  // setRoundPick(rounds: number[]): the earlier rounds decode steps attend above the watershed, as
  // the prefill picked them (engine.pickRounds), after the KV import; RangeError unless the policy
  // is rounds and they are ascending indices of earlier rounds of the prompt held.
  Napi::Value SetRoundPick(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    if (info.Length() != 1 || !info[0].IsArray()) throw Napi::TypeError::New(env, "setRoundPick(rounds) needs an array of numbers");
    auto* picker = dynamic_cast<RoundPicker*>(seq_->policy.get());
    if (!picker) throw Napi::RangeError::New(env, "setRoundPick: the sequence's policy is not rounds");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<int> rounds;
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Value v = arr.Get(i);
      const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (d != static_cast<int>(d) || d < 0) throw Napi::RangeError::New(env, "setRoundPick: rounds must be non-negative integers");
      rounds.push_back(static_cast<int>(d));
    }
    try {
      picker->take_picked_rounds(rounds, seq_->n_past());
    } catch (const std::invalid_argument& e) {
      throw Napi::RangeError::New(env, std::string("setRoundPick: ") + e.what());
    }
    return env.Undefined();
  }
  Napi::Value PreparePromptStateExport(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    derive_prompt_state_eagerly(*seq_->policy);
    return env.Undefined();
  }
  Napi::Value ExportPromptState(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    const std::vector<uint8_t> out = export_prompt_state(*seq_->policy, model_->config(), seq_->n_past());
    if (out.empty()) return env.Null();
    Napi::Uint8Array arr = Napi::Uint8Array::New(env, out.size());
    std::memcpy(arr.Data(), out.data(), out.size());
    return arr;
  }
  Napi::Value ImportPromptState(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    if (info.Length() != 1 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      throw Napi::TypeError::New(env, "importPromptState(bytes) needs a Uint8Array");
    Napi::Uint8Array bytes = info[0].As<Napi::Uint8Array>();
    try {
      return Napi::Boolean::New(env,
                                import_prompt_state(*seq_->policy, model_->config(), seq_->n_past(), bytes.Data(), bytes.ByteLength()));
    } catch (const std::invalid_argument& e) {
      throw Napi::RangeError::New(env, std::string("importPromptState: ") + e.what());
    }
  }
  // importRows(payload, layerIds, tokenStart, tokenCount): writes a token-major chunk payload
  // ([token][layer][K|V][kv_dim] f16) into the cache rows it covers; setLength() then declares
  // the length. exportRows(into, ...) is the reverse. RangeError when rows or sizes do not fit.
  // Export may run while a forward pass extends the sequence (the prefill writes finished blocks
  // while the next micro-batch computes): rows below the pass's start are never written again,
  // and the caller only exports those.
  Napi::Value ImportRows(const Napi::CallbackInfo& info) { return MoveRows(info, true); }
  Napi::Value ExportRows(const Napi::CallbackInfo& info) { return MoveRows(info, false); }
  Napi::Value MoveRows(const Napi::CallbackInfo& info, bool import) {
    Napi::Env env = info.Env();
    if (import && busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    refuse_moved_rows(env, import ? "importRows" : "exportRows");
    const BytesArg bytes = bytes_arg(info, 0, import ? "payload" : "into");
    const ChunkRows rows = chunk_rows_arg(info, 1);
    try {
      // A GPU sequence stages the rows through its host cache (same addressing, kv_cache.h).
      DeviceKv* gpu = seq_->device_kv.get();
      if (gpu && !import) {
        check_chunk_rows(seq_->kv, rows, bytes.size);
        for (int l : rows.layers) gpu->download(seq_->kv, l, rows.token_start, rows.token_count);
      }
      if (import)
        import_chunk_rows(seq_->kv, rows, bytes.data, bytes.size);
      else
        export_chunk_rows(seq_->kv, rows, bytes.data, bytes.size);
      if (gpu && import)
        for (int l : rows.layers) gpu->upload(seq_->kv, l, rows.token_start, rows.token_count);
    } catch (const DeviceError& e) {
      throw device_error(env, e);
    } catch (const std::invalid_argument& e) {
      throw Napi::RangeError::New(env, std::string(import ? "importRows: " : "exportRows: ") + e.what());
    }
    return env.Undefined();
  }
  // importChunk(chunk, headerSize, layerIds, tokenStart, tokenCount) -> number: importRows of a
  // whole chunk (header + payload) whose header the caller has parsed, computing its CRC-32C in the
  // same pass over the bytes (kv_transfer.h); returns that checksum. The rows count only when it
  // equals the header's: a GPU sequence uploads them only then, and the caller declares nothing
  // otherwise. RangeError when the sizes or rows do not fit.
  Napi::Value ImportChunk(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    refuse_moved_rows(env, "importChunk");
    const BytesArg chunk = bytes_arg(info, 0, "chunk");
    if (info.Length() < 2 || !info[1].IsNumber()) throw Napi::TypeError::New(env, "importChunk: headerSize must be a number");
    const double header = info[1].As<Napi::Number>().DoubleValue();
    if (!(header >= 0 && header <= 65535 && header == static_cast<double>(static_cast<int>(header))))
      throw Napi::RangeError::New(env, "importChunk: headerSize must be an integer in 0..65535");
    const ChunkRows rows = chunk_rows_arg(info, 2);
    try {
      const ChunkImport r = import_chunk_checked(seq_->kv, rows, chunk.data, chunk.size, static_cast<size_t>(header));
      if (DeviceKv* gpu = seq_->device_kv.get(); gpu && r.ok())
        for (int l : rows.layers) gpu->upload(seq_->kv, l, rows.token_start, rows.token_count);
      return Napi::Number::New(env, r.computed);
    } catch (const DeviceError& e) {
      throw device_error(env, e);
    } catch (const std::invalid_argument& e) {
      throw Napi::RangeError::New(env, std::string("importChunk: ") + e.what());
    }
  }
  // release(): frees the cache's memory now instead of at garbage collection.
  Napi::Value Release(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy) throw Napi::Error::New(env, "sequence is busy in a forward pass");
    seq_->kv.release();
    if (seq_->device_kv) seq_->device_kv->release();
    seq_->reset_policy_state();
    return env.Undefined();
  }
  // prefault(tokens) -> Promise<boolean>: commits, on a worker thread, the pages that rows
  // [nPast, tokens) will use, so an import that follows finds them ready (kv_cache.h). False when
  // there was nothing it could do: a GPU sequence, or a kernel without MADV_POPULATE_WRITE.
  Napi::Value Prefault(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() != 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "prefault(tokens) needs a number");
    const double tokens = info[0].As<Napi::Number>().DoubleValue();
    if (!(tokens >= 0 && tokens <= seq_->kv.capacity() && tokens == static_cast<int>(tokens)))
      throw Napi::RangeError::New(env, "prefault: tokens must be an integer in [0, capacity]");
    if (seq_->device_kv) {
      auto done = Napi::Promise::Deferred::New(env);
      done.Resolve(Napi::Boolean::New(env, false));
      return done.Promise();
    }
    return prefault_rows(env, std::shared_ptr<const KvCache>(seq_, &seq_->kv), seq_->n_past(), static_cast<int>(tokens));
  }
  // kvBuffer(): the whole cache as one external ArrayBuffer, no copy. Layer l's K starts at
  // element l * 2 * capacity * kvDim, its V capacity * kvDim later; rows are [token][kv_dim].
  Napi::Value Kv(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (seq_->device_kv) throw Napi::Error::New(env, "kvBuffer: this sequence's KV is in GPU memory; use exportRows/importRows");
    if (seq_->kv.ring_rows() > 0)
      throw Napi::Error::New(env, "kvBuffer: this sequence's sliding-window layers keep rings of rows; use exportRows/importRows");
    if (kv_buffer_.IsEmpty()) {
      auto* hold = new std::shared_ptr<Sequence>(seq_);
      Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(
          env, seq_->kv.k(0), seq_->kv.bytes_reserved(), [](Napi::Env, void*, std::shared_ptr<Sequence>* h) { delete h; }, hold);
      kv_buffer_ = Napi::Persistent(ab);
    }
    return kv_buffer_.Value();
  }

  std::shared_ptr<Sequence> seq_;
  std::shared_ptr<const Model> model_;  // for validating policies against the model
  Napi::Reference<Napi::ArrayBuffer> kv_buffer_;
};
Napi::FunctionReference NativeSequence::ctor;

class NativeEngine : public Napi::ObjectWrap<NativeEngine> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f =
        DefineClass(env, "NativeEngine",
                    {InstanceMethod<&NativeEngine::CreateSequence>("createSequence"), InstanceMethod<&NativeEngine::Forward>("forward"),
                     InstanceMethod<&NativeEngine::PickRounds>("pickRounds"), InstanceMethod<&NativeEngine::KvBytes>("kvBytes"),
                     InstanceAccessor<&NativeEngine::Info>("info")});
    exports.Set("NativeEngine", f);
  }

  // new NativeEngine(model, { threads, ubatch, maxContext, deviceBudgetBytes, device, cudaGraphs, cudaKernels })
  explicit NativeEngine(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeEngine>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(NativeModel::ctor.Value()))
      throw Napi::TypeError::New(env, "NativeEngine(model, options): model must come from loadModel()");
    Napi::Object o = info.Length() > 1 && info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
    EngineOptions opts;
    opts.n_threads = int_option(o, "threads", 1, 1, 256);
    opts.n_threads_decode = int_option(o, "decodeThreads", 1, 1, 256);
    opts.ubatch = int_option(o, "ubatch", 512, 1, 8192);
    opts.max_context = int_option(o, "maxContext", 0, 0, 1 << 22);
    const Napi::Value budget = o.Get("deviceBudgetBytes");
    if (!budget.IsUndefined()) {
      const double b = budget.IsNumber() ? budget.As<Napi::Number>().DoubleValue() : -1;
      if (!(b >= 0 && b <= 9007199254740991.0 && b == static_cast<double>(static_cast<uint64_t>(b))))
        throw Napi::RangeError::New(env, "deviceBudgetBytes must be a non-negative integer");
      opts.device_budget_bytes = static_cast<size_t>(b);
    }
    const Napi::Value graphs = o.Get("cudaGraphs");
    if (!graphs.IsUndefined()) {
      if (!graphs.IsBoolean()) throw Napi::TypeError::New(env, "cudaGraphs must be a boolean");
      opts.cuda_graphs = graphs.As<Napi::Boolean>().Value();
    }
    const Napi::Value device = o.Get("device");
    if (!device.IsUndefined()) {
      if (!device.IsString()) throw Napi::TypeError::New(env, "device must be a string (cpu, cuda, cuda:N or auto)");
      opts.device = device.As<Napi::String>().Utf8Value();
    }
    const Napi::Value kernels = o.Get("cudaKernels");
    if (!kernels.IsUndefined()) {
      if (!kernels.IsString()) throw Napi::TypeError::New(env, "cudaKernels must be a string (simple, fast or a list)");
      opts.cuda_kernels = kernels.As<Napi::String>().Utf8Value();
    }
    try {
      engine_ = std::make_shared<Engine>(NativeModel::Unwrap(info[0].As<Napi::Object>())->model(), opts);
    } catch (const DeviceError& e) {
      throw device_error(env, e);
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, e.what());
    }
    worker_ = std::make_unique<EngineWorker>(env);
  }

 private:
  Napi::Value Info(const Napi::CallbackInfo& info) {
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("kernels", engine_->kernels().name);
    o.Set("threads", engine_->options().n_threads);
    o.Set("decodeThreads", engine_->options().n_threads_decode);
    o.Set("ubatch", engine_->options().ubatch);
    o.Set("maxContext", engine_->max_context());
    o.Set("deviceBudgetBytes", static_cast<double>(engine_->options().device_budget_bytes));
    o.Set("device", engine_->device_name());
    o.Set("cudaGraphs", engine_->options().cuda_graphs && engine_->device() != nullptr);
    o.Set("cudaKernels", engine_->device() ? cuda_kernels_name(parse_cuda_kernels(engine_->options().cuda_kernels)) : "");
    o.Set("deviceDescription", engine_->device_description());
    o.Set("deviceWeightBytes", static_cast<double>(engine_->device() ? engine_->device()->weight_bytes() : 0));
    o.Set("weightBytesPerToken", static_cast<double>(engine_->weight_bytes_per_token()));
    o.Set("ringRows", engine_->ring_rows());
    return o;
  }
  // kvBytes(nTokens, ringBatch?, globalRows?): the KV bytes a sequence of this engine holds with n
  // tokens (its sliding layers' rings at most; its global layers' globalRows at most, when given:
  // a reclaiming policy's bound), for admission before any sequence exists.
  Napi::Value KvBytes(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || info.Length() > 3 || !info[0].IsNumber())
      throw Napi::TypeError::New(env, "kvBytes(nTokens, ringBatch?, globalRows?) needs a number");
    auto count = [&](size_t i, const char* what) {
      const double n = info[i].As<Napi::Number>().DoubleValue();
      if (!(n >= 0 && n <= (1 << 24) && n == static_cast<int>(n)))
        throw Napi::RangeError::New(env, std::string("kvBytes: ") + what + " must be an integer in [0, 2^24]");
      return static_cast<int>(n);
    };
    int global_rows = -1;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      if (!info[2].IsNumber()) throw Napi::TypeError::New(env, "kvBytes: globalRows must be a number");
      global_rows = count(2, "globalRows");
    }
    return Napi::Number::New(env, static_cast<double>(engine_->kv_bytes(count(0, "nTokens"), ring_batch_arg(info, 1), global_rows)));
  }
  // An optional ring batch (createSequence, kvBytes): 0 when absent.
  static int ring_batch_arg(const Napi::CallbackInfo& info, size_t i) {
    if (info.Length() <= i || info[i].IsUndefined()) return 0;
    const double b = info[i].IsNumber() ? info[i].As<Napi::Number>().DoubleValue() : -1;
    if (!(b >= 1 && b <= 8192 && b == static_cast<int>(b)))
      throw Napi::RangeError::New(info.Env(), "ringBatch must be an integer in [1, 8192]");
    return static_cast<int>(b);
  }

  Napi::Value CreateSequence(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int capacity = engine_->max_context();
    if (info.Length() > 0 && !info[0].IsUndefined()) {
      if (!info[0].IsNumber()) throw Napi::TypeError::New(env, "createSequence(capacity): capacity must be a number");
      const double c = info[0].As<Napi::Number>().DoubleValue();
      if (c != static_cast<int>(c) || c < 1 || c > engine_->max_context())
        throw Napi::RangeError::New(env,
                                    "createSequence: capacity must be an integer in [1, " + std::to_string(engine_->max_context()) + "]");
      capacity = static_cast<int>(c);
    }
    try {
      NativeSequence::SequenceInit init{engine_->create_sequence(capacity, ring_batch_arg(info, 1)), engine_->model_ptr()};
      auto ext = Napi::External<NativeSequence::SequenceInit>::New(env, &init);
      return NativeSequence::ctor.New({ext});
    } catch (const DeviceError& e) {
      throw device_error(env, e);
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, e.what());
    }
  }

  // forward([{ seq, tokens: Int32Array, logits?: Float32Array(nVocab), argmax?: Int32Array(1) }])
  // -> Promise<void>. Appends the tokens to each sequence; fills `logits` with the next-token
  // logits and `argmax` with the greedy next token.
  Napi::Value Forward(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() != 1 || !info[0].IsArray()) throw Napi::TypeError::New(env, "forward(items) needs an array");
    Napi::Array arr = info[0].As<Napi::Array>();
    if (arr.Length() == 0) throw Napi::RangeError::New(env, "forward: empty batch");
    struct Owned {
      std::shared_ptr<Sequence> seq;
      std::vector<int32_t> tokens;
      float* logits;
      float* probe;
      int32_t* argmax;
    };
    auto owned = std::make_shared<std::vector<Owned>>();
    std::vector<NativeSequence*> seqs;
    // Everything the job touches stays reachable until it settles, even if the caller drops it.
    Napi::Object keep = Napi::Object::New(env);
    Napi::Array held = Napi::Array::New(env);
    keep.Set("engine", Value());
    keep.Set("held", held);
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Value v = arr.Get(i);
      if (!v.IsObject()) throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + " is not an object");
      Napi::Object o = v.As<Napi::Object>();
      Napi::Value sv = o.Get("seq");
      if (!sv.IsObject() || !sv.As<Napi::Object>().InstanceOf(NativeSequence::ctor.Value()))
        throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + ".seq is not a sequence");
      NativeSequence* ns = NativeSequence::Unwrap(sv.As<Napi::Object>());
      if (ns->busy) throw Napi::Error::New(env, "forward: sequence is already in a forward pass");
      Napi::Value tv = o.Get("tokens");
      if (!tv.IsTypedArray() || tv.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
        throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + ".tokens must be an Int32Array");
      Napi::Int32Array ta = tv.As<Napi::Int32Array>();
      float* logits = nullptr;
      Napi::Value lv = o.Get("logits");
      if (!lv.IsUndefined() && !lv.IsNull()) {
        if (!lv.IsTypedArray() || lv.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
            lv.As<Napi::Float32Array>().ElementLength() != static_cast<size_t>(engine_->config().n_vocab))
          throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + ".logits must be a Float32Array of nVocab");
        logits = lv.As<Napi::Float32Array>().Data();
      }
      float* probe = nullptr;
      Napi::Value pv = o.Get("probe");
      if (!pv.IsUndefined() && !pv.IsNull()) {
        const size_t want = static_cast<size_t>(engine_->config().n_layer) * (ns->seq()->n_past() + 1);
        if (!pv.IsTypedArray() || pv.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
            pv.As<Napi::Float32Array>().ElementLength() != want)
          throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + ".probe must be a Float32Array of nLayer * (nPast + 1)");
        probe = pv.As<Napi::Float32Array>().Data();
      }
      int32_t* argmax = nullptr;
      Napi::Value av = o.Get("argmax");
      if (!av.IsUndefined() && !av.IsNull()) {
        if (!av.IsTypedArray() || av.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array ||
            av.As<Napi::Int32Array>().ElementLength() != 1)
          throw Napi::TypeError::New(env, "forward: item " + std::to_string(i) + ".argmax must be an Int32Array of length 1");
        argmax = av.As<Napi::Int32Array>().Data();
      }
      for (NativeSequence* other : seqs)
        if (other == ns) throw Napi::Error::New(env, "forward: a sequence appears twice in one batch");
      seqs.push_back(ns);
      held.Set(held.Length(), sv);
      if (logits) held.Set(held.Length(), lv);
      if (probe) held.Set(held.Length(), pv);
      if (argmax) held.Set(held.Length(), av);
      owned->push_back({ns->seq(), std::vector<int32_t>(ta.Data(), ta.Data() + ta.ElementLength()), logits, probe, argmax});
    }
    for (NativeSequence* ns : seqs) ns->busy = true;
    auto engine = engine_;
    return worker_->submit(
        env,
        [engine, owned] {
          std::vector<BatchItem> items;
          for (auto& o : *owned)
            items.push_back({o.seq.get(), o.tokens.data(), static_cast<int>(o.tokens.size()), o.logits, o.probe, o.argmax});
          engine->forward(items);
        },
        [](Napi::Env e) -> Napi::Value { return e.Undefined(); },
        [seqs] {
          for (NativeSequence* ns : seqs) ns->busy = false;
        },
        keep);
  }

  // pickRounds(seq) -> Promise<number[]>: Round Attention's pick of earlier rounds over the prompt
  // the sequence holds (Engine::pick_rounds), on the engine's thread like a forward pass.
  Napi::Value PickRounds(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() != 1 || !info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(NativeSequence::ctor.Value()))
      throw Napi::TypeError::New(env, "pickRounds(seq) needs a sequence");
    NativeSequence* ns = NativeSequence::Unwrap(info[0].As<Napi::Object>());
    if (ns->busy) throw Napi::Error::New(env, "pickRounds: sequence is busy in a forward pass");
    if (!dynamic_cast<RoundPicker*>(ns->seq()->policy.get()))
      throw Napi::RangeError::New(env, "pickRounds: the sequence's policy is not rounds");
    Napi::Object keep = Napi::Object::New(env);
    keep.Set("engine", Value());
    keep.Set("seq", info[0]);
    auto picked = std::make_shared<std::vector<int>>();
    ns->busy = true;
    auto engine = engine_;
    auto seq = ns->seq();
    return worker_->submit(
        env, [engine, seq, picked] { *picked = engine->pick_rounds(*seq); },
        [picked](Napi::Env e) -> Napi::Value {
          Napi::Array out = Napi::Array::New(e, picked->size());
          for (size_t i = 0; i < picked->size(); ++i) out.Set(static_cast<uint32_t>(i), Napi::Number::New(e, (*picked)[i]));
          return out;
        },
        [ns] { ns->busy = false; }, keep);
  }

  std::shared_ptr<Engine> engine_;
  std::unique_ptr<EngineWorker> worker_;
};

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("readGgufMetadata", Napi::Function::New(env, ReadGgufMetadata));
  exports.Set("ggufInfo", Napi::Function::New(env, GgufInfo));
  exports.Set("loadModel", Napi::Function::New(env, LoadModel));
  exports.Set("cudaStatus", Napi::Function::New(env, CudaStatus));
  exports.Set("kvPool", Napi::Function::New(env, KvPoolStats));
  exports.Set("measureReadBandwidth", Napi::Function::New(env, MeasureReadBandwidth));
  exports.Set("policyFields",
              Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value { return policy_fields_to_js(info.Env()); }));
  init_kv_io(env, exports);
  NativeModel::Init(env, exports);
  NativeSequence::Init(env, exports);
  NativeEngine::Init(env, exports);
  return exports;
}

}  // namespace ctx

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return ctx::Init(env, exports); }
NODE_API_MODULE(ctxbank_native, InitAddon)
