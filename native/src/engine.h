// The forward pass. An Engine owns the model, a thread pool and scratch buffers sized for one
// micro-batch; Sequences own their KV caches. forward() runs any mix of prefill chunks and
// single-token decode steps as one batch: the weights are read once for all of its tokens.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "decode_policy.h"
#include "device.h"
#include "function_ref.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kv_slots.h"
#include "model.h"
#include "policy.h"
#include "thread_pool.h"

namespace ctx {

struct EngineOptions {
  int n_threads = 1;
  // Threads for micro-batches of at most kSmallBatch tokens (decode steps). One thread is often
  // fastest for a memory-bound step on a small machine: no barriers, no cross-core traffic.
  int n_threads_decode = 1;
  int ubatch = 512;     // tokens per micro-batch (bounds the scratch memory)
  int max_context = 0;  // longest sequence the engine accepts; 0 = the model's trained context
  // The "device" arena one sequence may use: its device-tier KV plus OmniKV's packed buffers
  // (KvCache, policy.h). 0 = no limit. A forward that would exceed it is refused.
  size_t device_budget_bytes = 0;
  // cpu | cuda | cuda:N | auto (CUDA when a GPU is usable and runs the model, else the CPU). device.h.
  std::string device = "cpu";
  // CUDA only: replay each micro-batch shape's layers as a CUDA graph (decode steps are
  // launch-bound). Off by default until measured on a GPU.
  bool cuda_graphs = false;
  // CUDA only: which kernels run (device.h parse_cuda_kernels): "simple", "fast" or a list.
  std::string cuda_kernels = "simple";
  // CPU kernel table (tests comparing tables in one process); nullptr = select_kernels().
  const KernelTable* kernels = nullptr;
};

class Sequence {
 public:
  // `ring_batch`: the rings of its sliding-window layers hold the window plus this many rows
  // (KvRing::rows_for); a longer run of its prompt is computed in micro-batches of that size.
  Sequence(const ModelConfig& c, int capacity, int ring_batch = 512)
      : kv(c.n_layer, c.kv_dim(), capacity, KvRing{c.slides, c.sliding_window, KvRing::rows_for(c.sliding_window, ring_batch)}),
        policy(make_decode_policy(AttentionPolicy{})),
        n_head_kv_(c.n_head_kv),
        slides_(c.slides) {}
  KvCache kv;
  std::unique_ptr<DecodePolicy> policy;  // how decode steps attend (prefill is always full); never null
  // A GPU engine's sequences keep their KV here; `kv` then only tracks the length (its mapping
  // is reserved, never touched, so it holds no memory) and stages exportRows/importRows.
  std::unique_ptr<DeviceKv> device_kv;
  int n_past() const { return kv.size(); }
  int n_head_kv() const { return n_head_kv_; }
  // After the cache is rewound or replaced, decode-time selections start over.
  void reset_policy_state() { policy->reset(); }
  // Takes a validated policy; under OmniKV offload moves the sparse groups into the host bank
  // (and back when offload ends). Throws std::invalid_argument if its packed buffers alone
  // would not fit the device budget, or if this sequence's rows moved (rows_moved). On a model
  // with sliding-window layers the policy acts on the global layers only (Engine::prepare_sparse).
  // A policy that asks for reclamation (AttentionPolicy::reclaim) frees evicted tokens' rows of
  // the global layers for reuse (slots).
  void set_policy(const AttentionPolicy& p);
  // Device bytes with n tokens stored: the device-tier KV plus the packed buffers at full budget.
  size_t device_bytes(int n_tokens) const;
  size_t device_budget = 0;        // EngineOptions::device_budget_bytes at creation; 0 = none
  std::unique_ptr<KvSlots> slots;  // set while reclaiming: each global layer and head's position -> row
  // Reclamation reused a freed row: positions no longer sit at row = position, so the cache can
  // take no prompt tokens, and its rows cannot be exported, imported or truncated by position.
  bool rows_moved() const;
  // The cache's length from outside (after an import, or a rollback): kv.set_size, and a
  // reclaiming sequence's positions [0, n) back at row = position. std::invalid_argument once
  // rows moved, or as kv.set_size.
  void set_size(int n);
  // Decode steps since the policy was set: (layer, KV head, key) triples attended, summed. Times
  // row_pair_bytes() / n_head_kv, the KV bytes those steps read (the sliding layers' windows included).
  uint64_t decode_keys_read = 0;

 private:
  int n_head_kv_;
  std::vector<bool> slides_;  // per layer, empty when none slides (ModelConfig::slides)
};

struct BatchItem {
  Sequence* seq = nullptr;
  const int32_t* tokens = nullptr;
  int n_tokens = 0;
  float* logits = nullptr;  // if set: receives n_vocab next-token logits after the last token
  // If set (one-token items under full attention only): receives, per layer, the token's
  // attention probabilities over its n_past + 1 keys, averaged over heads: [n_layer][n_past + 1].
  float* probe = nullptr;
  // If set: receives the greedy next token (the lowest index of the largest logit). On a GPU
  // engine it is computed there, and the logits are copied to the host only if `logits` is set.
  int32_t* argmax = nullptr;
};

// One item's share of a micro-batch: `count` of its tokens from `offset`, at positions from pos0.
struct UbatchSlice {
  const BatchItem* item;
  int offset, count, pos0;
};

// Cuts a batch into micro-batches of at most `ubatch` tokens (a long prompt spans several) and
// calls run(slices) for each, in order; `slices` is the caller's reused buffer. Every backend
// batches this way, so a batch is computed in the same pieces on the CPU and on a GPU.
// A sequence whose sliding-window rings hold fewer rows (KvCache::max_run) has its prompt cut
// to that many tokens per micro-batch.
template <class Run>
void for_each_ubatch(const std::vector<BatchItem>& items, int ubatch, std::vector<UbatchSlice>& slices, Run&& run) {
  slices.clear();
  int filled = 0;
  for (const BatchItem& it : items) {
    const int base = it.seq->n_past();  // read before this item's first micro-batch runs
    const int run_cap = it.seq->kv.max_run();
    int offset = 0;
    while (offset < it.n_tokens) {
      const int count = std::min({it.n_tokens - offset, ubatch - filled, run_cap});
      slices.push_back({&it, offset, count, base + offset});
      offset += count;
      filled += count;
      // (a capped run ends its micro-batch: the next run of the sequence must see this one's rows)
      if (filled == ubatch || (count == run_cap && offset < it.n_tokens)) {
        run(slices);
        slices.clear();
        filled = 0;
      }
    }
  }
  if (!slices.empty()) run(slices);
}

// The rows of a micro-batch whose next-token logits (or greedy token) are wanted: each item's last
// token, when this micro-batch holds it, as (row in the micro-batch, item).
inline void logit_rows(const std::vector<UbatchSlice>& slices, std::vector<std::pair<int, const BatchItem*>>& wanted) {
  wanted.clear();
  int t0 = 0;
  for (const UbatchSlice& s : slices) {
    if ((s.item->logits || s.item->argmax) && s.offset + s.count == s.item->n_tokens) wanted.push_back({t0 + s.count - 1, s.item});
    t0 += s.count;
  }
}

// The engine is the CPU backend its sequences' decode policies call (decode_policy.h).
class Engine : private PolicyBackend {
 public:
  Engine(std::shared_ptr<const Model> model, const EngineOptions& opts);
  ~Engine();

  const ModelConfig& config() const override { return model_->config(); }
  const Model& model() const { return *model_; }
  const std::shared_ptr<const Model>& model_ptr() const { return model_; }
  const EngineOptions& options() const { return opts_; }
  const KernelTable& kernels() const { return k_; }
  int max_context() const { return max_ctx_; }
  // "cpu", or the GPU backend's name ("cuda:0") and description.
  std::string device_name() const { return device_ ? device_->name() : "cpu"; }
  std::string device_description() const;
  DeviceBackend* device() const { return device_.get(); }
  // A sequence for this engine (with its GPU cache on a GPU engine). `ring_batch` (0: the engine's
  // micro-batch) sizes its sliding-window layers' rings: a sequence that is imported and then
  // decoded a token at a time needs few rows past the window (its prompt runs are cut to fit).
  std::shared_ptr<Sequence> create_sequence(int capacity, int ring_batch = 0) const;
  // Rows of each sliding-window layer's ring in a sequence made with `ring_batch` (0: the engine's
  // micro-batch); 0 when the model has none.
  int ring_rows(int ring_batch = 0) const;
  // KV bytes such a sequence holds with n tokens stored (every global layer's n rows, each sliding
  // layer's ring at most); `global_rows` >= 0: the global layers hold at most that many rows (a
  // reclaiming policy's bound).
  size_t kv_bytes(int n_tokens, int ring_batch = 0, int global_rows = -1) const;
  // Bytes of weights a one-token forward pass reads: every layer's matrices and the output matrix
  // in the layout the kernels read (the embedding row and the norm vectors are left out).
  size_t weight_bytes_per_token() const;

  // Validates the whole batch first (token ids, capacity, duplicate sequences) and throws
  // std::invalid_argument before touching any KV.
  void forward(const std::vector<BatchItem>& items);  // no allocation once warmed up
  // Round Attention's pick over the prompt `seq` holds (RoundPicker, decode_policy.h), with the
  // attention's own scores; on the engine's thread, between forward passes. Throws
  // std::invalid_argument unless the sequence's policy is rounds and it holds a prompt.
  std::vector<int> pick_rounds(Sequence& seq);

 private:
  using Slice = UbatchSlice;
  struct MatJob {
    const Weight* w;
    float* y;
    int ldy;
  };
  void validate(const std::vector<BatchItem>& items) const;
  void forward_ubatch(const std::vector<Slice>& slices);
  void embed(const std::vector<Slice>& slices, int n);
  void rms_norm(const float* x, const float* weight, float* out, int rows, int width);
  void add_bias(float* x, const float* bias, int n, int width);
  void quantize(const float* x, int n, int k);
  void matmuls(std::initializer_list<MatJob> jobs, const float* x, int n, int k);
  void matmul_rows(const Weight& w, int r0, int rows, const float* x, int n, int k, float* y, int ldy);
  void soft_cap(float* logits, int n) const;
  void greedy_tokens(int rows, const std::pair<int, const BatchItem*>* wanted);
  void rope_tables(int n);
  void rope(float* x, int n_heads, int kind, int n);
  void gated_activation(int n);
  struct QueryBlock {
    int slice, t_begin, t_end;
  };
  struct AttnScratch {  // per thread
    // attend_flash: the block's queries per KV head, their running max, sum and output, the rows'
    // key ranges in the current key block and flash_block's scratch.
    std::vector<float> q, m, l, acc, work;
    std::vector<int> lo, hi;
    // attend_listed and probe_rows: widened keys or values, one KV head's score rows; a block's
    // gathered f16 K and V rows.
    std::vector<float> kv, scores;
    std::vector<uint16_t> gathered;
    std::vector<int32_t> rows, evicted;  // listed keys' cache rows (reclaiming), a step's evictions
  };
  struct AttnTask {
    int block, h0, n_heads;
  };
  void attention(int layer, const std::vector<Slice>& slices);
  int first_key(int layer, int p) const;
  void attend_flash(int layer, const Slice& s, const QueryBlock& qb, int h0, int n_heads, AttnScratch& sc);
  void probe_rows(int layer, const Slice& s, int t, AttnScratch& sc);
  void attend_listed(int layer, const Slice& s, const LayerKeys& keys, int t, int g, AttnScratch& sc);
  struct KeyRange {
    int begin, end;
  };
  void softmax_rows(float* s, size_t lds, int rows, int n_keys, FunctionRef<KeyRange(int)> range);
  // Decode policies (sparse.cc): their per-micro-batch view of a slice, the key lists each slice
  // attends at `layer`, and the backend services they call.
  PolicyStep policy_step(const Slice& s, int t) { return {*this, s.item->seq->kv, t, s.count, s.pos0, s.item->n_tokens != 1}; }
  void prepare_sparse(int layer, const std::vector<Slice>& slices);
  // After the layer's attention: the scores it kept for the policies that wanted them (LayerKeys::wants_scores).
  void finish_sparse(int layer, const std::vector<Slice>& slices);
  const float* query(int t) const override { return &q_[static_cast<size_t>(t) * config().q_dim()]; }
  int position(int t) const override { return pos_[t]; }
  float* score_keys(const KvCache& kv, int layer, const float* q, int n_keys) override;
  void softmax(float* scores, int rows, int n) override;
  void for_tokens(int n, FunctionRef<void(int)> fn);
  void parallel(int n_tasks, FunctionRef<void(int, int)> fn) { pool_.parallel_for(n_tasks, fn, single_thread_); }

  std::shared_ptr<const Model> model_;
  EngineOptions opts_;
  std::unique_ptr<DeviceBackend> device_;  // null: the CPU computes
  int max_ctx_;
  const KernelTable& k_;
  ThreadPool pool_;
  bool single_thread_ = false;  // this micro-batch runs on the calling thread only

  // Scratch, sized once for a micro-batch. The RoPE tables hold each token's angles for each kind
  // of layer (0: global, 1: sliding): [kind][ubatch][head_dim / 2].
  std::vector<float> x_, xn_, q_, kc_, vc_, attn_, gate_, up_, rope_cos_, rope_sin_;
  std::vector<int8_t> act_qs_;
  std::vector<float> act_d_, act_s_;
  std::vector<int32_t> act_isum_;
  ActQ8 act_;
  std::vector<int> pos_, token_seq_;
  // Attention works on blocks of query tokens against blocks of keys.
  static constexpr int kSmallBatch = 4;  // micro-batches this small run on n_threads_decode
  static constexpr int kQueryBlock = 16;
  static constexpr int kKeyBlock = kKvBlockRows;  // a ring of rows never splits one (kv_cache.h)
  std::vector<QueryBlock> qblocks_;
  std::vector<AttnTask> attn_tasks_;
  // Per slice, for the current layer: what its decode step attends (not listed: everything).
  std::vector<LayerKeys> slice_keys_;
  std::vector<std::vector<float>> slice_raw_;  // per slice whose keys want scores: [n_head][pos0 + 1]
  std::vector<float> sel_raw_;                 // score_keys: [n_head][ctx]
  std::vector<AttnScratch> attn_scratch_;
  std::vector<float> logits_x_, logits_buf_;  // [kLogitRows][n_embd], [kLogitRows][n_vocab]
  // greedy_tokens: output rows per slice (a multiple of kRowGroup), each thread's slice of logits
  // ([kLogitRows][kGreedyRows]) and every slice's best (logit, token) per row.
  static constexpr int kGreedyRows = 512;
  std::vector<std::vector<float>> greedy_scratch_;
  std::vector<std::pair<float, int>> greedy_best_;
  std::vector<Slice> slices_;
  std::vector<std::pair<int, const BatchItem*>> wanted_;
};

}  // namespace ctx
