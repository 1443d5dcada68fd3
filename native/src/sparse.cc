// The engine's side of decode policies (decode_policy.h): it asks each sequence's policy what to
// attend at every layer, and serves the scores and softmax policies compute their choices from.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine.h"

namespace ctx {

// Sets slice_keys_ for `layer`: prompt chunks let their policy observe the layer (remembered
// queries); decode steps get their policy's key lists (not listed: the whole cache, the faster
// dense path). A sliding-window layer's decode steps attend their window whatever the policy:
// the window already bounds what they read, so the policies choose keys on the global layers
// only (OmniKV's filter layers are global ones: policy.cc).
void Engine::prepare_sparse(int layer, const std::vector<Slice>& slices) {
  slice_keys_.assign(slices.size(), LayerKeys{});
  if (slice_raw_.size() < slices.size()) slice_raw_.resize(slices.size());
  const bool slides = config().layer_slides(layer);
  int t = 0;
  for (size_t i = 0; i < slices.size(); t += slices[i].count, ++i) {
    const PolicyStep step = policy_step(slices[i], t);
    DecodePolicy& policy = *slices[i].item->seq->policy;
    if (step.prompt) {
      policy.observe_prompt(layer, step);
      continue;
    }
    if (!slides) slice_keys_[i] = policy.keys(layer, step);
    if (slice_keys_[i].wants_scores) {
      if (slice_keys_[i].listed() || step.count != 1)
        throw std::logic_error("prepare_sparse: scores are kept for one dense decode token only");
      slice_raw_[i].resize(static_cast<size_t>(config().n_head) * (step.pos0 + 1));
    }
    uint64_t read = 0;
    if (slice_keys_[i].listed())
      for (const auto& head : *slice_keys_[i].heads) read += head.size();
    else
      read = static_cast<uint64_t>(step.pos0 + 1 - first_key(layer, step.pos0)) * config().n_head_kv;
    slices[i].item->seq->decode_keys_read += read;
  }
}

void Engine::finish_sparse(int layer, const std::vector<Slice>& slices) {
  int t = 0;
  for (size_t i = 0; i < slices.size(); t += slices[i].count, ++i)
    if (slice_keys_[i].wants_scores)
      slices[i].item->seq->policy->scored(layer, policy_step(slices[i], t), slice_raw_[i].data(), slices[i].pos0 + 1);
}

// Raw scores [n_head][n_keys] of query q over keys [0, n_keys) of `layer`, with the attention's
// score kernel, straight from the cache (each block's successor fetched ahead).
float* Engine::score_keys(const KvCache& kv, int layer, const float* q, int n_keys) {
  const ModelConfig& c = config();
  const int d = c.head_dim, group = c.n_head / c.n_head_kv;
  const float scale = c.attn_scale;
  // (Policies score global layers only: a sliding layer's ring no longer holds its old keys.)
  if (kv.in_ring(layer)) throw std::logic_error("score_keys: layer " + std::to_string(layer) + " keeps a ring of rows");
  for (int k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int nk = std::min(kKeyBlock, n_keys - k0);
    const bool more = k0 + kKeyBlock < n_keys;
    for (int g = 0; g < c.n_head_kv; ++g)
      k_.attn_scores_f16(q + static_cast<size_t>(g) * group * d, group, kv.k(layer, k0) + g * d, kv.ld(layer), nk, d, scale,
                         &sel_raw_[static_cast<size_t>(g) * group * n_keys + k0], n_keys,
                         more ? kv.k(layer, k0 + kKeyBlock) + g * d : nullptr);
  }
  return sel_raw_.data();
}

std::vector<int> Engine::pick_rounds(Sequence& seq) {
  auto* picker = dynamic_cast<RoundPicker*>(seq.policy.get());
  if (!picker) throw std::invalid_argument("pickRounds: the sequence's policy is not rounds");
  if (seq.device_kv) throw std::invalid_argument("pickRounds: a GPU sequence (sparse policies run on the CPU engine)");
  if (seq.n_past() == 0) throw std::invalid_argument("pickRounds: the sequence holds no prompt");
  return picker->pick_rounds(*this, seq.kv);
}

void Engine::softmax(float* scores, int rows, int n) {
  softmax_rows(scores, static_cast<size_t>(n), rows, n, [&](int) { return KeyRange{0, n}; });
}

}  // namespace ctx
