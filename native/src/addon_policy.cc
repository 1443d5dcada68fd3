// JS objects to attention policies and back, for NativeSequence.setPolicy / policyStats.
#include "addon_policy.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx {

namespace {

// The fields each sub-object must carry, all of them: the engine holds no defaults (the binding
// writes in shared/inference/defaults.ts through the schema, shared/inference/policy/schema.ts,
// whose field list test/engine/policy-schema.test.ts compares with this one).
const std::vector<std::string> kOmniKvFields = {"filterLayers", "budget", "selector", "window", "guard", "lazyIou", "offload"};
const std::vector<std::string> kScopeFields = {"mode", "beta1", "beta2", "maxOutput", "alpha1", "alpha2", "reclaim"};
const std::vector<std::string> kStreamingFields = {"sinks", "window", "reclaim"};
const std::vector<std::string> kH2oFields = {"budget", "recent", "reclaim"};
const std::vector<std::string> kRoundsFields = {"watershedLayer", "starts", "topK"};

// Refuses (TypeError naming it) a key of `o` outside `allowed` and a field of `allowed` it lacks.
void check_keys(Napi::Object o, const std::vector<std::string>& allowed, const std::string& what) {
  const Napi::Array names = o.GetPropertyNames();
  for (uint32_t i = 0; i < names.Length(); ++i) {
    const std::string key = names.Get(i).As<Napi::String>().Utf8Value();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw Napi::TypeError::New(o.Env(), what + "." + key + " is not a field of " + what);
  }
  for (const std::string& key : allowed)
    if (o.Get(key).IsUndefined())
      throw Napi::TypeError::New(o.Env(), what + "." + key + " is missing (the engine takes complete policies)");
}

int int_field(Napi::Object o, const char* key, const std::string& what) {
  const Napi::Value v = o.Get(key);
  if (!v.IsNumber() || v.As<Napi::Number>().DoubleValue() != v.As<Napi::Number>().Int32Value())
    throw Napi::TypeError::New(o.Env(), what + "." + key + " must be an integer");
  return v.As<Napi::Number>().Int32Value();
}

bool bool_field(Napi::Object o, const char* key, const std::string& what) {
  const Napi::Value v = o.Get(key);
  if (!v.IsBoolean()) throw Napi::TypeError::New(o.Env(), what + "." + key + " must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

std::string string_field(Napi::Object o, const char* key, const std::string& what) {
  const Napi::Value v = o.Get(key);
  if (!v.IsString()) throw Napi::TypeError::New(o.Env(), what + "." + key + " must be a string");
  return v.As<Napi::String>().Utf8Value();
}

// o[key] as an array of integers.
std::vector<int> int_array_field(Napi::Object o, const char* key, const std::string& what) {
  const Napi::Value v = o.Get(key);
  if (!v.IsArray()) throw Napi::TypeError::New(o.Env(), what + "." + key + " must be an array of integers");
  const Napi::Array arr = v.As<Napi::Array>();
  std::vector<int> out;
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    const Napi::Value e = arr.Get(i);
    if (!e.IsNumber() || e.As<Napi::Number>().DoubleValue() != e.As<Napi::Number>().Int32Value())
      throw Napi::TypeError::New(o.Env(), what + "." + key + " must hold integers");
    out.push_back(e.As<Napi::Number>().Int32Value());
  }
  return out;
}

// policy[key], an object with exactly `fields`.
Napi::Object sub_object(Napi::Object policy, const char* key, const std::vector<std::string>& fields) {
  const Napi::Value v = policy.Get(key);
  const std::string what = std::string("policy.") + key;
  if (!v.IsObject()) throw Napi::TypeError::New(policy.Env(), what + " must be an object");
  check_keys(v.As<Napi::Object>(), fields, what);
  return v.As<Napi::Object>();
}

OmniKvConfig omnikv_config(Napi::Object policy) {
  const std::string w = "policy.omnikv";
  Napi::Object o = sub_object(policy, "omnikv", kOmniKvFields);
  OmniKvConfig cfg;
  cfg.filter_layers = int_array_field(o, "filterLayers", w);
  cfg.budget = int_field(o, "budget", w);
  if (!parse_selector(string_field(o, "selector", w), &cfg.selector))
    throw Napi::TypeError::New(o.Env(), "policy.omnikv.selector: unknown selector (supported: last, last_softmax, uniform, exp)");
  cfg.window = int_field(o, "window", w);
  cfg.guard = bool_field(o, "guard", w);
  const Napi::Value lazy = o.Get("lazyIou");
  if (!lazy.IsNumber()) throw Napi::TypeError::New(o.Env(), "policy.omnikv.lazyIou must be a number");
  cfg.lazy_iou = lazy.As<Napi::Number>().FloatValue();
  cfg.offload = bool_field(o, "offload", w);
  return cfg;
}

ScopeConfig scope_config(Napi::Object policy) {
  const std::string w = "policy.scope";
  Napi::Object o = sub_object(policy, "scope", kScopeFields);
  ScopeConfig cfg;
  static const std::pair<const char*, ScopeMode> kModes[] = {
      {"slide", ScopeMode::Slide}, {"adaptive", ScopeMode::Adaptive}, {"discontinuous", ScopeMode::Discontinuous}};
  const std::string m = string_field(o, "mode", w);
  const auto* mode = std::find_if(std::begin(kModes), std::end(kModes), [&](const auto& e) { return m == e.first; });
  if (mode == std::end(kModes)) throw Napi::TypeError::New(o.Env(), "policy.scope.mode must be slide, adaptive or discontinuous");
  cfg.mode = mode->second;
  cfg.beta1 = int_field(o, "beta1", w);
  cfg.beta2 = int_field(o, "beta2", w);
  cfg.max_output = int_field(o, "maxOutput", w);
  cfg.alpha1 = int_field(o, "alpha1", w);
  cfg.alpha2 = int_field(o, "alpha2", w);
  cfg.reclaim = bool_field(o, "reclaim", w);
  return cfg;
}

StreamingConfig streaming_config(Napi::Object policy) {
  const std::string w = "policy.streaming";
  Napi::Object o = sub_object(policy, "streaming", kStreamingFields);
  StreamingConfig cfg;
  cfg.sinks = int_field(o, "sinks", w);
  cfg.window = int_field(o, "window", w);
  cfg.reclaim = bool_field(o, "reclaim", w);
  return cfg;
}

H2oConfig h2o_config(Napi::Object policy) {
  const std::string w = "policy.h2o";
  Napi::Object o = sub_object(policy, "h2o", kH2oFields);
  H2oConfig cfg;
  cfg.budget = int_field(o, "budget", w);
  cfg.recent = int_field(o, "recent", w);
  cfg.reclaim = bool_field(o, "reclaim", w);
  return cfg;
}

RoundsConfig rounds_config(Napi::Object policy) {
  const std::string w = "policy.rounds";
  Napi::Object o = sub_object(policy, "rounds", kRoundsFields);
  RoundsConfig cfg;
  cfg.watershed_layer = int_field(o, "watershedLayer", w);
  cfg.starts = int_array_field(o, "starts", w);
  cfg.top_k = int_field(o, "topK", w);
  return cfg;
}

}  // namespace

AttentionPolicy policy_from_js(Napi::Object o, const ModelConfig& mc) {
  Napi::Env env = o.Env();
  const Napi::Value kind = o.Get("kind");
  if (!kind.IsString()) throw Napi::TypeError::New(env, "policy.kind must be a string");
  const std::string k = kind.As<Napi::String>().Utf8Value();
  // The sub-objects each kind reads; any other key is refused.
  std::vector<std::string> keys = {"kind"};
  if (k == "omnikv" || k == "omnikv+scope") keys.push_back("omnikv");
  if (k == "scope" || k == "omnikv+scope") keys.push_back("scope");
  if (k == "streaming" || k == "h2o" || k == "rounds") keys.push_back(k);
  const bool known = k == "full" || k == "omnikv" || k == "scope" || k == "omnikv+scope" || k == "streaming" || k == "h2o" || k == "rounds";
  if (!known) throw Napi::TypeError::New(env, "policy.kind must be one of full, omnikv, scope, omnikv+scope, streaming, h2o, rounds");
  check_keys(o, keys, "policy");
  try {
    if (k == "full") return AttentionPolicy{};
    if (k == "omnikv") return AttentionPolicy::make_omnikv(omnikv_config(o), mc);
    if (k == "scope") return AttentionPolicy::make_scope(scope_config(o), mc);
    if (k == "omnikv+scope") return AttentionPolicy::make_omnikv_scope(omnikv_config(o), scope_config(o), mc);
    if (k == "streaming") return AttentionPolicy::make_streaming(streaming_config(o));
    if (k == "rounds") return AttentionPolicy::make_rounds(rounds_config(o), mc);
    return AttentionPolicy::make_h2o(h2o_config(o));
  } catch (const std::invalid_argument& e) {
    throw Napi::RangeError::New(env, e.what());
  }
}

Napi::Object policy_fields_to_js(Napi::Env env) {
  Napi::Object out = Napi::Object::New(env);
  const std::pair<const char*, const std::vector<std::string>*> parts[] = {{"omnikv", &kOmniKvFields},
                                                                           {"scope", &kScopeFields},
                                                                           {"streaming", &kStreamingFields},
                                                                           {"h2o", &kH2oFields},
                                                                           {"rounds", &kRoundsFields}};
  for (const auto& [name, fields] : parts) {
    Napi::Array a = Napi::Array::New(env, fields->size());
    for (size_t i = 0; i < fields->size(); ++i) a.Set(static_cast<uint32_t>(i), (*fields)[i]);
    out.Set(name, a);
  }
  return out;
}

Napi::Object policy_stats_to_js(Napi::Env env, const Sequence& seq) {
  Napi::Object o = Napi::Object::New(env);
  const DecodePolicy& policy = *seq.policy;
  const PolicyStats st = policy.stats();
  o.Set("kind", policy.name());
  o.Set("promptLength", st.prompt_len);
  o.Set("selections", static_cast<double>(st.selections));
  o.Set("lazyReuses", static_cast<double>(st.lazy_reuses));
  Napi::Array sizes = Napi::Array::New(env, st.selected.size());
  for (size_t i = 0; i < st.selected.size(); ++i) sizes.Set(static_cast<uint32_t>(i), static_cast<double>(st.selected[i].size()));
  o.Set("selectedSizes", sizes);
  // OmniKV: the current selection of each filter layer (prompt positions, ascending).
  Napi::Array selected = Napi::Array::New(env, st.selected.size());
  for (size_t i = 0; i < st.selected.size(); ++i) {
    Napi::Int32Array a = Napi::Int32Array::New(env, st.selected[i].size());
    std::copy(st.selected[i].begin(), st.selected[i].end(), a.Data());
    selected.Set(static_cast<uint32_t>(i), a);
  }
  o.Set("selected", selected);
  // SCOPE (generated tokens) and H2O (all tokens): kept per (layer, KV head), summed.
  o.Set("decodePoolTokens", st.decode_pool_tokens);
  // SCOPE prompt compression: prompt tokens kept, summed over the (layer, KV head) pools computed so far.
  o.Set("promptPoolTokens", st.prompt_pool_tokens);
  o.Set("decodeTokens", st.prompt_len < 0 ? 0 : seq.n_past() - st.prompt_len);
  // Decode steps since the policy was set: the KV bytes their attention read, every layer.
  o.Set("decodeKvBytesRead", static_cast<double>(seq.decode_keys_read * (seq.kv.row_pair_bytes() / seq.n_head_kv())));
  // OmniKV's per-layer roles and the filter layer (index into filterLayers) each sparse layer
  // follows; empty under other policies. The prefill groups its KV chunks by them.
  static const char* const kRoleNames[] = {"dense", "filter", "guard", "sparse"};
  const std::vector<LayerRole> role_list = policy.layer_roles();
  const std::vector<int> group_list = policy.layer_groups();
  Napi::Array roles = Napi::Array::New(env, role_list.size());
  Napi::Array groups = Napi::Array::New(env, group_list.size());
  for (size_t l = 0; l < role_list.size(); ++l) roles.Set(static_cast<uint32_t>(l), kRoleNames[static_cast<int>(role_list[l])]);
  for (size_t l = 0; l < group_list.size(); ++l) groups.Set(static_cast<uint32_t>(l), group_list[l]);
  o.Set("layerRoles", roles);
  o.Set("layerGroups", groups);
  return o;
}

}  // namespace ctx
