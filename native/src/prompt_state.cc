#include "prompt_state.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ctx {
namespace {

constexpr uint32_t kMagic = 0x53505843;  // "CXPS"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kWindows = 1, kPools = 2;
constexpr uint32_t kMaxKeep = 1u << 16;  // far above any window or pool a policy accepts

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  const size_t at = out.size();
  out.resize(at + 4);
  std::memcpy(out.data() + at, &v, 4);
}

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, p, n);
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
    if (n) std::memcpy(into, p_, n);
    p_ += n;
    left_ -= n;
  }
  size_t left() const { return left_; }

 private:
  const uint8_t* p_;
  size_t left_;
};

PromptStateHolder* holder_of(DecodePolicy& policy) { return dynamic_cast<PromptStateHolder*>(&policy); }

// count positions, ascending, in [0, n_tokens).
std::vector<int32_t> read_positions(Reader& r, uint32_t count, int n_tokens) {
  if (static_cast<size_t>(count) * 4 > r.left()) throw std::invalid_argument("prompt state: truncated positions");
  std::vector<int32_t> pos(count);
  r.take(pos.data(), static_cast<size_t>(count) * 4, "positions");
  for (uint32_t j = 0; j < count; ++j)
    if (pos[j] < 0 || pos[j] >= n_tokens || (j > 0 && pos[j] <= pos[j - 1]))
      throw std::invalid_argument("prompt state: positions must be ascending prompt positions");
  return pos;
}

bool import_windows(Reader& r, PromptStateHolder* holder, const ModelConfig& c, int n_tokens) {
  const uint32_t keep = r.u32("keep"), n_windows = r.u32("n_windows");
  if (keep == 0 || keep > kMaxKeep) throw std::invalid_argument("prompt state: window size out of range");
  if (n_windows == 0 || n_windows > static_cast<uint32_t>(c.n_layer))
    throw std::invalid_argument("prompt state: window count out of range");
  std::vector<int> layers(n_windows);
  std::vector<QueryWindow> parsed(n_windows);
  const size_t row_bytes = static_cast<size_t>(c.q_dim()) * sizeof(float);
  for (uint32_t i = 0; i < n_windows; ++i) {
    const uint32_t layer = r.u32("layer"), count = r.u32("count");
    if (layer >= static_cast<uint32_t>(c.n_layer) || (i > 0 && static_cast<int>(layer) <= layers[i - 1]))
      throw std::invalid_argument("prompt state: layers must be ascending and below the model's layer count");
    if (count > keep) throw std::invalid_argument("prompt state: a window holds more queries than its size");
    if (static_cast<size_t>(count) * (4 + row_bytes) > r.left()) throw std::invalid_argument("prompt state: truncated window");
    layers[i] = static_cast<int>(layer);
    QueryWindow& w = parsed[i];
    const std::vector<int32_t> pos = read_positions(r, count, n_tokens);
    w.pos.assign(pos.begin(), pos.end());
    w.q.assign(count, std::vector<float>(c.q_dim()));
    for (std::vector<float>& row : w.q) {
      r.take(row.data(), row_bytes, "queries");
      for (float x : row)
        if (!std::isfinite(x)) throw std::invalid_argument("prompt state: a query holds a non-finite value");
    }
  }
  if (r.left() != 0) throw std::invalid_argument("prompt state: trailing bytes");
  if (!holder) return false;
  const PromptStateHolder::Windows mine = holder->prompt_windows(c);
  if (mine.layers != layers || static_cast<uint32_t>(mine.keep) != keep) return false;
  for (uint32_t i = 0; i < n_windows; ++i) *mine.windows[i] = std::move(parsed[i]);
  return true;
}

bool import_pools(Reader& r, PromptStateHolder* holder, const ModelConfig& c, int n_tokens) {
  const uint32_t alpha1 = r.u32("alpha1"), alpha2 = r.u32("alpha2"), n_lists = r.u32("n_lists");
  if (alpha2 == 0 || alpha1 > kMaxKeep || alpha2 > kMaxKeep) throw std::invalid_argument("prompt state: pool size out of range");
  if (n_lists != static_cast<uint32_t>(c.n_layer) * static_cast<uint32_t>(c.n_head_kv))
    throw std::invalid_argument("prompt state: one kept list per layer and KV head expected");
  std::vector<std::vector<int32_t>> lists(n_lists);
  for (std::vector<int32_t>& list : lists) {
    const uint32_t count = r.u32("count");
    if (count > alpha1 + alpha2) throw std::invalid_argument("prompt state: a kept list is longer than alpha1 + alpha2");
    list = read_positions(r, count, n_tokens);
  }
  if (r.left() != 0) throw std::invalid_argument("prompt state: trailing bytes");
  return holder && holder->take_prompt_pools(c, n_tokens, static_cast<int>(alpha1), static_cast<int>(alpha2), lists);
}

}  // namespace

void derive_prompt_state_eagerly(DecodePolicy& policy) {
  if (PromptStateHolder* holder = holder_of(policy)) holder->derive_eagerly();
}

std::vector<uint8_t> export_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens) {
  PromptStateHolder* holder = holder_of(policy);
  if (!holder) return {};
  std::vector<uint8_t> out;
  const PromptStateHolder::Pools pools = holder->prompt_pools(c, n_tokens);
  const PromptStateHolder::Windows w = pools.lists ? PromptStateHolder::Windows{} : holder->prompt_windows(c);
  if (!pools.lists && w.windows.empty()) return {};
  for (uint32_t v : {kMagic, kVersion, static_cast<uint32_t>(c.q_dim()), static_cast<uint32_t>(n_tokens), pools.lists ? kPools : kWindows})
    put_u32(out, v);
  if (pools.lists) {
    for (uint32_t v :
         {static_cast<uint32_t>(pools.alpha1), static_cast<uint32_t>(pools.alpha2), static_cast<uint32_t>(pools.lists->size())})
      put_u32(out, v);
    for (const std::vector<int32_t>& list : *pools.lists) {
      put_u32(out, static_cast<uint32_t>(list.size()));
      put_bytes(out, list.data(), list.size() * 4);
    }
    return out;
  }
  put_u32(out, static_cast<uint32_t>(w.keep));
  put_u32(out, static_cast<uint32_t>(w.windows.size()));
  for (size_t i = 0; i < w.windows.size(); ++i) {
    const QueryWindow& q = *w.windows[i];
    put_u32(out, static_cast<uint32_t>(w.layers[i]));
    put_u32(out, static_cast<uint32_t>(q.q.size()));
    put_bytes(out, q.pos.data(), q.pos.size() * 4);
    for (const std::vector<float>& row : q.q) put_bytes(out, row.data(), row.size() * sizeof(float));
  }
  return out;
}

bool import_prompt_state(DecodePolicy& policy, const ModelConfig& c, int n_tokens, const uint8_t* data, size_t size) {
  Reader r(data, size);
  if (r.u32("magic") != kMagic) throw std::invalid_argument("prompt state: not a prompt state (bad magic)");
  const uint32_t version = r.u32("version");
  if (version != kVersion)
    throw std::invalid_argument("prompt state: version " + std::to_string(version) + " (this engine reads " + std::to_string(kVersion) +
                                ")");
  if (r.u32("query width") != static_cast<uint32_t>(c.q_dim()))
    throw std::invalid_argument("prompt state: made for another model (query width)");
  if (r.u32("n_tokens") != static_cast<uint32_t>(n_tokens))
    throw std::invalid_argument("prompt state: made for a prompt of another length than the sequence's " + std::to_string(n_tokens) +
                                " tokens");
  // Everything is parsed and checked before the policy is touched.
  const uint32_t kind = r.u32("kind");
  if (kind == kWindows) return import_windows(r, holder_of(policy), c, n_tokens);
  if (kind == kPools) return import_pools(r, holder_of(policy), c, n_tokens);
  throw std::invalid_argument("prompt state: unknown kind " + std::to_string(kind));
}

}  // namespace ctx
