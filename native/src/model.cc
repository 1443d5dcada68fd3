#include "model.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include "dequant.h"
#include "kernels.h"
#include "packed.h"
#include <stdexcept>
#include <vector>


namespace ctx {

namespace {

int checked_int(uint64_t v, const std::string& key, uint64_t max) {
  if (v == 0 || v > max) throw GgufError("gguf: metadata '" + key + "' = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

}  // namespace

const float* Model::norm(const std::string& name, int n) {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) throw GgufError("gguf: model is missing tensor '" + name + "'");
  if (t->type != static_cast<uint32_t>(GgmlType::F32) || t->n_elements() != static_cast<uint64_t>(n))
    throw std::invalid_argument("model: tensor '" + name + "' must be F32 with " + std::to_string(n) + " elements");
  // Copied out of the mapping (a few KiB each): after the repack drops the file's pages, nothing
  // the forward pass reads every step should fault them back in (a fault may map far more of the
  // file than the bytes read: on this project's CI machine 61 norm reads brought back 16 MiB).
  auto copy = std::make_unique<float[]>(static_cast<size_t>(n));
  std::memcpy(copy.get(), t->data, static_cast<size_t>(n) * sizeof(float));
  norms_.push_back(std::move(copy));
  return norms_.back().get();
}

Weight Model::weight(const std::string& name, int cols, int rows) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) throw GgufError("gguf: model is missing tensor '" + name + "'");
  if (t->n_dims != 2 || t->ne[0] != static_cast<uint64_t>(cols) || t->ne[1] != static_cast<uint64_t>(rows))
    throw std::invalid_argument("model: tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " +
                                std::to_string(t->ne[1]) + "], expected [" + std::to_string(cols) + ", " +
                                std::to_string(rows) + "]");
  const auto type = static_cast<GgmlType>(t->type);
  if (!is_supported_weight_type(type))
    throw std::invalid_argument("model: tensor '" + name + "' has type " + ggml_type_name(t->type) +
                                ", which ctxbank does not support (supported: " + supported_weight_types() + ")");
  const GgmlTypeTraits* tr = ggml_type_traits(t->type);
  Weight w;
  w.type = type;
  w.data = t->data;
  w.cols = cols;
  w.rows = rows;
  w.row_bytes = static_cast<size_t>(cols) / tr->block_size * tr->type_size;
  // Every bit pattern of a block is a valid quant except a scale that is Inf or NaN: such a file
  // is corrupt, and would only surface as NaN logits.
  if (const int64_t b = first_nonfinite_scale(w); b >= 0) {
    const int64_t per_row = cols / tr->block_size;
    throw GgufError("gguf: tensor '" + name + "' (" + tr->name + ") has a non-finite scale in block " +
                    std::to_string(b % per_row) + " of row " + std::to_string(b / per_row));
  }
  return w;
}

void Model::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

// Repacks every quantized matrix once at load (about as fast as reading it) into one aligned
// allocation; the file mapping still serves the embedding lookups (the norms are copies), so its
// pages are dropped afterwards and only the rows looked up come back.
void Model::pack_weights() {
  std::vector<Weight*> all = {&token_embd_};
  if (!config_.tied_output) all.push_back(&output_);
  for (auto& l : layers_)
    for (Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) all.push_back(w);
  size_t total = 0;
  for (Weight* w : all)
    if (is_packable(w->type)) total += packed_group_bytes(w->type, w->cols) * ((w->rows + kRowGroup - 1) / kRowGroup);
  if (total == 0) return;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
  if (!buf) throw std::runtime_error("model: out of memory packing weights");
  packed_.reset(buf);
  for (Weight* w : all) {
    if (!is_packable(w->type)) continue;
    w->group_bytes = packed_group_bytes(w->type, w->cols);
    pack_matrix(w->type, w->data, w->rows, w->cols, buf);
    w->packed = buf;
    buf += w->group_bytes * ((w->rows + kRowGroup - 1) / kRowGroup);
  }
  if (config_.tied_output) output_ = token_embd_;
  file_->drop_resident_pages();
}

std::shared_ptr<Model> Model::load(const std::string& path) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = *m->file_;
  ModelConfig& c = m->config_;

  c.architecture = f.get_string("general.architecture");
  if (c.architecture != "llama")
    throw std::invalid_argument("model: architecture '" + c.architecture + "' is not supported (only 'llama')");
  c.name = f.get_string_opt("general.name").value_or("");
  const std::string a = c.architecture + ".";
  c.n_layer = checked_int(f.get_uint(a + "block_count"), a + "block_count", 1024);
  c.n_embd = checked_int(f.get_uint(a + "embedding_length"), a + "embedding_length", 1 << 16);
  c.n_ff = checked_int(f.get_uint(a + "feed_forward_length"), a + "feed_forward_length", 1 << 18);
  c.n_head = checked_int(f.get_uint(a + "attention.head_count"), a + "attention.head_count", 1024);
  c.n_head_kv = checked_int(f.get_uint_opt(a + "attention.head_count_kv").value_or(c.n_head),
                            a + "attention.head_count_kv", 1024);
  c.n_ctx_train = checked_int(f.get_uint(a + "context_length"), a + "context_length", 1u << 24);
  c.rope_base = static_cast<float>(f.get_float_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(f.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (c.n_embd % c.n_head != 0) throw std::invalid_argument("model: embedding length is not a multiple of the head count");
  if (c.n_head % c.n_head_kv != 0) throw std::invalid_argument("model: head count is not a multiple of the KV head count");
  c.head_dim = c.n_embd / c.n_head;
  const auto rope_dims = f.get_uint_opt(a + "rope.dimension_count").value_or(c.head_dim);
  if (rope_dims != static_cast<uint64_t>(c.head_dim))
    throw std::invalid_argument("model: partial RoPE (rope.dimension_count != head size) is not supported");
  if (c.head_dim % 16 != 0 || c.head_dim > kMaxHeadDim)
    throw std::invalid_argument("model: head size must be a multiple of 16 and at most " + std::to_string(kMaxHeadDim));
  if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0)
    throw std::invalid_argument("model: embedding and feed-forward lengths must be multiples of 32");
  if (!(c.rope_base > 0.f) || !(c.rms_eps > 0.f)) throw std::invalid_argument("model: rope base and RMS epsilon must be positive");

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd || embd->n_dims != 2) throw GgufError("gguf: model is missing a 2-D 'token_embd.weight'");
  if (embd->ne[1] > static_cast<uint64_t>(std::numeric_limits<int>::max()))
    throw std::invalid_argument("model: vocabulary too large");
  c.n_vocab = static_cast<int>(embd->ne[1]);
  if (auto v = f.get_uint_opt(a + "vocab_size"); v && *v != static_cast<uint64_t>(c.n_vocab))
    throw std::invalid_argument("model: vocab_size metadata disagrees with token_embd.weight");

  m->token_embd_ = m->weight("token_embd.weight", c.n_embd, c.n_vocab);
  m->output_norm_ = m->norm("output_norm.weight", c.n_embd);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  m->output_ = c.tied_output ? m->token_embd_ : m->weight("output.weight", c.n_embd, c.n_vocab);

  const int q_dim = c.n_embd, kv_dim = c.kv_dim();
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.attn_norm = m->norm(p + "attn_norm.weight", c.n_embd);
    lw.wq = m->weight(p + "attn_q.weight", c.n_embd, q_dim);
    lw.wk = m->weight(p + "attn_k.weight", c.n_embd, kv_dim);
    lw.wv = m->weight(p + "attn_v.weight", c.n_embd, kv_dim);
    lw.wo = m->weight(p + "attn_output.weight", q_dim, c.n_embd);
    lw.ffn_norm = m->norm(p + "ffn_norm.weight", c.n_embd);
    lw.w_gate = m->weight(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    lw.w_up = m->weight(p + "ffn_up.weight", c.n_embd, c.n_ff);
    lw.w_down = m->weight(p + "ffn_down.weight", c.n_ff, c.n_embd);
    m->layers_.push_back(lw);
  }
  // Before packing drops the file's pages: packing faults them in again anyway.
  m->weights_crc32c_ = f.tensor_data_crc32c();
  m->pack_weights();
  return m;
}

}  // namespace ctx
