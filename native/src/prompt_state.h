// What a decode policy derives from the prompt for its decode steps, as bytes: a prefill in
// another process exports it with the KV, the decode imports it after the KV
// (docs/architecture.md). The smallest thing that suffices: SCOPE's prompt pool as its kept
// token lists (computed by the prefill); the OmniKV window selectors' and Round Attention's last
// prompt queries themselves (every decode step weighs them anew).
//
// Layout (little-endian): u32 magic "CXPS", u32 version, u32 query width (n_head x head_dim:
// n_embd for Llama), u32 n_tokens (the prompt's length), u32 kind, then
//   kind 1, query windows: u32 keep (queries a window holds at most), u32 n_windows, then per
//     window: u32 layer, u32 count, count x i32 positions (ascending, < n_tokens), count x query width
//     f32 queries;
//   kind 2, kept prompt lists: u32 alpha1, u32 alpha2, u32 n_lists (per layer, then KV head),
//     then per list: u32 count (<= alpha1 + alpha2), count x i32 positions (ascending, < n_tokens).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode_policy.h"
#include "policies/common.h"

namespace ctx {

// Implemented by the policies that derive state from the prompt (policies/scope.cc,
// policies/omnikv.h).
class PromptStateHolder {
 public:
  struct Windows {
    std::vector<int> layers;            // the layer each window belongs to, ascending
    std::vector<QueryWindow*> windows;  // the policy's own, parallel to `layers`
    int keep = 0;                       // queries a window holds at most
  };
  // The query windows decode steps will read; empty when this configuration remembers none.
  virtual Windows prompt_windows(const ModelConfig& c) { return {}; }

  struct Pools {
    const std::vector<std::vector<int32_t>>* lists = nullptr;  // per (layer, KV head), ascending
    int alpha1{}, alpha2{};                                    // zero: no pools
  };
  // The kept prompt lists computed for a prompt of n_tokens; lists null when there are none.
  virtual Pools prompt_pools(const ModelConfig& c, int n_tokens) const { return {}; }
  // The prompt state is wanted when the prompt ends (a prefill that exports it): derive it as
  // each prompt chunk is cached rather than at the first decode step.
  virtual void derive_eagerly() {}
  // Takes lists computed elsewhere for this prompt of n_tokens (well formed: one per layer and KV
  // head, ascending positions below n_tokens, at most alpha1 + alpha2 each); false when this
  // policy keeps no pool or another one.
  virtual bool take_prompt_pools(const ModelConfig& c, int n_tokens, int alpha1, int alpha2, std::vector<std::vector<int32_t>>& lists) {
    return false;
  }

 protected:
  ~PromptStateHolder() = default;
};

// Has the policy derive its prompt state as the prompt is cached (PromptStateHolder::derive_eagerly).
void derive_prompt_state_eagerly(DecodePolicy& policy);

// The policy's prompt state for a prompt of n_tokens; empty when it has none.
std::vector<uint8_t> export_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens);

// Loads a blob from export_prompt_state into `policy` (after the KV import: the sequence holds
// n_tokens). std::invalid_argument when the blob is malformed (bad magic, version, sizes, layers,
// positions, non-finite queries, or another model or prompt length); false, nothing changed, when
// it is well formed but made for a policy that derives other state from the prompt.
bool import_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens, const uint8_t* data, size_t size);

}  // namespace ctx
