// A small GGUF writer for tests: builds valid files and, by overriding any field, malformed
// ones. Deliberately independent of the reader (its own type-size table, its own encoding).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ctxtest {

// GGUF value type numbers (spec).
enum : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
// ggml type numbers used by the tests.
enum : uint32_t {
  kTF32 = 0,
  kTF16 = 1,
  kTQ4_0 = 2,
  kTQ4_1 = 3,
  kTQ5_0 = 6,
  kTQ5_1 = 7,
  kTQ8_0 = 8,
  kTQ3_K = 11,
  kTQ4_K = 12,
  kTQ5_K = 13,
  kTQ6_K = 14,
};

// Little-endian byte builder.
struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T v) {
    char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.append(tmp, sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& raw(const std::string& s) {
    b += s;
    return *this;
  }
};

template <typename T>
std::string le(T v) {
  return Bytes().put(v).b;
}
inline std::string gstr(const std::string& s) { return Bytes().str(s).b; }
// Array payload: element type, count, then the already-encoded elements.
inline std::string garr(uint32_t elem_type, uint64_t count, const std::string& elems) {
  return Bytes().u32(elem_type).u64(count).raw(elems).b;
}

// One metadata entry: the key (kept for lookups) and its encoding (key, type, payload).
struct Kv {
  std::string key;
  std::string encoded;
};
inline Kv kv(const std::string& key, uint32_t type, const std::string& payload) { return {key, Bytes().str(key).u32(type).raw(payload).b}; }
inline Kv kv_u32(const std::string& k, uint32_t v) { return kv(k, kU32, le(v)); }
inline Kv kv_f32(const std::string& k, float v) { return kv(k, kF32, le(v)); }
inline Kv kv_str(const std::string& k, const std::string& v) { return kv(k, kString, gstr(v)); }

// Bytes a tensor of this ggml type and element count occupies (own table, not ggml_types.cc).
inline uint64_t tensor_bytes(uint32_t type, uint64_t n) {
  switch (type) {
    case kTF32:
      return n * 4;
    case kTF16:
      return n * 2;
    case kTQ4_0:
      return n / 32 * 18;
    case kTQ4_1:
      return n / 32 * 20;
    case kTQ5_0:
      return n / 32 * 22;
    case kTQ5_1:
      return n / 32 * 24;
    case kTQ8_0:
      return n / 32 * 34;
    case kTQ3_K:
      return n / 256 * 110;
    case kTQ4_K:
      return n / 256 * 144;
    case kTQ5_K:
      return n / 256 * 176;
    case kTQ6_K:
      return n / 256 * 210;
    default:
      throw std::logic_error("gguf_writer: no size for this type; give data explicitly");
  }
}

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = kTF32;
  std::string data;                // empty: zero bytes of the natural size
  std::optional<uint64_t> offset;  // default: next aligned offset after the previous tensor
  bool write_data = true;          // false: describe the tensor but write none of its bytes
};

struct Spec {
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // override the counts in the header
  std::vector<Kv> kvs;
  std::vector<Tensor> tensors;
  uint64_t alignment = 32;  // padding used by the writer (general.alignment is a separate KV)

  Kv* find_kv(const std::string& key) {
    for (auto& k : kvs)
      if (k.key == key) return &k;
    return nullptr;
  }
  void erase_kv(const std::string& key) {
    for (size_t i = 0; i < kvs.size(); ++i)
      if (kvs[i].key == key) {
        kvs.erase(kvs.begin() + i);
        return;
      }
    throw std::logic_error("no kv " + key);
  }
  Tensor& tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return t;
    throw std::logic_error("no tensor " + name);
  }
  void erase_tensor(const std::string& name) {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].name == name) {
        tensors.erase(tensors.begin() + i);
        return;
      }
    throw std::logic_error("no tensor " + name);
  }
};

struct Built {
  std::string bytes;
  uint64_t header_bytes = 0;  // end of the tensor infos
  uint64_t data_start = 0;
  std::vector<uint64_t> offsets;  // per tensor, relative to data_start
};

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// The file ends right after the last tensor's data (no trailing padding), so every strict
// prefix of a valid file is truncated somewhere that matters.
inline Built build(const Spec& s) {
  Built out;
  Bytes h;
  h.u32(s.magic).u32(s.version).u64(s.n_tensors.value_or(s.tensors.size())).u64(s.n_kv.value_or(s.kvs.size()));
  for (const auto& k : s.kvs) h.raw(k.encoded);
  uint64_t next = 0;
  std::vector<std::string> datas;
  for (const auto& t : s.tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.dims) n *= d;
    std::string data = t.data;
    if (data.empty() && t.write_data) data.assign(tensor_bytes(t.type, n), '\0');
    const uint64_t off = t.offset.value_or(align_up(next, s.alignment));
    next = off + data.size();
    h.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) h.u64(d);
    h.u32(t.type).u64(off);
    out.offsets.push_back(off);
    datas.push_back(t.write_data ? std::move(data) : std::string());
  }
  out.header_bytes = h.b.size();
  out.data_start = s.tensors.empty() ? h.b.size() : align_up(h.b.size(), s.alignment);
  std::string blob;
  for (size_t i = 0; i < datas.size(); ++i) {
    if (datas[i].empty()) continue;
    const uint64_t end = out.offsets[i] + datas[i].size();
    if (blob.size() < end) blob.resize(end, '\0');
    std::memcpy(&blob[out.offsets[i]], datas[i].data(), datas[i].size());
  }
  out.bytes = h.b;
  if (!blob.empty()) {
    out.bytes.resize(out.data_start, '\0');
    out.bytes += blob;
  }
  return out;
}

inline std::string floats_to_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A fresh directory under the test temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ctxbank-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + p);
    return p;
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// ---------------------------------------------------------------------------------------------
// A tiny Llama model (F32 weights, random values) that Model::load accepts.

struct TinyLlama {
  int n_embd = 32, n_head = 2, n_head_kv = 1, n_ff = 64, n_layer = 2, n_vocab = 40, n_ctx = 64;
  float rope_base = 10000.f, rms_eps = 1e-5f;
};

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Round-to-nearest quantization of one row (length multiple of 32) into ggml blocks, for
// building quantized test models (independent of the engine's fp16.h).
inline uint16_t to_half(float f) {
  // Up to the normal range (test scales are ~1e-5..1).
  if (f == 0.f) return 0;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000;
  // Subnormal halves are multiples of 2^-24 (1024 of them is the smallest normal, 0x0400).
  if (std::fabs(f) < std::ldexp(1.f, -14))
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::ldexp(std::fabs(f), 24))));
  const int exp = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = (b & 0x7FFFFF) + 0x1000;  // round half up at bit 13
  int e = exp;
  if (mant & 0x800000) {
    mant = 0;
    ++e;
  }
  if (e <= 0 || e >= 31) throw std::logic_error("to_half: out of normal range");
  return static_cast<uint16_t>(sign | (e << 10) | (mant >> 13));
}
inline float from_half(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(static_cast<float>(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}
inline long round_clamp(float v, long lo, long hi) { return std::clamp<long>(std::lround(v), lo, hi); }

// A Q4_K (nmax 15) or Q5_K (nmax 31) super-block: per 32-sub-block an offset min(0, min x) and a
// step (max - min) / nmax, both as 6-bit multiples of the super-block's dmin and d.
inline void quantize_k4(const float* x, int nmax, Bytes& out) {
  float step[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    step[j] = (hi - lo) / nmax;
    mn[j] = -lo;
  }
  const uint16_t dh = to_half(*std::max_element(step, step + 8) / 63), mh = to_half(*std::max_element(mn, mn + 8) / 63);
  const float d = from_half(dh), dmin = from_half(mh);
  uint8_t sc[8], m[8], scales[12] = {}, qs[128] = {}, qh[32] = {};
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? round_clamp(step[j] / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? round_clamp(mn[j] / dmin, 0, 63) : 0);
    if (j < 4) {
      scales[j] = sc[j];
      scales[j + 4] = m[j];
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | (m[j] & 0xF) << 4);
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
    const float ds = d * sc[j], dm = dmin * m[j];
    for (int l = 0; l < 32; ++l) {
      const auto q = static_cast<uint8_t>(ds > 0 ? round_clamp((x[32 * j + l] + dm) / ds, 0, nmax) : 0);
      qs[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 0xF) << (4 * (j % 2)));
      qh[l] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
    }
  }
  out.put(dh).put(mh);
  for (uint8_t v : scales) out.u8(v);
  if (nmax == 31)
    for (uint8_t v : qh) out.u8(v);
  for (uint8_t v : qs) out.u8(v);
}

// A Q6_K super-block: per 16-group a signed step (the value of largest magnitude maps to -32) as
// an 8-bit multiple of d.
inline void quantize_q6_k(const float* x, Bytes& out) {
  float step[16], amax = 0;
  for (int g = 0; g < 16; ++g) {
    float big = 0;
    for (int l = 0; l < 16; ++l)
      if (std::fabs(x[16 * g + l]) > std::fabs(big)) big = x[16 * g + l];
    step[g] = big / -32;
    amax = std::max(amax, std::fabs(step[g]));
  }
  const uint16_t dh = to_half(amax / 127);
  const float d = from_half(dh);
  int8_t sc[16];
  uint8_t ql[128] = {}, qh[64] = {};
  for (int g = 0; g < 16; ++g) sc[g] = static_cast<int8_t>(d > 0 ? round_clamp(step[g] / d, -128, 127) : 0);
  for (int e = 0; e < 256; ++e) {
    const float ds = d * sc[e / 16];
    const auto q = static_cast<uint8_t>(ds != 0 ? round_clamp(x[e] / ds + 32, 0, 63) : 32);
    const int h = e / 128, a = (e % 128) / 32, l = e % 32;
    ql[64 * h + 32 * (a % 2) + l] |= static_cast<uint8_t>((q & 0xF) << (a < 2 ? 0 : 4));
    qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * a));
  }
  for (uint8_t v : ql) out.u8(v);
  for (uint8_t v : qh) out.u8(v);
  for (int8_t v : sc) out.put(v);
  out.put(dh);
}

inline std::string quantize_row(uint32_t type, const float* x, int n) {
  Bytes out;
  if (type == kTQ4_K || type == kTQ5_K || type == kTQ6_K) {
    if (n % 256 != 0) throw std::logic_error("quantize_row: K-quant rows hold multiples of 256");
    for (int b = 0; b < n / 256; ++b) {
      if (type == kTQ6_K)
        quantize_q6_k(x + 256 * b, out);
      else
        quantize_k4(x + 256 * b, type == kTQ4_K ? 15 : 31, out);
    }
    return out.b;
  }
  for (int b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    if (type == kTQ8_0) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const uint16_t dh = to_half(amax / 127.f);
      const float d = from_half(dh);
      out.put(dh);
      for (int j = 0; j < 32; ++j) out.put(static_cast<int8_t>(d > 0 ? std::lround(std::clamp(xb[j] / d, -127.f, 127.f)) : 0));
    } else if (type == kTQ4_1) {
      float lo = xb[0], hi = xb[0];
      for (int j = 0; j < 32; ++j) lo = std::min(lo, xb[j]), hi = std::max(hi, xb[j]);
      const uint16_t dh = to_half((hi - lo) / 15.f), mh = to_half(lo);
      const float d = from_half(dh), m = from_half(mh);
      out.put(dh).put(mh);
      auto q = [&](int j) { return static_cast<uint8_t>(d > 0 ? std::clamp<long>(std::lround((xb[j] - m) / d), 0, 15) : 0); };
      for (int j = 0; j < 16; ++j) out.u8(static_cast<uint8_t>(q(j) | (q(j + 16) << 4)));
    } else if (type == kTQ4_0) {
      // ggml's reference: the signed value of largest magnitude maps to -8.
      float amax = 0, max = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
      const uint16_t dh = to_half(max / -8.f);
      const float d = from_half(dh);
      out.put(dh);
      auto q = [&](int j) { return static_cast<uint8_t>(d != 0 ? std::clamp<long>(std::lround(xb[j] / d + 8.f), 0, 15) : 8); };
      for (int j = 0; j < 16; ++j) out.u8(static_cast<uint8_t>(q(j) | (q(j + 16) << 4)));
    } else if (type == kTQ5_0 || type == kTQ5_1) {
      // Q5_0 as Q4_0 (largest magnitude -> -16), Q5_1 as Q4_1 with 31 steps; bit 4 in qh.
      uint8_t q[32];
      float lo = xb[0], hi = xb[0], amax = 0, max = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, xb[j]), hi = std::max(hi, xb[j]);
        if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
      }
      if (type == kTQ5_0) {
        const uint16_t dh = to_half(max / -16.f);
        const float d = from_half(dh);
        out.put(dh);
        for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(d != 0 ? round_clamp(xb[j] / d + 16.f, 0, 31) : 16);
      } else {
        const uint16_t dh = to_half((hi - lo) / 31.f), mh = to_half(lo);
        const float d = from_half(dh), m = from_half(mh);
        out.put(dh).put(mh);
        for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(d > 0 ? round_clamp((xb[j] - m) / d, 0, 31) : 0);
      }
      uint32_t qh = 0;
      for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      out.put(qh);
      for (int j = 0; j < 16; ++j) out.u8(static_cast<uint8_t>((q[j] & 0xF) | (q[j + 16] & 0xF) << 4));
    } else if (type == kTF16) {
      // Values too small for a normal half become 0 (to_half handles normal values only).
      for (int j = 0; j < 32; ++j) out.put(std::fabs(xb[j]) < 1e-4f ? static_cast<uint16_t>(0) : to_half(xb[j]));
    } else {
      throw std::logic_error("quantize_row: no quantizer for this type");
    }
  }
  return out.b;
}

// Converts a 2-D F32 tensor to `type`.
inline void quantize_tensor(Tensor& t, uint32_t type) {
  if (t.dims.size() != 2 || t.type != kTF32) throw std::logic_error("quantize_tensor: needs a 2-D F32 tensor");
  const auto* f = reinterpret_cast<const float*>(t.data.data());
  std::string q;
  for (uint64_t r = 0; r < t.dims[1]; ++r) q += quantize_row(type, f + r * t.dims[0], static_cast<int>(t.dims[0]));
  t.type = type;
  t.data = q;
}

inline Spec tiny_llama_spec(const TinyLlama& c, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  Spec s;
  s.kvs = {
      kv_str("general.architecture", "llama"),
      kv_str("general.name", "tiny"),
      kv_u32("llama.context_length", c.n_ctx),
      kv_u32("llama.embedding_length", c.n_embd),
      kv_u32("llama.block_count", c.n_layer),
      kv_u32("llama.feed_forward_length", c.n_ff),
      kv_u32("llama.rope.dimension_count", c.n_embd / c.n_head),
      kv_u32("llama.attention.head_count", c.n_head),
      kv_u32("llama.attention.head_count_kv", c.n_head_kv),
      kv_f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps),
      kv_f32("llama.rope.freq_base", c.rope_base),
  };
  const uint64_t E = c.n_embd, F = c.n_ff, KV = static_cast<uint64_t>(c.n_embd / c.n_head) * c.n_head_kv;
  // Scales chosen so activations stay O(1) through the layers.
  auto mat = [&](const std::string& name, uint64_t cols, uint64_t rows) {
    const float r = 1.f / std::sqrt(static_cast<float>(cols));
    s.tensors.push_back({name, {cols, rows}, kTF32, floats_to_bytes(random_floats(cols * rows, rng, -r, r)), {}, true});
  };
  auto norm = [&](const std::string& name) {
    s.tensors.push_back({name, {E}, kTF32, floats_to_bytes(random_floats(E, rng, 0.5f, 1.5f)), {}, true});
  };
  s.tensors.push_back({"token_embd.weight",
                       {E, static_cast<uint64_t>(c.n_vocab)},
                       kTF32,
                       floats_to_bytes(random_floats(E * c.n_vocab, rng, -1.f, 1.f)),
                       {},
                       true});
  norm("output_norm.weight");
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    mat(p + "attn_q.weight", E, E);
    mat(p + "attn_k.weight", E, KV);
    mat(p + "attn_v.weight", E, KV);
    mat(p + "attn_output.weight", E, E);
    norm(p + "ffn_norm.weight");
    mat(p + "ffn_gate.weight", E, F);
    mat(p + "ffn_up.weight", E, F);
    mat(p + "ffn_down.weight", F, E);
  }
  return s;
}

// tiny_llama_spec with every 2-D tensor (the embedding, tied output, and the layers' matrices)
// converted to `type`.
inline Spec quantized_tiny_llama_spec(const TinyLlama& c, uint32_t type, uint32_t seed = 1) {
  Spec s = tiny_llama_spec(c, seed);
  for (auto& t : s.tensors)
    if (t.dims.size() == 2) quantize_tensor(t, type);
  return s;
}

// A tiny Llama whose widths are multiples of 256, so every matrix can be a K-quant.
constexpr TinyLlama kTinyWide = [] {
  TinyLlama c;
  c.n_embd = 256, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 512, c.n_layer = 2, c.n_vocab = 40, c.n_ctx = 128;
  return c;
}();

// ---------------------------------------------------------------------------------------------
// A tiny model of any architecture the engine runs (F32 weights, random values), with the keys
// and tensors llama.cpp's GGUF converter writes for it (llama.cpp: src/models/<arch>.cpp).

struct TinyArch {
  std::string arch = "llama";  // llama | qwen2 | qwen3 | gemma3
  int n_embd = 64, n_head = 4, n_head_kv = 2, n_ff = 128, n_layer = 2, n_vocab = 50, n_ctx = 256;
  int head_dim = 0;  // 0: n_embd / n_head, no attention.key_length key
  float rope_base = 100.f, rms_eps = 1e-6f;
  bool rope_freqs = false;       // llama: a rope_freqs.weight of random factors in [1, 8]
  float rope_linear_factor = 0;  // > 0: rope.scaling.type "linear" with this factor
  bool tied_output = true;
  // gemma3 only: attention.sliding_window (0: absent), the pattern as a period (0: absent) or
  // as per-layer flags (empty: absent), rope.freq_base_swa and final_logit_softcapping (0: absent).
  int sliding_window = 0;
  uint32_t swa_period = 0;
  std::vector<bool> swa_flags;
  float rope_base_swa = 0, softcap = 0;

  int dim() const { return head_dim ? head_dim : n_embd / n_head; }
};

inline Kv kv_bool_array(const std::string& k, const std::vector<bool>& v) {
  Bytes elems;
  for (bool b : v) elems.u8(b ? 1 : 0);
  return kv(k, kArray, garr(kBool, v.size(), elems.b));
}

inline Spec tiny_arch_spec(const TinyArch& c, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::string a = c.arch + ".";
  const bool gemma3 = c.arch == "gemma3";
  Spec s;
  s.kvs = {
      kv_str("general.architecture", c.arch),
      kv_str("general.name", "tiny " + c.arch),
      kv_u32(a + "context_length", c.n_ctx),
      kv_u32(a + "embedding_length", c.n_embd),
      kv_u32(a + "block_count", c.n_layer),
      kv_u32(a + "feed_forward_length", c.n_ff),
      kv_u32(a + "attention.head_count", c.n_head),
      kv_u32(a + "attention.head_count_kv", c.n_head_kv),
      kv_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps),
      kv_f32(a + "rope.freq_base", c.rope_base),
  };
  if (c.head_dim) {
    s.kvs.push_back(kv_u32(a + "attention.key_length", c.head_dim));
    s.kvs.push_back(kv_u32(a + "attention.value_length", c.head_dim));
  }
  if (c.rope_linear_factor > 0) {
    s.kvs.push_back(kv_str(a + "rope.scaling.type", "linear"));
    s.kvs.push_back(kv_f32(a + "rope.scaling.factor", c.rope_linear_factor));
  }
  if (c.sliding_window) s.kvs.push_back(kv_u32(a + "attention.sliding_window", c.sliding_window));
  if (c.swa_period) s.kvs.push_back(kv_u32(a + "attention.sliding_window_pattern", c.swa_period));
  if (!c.swa_flags.empty()) s.kvs.push_back(kv_bool_array(a + "attention.sliding_window_pattern", c.swa_flags));
  if (c.rope_base_swa > 0) s.kvs.push_back(kv_f32(a + "rope.freq_base_swa", c.rope_base_swa));
  if (c.softcap > 0) s.kvs.push_back(kv_f32(a + "final_logit_softcapping", c.softcap));

  const uint64_t E = c.n_embd, F = c.n_ff, D = c.dim(), Q = D * c.n_head, KV = D * c.n_head_kv;
  auto vec = [&](const std::string& name, uint64_t n, float lo, float hi) {
    s.tensors.push_back({name, {n}, kTF32, floats_to_bytes(random_floats(n, rng, lo, hi)), {}, true});
  };
  // Scales chosen so activations stay O(1) through the layers.
  auto mat = [&](const std::string& name, uint64_t cols, uint64_t rows) {
    const float r = 1.f / std::sqrt(static_cast<float>(cols));
    s.tensors.push_back({name, {cols, rows}, kTF32, floats_to_bytes(random_floats(cols * rows, rng, -r, r)), {}, true});
  };
  s.tensors.push_back({"token_embd.weight",
                       {E, static_cast<uint64_t>(c.n_vocab)},
                       kTF32,
                       floats_to_bytes(random_floats(E * c.n_vocab, rng, -1.f, 1.f)),
                       {},
                       true});
  if (!c.tied_output) mat("output.weight", E, c.n_vocab);
  vec("output_norm.weight", E, 0.5f, 1.5f);
  if (c.rope_freqs) vec("rope_freqs.weight", D / 2, 1.f, 8.f);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", E, 0.5f, 1.5f);
    mat(p + "attn_q.weight", E, Q);
    mat(p + "attn_k.weight", E, KV);
    mat(p + "attn_v.weight", E, KV);
    if (c.arch == "qwen2") {
      vec(p + "attn_q.bias", Q, -0.5f, 0.5f);
      vec(p + "attn_k.bias", KV, -0.5f, 0.5f);
      vec(p + "attn_v.bias", KV, -0.5f, 0.5f);
    }
    if (c.arch == "qwen3" || gemma3) {
      vec(p + "attn_q_norm.weight", D, 0.5f, 1.5f);
      vec(p + "attn_k_norm.weight", D, 0.5f, 1.5f);
    }
    mat(p + "attn_output.weight", Q, E);
    if (gemma3) vec(p + "post_attention_norm.weight", E, 0.5f, 1.5f);
    vec(p + "ffn_norm.weight", E, 0.5f, 1.5f);
    mat(p + "ffn_gate.weight", E, F);
    mat(p + "ffn_up.weight", E, F);
    mat(p + "ffn_down.weight", F, E);
    if (gemma3) vec(p + "post_ffw_norm.weight", E, 0.5f, 1.5f);
  }
  return s;
}

}  // namespace ctxtest
