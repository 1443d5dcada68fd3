// JS objects to attention policies and back, for NativeSequence.setPolicy / policyStats.
#include "addon_policy.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx {

namespace {

int int_field(Napi::Object o, const char* key, int fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber() || v.As<Napi::Number>().DoubleValue() != v.As<Napi::Number>().Int32Value())
    throw Napi::TypeError::New(o.Env(), std::string(key) + " must be an integer");
  return v.As<Napi::Number>().Int32Value();
}

// o[key] as an array of integers; `what` names it in the TypeError ("omnikv.filterLayers").
std::vector<int> int_array_field(Napi::Object o, const char* key, const std::string& what) {
  const Napi::Value v = o.Get(key);
  if (!v.IsArray()) throw Napi::TypeError::New(o.Env(), what + " must be an array of integers");
  const Napi::Array arr = v.As<Napi::Array>();
  std::vector<int> out;
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    const Napi::Value e = arr.Get(i);
    if (!e.IsNumber() || e.As<Napi::Number>().DoubleValue() != e.As<Napi::Number>().Int32Value())
      throw Napi::TypeError::New(o.Env(), what + " must hold integers");
    out.push_back(e.As<Napi::Number>().Int32Value());
  }
  return out;
}

Napi::Object sub_object(Napi::Object o, const char* key) {
  const Napi::Value v = o.Get(key);
  if (!v.IsObject()) throw Napi::TypeError::New(o.Env(), std::string("policy.") + key + " must be an object");
  return v.As<Napi::Object>();
}

OmniKvConfig omnikv_config(Napi::Object policy) {
  Napi::Env env = policy.Env();
  Napi::Object o = sub_object(policy, "omnikv");
  OmniKvConfig cfg;
  cfg.filter_layers = int_array_field(o, "filterLayers", "omnikv.filterLayers");
  cfg.budget = int_field(o, "budget", cfg.budget);
  const Napi::Value sel = o.Get("selector");
  if (!sel.IsUndefined() && (!sel.IsString() || !parse_selector(sel.As<Napi::String>().Utf8Value(), &cfg.selector)))
    throw Napi::TypeError::New(env, "omnikv.selector: unknown selector (supported: last, last_softmax, uniform, exp)");
  cfg.window = int_field(o, "window", cfg.window);
  const Napi::Value offload = o.Get("offload");
  if (!offload.IsUndefined()) {
    if (!offload.IsBoolean()) throw Napi::TypeError::New(env, "omnikv.offload must be a boolean");
    cfg.offload = offload.As<Napi::Boolean>().Value();
  }
  const Napi::Value guard = o.Get("guard");
  if (!guard.IsUndefined()) {
    if (!guard.IsBoolean()) throw Napi::TypeError::New(env, "omnikv.guard must be a boolean");
    cfg.guard = guard.As<Napi::Boolean>().Value();
  }
  const Napi::Value lazy = o.Get("lazyIou");
  if (!lazy.IsUndefined()) {
    if (!lazy.IsNumber()) throw Napi::TypeError::New(env, "omnikv.lazyIou must be a number");
    cfg.lazy_iou = lazy.As<Napi::Number>().FloatValue();
  }
  return cfg;
}
ScopeConfig scope_config(Napi::Object policy) {
  Napi::Env env = policy.Env();
  Napi::Object o = sub_object(policy, "scope");
  ScopeConfig cfg;
  const Napi::Value mode = o.Get("mode");
  if (!mode.IsUndefined()) {
    const std::string m = mode.IsString() ? mode.As<Napi::String>().Utf8Value() : "";
    if (m == "slide") cfg.mode = ScopeMode::Slide;
    else if (m == "adaptive") cfg.mode = ScopeMode::Adaptive;
    else if (m == "discontinuous") cfg.mode = ScopeMode::Discontinuous;
    else throw Napi::TypeError::New(env, "scope.mode must be slide, adaptive or discontinuous");
  }
  cfg.beta1 = int_field(o, "beta1", cfg.beta1);
  cfg.beta2 = int_field(o, "beta2", cfg.beta2);
  cfg.max_output = int_field(o, "maxOutput", cfg.max_output);
  cfg.alpha1 = int_field(o, "alpha1", cfg.alpha1);
  cfg.alpha2 = int_field(o, "alpha2", cfg.alpha2);
  return cfg;
}
}  // namespace

AttentionPolicy policy_from_js(Napi::Object o, const ModelConfig& mc) {
  Napi::Env env = o.Env();
  const Napi::Value kind = o.Get("kind");
  if (!kind.IsString()) throw Napi::TypeError::New(env, "policy.kind must be a string");
  const std::string k = kind.As<Napi::String>().Utf8Value();
  try {
    if (k == "full") return AttentionPolicy{};
    if (k == "omnikv") return AttentionPolicy::make_omnikv(omnikv_config(o), mc);
    if (k == "scope") return AttentionPolicy::make_scope(scope_config(o), mc);
    if (k == "omnikv+scope") return AttentionPolicy::make_omnikv_scope(omnikv_config(o), scope_config(o), mc);
    if (k == "streaming") {
      Napi::Object so = sub_object(o, "streaming");
      StreamingConfig cfg;
      cfg.sinks = int_field(so, "sinks", cfg.sinks);
      cfg.window = int_field(so, "window", cfg.window);
      return AttentionPolicy::make_streaming(cfg);
    }
    if (k == "rounds") {
      Napi::Object ro = sub_object(o, "rounds");
      RoundsConfig cfg;
      cfg.watershed_layer = int_field(ro, "watershedLayer", cfg.watershed_layer);
      cfg.top_k = int_field(ro, "topK", cfg.top_k);
      cfg.starts = int_array_field(ro, "starts", "rounds.starts");
      return AttentionPolicy::make_rounds(cfg, mc);
    }
    if (k == "h2o") {
      Napi::Object ho = sub_object(o, "h2o");
      H2oConfig cfg;
      cfg.budget = int_field(ho, "budget", cfg.budget);
      cfg.recent = int_field(ho, "recent", cfg.recent);
      return AttentionPolicy::make_h2o(cfg);
    }
  } catch (const std::invalid_argument& e) {
    throw Napi::RangeError::New(env, e.what());
  }
  throw Napi::TypeError::New(env, "policy.kind must be one of full, omnikv, scope, omnikv+scope, streaming, h2o, rounds");
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
