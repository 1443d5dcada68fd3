// Round Attention (docs/algorithms.md): a multi-turn context is a list of rounds. At the
// watershed layer (OmniKV's one filter layer, no guard) the current round's question picks the
// earlier rounds that matter, once per round; the layers above attend only to those rounds plus
// the current round and everything generated.
//
// The pick reads only the prompt: the attention mass the question's remembered queries pay each
// earlier round. So it is the same made where the prompt ends (pick_rounds: a prefill that hands
// its KV over picks, and names the rounds the decode must load) or at the first decode step (a
// sequence that computed its own prompt). A decode given a pick (take_picked_rounds) attends
// exactly those rounds, whatever its own scores would say.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "policies/omnikv.h"
#include "policies/policies.h"

namespace ctx {
namespace {

class RoundsPolicy final : public OmniKvPolicy, public RoundPicker {
 public:
  explicit RoundsPolicy(const AttentionPolicy& spec) : OmniKvPolicy(spec) {}

  void reset() override {
    OmniKvPolicy::reset();
    given_.reset();
  }
  void begin(const PolicyStep& step) override {
    if (step.prompt) given_.reset();  // new prompt tokens: a pick made for the old prompt is stale
    OmniKvPolicy::begin(step);
  }

  std::vector<int> pick_rounds(PolicyBackend& backend, const KvCache& kv) override { return choose(backend, kv, kv.size(), nullptr); }

  void take_picked_rounds(const std::vector<int>& rounds, int n_prompt) override {
    const int earlier = static_cast<int>(earlier_bounds(n_prompt).size()) - 1;
    for (size_t i = 0; i < rounds.size(); ++i)
      if (rounds[i] < 0 || rounds[i] >= earlier || (i > 0 && rounds[i] <= rounds[i - 1]))
        throw std::invalid_argument("rounds: a pick must be ascending indices of the " + std::to_string(earlier) +
                                    " rounds before the current one");
    given_ = rounds;
  }

 protected:
  // The rounds before the current one (the current round is always attended).
  int candidate_end() const override { return std::min(spec().rounds.starts.back(), prompt_len_); }
  bool remembers_queries() const override { return true; }  // the current round's question

  bool select(int layer, const PolicyStep& step, std::vector<int32_t>& out) override {
    ++selections_;
    if (!out.empty()) return false;  // chosen once per round, at its first decode step
    // Without a remembered question (a KV import without the prompt state) the current token asks.
    const std::vector<int> rounds = given_ ? *given_ : choose(step.backend, step.kv, prompt_len_, &step);
    const std::vector<int> bounds = earlier_bounds(prompt_len_);
    out.clear();
    for (int r : rounds)
      for (int p = bounds[r]; p < bounds[r + 1]; ++p) out.push_back(p);
    return true;
  }

 private:
  // Earlier round r of a prompt of n tokens is [bounds[r], bounds[r + 1]).
  std::vector<int> earlier_bounds(int n_prompt) const {
    const int cand = std::min(spec().rounds.starts.back(), n_prompt);
    std::vector<int> bounds;
    for (int start : spec().rounds.starts)
      if (start < cand) bounds.push_back(start);
    bounds.push_back(cand);
    return bounds;
  }

  // Round 0 is always kept (in a chat, the template's system part: it holds the attention sink,
  // which draws a large share of every query's attention whatever the question, so it would win
  // any ranking by mass). Among the later earlier rounds, the attention mass the current round's
  // remembered queries pay each at the watershed layer, summed over heads and queries, keeps
  // top_k of them (or those above mean + std). `now`: a decode step whose token's query is used
  // when no query of the current round is remembered.
  std::vector<int> choose(PolicyBackend& be, const KvCache& kv, int n_prompt, const PolicyStep* now) {
    const int layer = spec().rounds.watershed_layer, n_head = be.config().n_head;
    const std::vector<int> bounds = earlier_bounds(n_prompt);
    const int cand = bounds.back();
    if (bounds.size() <= 2) return std::vector<int>(bounds.size() - 1, 0);  // round 0 alone, or none
    std::vector<double> mass(bounds.size() - 2, 0.0);                       // rounds 1.. as mass[r - 1]
    auto add = [&](const float* q, int pos) {
      const int n_all = pos + 1;
      float* raw = be.score_keys(kv, layer, q, n_all);
      be.softmax(raw, n_head, n_all);
      for (int h = 0; h < n_head; ++h) {
        const float* row = raw + static_cast<size_t>(h) * n_all;
        for (size_t r = 1; r + 1 < bounds.size(); ++r)
          for (int j = bounds[r]; j < bounds[r + 1]; ++j) mass[r - 1] += row[j];
      }
    };
    const QueryWindow& w = window_of(layer);
    int asked = 0;
    for (size_t j = 0; j < w.q.size(); ++j)
      if (w.pos[j] >= cand && w.pos[j] < n_prompt) {
        add(w.q[j].data(), w.pos[j]);
        ++asked;
      }
    if (asked == 0 && now) add(now->backend.query(now->t), now->backend.position(now->t));
    std::vector<int> kept{0};
    for (int r : choose_rounds(mass, spec().rounds.top_k)) kept.push_back(r + 1);
    return kept;
  }

  std::optional<std::vector<int>> given_;  // the prefill's pick, when the KV came from one
};

}  // namespace

std::unique_ptr<DecodePolicy> make_rounds_policy(const AttentionPolicy& spec) { return std::make_unique<RoundsPolicy>(spec); }

}  // namespace ctx
