// Conversions between JS policy objects and the engine's AttentionPolicy (see policy.h).
#pragma once
#include <napi.h>

#include "engine.h"

namespace ctx {

// { kind, <the kind's sub-objects> } -> a validated policy. The object must be complete: TypeError
// for a missing, unknown or mistyped field, RangeError for values the model or the algorithm
// cannot take.
AttentionPolicy policy_from_js(Napi::Object policy, const ModelConfig& model);
// The fields policy_from_js requires, per sub-object: { omnikv: [...], scope: [...], ... }.
Napi::Object policy_fields_to_js(Napi::Env env);
Napi::Object policy_stats_to_js(Napi::Env env, const Sequence& seq);

}  // namespace ctx
