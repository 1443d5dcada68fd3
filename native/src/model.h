// A Llama-architecture model read from GGUF: hyper-parameters from the metadata, weights as
// views into the memory map in their stored (quantized) form.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml_types.h"
#include "gguf.h"

namespace ctx {

struct ModelConfig {
  std::string architecture;
  std::string name;
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.f;
  float rms_eps = 1e-5f;
  bool tied_output = false;

  int kv_dim() const { return n_head_kv * head_dim; }
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

struct LayerWeights {
  const float* attn_norm = nullptr;
  Weight wq, wk, wv, wo;
  const float* ffn_norm = nullptr;
  Weight w_gate, w_up, w_down;
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
  // CRC-32C of the file's whole tensor data, taken at load: the services' model fingerprint
  // includes it, so weights that differ in any byte give another fingerprint.
  uint32_t weights_crc32c() const { return weights_crc32c_; }

 private:
  Model() = default;
  Weight weight(const std::string& name, int cols, int rows) const;
  void pack_weights();
  const float* norm(const std::string& name, int n);

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  Weight token_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<float[]>> norms_;  // the F32 norm vectors, copied out of the file
  uint32_t weights_crc32c_ = 0;
  struct FreeAligned { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, FreeAligned> packed_;  // every packed weight, one allocation
};

}  // namespace ctx
