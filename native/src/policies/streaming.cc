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
  void reset() override { prompt_len_ = -1; }
  void begin(const PolicyStep& step) override {
    if (step.prompt) prompt_len_ = -1;
    else if (prompt_len_ < 0) {
      prompt_len_ = step.pos0;
      keys_.resize(step.backend.config().n_head_kv);
    }
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
  size_t state_bytes() const override { return vector_bytes(keys_); }

 private:
  int prompt_len_ = -1;
  std::vector<std::vector<int32_t>> keys_;  // per KV head (all equal)
};

}  // namespace

std::unique_ptr<DecodePolicy> make_streaming_policy(const AttentionPolicy& spec) {
  return std::make_unique<StreamingPolicy>(spec);
}

}  // namespace ctx
