// Round Attention (docs/algorithms.md): a multi-turn context is a list of rounds. At the
// watershed layer (OmniKV's one filter layer, no guard) the current round's queries pick the
// earlier rounds that matter, once per round at its first decode step; the layers above attend
// only to those rounds plus the current round and everything generated.
#include <algorithm>
#include <vector>

#include "policies/omnikv.h"
#include "policies/policies.h"

namespace ctx {
namespace {

class RoundsPolicy final : public OmniKvPolicy {
 public:
  explicit RoundsPolicy(const AttentionPolicy& spec) : OmniKvPolicy(spec) {}

 protected:
  // The rounds before the current one (the current round is always attended).
  int candidate_end() const override { return std::min(spec().rounds.starts.back(), prompt_len_); }
  bool remembers_queries() const override { return true; }  // the current round's question

  // The attention mass the current round's queries (its question, remembered at prefill, and the
  // current token) pay each earlier round, summed over heads and queries; the chosen rounds
  // (top_k, or mean + std) are attended whole above the watershed.
  bool select(int layer, const PolicyStep& step, std::vector<int32_t>& out) override {
    ++selections_;
    if (!out.empty()) return false;  // chosen once per round, at its first decode step
    PolicyBackend& be = step.backend;
    const int n_head = be.config().n_head, cand = candidate_end();
    std::vector<int> bounds;  // earlier round r is [bounds[r], bounds[r + 1])
    for (int start : spec().rounds.starts)
      if (start < cand) bounds.push_back(start);
    bounds.push_back(cand);
    std::vector<double> mass(bounds.size() - 1, 0.0);
    auto add = [&](const float* q, int pos) {
      const int n_all = pos + 1;
      float* raw = be.score_keys(step.kv, layer, q, n_all);
      be.softmax(raw, n_head, n_all);
      for (int h = 0; h < n_head; ++h) {
        const float* row = raw + static_cast<size_t>(h) * n_all;
        for (size_t r = 0; r + 1 < bounds.size(); ++r)
          for (int j = bounds[r]; j < bounds[r + 1]; ++j) mass[r] += row[j];
      }
    };
    const QueryWindow& w = window_of(layer);
    for (size_t j = 0; j < w.q.size(); ++j)
      if (w.pos[j] >= cand) add(w.q[j].data(), w.pos[j]);
    add(be.query(step.t), be.position(step.t));
    out.clear();
    for (int r : choose_rounds(mass, spec().rounds.top_k))
      for (int p = bounds[r]; p < bounds[r + 1]; ++p) out.push_back(p);
    return true;
  }
};

}  // namespace

std::unique_ptr<DecodePolicy> make_rounds_policy(const AttentionPolicy& spec) { return std::make_unique<RoundsPolicy>(spec); }

}  // namespace ctx
