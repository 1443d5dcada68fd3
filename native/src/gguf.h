// GGUF reader over a read-only memory map. Every length, count, offset and type is checked
// against the file before use; a malformed file throws GgufError with a message naming the
// field, never reads out of bounds.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx {

class GgufError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GgufValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  // Scalars: integers in i or u (by signedness), floats in f, bools in u.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string str;
  GgufValueType elem_type = GgufValueType::U8;  // arrays only
  std::vector<GgufValue> arr;

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::F32 || type == GgufValueType::F64; }
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the innermost, contiguous dimension
  uint32_t type = 0;              // ggml type number
  uint64_t offset = 0;            // from the start of the tensor data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the map

  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  // Maps and parses the file; throws GgufError on any problem.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint32_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // Bytes from the start of the file to the end of the tensor-info section: the part that
  // describes the model. Hashed for the model fingerprint.
  uint64_t header_bytes() const { return header_bytes_; }
  // Offset of the tensor data section (the header rounded up to the alignment).
  uint64_t data_start() const { return data_start_; }
  // CRC-32C of every byte from data_start() to the end of the file: all the weights. Reads the
  // whole file (at memory speed, but still the whole file), so it is computed once at load, not per call site.
  uint32_t tensor_data_crc32c() const;
  const uint8_t* bytes() const { return base_; }
  // Unmaps the file's pages from this process (madvise DONTNEED; the mapping stays valid and a
  // later read faults the page back in from the page cache). Once the model has repacked its
  // weights it reads only the embedding rows and the norms from the file, so without this the
  // file stayed resident beside the packed copy: the weights counted twice.
  void drop_resident_pages() const;

  // Typed metadata access; the *_or variants return the fallback when the key is absent but
  // still throw when it is present with the wrong type.
  const GgufValue* find(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  std::optional<uint64_t> get_uint_opt(const std::string& key) const;
  double get_float_or(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key) const;
  std::optional<std::string> get_string_opt(const std::string& key) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t header_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

const char* gguf_value_type_name(GgufValueType t);

}  // namespace ctx
