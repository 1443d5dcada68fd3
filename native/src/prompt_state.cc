#include "prompt_state.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ctx {
namespace {

constexpr uint32_t kMagic = 0x53505843;  // "CXPS"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxKeep = 1u << 16;  // far above any window a policy accepts

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  const size_t at = out.size();
  out.resize(at + 4);
  std::memcpy(out.data() + at, &v, 4);
}

// Reads the blob front to back; every read is bounds-checked.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  uint32_t u32(const char* what) {
    uint32_t v;
    take(&v, 4, what);
    return v;
  }
  void take(void* into, size_t n, const char* what) {
    if (n > left_) throw std::invalid_argument(std::string("prompt state: truncated at ") + what);
    std::memcpy(into, p_, n);
    p_ += n;
    left_ -= n;
  }
  size_t left() const { return left_; }

 private:
  const uint8_t* p_;
  size_t left_;
};

PromptQueries::Windows windows_of(DecodePolicy& policy, const ModelConfig& c) {
  auto* keeper = dynamic_cast<PromptQueries*>(&policy);
  return keeper ? keeper->prompt_windows(c) : PromptQueries::Windows{};
}

}  // namespace

std::vector<uint8_t> export_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens) {
  const PromptQueries::Windows w = windows_of(policy, c);
  if (w.windows.empty()) return {};
  std::vector<uint8_t> out;
  for (uint32_t v : {kMagic, kVersion, static_cast<uint32_t>(c.n_embd), static_cast<uint32_t>(n_tokens),
                     static_cast<uint32_t>(w.keep), static_cast<uint32_t>(w.windows.size())})
    put_u32(out, v);
  for (size_t i = 0; i < w.windows.size(); ++i) {
    const QueryWindow& q = *w.windows[i];
    put_u32(out, static_cast<uint32_t>(w.layers[i]));
    put_u32(out, static_cast<uint32_t>(q.q.size()));
    const size_t at = out.size();
    out.resize(at + q.pos.size() * 4 + q.q.size() * c.n_embd * sizeof(float));
    uint8_t* dst = out.data() + at;
    std::memcpy(dst, q.pos.data(), q.pos.size() * 4);
    dst += q.pos.size() * 4;
    for (const std::vector<float>& row : q.q) {
      std::memcpy(dst, row.data(), row.size() * sizeof(float));
      dst += row.size() * sizeof(float);
    }
  }
  return out;
}

bool import_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens, const uint8_t* data, size_t size) {
  Reader r(data, size);
  if (r.u32("magic") != kMagic) throw std::invalid_argument("prompt state: not a prompt state (bad magic)");
  const uint32_t version = r.u32("version");
  if (version != kVersion) throw std::invalid_argument("prompt state: version " + std::to_string(version) + " (this engine reads " + std::to_string(kVersion) + ")");
  if (r.u32("n_embd") != static_cast<uint32_t>(c.n_embd)) throw std::invalid_argument("prompt state: made for another model (n_embd)");
  if (r.u32("n_tokens") != static_cast<uint32_t>(n_tokens))
    throw std::invalid_argument("prompt state: made for a prompt of another length than the sequence's " + std::to_string(n_tokens) + " tokens");
  const uint32_t keep = r.u32("keep"), n_windows = r.u32("n_windows");
  if (keep == 0 || keep > kMaxKeep) throw std::invalid_argument("prompt state: window size out of range");
  if (n_windows == 0 || n_windows > static_cast<uint32_t>(c.n_layer)) throw std::invalid_argument("prompt state: window count out of range");
  // Parse and check everything before touching the policy.
  std::vector<int> layers(n_windows);
  std::vector<QueryWindow> parsed(n_windows);
  const size_t row_bytes = static_cast<size_t>(c.n_embd) * sizeof(float);
  for (uint32_t i = 0; i < n_windows; ++i) {
    const uint32_t layer = r.u32("layer"), count = r.u32("count");
    if (layer >= static_cast<uint32_t>(c.n_layer) || (i > 0 && static_cast<int>(layer) <= layers[i - 1]))
      throw std::invalid_argument("prompt state: layers must be ascending and below the model's layer count");
    if (count > keep) throw std::invalid_argument("prompt state: a window holds more queries than its size");
    if (static_cast<size_t>(count) * (4 + row_bytes) > r.left()) throw std::invalid_argument("prompt state: truncated window");
    layers[i] = static_cast<int>(layer);
    QueryWindow& w = parsed[i];
    w.pos.resize(count);
    r.take(w.pos.data(), count * 4, "positions");
    for (uint32_t j = 0; j < count; ++j)
      if (w.pos[j] < 0 || w.pos[j] >= n_tokens || (j > 0 && w.pos[j] <= w.pos[j - 1]))
        throw std::invalid_argument("prompt state: positions must be ascending prompt positions");
    w.q.assign(count, std::vector<float>(c.n_embd));
    for (std::vector<float>& row : w.q) {
      r.take(row.data(), row_bytes, "queries");
      for (float x : row)
        if (!std::isfinite(x)) throw std::invalid_argument("prompt state: a query holds a non-finite value");
    }
  }
  if (r.left() != 0) throw std::invalid_argument("prompt state: trailing bytes");
  const PromptQueries::Windows mine = windows_of(policy, c);
  if (mine.layers != layers || static_cast<uint32_t>(mine.keep) != keep) return false;
  for (uint32_t i = 0; i < n_windows; ++i) *mine.windows[i] = std::move(parsed[i]);
  return true;
}

}  // namespace ctx
