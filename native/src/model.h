// A decoder-only transformer read from GGUF: hyper-parameters from the metadata, weights as
// views into the memory map in their stored (quantized) form. One forward pass (engine.cc) runs
// every supported architecture: Llama is the base, and each way another architecture differs
// from it is one field of ModelConfig below, set by Model::load from general.architecture and
// that architecture's keys (as llama.cpp reads them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml_types.h"
#include "gguf.h"

namespace ctx {

// Which elements of a head RoPE rotates together: (2i, 2i+1) is ggml's "normal" mode (Llama's
// GGUF converter permuted Q and K for it); (i, i + d/2) is its NEOX mode (Qwen 2/3, Gemma 3).
enum class RopePairs { Adjacent, Halves };
enum class FfnActivation { Silu, GeluTanh };  // the gated FFN's activation: SwiGLU or GeGLU

// The rotation of one kind of layer: pair i of a head at position p turns by
// scale * p * base^(-2i/head_dim) / factor_i (factor_i: Llama 3's rope_freqs, else 1).
struct RopeParams {
  float base = 10000.f;
  float scale = 1.f;  // 1 / rope.scaling.factor (linear scaling)
};

struct ModelConfig {
  std::string architecture;  // general.architecture: llama, qwen2, qwen3 or gemma3
  std::string name;
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // attention.key_length, else n_embd / n_head
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  RopeParams rope;  // global layers
  float rms_eps = 1e-5f;
  bool tied_output = false;

  // How the architecture differs from Llama; the defaults are Llama's.
  RopePairs rope_pairs = RopePairs::Adjacent;
  bool rope_freq_factors = false;  // Llama 3: rope_freqs.weight divides each pair's frequency
  bool qkv_bias = false;           // Qwen 2: Q, K and V projections have biases
  bool qk_norm = false;            // Qwen 3, Gemma 3: RMSNorm of each head of Q and K before RoPE
  bool post_norms = false;         // Gemma 3: RMSNorm of the attention and FFN outputs before each residual add
  FfnActivation ffn_activation = FfnActivation::Silu;
  float embd_scale = 1.f;           // Gemma 3: sqrt(n_embd) times each embedding row
  float attn_scale = 0.f;           // the softmax's scale of q.k: 1/sqrt(head_dim) (Gemma 3 27B: see model.cc)
  float final_logit_softcap = 0.f;  // > 0: logits = cap * tanh(logits / cap) (Gemma 3 files that set it)
  // Sliding-window layers (Gemma 3): layer l with slides[l] attends only to its last
  // `sliding_window` keys (the query's own included) and turns by rope_swa.
  int sliding_window = 0;
  std::vector<bool> slides;  // per layer; empty when no layer slides
  RopeParams rope_swa;

  int q_dim() const { return n_head * head_dim; }  // width of Q and of the attention output
  int kv_dim() const { return n_head_kv * head_dim; }
  bool layer_slides(int layer) const { return !slides.empty() && slides[static_cast<size_t>(layer)]; }
  bool any_layer_slides() const { return !slides.empty(); }
  // What this model needs beyond the Llama forward pass, in words (empty for plain Llama): for
  // backends that implement only that pass (the CUDA backend refuses the model with this list).
  std::vector<std::string> beyond_llama() const;
  // f16 K and V of every layer for one token.
  size_t kv_bytes_per_token() const { return static_cast<size_t>(2) * n_layer * kv_dim() * sizeof(uint16_t); }
};

// A 2-D weight: `rows` rows of `cols` elements. `data` is the file's layout (rows `row_bytes`
// apart); quantized weights also have a `packed` copy in the kernels' 8-row layout (packed.h).
struct Weight {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int cols = 0;
  int rows = 0;
  size_t row_bytes = 0;
  const uint8_t* packed = nullptr;
  size_t group_bytes = 0;  // bytes of one packed row group
};

// The F32 vectors are copies (Model::vector); those an architecture does not have are null.
struct LayerWeights {
  const float* attn_norm = nullptr;
  Weight wq, wk, wv, wo;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // qkv_bias
  const float *q_norm = nullptr, *k_norm = nullptr;         // qk_norm: head_dim each
  const float* post_attn_norm = nullptr;                    // post_norms
  const float* ffn_norm = nullptr;
  Weight w_gate, w_up, w_down;
  const float* post_ffn_norm = nullptr;  // post_norms
};

class Model {
 public:
  // Throws GgufError (file problems) or std::invalid_argument (unsupported model) with a clear
  // message.
  static std::shared_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const Weight& token_embd() const { return token_embd_; }
  const Weight& output() const { return output_; }
  const float* output_norm() const { return output_norm_; }
  const float* rope_freq_factors() const { return rope_freq_factors_; }  // head_dim / 2, or null
  // CRC-32C of the file's whole tensor data, taken at load: the services' model fingerprint
  // includes it, so weights that differ in any byte give another fingerprint.
  uint32_t weights_crc32c() const { return weights_crc32c_; }

 private:
  Model() = default;
  void read_config();
  void read_tensors();
  Weight weight(const std::string& name, int cols, int rows);
  void pack_weights();
  const float* vector(const std::string& name, int n);

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  Weight token_embd_, output_;
  const float* output_norm_ = nullptr;
  const float* rope_freq_factors_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<float[]>> vectors_;  // the F32 vectors (norms, biases), copied out of the file
  std::vector<std::string> used_;                  // names of the tensors read, to refuse any other
  uint32_t weights_crc32c_ = 0;
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeAligned> packed_;  // every packed weight, one allocation
};

}  // namespace ctx
