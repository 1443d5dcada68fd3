#include "ggml_types.h"

namespace ctx {

namespace {
struct Entry {
  uint32_t id;
  GgmlTypeTraits traits;
};
// Block geometry from ggml-common.h (QK_K = 256).
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4}},        {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},    {3, {"Q4_1", 32, 20}},    {6, {"Q5_0", 32, 22}},
    {7, {"Q5_1", 32, 24}},     {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 36}},    {10, {"Q2_K", 256, 84}},  {11, {"Q3_K", 256, 110}},
    {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},   {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}}, {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}}, {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}}, {20, {"IQ4_NL", 32, 18}}, {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},  {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},      {26, {"I32", 1, 4}},
    {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},        {29, {"IQ1_M", 256, 56}}, {30, {"BF16", 1, 2}},     {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}},
};
}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  for (const auto& e : kTypes)
    if (e.id == type) return &e.traits;
  return nullptr;
}

std::string ggml_type_name(uint32_t type) {
  const auto* t = ggml_type_traits(type);
  return t ? t->name : "type#" + std::to_string(type);
}

bool is_supported_weight_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

const char* supported_weight_types() { return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"; }

void k_scale_min(const uint8_t scales[12], int s, uint8_t* sc, uint8_t* m) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *m = scales[s + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

void quants_q5(const uint8_t qh[4], const uint8_t qs[16], uint8_t q[32]) {
  for (int j = 0; j < 32; ++j) {
    const int low = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
    q[j] = static_cast<uint8_t>(low | ((qh[j / 8] >> (j % 8)) & 1) << 4);
  }
}

void quants_q4_k(const BlockQ4_K& b, int s, uint8_t q[32]) {
  const uint8_t* qs = b.qs + 32 * (s / 2);
  for (int l = 0; l < 32; ++l) q[l] = s % 2 ? qs[l] >> 4 : qs[l] & 0xF;
}

void quants_q5_k(const BlockQ5_K& b, int s, uint8_t q[32]) {
  const uint8_t* qs = b.qs + 32 * (s / 2);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>((s % 2 ? qs[l] >> 4 : qs[l] & 0xF) | ((b.qh[l] >> s) & 1) << 4);
}

void quants_q6_k(const BlockQ6_K& b, int s, uint8_t q[32]) {
  const int h = s / 4, a = s % 4;
  const uint8_t* ql = b.ql + 64 * h + 32 * (a % 2);
  const uint8_t* qh = b.qh + 32 * h;
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>((a < 2 ? ql[l] & 0xF : ql[l] >> 4) | ((qh[l] >> (2 * a)) & 3) << 4);
}

}  // namespace ctx
