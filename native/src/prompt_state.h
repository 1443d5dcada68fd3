// What a decode policy remembers of the prompt's queries (SCOPE's prompt-pool observation window,
// the OmniKV window selectors' and Round Attention's last queries), as bytes: a prefill in another
// process exports it with the KV, the decode imports it after the KV (docs/architecture.md).
//
// Layout (little-endian): u32 magic "CXPS", u32 version, u32 n_embd, u32 n_tokens (the prompt's
// length), u32 keep (queries each window holds at most), u32 n_windows, then per window: u32
// layer, u32 count, count x i32 positions (ascending, < n_tokens), count x n_embd f32 queries.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode_policy.h"
#include "policies/common.h"

namespace ctx {

// Implemented by the policies that remember prompt queries (policies/scope.cc, policies/omnikv.h).
class PromptQueries {
 public:
  struct Windows {
    std::vector<int> layers;            // the layer each window belongs to, ascending
    std::vector<QueryWindow*> windows;  // the policy's own, parallel to `layers`
    int keep = 0;                       // queries a window holds at most
  };
  // The windows decode steps will read; empty when this configuration remembers none.
  virtual Windows prompt_windows(const ModelConfig& c) = 0;

 protected:
  ~PromptQueries() = default;
};

// The policy's remembered prompt queries for a prompt of n_tokens; empty when it keeps none.
std::vector<uint8_t> export_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens);

// Loads a blob from export_prompt_state into `policy` (after the KV import: the sequence holds
// n_tokens). std::invalid_argument when the blob is malformed (bad magic, version, sizes, layers,
// positions, non-finite queries, or another model or prompt length); false, nothing changed, when
// it is well formed but made for a policy that remembers other windows.
bool import_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens, const uint8_t* data, size_t size);

}  // namespace ctx
