// omnikv+scope: OmniKV over the prompt, SCOPE's pool over the generated tokens. Every layer
// lists its keys: the prompt (whole, or the filter layer's selection on sparse layers), then
// the layer and head's pool, then the current token.
#include "policies/omnikv.h"
#include "policies/policies.h"
#include "policies/scope_pool.h"

namespace ctx {
namespace {

class OmniKvScopePolicy final : public OmniKvPolicy {
 public:
  explicit OmniKvScopePolicy(const AttentionPolicy& spec) : OmniKvPolicy(spec), pool_(this->spec().scope) {}
  void reset() override {
    OmniKvPolicy::reset();
    pool_.clear();
  }
  // Not reclaiming: the softmax and window selectors score every generated key, evicted ones too.
  void update(int layer, int g, const float* probs, int n_keys, std::vector<int32_t>*) override {
    pool_.update(layer, g, keys_[g], prompt_len_, probs, n_keys, nullptr);
  }
  bool reads_probabilities() const override { return true; }
  PolicyStats stats() const override {
    PolicyStats s = OmniKvPolicy::stats();
    s.decode_pool_tokens = pool_.tokens();
    return s;
  }
  size_t state_bytes() const override { return OmniKvPolicy::state_bytes() + pool_.bytes(); }

 protected:
  void start_decode(const PolicyStep& step) override { pool_.start(step.backend.config()); }
  bool lists_every_layer() const override { return true; }
  void append_generated(int layer, int g, int pos, std::vector<int32_t>& keys) override { pool_.append(layer, g, pos, keys); }

 private:
  ScopePool pool_;
};

}  // namespace

std::unique_ptr<DecodePolicy> make_omnikv_scope_policy(const AttentionPolicy& spec) { return std::make_unique<OmniKvScopePolicy>(spec); }

}  // namespace ctx
