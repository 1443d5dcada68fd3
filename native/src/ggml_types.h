// Tensor element types as numbered by ggml/GGUF, with the block geometry the reader needs to
// validate tensor sizes. Only some are computable by the engine (see is_supported_weight_type).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ctx {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeTraits {
  const char* name;      // nullptr for numbers ggml does not define
  uint32_t block_size;   // elements per block
  uint32_t type_size;    // bytes per block
};

// Traits of a ggml type number, or nullptr when the number is not a known ggml type.
const GgmlTypeTraits* ggml_type_traits(uint32_t type);

// Human-readable name, "type#N" for unknown numbers.
std::string ggml_type_name(uint32_t type);

// Types the engine multiplies in their stored form.
bool is_supported_weight_type(GgmlType t);

// Quantized types store 32-element blocks: d (and m) scales followed by packed quants.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
constexpr int kQuantBlock = 32;

}  // namespace ctx
