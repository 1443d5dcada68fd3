// Full attention: every decode step attends the whole cache; no state.
#include "policies/policies.h"

namespace ctx {
namespace {

class FullPolicy final : public DecodePolicy {
 public:
  using DecodePolicy::DecodePolicy;
  bool attends_everything() const override { return true; }
  void reset() override {}
  void begin(const PolicyStep&) override {}
  LayerKeys keys(int, const PolicyStep&) override { return LayerKeys{}; }
  PolicyStats stats() const override { return PolicyStats{}; }
  size_t state_bytes() const override { return 0; }
};

}  // namespace

std::unique_ptr<DecodePolicy> make_full_policy(const AttentionPolicy& spec) { return std::make_unique<FullPolicy>(spec); }

}  // namespace ctx
