#include "kv_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

namespace ctx {

namespace {

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Mappings holding less than this are not worth a pool slot (a released sequence's emptied
// range, a GPU sequence's untouched host reservation): unmapped instead.
constexpr size_t kMinResident = size_t{2} << 20;

// Whether the page at p holds a non-zero byte. Written KV pages show one in their first words;
// pages only ever read map the kernel's zero page, which writing would turn into real memory.
bool page_dirty(const uint8_t* p, size_t page) {
  for (size_t i = 0; i < page; i += sizeof(uint64_t)) {
    uint64_t w;
    std::memcpy(&w, p + i, sizeof w);
    if (w != 0) return true;
  }
  return false;
}

// Zeroes the resident pages of [p, p + bytes) and returns how many bytes are resident. Pages
// that are not resident read as zeros already; touching them would only commit memory.
size_t zero_resident(void* p, size_t bytes) {
  const size_t page = page_size();
  const size_t pages = round_up(bytes, page) / page;
  std::vector<unsigned char> in_core(pages);
  auto* base = static_cast<uint8_t*>(p);
  if (mincore(p, pages * page, in_core.data()) != 0) {
    std::memset(p, 0, bytes);  // cannot tell: zero it all
    return bytes;
  }
  size_t resident = 0;
  for (size_t i = 0; i < pages; ++i) {
    if (!(in_core[i] & 1)) continue;
    const size_t n = std::min(page, bytes - i * page);
    if (page_dirty(base + i * page, n)) std::memset(base + i * page, 0, n);
    resident += n;
  }
  return resident;
}

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

void* reserve_huge_aligned(size_t bytes) {
  const size_t span = round_up(bytes, page_size()) + kHugePage;
  void* r = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return MAP_FAILED;
  auto* lo = static_cast<uint8_t*>(r);
  auto* start = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(lo), kHugePage));
  uint8_t* end = start + round_up(bytes, page_size());
  if (start > lo) munmap(lo, static_cast<size_t>(start - lo));
  if (lo + span > end) munmap(end, static_cast<size_t>(lo + span - end));
  return start;
}

void* move_huge_aligned(void* p, size_t old_bytes, size_t new_bytes, int flags) {
  void* to = reserve_huge_aligned(new_bytes);
  if (to == MAP_FAILED) return MAP_FAILED;
  void* moved = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED | flags, to);
  if (moved == MAP_FAILED) {
    const int err = errno;
    munmap(to, new_bytes);
    errno = err;
  }
  return moved;
}

KvPool& KvPool::instance() {
  static KvPool* pool = new KvPool();
  return *pool;
}

void KvPool::set_limit(size_t bytes) {
  std::vector<Region> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
    evicted = trim_to(bytes);
  }
  for (const Region& r : evicted) munmap(r.p, r.bytes);
}

size_t KvPool::limit() {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

void* KvPool::take(size_t bytes) {
  Region r{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ready_.empty()) {
      stats_.misses++;
      return nullptr;
    }
    // The smallest region that is long enough, else the longest one (grown below).
    size_t best = 0;
    for (size_t i = 1; i < ready_.size(); ++i) {
      const bool fits = ready_[i].bytes >= bytes, best_fits = ready_[best].bytes >= bytes;
      if (fits ? (!best_fits || ready_[i].bytes < ready_[best].bytes) : (!best_fits && ready_[i].bytes > ready_[best].bytes)) best = i;
    }
    r = ready_[best];
    ready_.erase(ready_.begin() + static_cast<std::ptrdiff_t>(best));
    ready_resident_ -= r.resident;
    stats_.takes++;
  }
  const size_t have = round_up(r.bytes, page_size()), want = round_up(bytes, page_size());
  if (have > want) {
    munmap(static_cast<uint8_t*>(r.p) + want, have - want);
  } else if (have < want) {
    // Moved with its pages to room for the new size; the new tail is fresh (zero) memory.
    void* q = move_huge_aligned(r.p, have, want, 0);
    if (q == MAP_FAILED) {
      munmap(r.p, have);
      return nullptr;
    }
    r.p = q;
  }
  return r.p;
}

void KvPool::give(void* p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (limit_ > 0) {
      dirty_.push_back({p, bytes, 0});
      if (!thread_started_) {
        std::thread([this] { run(); }).detach();
        thread_started_ = true;
      }
      wake_.notify_one();
      return;
    }
  }
  munmap(p, bytes);
}

void KvPool::settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  settled_.wait(lock, [&] { return dirty_.empty() && zeroing_ == 0; });
}

KvPool::Stats KvPool::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.limit = limit_;
  s.ready_regions = ready_.size();
  s.ready_resident_bytes = ready_resident_;
  return s;
}

// Oldest first, until the resident bytes pooled are within `limit`. Mutex held; the caller
// unmaps what comes back, outside it.
std::vector<KvPool::Region> KvPool::trim_to(size_t limit) {
  std::vector<Region> evicted;
  size_t n = 0;
  while (n < ready_.size() && ready_resident_ > limit) {
    ready_resident_ -= ready_[n].resident;
    evicted.push_back(ready_[n++]);
  }
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
  return evicted;
}

// The zeroing thread, at low priority: the engine's threads come first; a sequence that finds
// nothing ready maps fresh memory as it always did.
void KvPool::run() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  for (;;) {
    Region r{};
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return !dirty_.empty(); });
      r = dirty_.front();
      dirty_.pop_front();
      zeroing_++;
    }
    r.resident = zero_resident(r.p, r.bytes);
    std::vector<Region> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      zeroing_--;
      if (r.resident < kMinResident || r.resident > limit_) {
        evicted.push_back(r);
      } else {
        ready_.push_back(r);
        ready_resident_ += r.resident;
        evicted = trim_to(limit_);
      }
      if (dirty_.empty() && zeroing_ == 0) settled_.notify_all();
    }
    for (const Region& e : evicted) munmap(e.p, e.bytes);
  }
}

}  // namespace ctx
