// The decode-policy interface: what the engine asks of an attention policy at each decode step,
// one implementation per file in policies/ (full, omnikv, scope, omnikv+scope, rounds,
// streaming, h2o). A policy decides *which* tokens each layer and KV head attends to and keeps
// its own per-sequence state; the backend (the CPU engine today) does every computation over
// the KV cache and calls the policy at fixed points of the forward pass:
//
//   begin(step)                     once per micro-batch a sequence takes part in
//   observe_prompt(layer, step)     prompt chunks, after the layer's K/V are in the cache
//   keys(layer, step)               decode steps, before the layer's attention
//   update(layer, g, probs, n)      decode steps, after attention over a listed key set
//
// The engine never asks which kind a policy is. Prefill is always full attention.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv_cache.h"
#include "model.h"
#include "policy.h"

namespace ctx {

// What a policy may ask of the backend while it decides. Scores and softmax are the backend's
// (the same kernels as attention, so selections are bit-identical to the attention's view).
class PolicyBackend {
 public:
  virtual const ModelConfig& config() const = 0;
  // Micro-batch row t at the current layer: its query (post-RoPE, [n_head][head_dim]) and position.
  virtual const float* query(int t) const = 0;
  virtual int position(int t) const = 0;
  // Pre-softmax scores of query q (every head) over keys [0, n_keys) of `layer`, as
  // [n_head][n_keys]; the buffer is the backend's and valid until the next call.
  virtual float* score_keys(const KvCache& kv, int layer, const float* q, int n_keys) = 0;
  // Softmax of `rows` rows of n scores each, in place.
  virtual void softmax(float* scores, int rows, int n) = 0;

 protected:
  ~PolicyBackend() = default;
};

// One sequence's rows in the current micro-batch.
struct PolicyStep {
  PolicyBackend& backend;
  KvCache& kv;
  int t;        // its first micro-batch row
  int count;    // its rows in this micro-batch (a decode step: 1)
  int pos0;     // position of row t
  bool prompt;  // part of a prompt (an item of several tokens), else a decode step
};

// Keys of a sparse layer already gathered into one packed buffer (OmniKV offload): the first n
// keys of every head's list are rows 0..n-1 here, ld elements apart, K at 0 and V at kv_dim.
struct PackedRows {
  const uint16_t* k = nullptr;
  size_t ld = 0;
  int n = 0;
};

// What a decode step attends to at one layer.
struct LayerKeys {
  // Per KV head, ascending positions (every one before or at the current token); nullptr: the
  // whole cache (the dense path). Owned by the policy, valid until its next keys() call.
  const std::vector<std::vector<int32_t>>* heads = nullptr;
  PackedRows packed;
  // The whole cache, and the policy ranks keys by this step's raw scores: the backend keeps them
  // as its attention computes them and hands them to DecodePolicy::scored after the layer.
  bool wants_scores = false;
  bool listed() const { return heads != nullptr; }
};

// What policyStats reports (addon_policy.cc).
struct PolicyStats {
  int prompt_len = -1;                         // -1: no decode step since the last prompt
  uint64_t selections = 0, lazy_reuses = 0;    // OmniKV selections run, and reused by lazy_iou
  std::vector<std::vector<int32_t>> selected;  // OmniKV: per filter layer, prompt positions
  double decode_pool_tokens = 0;               // SCOPE / H2O: kept per (layer, KV head), summed
  double prompt_pool_tokens = 0;               // SCOPE prompt pool, summed the same way
};

class DecodePolicy {
 public:
  explicit DecodePolicy(const AttentionPolicy& spec) : spec_(spec) {}
  virtual ~DecodePolicy() = default;
  DecodePolicy(const DecodePolicy&) = delete;
  DecodePolicy& operator=(const DecodePolicy&) = delete;

  // The validated configuration this policy was made from.
  const AttentionPolicy& spec() const { return spec_; }
  const char* name() const { return spec_.name(); }

  // Per layer: OmniKV's roles and the filter layer (index) each sparse layer follows; empty for
  // policies without layer roles. The prefill groups its KV chunks by them.
  virtual std::vector<LayerRole> layer_roles() const { return {}; }
  virtual std::vector<int> layer_groups() const { return {}; }
  // True if every decode step attends the whole cache at every layer (attention probes allowed).
  virtual bool attends_everything() const { return false; }
  // Layer groups whose KV lives in the host bank (KvCache::offload), and the device rows of the
  // packed buffers those groups need at most (per K/V row pair).
  virtual std::vector<std::vector<int>> host_groups() const { return {}; }
  virtual size_t packed_rows() const { return 0; }

  // The cache was rewound or replaced: forget every selection, pool and remembered query.
  virtual void reset() = 0;
  // Before each micro-batch this sequence is part of. Prompt tokens restart the decode-time
  // state at the next decode step; the first decode step after a prompt sets it up.
  virtual void begin(const PolicyStep& step) = 0;
  // A prompt chunk after `layer`'s K/V are cached: remember what decode steps will need.
  virtual void observe_prompt(int layer, const PolicyStep& step) {}
  // A decode step at `layer`: the keys each KV head attends to (runs the layer's selection).
  virtual LayerKeys keys(int layer, const PolicyStep& step) = 0;
  // After a decode step's attention at a layer whose keys() wanted its scores: raw
  // [n_head][n_keys], the token's scaled query-key dot products over keys [0, n_keys), as
  // PolicyBackend::score_keys computes them, bit for bit.
  virtual void scored(int layer, const PolicyStep& step, const float* raw, int n_keys) {}
  // After a decode step's attention at (layer, KV head g) over keys(layer).heads[g]: the
  // softmax probabilities [n_head / n_head_kv][n_keys] if reads_probabilities(), else null. Calls
  // for different heads of one layer may run concurrently; a policy keeps per-head state apart.
  // If `evicted` is given, the policy appends the positions no later step of (layer, g) will
  // attend, so the backend can free them.
  virtual void update(int layer, int g, const float* probs, int n_keys, std::vector<int32_t>* evicted) {}
  // Whether update() reads the probabilities (SCOPE's pools, H2O's scores): the backend then
  // computes whole softmax rows besides the attention itself, which it computes in one pass.
  virtual bool reads_probabilities() const { return false; }
  // Whether its evictions are final and it reads no evicted KV again (not even for scores), so
  // the backend may reuse their rows (kv_slots.h): SCOPE, H2O, streaming.
  virtual bool reclaims() const { return false; }

  virtual PolicyStats stats() const = 0;
  // Host bytes of the policy's own state (selections, pools, remembered queries, packed rows).
  virtual size_t state_bytes() const = 0;

 private:
  AttentionPolicy spec_;
};

// Round Attention's pick of earlier rounds, made where the prompt ends (policies/rounds.cc): a
// prefill that hands its KV over picks, so that it can name the rounds the decode must load, and
// the decode attends exactly the rounds it was given.
class RoundPicker {
 public:
  // The earlier rounds (indices into spec().rounds.starts, ascending) the current round's
  // remembered queries pick at the watershed layer, over a cache holding the whole prompt
  // (kv.size() tokens, none generated yet). The backend's scores, as a decode step's.
  virtual std::vector<int> pick_rounds(PolicyBackend& backend, const KvCache& kv) = 0;
  // Fixes the rounds decode steps attend above the watershed (a pick made by the prefill), until
  // the cache is reset or new prompt tokens come. std::invalid_argument unless `rounds` are
  // ascending indices of earlier rounds of a prompt of n_prompt tokens.
  virtual void take_picked_rounds(const std::vector<int>& rounds, int n_prompt) = 0;

 protected:
  ~RoundPicker() = default;
};

// The one place that maps a policy kind to its implementation (policies/factory.cc).
std::unique_ptr<DecodePolicy> make_decode_policy(const AttentionPolicy& spec);

}  // namespace ctx
