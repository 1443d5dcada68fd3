// Conversions between JS policy objects and the engine's AttentionPolicy (see policy.h).
#pragma once
#include <napi.h>

#include "engine.h"

namespace ctx {

// { kind, omnikv?, scope?, streaming?, h2o? } -> a validated policy; TypeError for malformed
// objects, RangeError for values the model or the algorithm cannot take.
AttentionPolicy policy_from_js(Napi::Object policy, const ModelConfig& model);
Napi::Object policy_stats_to_js(Napi::Env env, const Sequence& seq);

}  // namespace ctx
