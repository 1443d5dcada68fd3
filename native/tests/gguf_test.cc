// GGUF reader and Model::load: a valid file parses to exactly what was written; every kind of
// malformed file is refused with a GgufError (or, for a well-formed but unsupported model,
// std::invalid_argument) whose message names the problem -- never a crash or a huge allocation.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>

#include "crc32c.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model.h"
#include "packed.h"

namespace {

using namespace ctxtest;
using ctx::GgufError;
using ctx::GgufFile;
using ctx::GgufValueType;

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' lacks '" << needle << "'";
}

// Opening `bytes` as a file must throw GgufError mentioning `needle`. Any other exception
// (bad_alloc, length_error...) escapes and fails the test with its own message.
::testing::AssertionResult Rejects(const TempDir& dir, const std::string& bytes, const std::string& needle) {
  const std::string path = dir.write("bad.gguf", bytes);
  try {
    GgufFile::open(path);
  } catch (const GgufError& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << needle << "'";
  }
  return ::testing::AssertionFailure() << "file was accepted; expected an error about '" << needle << "'";
}

::testing::AssertionResult Rejects(const TempDir& dir, const Spec& s, const std::string& needle) {
  return Rejects(dir, build(s).bytes, needle);
}

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) % 251);
  return s;
}

// Every value type, arrays of scalars and strings, nested arrays, and tensors of several
// types, ranks and sizes (so the writer has to pad between them).
Spec full_spec() {
  Spec s;
  s.kvs = {
      kv("t.u8", kU8, le<uint8_t>(200)),
      kv("t.i8", kI8, le<int8_t>(-5)),
      kv("t.u16", kU16, le<uint16_t>(60000)),
      kv("t.i16", kI16, le<int16_t>(-30000)),
      kv("t.u32", kU32, le<uint32_t>(4000000000u)),
      kv("t.i32", kI32, le<int32_t>(-2000000000)),
      kv("t.f32", kF32, le<float>(1.5f)),
      kv("t.bool", kBool, le<uint8_t>(1)),
      kv("t.str", kString, gstr("h\xc3\xa9llo")),
      kv("t.empty_str", kString, gstr("")),
      kv("t.u64", kU64, le<uint64_t>(1ull << 40)),
      kv("t.i64", kI64, le<int64_t>(-(1ll << 40))),
      kv("t.f64", kF64, le<double>(3.25)),
      kv("t.arr_i32", kArray, garr(kI32, 3, le<int32_t>(1) + le<int32_t>(-2) + le<int32_t>(3))),
      kv("t.arr_str", kArray, garr(kString, 2, gstr("a") + gstr("bc"))),
      kv("t.arr_empty", kArray, garr(kF32, 0, "")),
      kv("t.arr_nested", kArray, garr(kArray, 2, garr(kU8, 2, le<uint8_t>(7) + le<uint8_t>(9)) + garr(kString, 1, gstr("x")))),
  };
  s.tensors = {
      {"a", {8}, kTF32, pattern(32, 1), {}, true},
      {"b", {64, 2}, kTQ4_1, pattern(80, 2), {}, true},
      {"c", {3, 5, 2}, kTF16, pattern(60, 3), {}, true},
      {"d", {32, 1, 1, 2}, kTQ8_0, pattern(68, 4), {}, true},
  };
  return s;
}

// A small valid file for the corruption tests: one KV, two tensors.
Spec small_spec() {
  Spec s;
  s.kvs = {kv_str("general.name", "x")};
  s.tensors = {{"a", {8}, kTF32, pattern(32, 1), {}, true}, {"b", {32}, kTQ8_0, pattern(34, 2), {}, true}};
  return s;
}

class GgufTest : public ::testing::Test {
 protected:
  TempDir dir;
};

TEST_F(GgufTest, ValidFileParsesExactly) {
  const Spec spec = full_spec();
  const Built b = build(spec);
  auto f = GgufFile::open(dir.write("ok.gguf", b.bytes));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), b.bytes.size());
  EXPECT_EQ(f->header_bytes(), b.header_bytes);
  ASSERT_EQ(f->metadata().size(), spec.kvs.size());

  auto get = [&](const char* k) -> const ctx::GgufValue& {
    const ctx::GgufValue* v = f->find(k);
    if (!v) throw std::runtime_error(std::string("missing ") + k);
    return *v;
  };
  EXPECT_EQ(get("t.u8").type, GgufValueType::U8);
  EXPECT_EQ(get("t.u8").u, 200u);
  EXPECT_EQ(get("t.i8").i, -5);
  EXPECT_EQ(get("t.u16").u, 60000u);
  EXPECT_EQ(get("t.i16").i, -30000);
  EXPECT_EQ(get("t.u32").u, 4000000000u);
  EXPECT_EQ(get("t.i32").i, -2000000000);
  EXPECT_EQ(get("t.f32").f, 1.5);
  EXPECT_EQ(get("t.bool").type, GgufValueType::BOOL);
  EXPECT_EQ(get("t.bool").u, 1u);
  EXPECT_EQ(get("t.str").str, "h\xc3\xa9llo");
  EXPECT_EQ(get("t.empty_str").str, "");
  EXPECT_EQ(get("t.u64").u, 1ull << 40);
  EXPECT_EQ(get("t.i64").i, -(1ll << 40));
  EXPECT_EQ(get("t.f64").f, 3.25);
  const auto& ai = get("t.arr_i32");
  EXPECT_EQ(ai.elem_type, GgufValueType::I32);
  ASSERT_EQ(ai.arr.size(), 3u);
  EXPECT_EQ(ai.arr[1].i, -2);
  const auto& as = get("t.arr_str");
  ASSERT_EQ(as.arr.size(), 2u);
  EXPECT_EQ(as.arr[1].str, "bc");
  EXPECT_TRUE(get("t.arr_empty").arr.empty());
  const auto& an = get("t.arr_nested");
  ASSERT_EQ(an.arr.size(), 2u);
  EXPECT_EQ(an.arr[0].elem_type, GgufValueType::U8);
  ASSERT_EQ(an.arr[0].arr.size(), 2u);
  EXPECT_EQ(an.arr[0].arr[1].u, 9u);
  ASSERT_EQ(an.arr[1].arr.size(), 1u);
  EXPECT_EQ(an.arr[1].arr[0].str, "x");

  // Typed accessors.
  EXPECT_EQ(f->get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(f->get_uint("t.u64"), 1ull << 40);
  EXPECT_EQ(f->get_float_or("t.u16", 0), 60000.0);
  EXPECT_EQ(f->get_float_or("t.f32", 0), 1.5);
  EXPECT_EQ(f->get_float_or("t.absent", 7.0), 7.0);
  EXPECT_EQ(f->get_string("t.str"), "h\xc3\xa9llo");
  EXPECT_FALSE(f->get_string_opt("t.absent").has_value());
  EXPECT_THROW(f->get_uint("t.i8"), GgufError);      // negative
  EXPECT_THROW(f->get_uint("t.str"), GgufError);     // not an integer
  EXPECT_THROW(f->get_string("t.u8"), GgufError);    // not a string
  EXPECT_THROW(f->get_uint("t.absent"), GgufError);  // required but missing

  ASSERT_EQ(f->tensors().size(), spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& want = spec.tensors[i];
    const auto& t = f->tensors()[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(t.name, want.name);
    ASSERT_EQ(t.n_dims, want.dims.size());
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < want.dims.size() ? want.dims[d] : 1u);
    EXPECT_EQ(t.type, want.type);
    EXPECT_EQ(t.offset, b.offsets[i]);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.n_bytes, want.data.size());
    EXPECT_EQ(t.data, f->bytes() + b.data_start + b.offsets[i]);
    EXPECT_EQ(std::memcmp(t.data, want.data.data(), want.data.size()), 0);
    EXPECT_EQ(f->find_tensor(want.name), &t);
  }
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
}

TEST_F(GgufTest, HonoursGeneralAlignmentAndVersion2) {
  Spec s = small_spec();
  s.kvs.push_back(kv_u32("general.alignment", 64));
  s.alignment = 64;
  s.version = 2;
  const Built b = build(s);
  auto f = GgufFile::open(dir.write("a64.gguf", b.bytes));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(b.data_start % 64, 0u);
  EXPECT_EQ(f->tensors()[1].offset, 64u);
  EXPECT_EQ(f->tensors()[1].data, f->bytes() + b.data_start + 64);
  // Written with 32-byte padding but declaring 64: the second tensor's offset (32) is misaligned.
  s.alignment = 32;
  EXPECT_TRUE(Rejects(dir, s, "offset is not aligned to 64"));
}

TEST_F(GgufTest, MetadataOnlyFileIsValid) {
  Spec s;
  s.kvs = {kv_str("general.name", "x")};
  auto f = GgufFile::open(dir.write("meta.gguf", build(s).bytes));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->get_string("general.name"), "x");
}

// Every strict prefix of a valid file is refused. The file ends at the last tensor's last
// byte, so there is no prefix that happens to be complete.
TEST_F(GgufTest, EveryTruncationIsRefused) {
  const std::string full = build(full_spec()).bytes;
  ASSERT_NO_THROW(GgufFile::open(dir.write("full.gguf", full)));
  const auto start = std::chrono::steady_clock::now();
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string path = dir.write("cut.gguf", full.substr(0, n));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const GgufError& e) {
      // Whatever field the cut lands in, the message says what a user needs to know.
      EXPECT_TRUE(std::regex_search(e.what(), std::regex("truncated|too small to be a GGUF file"))) << "prefix " << n << ": " << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << full.size() << " prefixes";
}

TEST_F(GgufTest, RefusesBadHeaders) {
  EXPECT_TRUE(Rejects(dir, std::string(), "too small"));
  EXPECT_TRUE(Rejects(dir, std::string(23, 'G'), "too small"));
  Spec s = small_spec();
  s.magic = 0x46554746;  // "FGUF"
  EXPECT_TRUE(Rejects(dir, s, "bad magic"));
  EXPECT_TRUE(Rejects(dir, std::string(1000, 'x'), "bad magic"));
  s = small_spec();
  s.version = 1;
  EXPECT_TRUE(Rejects(dir, s, "unsupported GGUF version 1"));
  s.version = 4;
  EXPECT_TRUE(Rejects(dir, s, "unsupported GGUF version 4"));
  s = small_spec();
  s.n_kv = 1ull << 60;
  EXPECT_TRUE(Rejects(dir, s, "metadata count"));
  s = small_spec();
  s.n_tensors = 1ull << 40;
  EXPECT_TRUE(Rejects(dir, s, "tensor count"));
}

TEST_F(GgufTest, RefusesBadMetadata) {
  auto with = [](std::vector<Kv> kvs) {
    Spec s = small_spec();
    s.kvs.insert(s.kvs.end(), kvs.begin(), kvs.end());
    return s;
  };
  // Huge lengths and counts are refused before anything is allocated for them.
  Spec s = small_spec();
  s.kvs.push_back({"", Bytes().u64(1ull << 62).b});  // a key claiming 4 EiB
  EXPECT_TRUE(Rejects(dir, s, "over the 1 GiB limit"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kString, le<uint64_t>(1ull << 40))}), "over the 1 GiB limit"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kString, le<uint64_t>(1ull << 29))}), "truncated"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, garr(kU8, 1ull << 61, ""))}), "more than the file holds"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, garr(kString, 1ull << 40, ""))}), "more than the file holds"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, garr(kArray, 1, garr(kU64, 1ull << 58, "")))}), "more than the file holds"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", 13, le<uint32_t>(0))}), "unknown value type 13"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", 0xFFFFFFFFu, le<uint32_t>(0))}), "unknown value type"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, garr(13, 1, le<uint32_t>(0)))}), "array of unknown type 13"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kBool, le<uint8_t>(2))}), "bool byte of 2"));
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, garr(kBool, 2, le<uint8_t>(1) + le<uint8_t>(2)))}), "bool byte of 2"));
  EXPECT_TRUE(Rejects(dir, with({kv_u32("dup", 1), kv_u32("dup", 2)}), "duplicate metadata key 'dup'"));
  EXPECT_TRUE(Rejects(dir, with({kv("", kU32, le<uint32_t>(1))}), "is empty"));
  // Arrays nested five deep (the reader allows four levels).
  std::string nested = garr(kU8, 0, "");
  for (int i = 0; i < 4; ++i) nested = garr(kArray, 1, nested);
  EXPECT_TRUE(Rejects(dir, with({kv("k", kArray, nested)}), "nests arrays too deeply"));
}

TEST_F(GgufTest, RefusesBadAlignment) {
  for (uint32_t a : {0u, 3u, 4u, 24u, 1u << 20}) {
    SCOPED_TRACE(a);
    Spec s = small_spec();
    s.kvs.push_back(kv_u32("general.alignment", a));
    EXPECT_TRUE(Rejects(dir, s, "general.alignment must be a power of two"));
  }
  Spec s = small_spec();
  s.kvs.push_back(kv_str("general.alignment", "32"));
  EXPECT_TRUE(Rejects(dir, s, "general.alignment"));
}

TEST_F(GgufTest, RefusesBadTensorInfos) {
  auto with = [](Tensor t) {
    Spec s = small_spec();
    s.tensors.push_back(std::move(t));
    return s;
  };
  Spec s = small_spec();
  s.tensors.push_back(s.tensors[0]);
  EXPECT_TRUE(Rejects(dir, s, "duplicate tensor name 'a'"));
  EXPECT_TRUE(Rejects(dir, with({"z", {}, kTF32, std::string(4, '\0'), {}, true}), "'z' has 0 dimensions"));
  EXPECT_TRUE(Rejects(dir, with({"z", {1, 1, 1, 1, 1}, kTF32, std::string(4, '\0'), {}, true}), "'z' has 5 dimensions"));
  EXPECT_TRUE(Rejects(dir, with({"z", {4, 0}, kTF32, "", {}, false}), "'z' has an invalid shape"));
  EXPECT_TRUE(Rejects(dir, with({"z", {1ull << 32, 1ull << 32}, kTF32, "", {}, false}), "'z' has an invalid shape"));
  EXPECT_TRUE(Rejects(dir, with({"z", {(1ull << 40) + 1}, kTF32, "", {}, false}), "'z' has an invalid shape"));
  // 2^62 elements pass the element-count limit, but 2^62 F32 values are 2^64 bytes: a byte
  // count computed in 64 bits wraps to 0 and the tensor would "fit" in any file.
  Spec wrap;
  wrap.tensors = {{"z", {1ull << 31, 1ull << 31}, kTF32, pattern(32, 0), 0, true}};
  EXPECT_TRUE(Rejects(dir, wrap, "'z' has an invalid shape"));
  EXPECT_TRUE(Rejects(dir, with({"z", {32}, 99, "", {}, false}), "'z' has unknown ggml type 99"));
  EXPECT_TRUE(Rejects(dir, with({"z", {32}, 4, "", {}, false}), "unknown ggml type 4"));  // Q4_2, removed from ggml
  EXPECT_TRUE(Rejects(dir, with({"z", {48, 2}, kTQ4_1, "", {}, false}), "row of 48 is not a multiple of the Q4_1 block size"));
  EXPECT_TRUE(Rejects(dir, with({"z", {8}, kTF32, pattern(32, 0), 104, true}), "'z' offset is not aligned to 32"));
  EXPECT_TRUE(Rejects(dir, with({"z", {8}, kTF32, "", 1ull << 20, false}), "'z' extends past the end of the file"));
  EXPECT_TRUE(Rejects(dir, with({"z", {8}, kTF32, "", ~0ull << 5, false}), "'z' extends past the end of the file"));
  EXPECT_TRUE(Rejects(dir, with({std::string(64, 'n'), {8}, kTF32, pattern(32, 0), {}, true}), "over-long name"));
  EXPECT_TRUE(Rejects(dir, with({"", {8}, kTF32, pattern(32, 0), {}, true}), "empty or over-long name"));
  // "a" occupies [0, 32); "z" starts inside it.
  s = small_spec();
  s.tensors[0] = {"a", {16}, kTF32, pattern(64, 1), 0, true};
  s.tensors[1].offset = 32;
  EXPECT_TRUE(Rejects(dir, s, "'a' and 'b' overlap"));
  // Overlap must be found whatever order the infos come in.
  std::swap(s.tensors[0], s.tensors[1]);
  EXPECT_TRUE(Rejects(dir, s, "'a' and 'b' overlap"));
}

TEST_F(GgufTest, RefusesNonFiles) {
  try {
    GgufFile::open(dir.path());
    FAIL() << "a directory was accepted";
  } catch (const GgufError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "is not a regular file"));
  }
  try {
    GgufFile::open(dir.path() + "/missing.gguf");
    FAIL() << "a missing file was accepted";
  } catch (const GgufError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "cannot open"));
    EXPECT_TRUE(HasSubstr(e.what(), "No such file"));
  }
}

// ---------------------------------------------------------------------------------------------
// Model::load on a tiny Llama.

class ModelLoadTest : public GgufTest {
 protected:
  template <typename Exc>
  void ExpectLoadFails(const Spec& s, const std::string& needle) {
    const std::string path = dir.write("model.gguf", build(s).bytes);
    try {
      ctx::Model::load(path);
      ADD_FAILURE() << "model was accepted; expected an error about '" << needle << "'";
    } catch (const Exc& e) {
      EXPECT_TRUE(HasSubstr(e.what(), needle));
    }
  }
};

TEST_F(ModelLoadTest, LoadsTinyLlama) {
  TinyLlama c;
  auto m = ctx::Model::load(dir.write("tiny.gguf", build(tiny_llama_spec(c)).bytes));
  const auto& cfg = m->config();
  EXPECT_EQ(cfg.architecture, "llama");
  EXPECT_EQ(cfg.name, "tiny");
  EXPECT_EQ(cfg.n_layer, 2);
  EXPECT_EQ(cfg.n_embd, 32);
  EXPECT_EQ(cfg.n_head, 2);
  EXPECT_EQ(cfg.n_head_kv, 1);
  EXPECT_EQ(cfg.head_dim, 16);
  EXPECT_EQ(cfg.n_ff, 64);
  EXPECT_EQ(cfg.n_vocab, 40);
  EXPECT_EQ(cfg.n_ctx_train, 64);
  EXPECT_FLOAT_EQ(cfg.rope.base, 10000.f);
  EXPECT_FLOAT_EQ(cfg.rms_eps, 1e-5f);
  EXPECT_TRUE(cfg.tied_output);
  EXPECT_EQ(cfg.kv_bytes_per_token(), 2u * 2 * 16 * 2);
  EXPECT_EQ(m->layers().size(), 2u);
  EXPECT_EQ(m->layers()[1].wk.rows, 16);
  EXPECT_EQ(m->layers()[1].w_down.cols, 64);
  EXPECT_EQ(m->output().data, m->token_embd().data);

  Spec s = tiny_llama_spec(c);
  s.tensors.push_back({"output.weight", {32, 40}, kTQ8_0, "", {}, true});
  m = ctx::Model::load(dir.write("untied.gguf", build(s).bytes));
  EXPECT_FALSE(m->config().tied_output);
  EXPECT_EQ(m->output().type, ctx::GgmlType::Q8_0);
  EXPECT_EQ(m->output().row_bytes, 34u);
}

// The weights' CRC-32C (part of the services' model fingerprint) covers every byte of the tensor
// data: one flipped bit in a weight gives another value; the same bytes give the same value.
TEST_F(ModelLoadTest, WeightsCrcCoversEveryTensorByte) {
  auto bytes = build(tiny_llama_spec(TinyLlama())).bytes;
  const auto a = ctx::Model::load(dir.write("a.gguf", bytes));
  const auto again = ctx::Model::load(dir.write("again.gguf", bytes));
  EXPECT_EQ(a->weights_crc32c(), again->weights_crc32c());
  EXPECT_EQ(a->weights_crc32c(),
            ctx::crc32c(0, a->file().bytes() + a->file().data_start(), a->file().file_size() - a->file().data_start()));
  bytes[bytes.size() - 3] ^= 0x10;  // a bit in the last tensor's data
  const auto flipped = ctx::Model::load(dir.write("flipped.gguf", bytes));
  EXPECT_NE(a->weights_crc32c(), flipped->weights_crc32c());
}

TEST_F(ModelLoadTest, RefusesWrongArchitecture) {
  Spec s = tiny_llama_spec(TinyLlama());
  *s.find_kv("general.architecture") = kv_str("general.architecture", "gpt2");
  ExpectLoadFails<std::invalid_argument>(s, "architecture 'gpt2' is not supported");
}

TEST_F(ModelLoadTest, RefusesMissingOrMistypedKeys) {
  for (const char* key : {"general.architecture", "llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.context_length"}) {
    SCOPED_TRACE(key);
    Spec s = tiny_llama_spec(TinyLlama());
    s.erase_kv(key);
    ExpectLoadFails<GgufError>(s, std::string("required metadata '") + key + "' is missing");
  }
  Spec s = tiny_llama_spec(TinyLlama());
  *s.find_kv("llama.block_count") = kv_str("llama.block_count", "2");
  ExpectLoadFails<GgufError>(s, "'llama.block_count' must be an integer");
  s = tiny_llama_spec(TinyLlama());
  *s.find_kv("llama.block_count") = kv_u32("llama.block_count", 0);
  ExpectLoadFails<GgufError>(s, "'llama.block_count' = 0 is out of range");
}

TEST_F(ModelLoadTest, RefusesMissingTensor) {
  Spec s = tiny_llama_spec(TinyLlama());
  s.erase_tensor("blk.1.ffn_up.weight");
  ExpectLoadFails<GgufError>(s, "missing tensor 'blk.1.ffn_up.weight'");
  s = tiny_llama_spec(TinyLlama());
  s.erase_tensor("output_norm.weight");
  ExpectLoadFails<GgufError>(s, "missing tensor 'output_norm.weight'");
}

TEST_F(ModelLoadTest, RefusesWrongShape) {
  Spec s = tiny_llama_spec(TinyLlama());
  s.tensor("blk.0.attn_k.weight").dims = {32, 32};
  s.tensor("blk.0.attn_k.weight").data.resize(32 * 32 * 4);
  ExpectLoadFails<std::invalid_argument>(s, "tensor 'blk.0.attn_k.weight' has shape [32, 32], expected [32, 16]");
  s = tiny_llama_spec(TinyLlama());
  s.tensor("blk.1.attn_norm.weight").dims = {16};
  s.tensor("blk.1.attn_norm.weight").data.resize(16 * 4);
  ExpectLoadFails<std::invalid_argument>(s, "tensor 'blk.1.attn_norm.weight' must be F32 with 32 elements");
  s = tiny_llama_spec(TinyLlama());
  s.tensor("blk.1.attn_norm.weight").type = kTF16;
  s.tensor("blk.1.attn_norm.weight").data.resize(32 * 2);
  ExpectLoadFails<std::invalid_argument>(s, "tensor 'blk.1.attn_norm.weight' must be F32 with 32 elements");
}

TEST_F(ModelLoadTest, RefusesUnsupportedTensorType) {
  TinyLlama c;
  c.n_ff = 256;  // Q3_K rows hold 256 elements
  Spec s = tiny_llama_spec(c);
  Tensor& t = s.tensor("blk.0.ffn_down.weight");
  t.type = kTQ3_K;
  t.data.clear();  // the writer sizes it: 32 rows x 1 block x 110 bytes
  ExpectLoadFails<std::invalid_argument>(
      s,
      "tensor 'blk.0.ffn_down.weight' has type Q3_K, which ctxbank does not support (supported: F32, F16, BF16, "
      "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
}

// ---------------------------------------------------------------------------------------------
// The quant types Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: valid files load; malformed ones are refused
// with a message that names the problem.

const uint32_t kNewQuantTypes[] = {kTQ5_0, kTQ5_1, kTQ4_K, kTQ5_K, kTQ6_K};

TEST_F(ModelLoadTest, LoadsEveryNewQuantType) {
  for (uint32_t type : kNewQuantTypes) {
    SCOPED_TRACE(type);
    const auto m = ctx::Model::load(dir.write("q.gguf", build(quantized_tiny_llama_spec(kTinyWide, type)).bytes));
    const auto& w = m->layers()[1].w_down;
    EXPECT_EQ(static_cast<uint32_t>(w.type), type);
    EXPECT_EQ(w.row_bytes, tensor_bytes(type, 512));  // one row of 512 columns, the writer's own size table
    ASSERT_NE(w.packed, nullptr);
    EXPECT_EQ(w.group_bytes, ctx::packed_group_bytes(w.type, 512));
    // The tied output is the packed embedding.
    EXPECT_TRUE(m->config().tied_output);
    EXPECT_EQ(m->output().packed, m->token_embd().packed);
    EXPECT_NE(m->token_embd().packed, nullptr);
  }
}

TEST_F(GgufTest, RefusesNewQuantTypesWithRowsThatAreNotWholeBlocks) {
  auto with = [](Tensor t) {
    Spec s = small_spec();
    s.tensors.push_back(std::move(t));
    return s;
  };
  EXPECT_TRUE(Rejects(dir, with({"z", {48, 2}, kTQ5_0, "", {}, false}), "'z' row of 48 is not a multiple of the Q5_0 block size"));
  EXPECT_TRUE(Rejects(dir, with({"z", {80, 2}, kTQ5_1, "", {}, false}), "'z' row of 80 is not a multiple of the Q5_1 block size"));
  // Multiples of 32 that are not whole super-blocks.
  EXPECT_TRUE(Rejects(dir, with({"z", {288, 2}, kTQ4_K, "", {}, false}), "'z' row of 288 is not a multiple of the Q4_K block size"));
  EXPECT_TRUE(Rejects(dir, with({"z", {32, 8}, kTQ5_K, "", {}, false}), "'z' row of 32 is not a multiple of the Q5_K block size"));
  EXPECT_TRUE(Rejects(dir, with({"z", {640, 1}, kTQ6_K, "", {}, false}), "'z' row of 640 is not a multiple of the Q6_K block size"));
}

TEST_F(GgufTest, RefusesUnknownTypeNumbers) {
  // Numbers ggml retired (Q4_2, Q4_3, the Q4_0 repackings 31..33 and 36..38) or never defined.
  for (uint32_t type : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 255u, 1u << 31, 0xFFFFFFFFu}) {
    SCOPED_TRACE(type);
    Spec s = small_spec();
    s.tensors.push_back({"z", {256}, type, "", {}, false});
    EXPECT_TRUE(Rejects(dir, s, "'z' has unknown ggml type " + std::to_string(type)));
  }
}

// A tensor whose bytes are sized for another type: the next tensor's data overlaps it, or, last
// in the file, it runs past the end.
TEST_F(GgufTest, RefusesNewQuantTensorsOfTheWrongByteSize) {
  const std::pair<uint32_t, uint32_t> written_as[] = {
      {kTQ5_0, kTQ4_0}, {kTQ5_1, kTQ5_0}, {kTQ4_K, kTQ3_K}, {kTQ5_K, kTQ4_K}, {kTQ6_K, kTQ5_K}};
  for (const auto& [type, smaller] : written_as) {
    SCOPED_TRACE(type);
    const std::string short_data = pattern(tensor_bytes(smaller, 512), 5);
    Spec last = small_spec();
    last.tensors.push_back({"z", {256, 2}, type, short_data, {}, true});
    EXPECT_TRUE(Rejects(dir, last, "'z' extends past the end of the file"));
    Spec middle = small_spec();
    middle.tensors.insert(middle.tensors.begin(), {"z", {256, 2}, type, short_data, {}, true});
    middle.tensors.push_back({"tail", {256}, kTF32, pattern(1024, 6), {}, true});  // the file goes on past z's true end
    EXPECT_TRUE(Rejects(dir, middle, "overlap"));
  }
}

// Every strict prefix of a file holding each new type is refused.
TEST_F(GgufTest, EveryTruncationOfNewQuantTensorsIsRefused) {
  Spec s = small_spec();
  for (uint32_t type : kNewQuantTypes)
    s.tensors.push_back({"t" + std::to_string(type), {256, 2}, type, pattern(tensor_bytes(type, 512), static_cast<int>(type)), {}, true});
  const std::string full = build(s).bytes;
  ASSERT_NO_THROW(GgufFile::open(dir.write("full.gguf", full)));
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string path = dir.write("cut.gguf", full.substr(0, n));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const GgufError& e) {
      EXPECT_TRUE(std::regex_search(e.what(), std::regex("truncated|too small to be a GGUF file|past the end")))
          << "prefix " << n << ": " << e.what();
    }
  }
}

// Every bit pattern of a block is a valid weight except an Inf or NaN scale: refused at load,
// naming the tensor, its type, the block and the row.
TEST_F(ModelLoadTest, RefusesNonFiniteBlockScales) {
  struct Case {
    uint32_t type;
    size_t block_elems, field;  // the f16 field's byte offset in its block
    uint16_t bits;
  };
  const Case cases[] = {
      {kTQ5_0, 32, 0, 0x7C00},     // d = +Inf
      {kTQ5_1, 32, 2, 0x7E00},     // m = NaN
      {kTQ4_K, 256, 0, 0xFC00},    // d = -Inf
      {kTQ5_K, 256, 2, 0x7C01},    // dmin = NaN
      {kTQ6_K, 256, 208, 0x7C00},  // d, the last field of a Q6_K block
      {kTQ4_0, 32, 0, 0x7C00},     // the older types are checked the same way
      {kTQ8_0, 32, 0, 0x7FFF},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.type);
    Spec s = quantized_tiny_llama_spec(kTinyWide, c.type);
    Tensor& t = s.tensor("blk.1.ffn_up.weight");  // 512 rows of 256 columns
    const size_t row_bytes = tensor_bytes(c.type, 256), block_bytes = tensor_bytes(c.type, c.block_elems);
    const size_t row = 300, block = 256 / c.block_elems - 1;
    std::memcpy(&t.data[row * row_bytes + block * block_bytes + c.field], &c.bits, 2);
    ExpectLoadFails<GgufError>(s, "tensor 'blk.1.ffn_up.weight' (" + std::string(ctx::ggml_type_name(c.type)) +
                                      ") has a non-finite scale in block " + std::to_string(block) + " of row " + std::to_string(row));
  }
}

// Random byte corruption anywhere in a file of new-type tensors: either it loads (a changed quant
// is a valid quant) or it is refused with GgufError / std::invalid_argument -- never a crash, a
// hang or another exception.
TEST_F(ModelLoadTest, RandomCorruptionLoadsOrIsRefused) {
  std::mt19937 rng(77);
  int loaded = 0, refused = 0;
  for (uint32_t type : kNewQuantTypes) {
    const std::string good = build(quantized_tiny_llama_spec(kTinyWide, type)).bytes;
    for (int trial = 0; trial < 60; ++trial) {
      std::string bad = good;
      // Mostly the header (where a flip changes meaning), some in the data.
      const size_t span = trial % 3 == 0 ? bad.size() : std::min<size_t>(bad.size(), 2048);
      for (int flips = 1 + trial % 4; flips > 0; --flips)
        bad[std::uniform_int_distribution<size_t>(0, span - 1)(rng)] ^= static_cast<char>(1 + rng() % 255);
      try {
        ctx::Model::load(dir.write("fuzz.gguf", bad));
        ++loaded;
      } catch (const GgufError& e) {
        ++refused;
        EXPECT_GT(std::strlen(e.what()), 10u);
      } catch (const std::invalid_argument& e) {
        ++refused;
        EXPECT_GT(std::strlen(e.what()), 10u);
      }
    }
  }
  // Both outcomes occur, so the loop exercised the loader's refusals as well as its success path.
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
