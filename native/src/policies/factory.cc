#include "policies/policies.h"

namespace ctx {

std::unique_ptr<DecodePolicy> make_decode_policy(const AttentionPolicy& spec) {
  using Kind = AttentionPolicy::Kind;
  switch (spec.kind) {
    case Kind::Full:
      return make_full_policy(spec);
    case Kind::OmniKv:
      return make_omnikv_policy(spec);
    case Kind::Scope:
      return make_scope_policy(spec);
    case Kind::OmniKvScope:
      return make_omnikv_scope_policy(spec);
    case Kind::Rounds:
      return make_rounds_policy(spec);
    case Kind::Streaming:
      return make_streaming_policy(spec);
    case Kind::H2o:
      return make_h2o_policy(spec);
  }
  return make_full_policy(spec);
}

}  // namespace ctx
