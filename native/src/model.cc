#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "dequant.h"
#include "kernels.h"
#include "packed.h"

namespace ctx {

namespace {

int checked_int(uint64_t v, const std::string& key, uint64_t max) {
  if (v == 0 || v > max) throw GgufError("gguf: metadata '" + key + "' = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

float positive_float(const GgufFile& f, const std::string& key, double fallback) {
  const double v = f.get_float_or(key, fallback);
  if (!(v > 0) || !std::isfinite(v))
    throw std::invalid_argument("model: metadata '" + key + "' = " + number(v) + " must be a positive number");
  return static_cast<float>(v);
}

float required_positive_float(const GgufFile& f, const std::string& key) {
  if (!f.find(key)) throw GgufError("gguf: required metadata '" + key + "' is missing");
  return positive_float(f, key, 0.0);
}

// RoPE of the global layers: rope.freq_base, and linear scaling of the positions when
// rope.scaling.type says so (llama.cpp's default when only a factor is given). YaRN and LongRoPE
// change more than the frequencies and are refused, as is a magnitude factor.
RopeParams read_rope(const GgufFile& f, const std::string& a) {
  RopeParams r;
  r.base = positive_float(f, a + "rope.freq_base", 10000.0);
  const std::string type = f.get_string_opt(a + "rope.scaling.type").value_or("linear");
  if (type != "none" && type != "linear")
    throw std::invalid_argument("model: metadata '" + a + "rope.scaling.type' = '" + type + "' is not supported (none or linear)");
  const std::string factor_key = f.find(a + "rope.scaling.factor") ? a + "rope.scaling.factor" : a + "rope.scale_linear";
  const double factor = f.get_float_or(factor_key, 0.0);  // 0: not scaled
  if (factor < 0 || !std::isfinite(factor))
    throw std::invalid_argument("model: metadata '" + factor_key + "' = " + number(factor) + " must be positive");
  if (type == "linear" && factor > 0) r.scale = static_cast<float>(1.0 / factor);
  if (const double m = f.get_float_or(a + "rope.scaling.attn_factor", 1.0); m != 1.0)
    throw std::invalid_argument("model: metadata '" + a + "rope.scaling.attn_factor' = " + number(m) + " is not supported (only 1)");
  return r;
}

// Which Gemma 3 layers slide: attention.sliding_window_pattern is either one flag per layer or a
// period n (every n-th layer is global: layer l slides when l % n < n - 1; n = 0: every layer);
// without it, n = 6 (Gemma 3's five sliding layers per global one, llama.cpp's default).
std::vector<bool> sliding_layers(const GgufFile& f, const std::string& key, int n_layer) {
  std::vector<bool> slides(static_cast<size_t>(n_layer));
  const GgufValue* v = f.find(key);
  if (v && v->type == GgufValueType::ARRAY) {
    const GgufValueType e = v->elem_type;
    if (e != GgufValueType::BOOL && e != GgufValueType::U32 && e != GgufValueType::I32)
      throw std::invalid_argument("model: metadata '" + key + "' must be an array of bool, u32 or i32, is an array of " +
                                  gguf_value_type_name(v->elem_type));
    if (v->arr.size() != slides.size())
      throw std::invalid_argument("model: metadata '" + key + "' has " + std::to_string(v->arr.size()) +
                                  " entries, expected one per layer (" + std::to_string(n_layer) + ")");
    for (size_t l = 0; l < slides.size(); ++l) slides[l] = v->arr[l].u != 0 || v->arr[l].i != 0;
    return slides;
  }
  const uint64_t n = v ? f.get_uint(key) : 6;
  for (int l = 0; l < n_layer; ++l) slides[static_cast<size_t>(l)] = n == 0 || static_cast<uint64_t>(l) % n < n - 1;
  return slides;
}

}  // namespace

std::vector<std::string> ModelConfig::beyond_llama() const {
  std::vector<std::string> out;
  if (any_layer_slides()) out.push_back("sliding-window layers");
  if (q_dim() != n_embd) out.push_back("a query width (heads x head size) other than the embedding length");
  if (rope_pairs != RopePairs::Adjacent) out.push_back("NEOX RoPE pairs");
  if (rope_freq_factors) out.push_back("RoPE frequency factors (rope_freqs)");
  if (rope.scale != 1.f) out.push_back("linear RoPE scaling");
  if (qkv_bias) out.push_back("Q/K/V biases");
  if (qk_norm) out.push_back("per-head Q/K RMSNorm");
  if (post_norms) out.push_back("post-attention and post-FFN norms");
  if (ffn_activation != FfnActivation::Silu) out.push_back("a GELU feed-forward");
  if (embd_scale != 1.f) out.push_back("scaled embeddings");
  if (attn_scale != 1.0f / std::sqrt(static_cast<float>(head_dim))) out.push_back("an attention scale other than 1/sqrt(head size)");
  if (final_logit_softcap > 0.f) out.push_back("final logit soft-capping");
  return out;
}

// Hyper-parameters and architecture switches from the metadata (llama.cpp's keys and defaults).
void Model::read_config() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  c.architecture = f.get_string("general.architecture");
  const bool llama = c.architecture == "llama", qwen2 = c.architecture == "qwen2", qwen3 = c.architecture == "qwen3",
             gemma3 = c.architecture == "gemma3";
  if (!llama && !qwen2 && !qwen3 && !gemma3)
    throw std::invalid_argument("model: architecture '" + c.architecture + "' is not supported (supported: llama, qwen2, qwen3, gemma3)");
  c.name = f.get_string_opt("general.name").value_or("");
  const std::string a = c.architecture + ".";
  c.n_layer = checked_int(f.get_uint(a + "block_count"), a + "block_count", 1024);
  c.n_embd = checked_int(f.get_uint(a + "embedding_length"), a + "embedding_length", 1 << 16);
  c.n_ff = checked_int(f.get_uint(a + "feed_forward_length"), a + "feed_forward_length", 1 << 18);
  c.n_head = checked_int(f.get_uint(a + "attention.head_count"), a + "attention.head_count", 1024);
  c.n_head_kv = checked_int(f.get_uint_opt(a + "attention.head_count_kv").value_or(c.n_head), a + "attention.head_count_kv", 1024);
  c.n_ctx_train = checked_int(f.get_uint(a + "context_length"), a + "context_length", 1u << 24);
  c.rope = read_rope(f, a);
  c.rms_eps = required_positive_float(f, a + "attention.layer_norm_rms_epsilon");
  if (c.n_head % c.n_head_kv != 0) throw std::invalid_argument("model: head count is not a multiple of the KV head count");

  // Head size: attention.key_length, else n_embd / n_head; V heads must be as wide.
  const uint64_t default_dim = c.n_embd % c.n_head == 0 ? static_cast<uint64_t>(c.n_embd / c.n_head) : 0;
  if (const auto k = f.get_uint_opt(a + "attention.key_length"))
    c.head_dim = checked_int(*k, a + "attention.key_length", 1024);
  else if (default_dim)
    c.head_dim = static_cast<int>(default_dim);
  else
    throw std::invalid_argument("model: embedding length is not a multiple of the head count, and '" + a +
                                "attention.key_length' is absent");
  const uint64_t v_dim = f.get_uint_opt(a + "attention.value_length").value_or(default_dim);
  if (v_dim != static_cast<uint64_t>(c.head_dim))
    throw std::invalid_argument("model: V heads of size " + std::to_string(v_dim) + " ('" + a +
                                "attention.value_length', else embedding length / heads) differ from K heads of size " +
                                std::to_string(c.head_dim) + ": not supported");
  const auto rope_dims = f.get_uint_opt(a + "rope.dimension_count").value_or(c.head_dim);
  if (rope_dims != static_cast<uint64_t>(c.head_dim))
    throw std::invalid_argument("model: partial RoPE ('" + a + "rope.dimension_count' != head size) is not supported");
  if (c.head_dim % 16 != 0 || c.head_dim > kMaxHeadDim)
    throw std::invalid_argument("model: head size must be a multiple of 16 and at most " + std::to_string(kMaxHeadDim));
  if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0 || c.q_dim() % 32 != 0)
    throw std::invalid_argument("model: embedding, query and feed-forward widths must be multiples of 32");
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // The switches (model.h); the tensors they need are read in read_tensors.
  c.rope_pairs = llama ? RopePairs::Adjacent : RopePairs::Halves;
  c.qkv_bias = qwen2;
  c.qk_norm = qwen3 || gemma3;
  if (gemma3) {
    c.post_norms = true;
    c.ffn_activation = FfnActivation::GeluTanh;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    // Gemma scales queries by query_pre_attn_scalar^-1/2, which its GGUFs do not carry: it is the
    // head size in every Gemma 3 but the 27B (62 layers), where it is n_embd / n_head. llama.cpp
    // (gemma3.cpp) decides by the layer count the same way.
    if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
    const double cap = f.get_float_or(a + "final_logit_softcapping", 0.0);
    if (cap < 0 || !std::isfinite(cap))
      throw std::invalid_argument("model: metadata '" + a + "final_logit_softcapping' = " + number(cap) + " must not be negative");
    c.final_logit_softcap = static_cast<float>(cap);
    const uint64_t window = f.get_uint_opt(a + "attention.sliding_window").value_or(0);
    if (window > 0) {
      c.sliding_window = checked_int(window, a + "attention.sliding_window", 1u << 24);
      c.slides = sliding_layers(f, a + "attention.sliding_window_pattern", c.n_layer);
      if (std::none_of(c.slides.begin(), c.slides.end(), [](bool s) { return s; })) c.slides.clear();
      // The sliding layers' own base (Gemma 3's local base, 10000, when the file leaves it out),
      // never scaled.
      c.rope_swa.base = positive_float(f, a + "rope.freq_base_swa", 10000.0);
    }
  }
}

const float* Model::vector(const std::string& name, int n) {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) throw GgufError("gguf: model is missing tensor '" + name + "'");
  if (t->type != static_cast<uint32_t>(GgmlType::F32) || t->n_elements() != static_cast<uint64_t>(n))
    throw std::invalid_argument("model: tensor '" + name + "' must be F32 with " + std::to_string(n) + " elements");
  used_.push_back(name);
  // Copied out of the mapping (a few KiB each): after the repack drops the file's pages, nothing
  // the forward pass reads every step should fault them back in (a fault may map far more of the
  // file than the bytes read: on this project's CI machine 61 norm reads brought back 16 MiB).
  auto copy = std::make_unique<float[]>(static_cast<size_t>(n));
  std::memcpy(copy.get(), t->data, static_cast<size_t>(n) * sizeof(float));
  vectors_.push_back(std::move(copy));
  return vectors_.back().get();
}

Weight Model::weight(const std::string& name, int cols, int rows) {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) throw GgufError("gguf: model is missing tensor '" + name + "'");
  used_.push_back(name);
  if (t->n_dims != 2 || t->ne[0] != static_cast<uint64_t>(cols) || t->ne[1] != static_cast<uint64_t>(rows))
    throw std::invalid_argument("model: tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                                "], expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
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
    throw GgufError("gguf: tensor '" + name + "' (" + tr->name + ") has a non-finite scale in block " + std::to_string(b % per_row) +
                    " of row " + std::to_string(b / per_row));
  }
  return w;
}

void Model::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

// Repacks every quantized matrix once at load (about as fast as reading it) into one aligned
// allocation; the file mapping still serves the embedding lookups (the F32 vectors are copies), so its
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

// The tensors the configuration calls for, with their shapes; a tensor of the file that none of
// them is would be ignored, so the model computed would not be the file's: refused (llama.cpp
// refuses such a file too).
void Model::read_tensors() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd || embd->n_dims != 2) throw GgufError("gguf: model is missing a 2-D 'token_embd.weight'");
  if (embd->ne[1] > static_cast<uint64_t>(std::numeric_limits<int>::max())) throw std::invalid_argument("model: vocabulary too large");
  c.n_vocab = static_cast<int>(embd->ne[1]);
  const std::string a = c.architecture + ".";
  if (auto v = f.get_uint_opt(a + "vocab_size"); v && *v != static_cast<uint64_t>(c.n_vocab))
    throw std::invalid_argument("model: vocab_size metadata disagrees with token_embd.weight");

  token_embd_ = weight("token_embd.weight", c.n_embd, c.n_vocab);
  output_norm_ = vector("output_norm.weight", c.n_embd);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  output_ = c.tied_output ? token_embd_ : weight("output.weight", c.n_embd, c.n_vocab);
  // Llama 3's per-frequency divisors, one tensor for every layer (llama.cpp's rope_freqs).
  if (c.architecture == "llama" && f.find_tensor("rope_freqs.weight")) {
    rope_freq_factors_ = vector("rope_freqs.weight", c.head_dim / 2);
    for (int i = 0; i < c.head_dim / 2; ++i)
      if (!(rope_freq_factors_[i] > 0.f) || !std::isfinite(rope_freq_factors_[i]))
        throw std::invalid_argument("model: tensor 'rope_freqs.weight' holds " + number(rope_freq_factors_[i]) + " at " +
                                    std::to_string(i) + " (factors must be positive)");
    c.rope_freq_factors = true;
  }

  const int q_dim = c.q_dim(), kv_dim = c.kv_dim();
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.attn_norm = vector(p + "attn_norm.weight", c.n_embd);
    lw.wq = weight(p + "attn_q.weight", c.n_embd, q_dim);
    lw.wk = weight(p + "attn_k.weight", c.n_embd, kv_dim);
    lw.wv = weight(p + "attn_v.weight", c.n_embd, kv_dim);
    if (c.qkv_bias) {
      lw.bq = vector(p + "attn_q.bias", q_dim);
      lw.bk = vector(p + "attn_k.bias", kv_dim);
      lw.bv = vector(p + "attn_v.bias", kv_dim);
    }
    if (c.qk_norm) {
      lw.q_norm = vector(p + "attn_q_norm.weight", c.head_dim);
      lw.k_norm = vector(p + "attn_k_norm.weight", c.head_dim);
    }
    lw.wo = weight(p + "attn_output.weight", q_dim, c.n_embd);
    if (c.post_norms) lw.post_attn_norm = vector(p + "post_attention_norm.weight", c.n_embd);
    lw.ffn_norm = vector(p + "ffn_norm.weight", c.n_embd);
    lw.w_gate = weight(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    lw.w_up = weight(p + "ffn_up.weight", c.n_embd, c.n_ff);
    lw.w_down = weight(p + "ffn_down.weight", c.n_ff, c.n_embd);
    if (c.post_norms) lw.post_ffn_norm = vector(p + "post_ffw_norm.weight", c.n_embd);
    layers_.push_back(lw);
  }

  std::sort(used_.begin(), used_.end());
  for (const GgufTensorInfo& t : f.tensors())
    if (!std::binary_search(used_.begin(), used_.end(), t.name))
      throw std::invalid_argument("model: tensor '" + t.name + "' is not part of the " + c.architecture +
                                  " architecture as ctxbank runs it (ignoring it would compute another model)");
}

std::shared_ptr<Model> Model::load(const std::string& path) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  m->read_config();
  m->read_tensors();
  // Before packing drops the file's pages: packing faults them in again anyway.
  m->weights_crc32c_ = m->file_->tensor_data_crc32c();
  m->pack_weights();
  return m;
}

}  // namespace ctx
