// OmniKV (policy.h): filter layers select prompt tokens, the sparse layers after each attend to
// its selection plus every generated token. Round Attention (rounds.cc) and omnikv+scope
// (omnikv_scope.cc) reuse it and override the hooks below.
#pragma once
#include <cstdint>
#include <vector>

#include "decode_policy.h"
#include "policies/common.h"
#include "prompt_state.h"

namespace ctx {

class OmniKvPolicy : public DecodePolicy, public PromptStateHolder {
 public:
  explicit OmniKvPolicy(const AttentionPolicy& spec) : DecodePolicy(spec), cfg_(this->spec().omnikv) {}
  std::vector<LayerRole> layer_roles() const override { return spec().roles; }
  std::vector<int> layer_groups() const override { return spec().group; }
  std::vector<std::vector<int>> host_groups() const override;
  size_t packed_rows() const override;
  void reset() override;
  void begin(const PolicyStep& step) override;
  void observe_prompt(int layer, const PolicyStep& step) override;
  LayerKeys keys(int layer, const PolicyStep& step) override;
  void scored(int layer, const PolicyStep& step, const float* raw, int n_keys) override;
  PolicyStats stats() const override;
  size_t state_bytes() const override;
  // The filter layers' remembered queries, where the selection reads them.
  Windows prompt_windows(const ModelConfig& c) override;

 protected:
  // The first decode step after a prompt (prompt_len_ is set): size the per-step state.
  virtual void start_decode(const PolicyStep& step) {}
  // Selections pick among positions [0, candidate_end()); every later position is attended.
  virtual int candidate_end() const { return prompt_len_; }
  // Runs filter `layer`'s selection into `out` (ascending); true if `out` changed.
  virtual bool select(int layer, const PolicyStep& step, std::vector<int32_t>& out);
  // Whether filter layers remember their last queries (window selectors, Round Attention).
  virtual bool remembers_queries() const { return is_window_selector(cfg_.selector); }
  // Whether layers without a prompt subset are listed too (SCOPE's pool over generated tokens);
  // otherwise they attend the whole cache.
  virtual bool lists_every_layer() const { return false; }
  // The generated part of KV head g's keys at `layer`, up to the current token at `pos`.
  virtual void append_generated(int layer, int g, int pos, std::vector<int32_t>& keys) { append_range(keys, candidate_end(), pos + 1); }
  QueryWindow& window_of(int layer);

  const OmniKvConfig& cfg_;
  int prompt_len_ = -1;                         // prompt = positions < prompt_len_
  std::vector<std::vector<int32_t>> selected_;  // per filter layer, ascending
  std::vector<std::vector<int32_t>> keys_;      // per KV head: the current layer's list
  uint64_t selections_ = 0, lazy_reuses_ = 0;

 private:
  int filter_index(int layer) const;
  // Whether filter layers rank by the current query's scores alone, which their own dense
  // attention computes (keys() then asks for them; scored() selects).
  bool ranks_own_scores(const PolicyStep& step) const;
  // The `budget` best of rank_ into `out`, unless lazy_iou keeps `out`; true if `out` changed.
  bool take_top(std::vector<int32_t>& out);
  // After filter selection idx ran: its packed rows under offload.
  void selected(int idx, const KvCache& kv, bool changed);
  // Per filter layer (in order) that has any, the sparse layers that use its selection.
  std::vector<std::vector<int>> sparse_groups() const;
  void refresh_packed(const KvCache& kv, int idx);
  PackedRows packed_for(int layer, const KvCache& kv) const;

  // Window selectors: per filter layer, the queries of the last window - 1 tokens before the
  // current one. Prompt queries are kept when this engine ran the prefill; after a KV import only
  // decode queries exist.
  std::vector<QueryWindow> windows_;
  // Offload: per filter layer, its sparse group's rows for the selected tokens, token-major
  // ([selected][layer of the group][K|V][kv_dim]), refreshed when the selection changes.
  std::vector<std::vector<uint16_t>> packed_;
  std::vector<float> rank_, window_scratch_;
  std::vector<int32_t> new_;
};

}  // namespace ctx
