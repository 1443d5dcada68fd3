// StreamingLLM (a baseline over the whole context): the first `sinks` tokens plus the most
// recent `window`, the same for every layer and head.
#include <algorithm>

#include "policies/common.h"
#include "policies/policies.h"

namespace ctx {
namespace {

class StreamingPolicy final : public DecodePolicy {
 public:
  using DecodePolicy::DecodePolicy;
  void reset() override {
    prompt_len_ = -1;
    held_from_.clear();
  }
  void begin(const PolicyStep& step) override {
    if (step.prompt)
      prompt_len_ = -1;
    else if (prompt_len_ < 0) {
      const ModelConfig& c = step.backend.config();
      prompt_len_ = step.pos0;
      keys_.resize(c.n_head_kv);
      n_head_kv_ = c.n_head_kv;
      held_from_.assign(static_cast<size_t>(c.n_layer) * c.n_head_kv, spec().streaming.sinks);
    }
  }
  bool reclaims() const override { return true; }
  // Past the sinks, the tokens before the next step's window are never attended again.
  void update(int layer, int g, const float*, int, std::vector<int32_t>* evicted) override {
    if (!evicted) return;
    const StreamingConfig& c = spec().streaming;
    const int pos = keys_[g].back(), next_from = std::max(c.sinks, pos + 2 - c.window);
    int& from = held_from_[static_cast<size_t>(layer) * n_head_kv_ + g];
    append_range(*evicted, from, next_from);
    from = std::max(from, next_from);
  }
  LayerKeys keys(int, const PolicyStep& step) override {
    const StreamingConfig& c = spec().streaming;
    const int pos = step.pos0, sinks = std::min(c.sinks, pos + 1), from = std::max(sinks, pos - c.window + 1);
    for (std::vector<int32_t>& keys : keys_) {
      keys.clear();
      append_range(keys, 0, sinks);
      append_range(keys, from, pos + 1);
    }
    return LayerKeys{&keys_, PackedRows{}};
  }
  PolicyStats stats() const override {
    PolicyStats s;
    s.prompt_len = prompt_len_;
    return s;
  }
  size_t state_bytes() const override { return vector_bytes(keys_) + vector_bytes(held_from_); }

 private:
  int prompt_len_ = -1, n_head_kv_ = 0;
  std::vector<std::vector<int32_t>> keys_;  // per KV head (all equal)
  std::vector<int> held_from_;              // per (layer, KV head): first non-sink position still held
};

}  // namespace

std::unique_ptr<DecodePolicy> make_streaming_policy(const AttentionPolicy& spec) { return std::make_unique<StreamingPolicy>(spec); }

}  // namespace ctx
