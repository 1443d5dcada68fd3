// Complete policy configurations for the tests: the engine holds no defaults (policy.h), so each
// helper sets every field, with the values of shared/inference/defaults.ts where a test does not
// care. Aggregate initialization in field order: the tests build with
// -Werror=missing-field-initializers, so a field added to policy.h and not here fails to compile.
#pragma once
#include <utility>
#include <vector>

#include "policy.h"

namespace ctx::test {

inline OmniKvConfig omnikv_config(std::vector<int> filter_layers, int budget, Selector selector = Selector::Last) {
  // filter_layers, budget, selector, window, guard, lazy_iou, offload
  return OmniKvConfig{std::move(filter_layers), budget, selector, 16, true, 0.f, false};
}

inline ScopeConfig scope_config(int beta1, int beta2, int max_output, ScopeMode mode = ScopeMode::Slide) {
  // mode, beta1, beta2, max_output, alpha1, alpha2, reclaim
  return ScopeConfig{mode, beta1, beta2, max_output, 0, 8, false};
}

// `p` with physical reclamation asked for (AttentionPolicy::reclaim: scope, streaming, h2o).
inline AttentionPolicy reclaiming(AttentionPolicy p) {
  p.scope.reclaim = p.kind == AttentionPolicy::Kind::Scope;
  p.streaming.reclaim = p.kind == AttentionPolicy::Kind::Streaming;
  p.h2o.reclaim = p.kind == AttentionPolicy::Kind::H2o;
  return p;
}

inline RoundsConfig rounds_config(int watershed_layer, std::vector<int> starts, int top_k) {
  // watershed_layer, starts, top_k
  return RoundsConfig{watershed_layer, std::move(starts), top_k};
}

}  // namespace ctx::test
