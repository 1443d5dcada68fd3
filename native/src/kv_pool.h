// A process-wide pool of KV cache memory, so that a new sequence need not fault in and have the
// kernel zero every page its KV lands on. Loading 8K tokens of KV (180 MiB) into a new sequence
// took ~71 ms here against ~53 ms into a sequence whose pages were already there
// (bench/handoff/shm-load.ts): the difference is page faults and the kernel zeroing huge pages on
// the request's critical path. A released or destroyed sequence gives its mapping to the pool; a
// background thread zeroes its resident pages (so no sequence ever sees another's KV, and reads
// past a sequence's rows see zeros, as with fresh memory) and offers it to the next sequence,
// trimmed or grown to its size. The pool holds at most limit() resident bytes; 0 turns it off.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

namespace ctx {

// Address space for `bytes` bytes starting on a 2 MiB boundary (inaccessible until a mapping is
// moved or placed over it); MAP_FAILED when there is none. KV memory lives at such addresses so
// that its transparent huge pages stay mapped whole when the pool moves it: mremap to an address
// that is not 2 MiB aligned splits every huge page into 4 KiB entries for good.
void* reserve_huge_aligned(size_t bytes);

// mremap(p, old_bytes, new_bytes) to a fresh 2 MiB-aligned address (`flags` adds e.g.
// MREMAP_DONTUNMAP); MAP_FAILED with errno on failure, when p is left as it was.
void* move_huge_aligned(void* p, size_t old_bytes, size_t new_bytes, int flags);

class KvPool {
 public:
  // The process's pool (never destroyed: its thread may still be zeroing at exit).
  static KvPool& instance();

  // At most `bytes` resident bytes pooled (default kDefaultLimit); 0 turns the pool off. Pooled
  // memory above it is returned to the OS.
  void set_limit(size_t bytes);
  size_t limit();

  // A private anonymous mapping of exactly `bytes` bytes, all zero, with as many pages already
  // resident as the pool had; null when the pool has nothing ready.
  void* take(size_t bytes);
  // Takes ownership of the mapping [p, p + bytes) (private, anonymous): zeroed in the background,
  // then offered to take(), or unmapped when it holds little or the pool is full or off.
  void give(void* p, size_t bytes);
  // Waits until every mapping given so far is zeroed and pooled or unmapped (tests).
  void settle();

  struct Stats {
    size_t limit = 0;
    size_t ready_regions = 0;
    size_t ready_resident_bytes = 0;
    size_t takes = 0;   // take() calls that returned pooled memory
    size_t misses = 0;  // take() calls that found nothing ready
  };
  Stats stats();

  static constexpr size_t kDefaultLimit = size_t{1} << 30;

 private:
  KvPool() = default;
  struct Region {
    void* p;
    size_t bytes;
    size_t resident;
  };
  void run();
  std::vector<Region> trim_to(size_t limit);  // mutex held

  std::mutex mutex_;
  std::condition_variable wake_, settled_;
  std::deque<Region> dirty_;   // given, not yet zeroed
  std::vector<Region> ready_;  // zeroed, oldest first
  size_t ready_resident_ = 0;
  size_t limit_ = kDefaultLimit;
  size_t zeroing_ = 0;  // regions the thread holds right now
  bool thread_started_ = false;
  Stats stats_;
};

}  // namespace ctx
