#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "crc32c.h"
#include "ggml_types.h"

namespace ctx {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint64_t kMaxTensorName = 64;  // GGML_MAX_NAME
constexpr int kMaxArrayDepth = 4;
// Parsed metadata costs ~100 bytes per array element, so a small crafted file could claim
// gigabytes; real vocabularies and merge lists stay far below this.
constexpr uint64_t kMaxMetadataElements = 1ull << 23;

// Bounds-checked little-endian cursor over the mapped bytes.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      throw GgufError("gguf: file is truncated while reading " + what + " at byte " + std::to_string(pos_) + " (needs " +
                      std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left)");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    if (len > kMaxStringBytes) throw GgufError("gguf: " + what + " claims " + std::to_string(len) + " bytes, over the 1 GiB limit");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  void skip(uint64_t n, const std::string& what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::U16:
    case GgufValueType::I16:
      return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32:
      return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64:
      return 8;
    default:
      return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::F64); }

GgufValue read_value(Cursor& c, GgufValueType type, const std::string& key, int depth, uint64_t& elements) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::U8:
      v.u = c.read<uint8_t>(key);
      break;
    case GgufValueType::I8:
      v.i = c.read<int8_t>(key);
      break;
    case GgufValueType::U16:
      v.u = c.read<uint16_t>(key);
      break;
    case GgufValueType::I16:
      v.i = c.read<int16_t>(key);
      break;
    case GgufValueType::U32:
      v.u = c.read<uint32_t>(key);
      break;
    case GgufValueType::I32:
      v.i = c.read<int32_t>(key);
      break;
    case GgufValueType::U64:
      v.u = c.read<uint64_t>(key);
      break;
    case GgufValueType::I64:
      v.i = c.read<int64_t>(key);
      break;
    case GgufValueType::F32:
      v.f = c.read<float>(key);
      break;
    case GgufValueType::F64:
      v.f = c.read<double>(key);
      break;
    case GgufValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>(key);
      if (b > 1) throw GgufError("gguf: metadata '" + key + "' has a bool byte of " + std::to_string(b));
      v.u = b;
      break;
    }
    case GgufValueType::STRING:
      v.str = c.read_string("metadata '" + key + "'");
      break;
    case GgufValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) throw GgufError("gguf: metadata '" + key + "' nests arrays too deeply");
      const uint32_t et = c.read<uint32_t>(key + " array type");
      if (!known_value_type(et)) throw GgufError("gguf: metadata '" + key + "' is an array of unknown type " + std::to_string(et));
      v.elem_type = static_cast<GgufValueType>(et);
      const uint64_t n = c.read<uint64_t>(key + " array length");
      // Every element needs at least one byte (strings 8), so a count larger than the bytes left
      // is corrupt; checking first avoids reserving memory for a lie.
      const uint64_t min_elem = v.elem_type == GgufValueType::STRING  ? 8
                                : v.elem_type == GgufValueType::ARRAY ? 12
                                                                      : scalar_size(v.elem_type);
      if (n > c.remaining() / min_elem)
        throw GgufError("gguf: metadata '" + key + "' claims " + std::to_string(n) +
                        " elements, more than the file holds (truncated or corrupt)");
      elements += n;
      if (elements > kMaxMetadataElements)
        throw GgufError("gguf: metadata arrays hold more than " + std::to_string(kMaxMetadataElements) + " elements in all");
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, v.elem_type, key, depth + 1, elements));
      break;
    }
  }
  return v;
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::U16:
    case GgufValueType::I16:
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::U64:
    case GgufValueType::I64:
      return true;
    default:
      return false;
  }
}

const char* gguf_value_type_name(GgufValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw GgufError("gguf: cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GgufError("gguf: '" + path + "' is not a regular file");
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 24) {
    ::close(fd);
    throw GgufError("gguf: '" + path + "' is too small to be a GGUF file (" + std::to_string(f->size_) + " bytes)");
  }
  void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw GgufError("gguf: cannot map '" + path + "': " + std::strerror(errno));
  f->base_ = static_cast<const uint8_t*>(p);
  f->parse();  // on throw, the destructor unmaps
  return f;
}

void GgufFile::drop_resident_pages() const {
  // The mapping is private and read-only, never written: dropping its pages loses nothing. Best
  // effort: if the kernel refuses, the pages just stay resident as before.
  if (base_) (void)madvise(const_cast<uint8_t*>(base_), size_, MADV_DONTNEED);
}

GgufFile::~GgufFile() {
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
}

void GgufFile::parse() {
  Cursor c(base_, size_);
  if (c.read<uint32_t>("magic") != kMagic) throw GgufError("gguf: '" + path_ + "' is not a GGUF file (bad magic)");
  version_ = c.read<uint32_t>("version");
  if (version_ < 2 || version_ > 3) throw GgufError("gguf: unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A KV needs >= 8+1+4+1 bytes and a tensor info >= 8+4+8+4+8 bytes.
  if (n_kv > c.remaining() / 14)
    throw GgufError("gguf: metadata count " + std::to_string(n_kv) + " exceeds the file (truncated or corrupt)");
  if (n_tensors > c.remaining() / 32)
    throw GgufError("gguf: tensor count " + std::to_string(n_tensors) + " exceeds the file (truncated or corrupt)");

  uint64_t elements = 0;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key #" + std::to_string(k));
    if (key.empty()) throw GgufError("gguf: metadata key #" + std::to_string(k) + " is empty");
    const uint32_t t = c.read<uint32_t>("type of '" + key + "'");
    if (!known_value_type(t)) throw GgufError("gguf: metadata '" + key + "' has unknown value type " + std::to_string(t));
    GgufValue v = read_value(c, static_cast<GgufValueType>(t), key, 0, elements);
    if (!kv_.emplace(key, std::move(v)).second) throw GgufError("gguf: duplicate metadata key '" + key + "'");
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || a->u > (1u << 16) || (a->u & (a->u - 1)) != 0 || a->u % 8 != 0)
      throw GgufError("gguf: general.alignment must be a power of two and a multiple of 8");
    alignment_ = static_cast<uint32_t>(a->u);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = c.read_string("tensor name #" + std::to_string(k));
    if (t.name.empty() || t.name.size() >= kMaxTensorName)
      throw GgufError("gguf: tensor #" + std::to_string(k) + " has an empty or over-long name");
    t.n_dims = c.read<uint32_t>("dims of " + t.name);
    if (t.n_dims < 1 || t.n_dims > 4)
      throw GgufError("gguf: tensor '" + t.name + "' has " + std::to_string(t.n_dims) + " dimensions (1-4 allowed)");
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = c.read<uint64_t>("shape of " + t.name);
      if (t.ne[d] == 0 || t.ne[d] > (1ull << 40) || n > (1ull << 62) / t.ne[d])
        throw GgufError("gguf: tensor '" + t.name + "' has an invalid shape");
      n *= t.ne[d];
    }
    t.type = c.read<uint32_t>("type of " + t.name);
    const GgmlTypeTraits* tr = ggml_type_traits(t.type);
    if (!tr) throw GgufError("gguf: tensor '" + t.name + "' has unknown ggml type " + std::to_string(t.type));
    if (t.ne[0] % tr->block_size != 0)
      throw GgufError("gguf: tensor '" + t.name + "' row of " + std::to_string(t.ne[0]) + " is not a multiple of the " + tr->name +
                      " block size");
    // n <= 2^62, but at up to 8 bytes per element the byte count could still wrap to a small
    // number that "fits" in the file.
    if (n / tr->block_size > UINT64_MAX / tr->type_size)
      throw GgufError("gguf: tensor '" + t.name + "' has an invalid shape (too many bytes)");
    t.n_bytes = n / tr->block_size * tr->type_size;
    t.offset = c.read<uint64_t>("offset of " + t.name);
    if (t.offset % alignment_ != 0) throw GgufError("gguf: tensor '" + t.name + "' offset is not aligned to " + std::to_string(alignment_));
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) throw GgufError("gguf: duplicate tensor name '" + t.name + "'");
    tensors_.push_back(std::move(t));
  }
  header_bytes_ = c.pos();

  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_ && n_tensors > 0) throw GgufError("gguf: file is truncated before the tensor data");
  data_start_ = std::min(data_start, size_);
  // Tensors must lie inside the file and must not overlap each other.
  std::vector<const GgufTensorInfo*> by_offset;
  for (auto& t : tensors_) {
    if (t.offset > size_ - data_start || t.n_bytes > size_ - data_start - t.offset)
      throw GgufError("gguf: tensor '" + t.name + "' extends past the end of the file (truncated?)");
    t.data = base_ + data_start + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k)
    if (by_offset[k - 1]->offset + by_offset[k - 1]->n_bytes > by_offset[k]->offset)
      throw GgufError("gguf: tensors '" + by_offset[k - 1]->name + "' and '" + by_offset[k]->name + "' overlap");
}

uint32_t GgufFile::tensor_data_crc32c() const { return crc32c(0, base_ + data_start_, static_cast<size_t>(size_ - data_start_)); }

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<uint64_t> GgufFile::get_uint_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) throw GgufError("gguf: metadata '" + key + "' must be an integer, is " + gguf_value_type_name(v->type));
  const bool is_signed =
      v->type == GgufValueType::I8 || v->type == GgufValueType::I16 || v->type == GgufValueType::I32 || v->type == GgufValueType::I64;
  if (is_signed && v->i < 0) throw GgufError("gguf: metadata '" + key + "' must not be negative");
  return is_signed ? static_cast<uint64_t>(v->i) : v->u;
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  auto v = get_uint_opt(key);
  if (!v) throw GgufError("gguf: required metadata '" + key + "' is missing");
  return *v;
}

double GgufFile::get_float_or(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(get_uint(key));
  throw GgufError("gguf: metadata '" + key + "' must be a number, is " + gguf_value_type_name(v->type));
}

std::optional<std::string> GgufFile::get_string_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::STRING)
    throw GgufError("gguf: metadata '" + key + "' must be a string, is " + gguf_value_type_name(v->type));
  return v->str;
}

std::string GgufFile::get_string(const std::string& key) const {
  auto v = get_string_opt(key);
  if (!v) throw GgufError("gguf: required metadata '" + key + "' is missing");
  return *v;
}

}  // namespace ctx
