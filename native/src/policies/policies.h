// One constructor per policy file; factory.cc picks among them by kind.
#pragma once
#include <memory>

#include "decode_policy.h"

namespace ctx {

std::unique_ptr<DecodePolicy> make_full_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_omnikv_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_scope_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_omnikv_scope_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_rounds_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_streaming_policy(const AttentionPolicy& spec);
std::unique_ptr<DecodePolicy> make_h2o_policy(const AttentionPolicy& spec);

}  // namespace ctx
