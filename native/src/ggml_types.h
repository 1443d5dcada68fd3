// Tensor element types as numbered by ggml/GGUF, with the block geometry the reader needs to
// validate tensor sizes. Only some are computable by the engine (see is_supported_weight_type).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ctx {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeTraits {
  const char* name;     // nullptr for numbers ggml does not define
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
};

// Traits of a ggml type number, or nullptr when the number is not a known ggml type.
const GgmlTypeTraits* ggml_type_traits(uint32_t type);

// Human-readable name, "type#N" for unknown numbers.
std::string ggml_type_name(uint32_t type);

// Types the engine multiplies in their stored form.
bool is_supported_weight_type(GgmlType t);
// Their names, for error messages: "F32, F16, ...".
const char* supported_weight_types();

// The quantized block formats the engine computes, as ggml stores them (ggml-common.h). f16
// fields are raw half bits. Each 32 elements, or each 32-element sub-block of a 256-element
// K-quant super-block, is one unit of the kernels (activations are quantized per 32).
constexpr int kQuantBlock = 32;
constexpr int kSuperBlock = 256;

// w = d * (q - 8), q = 4 bits: element j < 16 in qs[j]'s low nibble, j >= 16 in qs[j - 16]'s high one.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
// w = d * q + m, q as Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
// w = d * (q - 16), q = 5 bits: the low 4 as Q4_0, bit 4 of element j in bit j of qh (little-endian).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// w = d * q + m, q as Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// w = d * q, q signed 8 bits.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// Sub-block s (0..7) of 32: w = d * sc[s] * q - dmin * m[s], with 6-bit sc and m packed in
// `scales` (k_scale_min) and 4-bit q: element l of sub-block s in the low (s even) or high
// (s odd) nibble of qs[32 * (s / 2) + l].
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// As Q4_K with 5-bit q: bit 4 of element l of sub-block s is bit s of qh[l].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// 16 groups of 16: w = d * scales[e / 16] * (q - 32), q = 6 bits. In each half h of 128 elements,
// element 32a + l (a = 0..3) has its low 4 bits in ql[64h + 32(a % 2) + l] (low nibble for
// a < 2, high for a >= 2) and its top 2 in bits 2a..2a+1 of qh[32h + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 &&
                  sizeof(BlockQ8_0) == 34,
              "32-element block sizes");
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "K-quant block sizes");

// Sub-block s's 6-bit scale and min from a Q4_K/Q5_K `scales` field: s < 4 in the low 6 bits of
// bytes s and s + 4; s >= 4 in the nibbles of byte s + 4 with their top 2 bits in the top bits of
// bytes s - 4 and s.
void k_scale_min(const uint8_t scales[12], int s, uint8_t* sc, uint8_t* m);

// The unsigned quants q[0..32) of one 32-element block or sub-block s, before scale and offset
// (the formulas above): Q5_0/Q5_1 0..31, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (scales 2s, 2s + 1).
void quants_q5(const uint8_t qh[4], const uint8_t qs[16], uint8_t q[32]);
void quants_q4_k(const BlockQ4_K& b, int s, uint8_t q[32]);
void quants_q5_k(const BlockQ5_K& b, int s, uint8_t q[32]);
void quants_q6_k(const BlockQ6_K& b, int s, uint8_t q[32]);

}  // namespace ctx
