// KvPool: memory a sequence gives back comes to the next one zeroed (no sequence sees another's
// KV) and already resident; it is trimmed or grown to fit; the pool keeps at most its limit and
// nothing when off; released sequences read zeros, as before the pool.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kv_cache.h"
#include "kv_pool.h"

namespace {

using ctx::KvCache;
using ctx::KvPool;

constexpr size_t MiB = size_t{1} << 20;

size_t resident_bytes(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t n = (bytes + page - 1) / page;
  std::vector<unsigned char> in(n);
  if (mincore(const_cast<void*>(p), n * page, in.data()) != 0) return 0;
  size_t count = 0;
  for (unsigned char c : in) count += c & 1;
  return count * page;
}

bool all_zero(const KvCache& kv) {
  const auto* p = reinterpret_cast<const uint8_t*>(kv.k(0));
  for (size_t i = 0; i < kv.bytes_reserved(); ++i)
    if (p[i] != 0) return false;
  return true;
}

// A fresh pool with this limit (tests may share a process).
void reset_pool(size_t limit) {
  KvPool::instance().settle();
  KvPool::instance().set_limit(0);
  KvPool::instance().set_limit(limit);
}

TEST(KvPool, AReleasedCachesPagesComeToTheNextOneZeroedAndResident) {
  reset_pool(256 * MiB);
  KvCache a(30, 192, 2048);                       // 45 MiB
  std::memset(a.k(0), 0xab, a.bytes_reserved());  // every byte, rows past its size included
  a.set_size(1000);
  a.release();
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(resident_bytes(a.k(0), a.bytes_reserved()), 0u);  // the pages went to the pool
  EXPECT_TRUE(all_zero(a));                                   // and the range reads zeros
  KvPool::instance().settle();
  const KvPool::Stats before = KvPool::instance().stats();
  EXPECT_EQ(before.ready_regions, 1u);
  EXPECT_GE(before.ready_resident_bytes, a.bytes_reserved() - 2 * MiB);

  KvCache b(30, 192, 2048);
  EXPECT_EQ(KvPool::instance().stats().takes, before.takes + 1);
  EXPECT_GE(resident_bytes(b.k(0), b.bytes_reserved()), b.bytes_reserved() - 2 * MiB);
  EXPECT_TRUE(all_zero(b));
}

TEST(KvPool, ADestroyedCacheIsPooledAndFitsSmallerAndLargerCaches) {
  reset_pool(256 * MiB);
  {
    KvCache a(30, 192, 2048);
    std::memset(a.k(0), 0x5c, a.bytes_reserved());
  }
  KvPool::instance().settle();
  ASSERT_EQ(KvPool::instance().stats().ready_regions, 1u);
  {
    KvCache small(30, 192, 1000);  // a prefix of the region; the rest goes back to the OS
    EXPECT_TRUE(all_zero(small));
    EXPECT_GE(resident_bytes(small.k(0), small.bytes_reserved()), small.bytes_reserved() - 2 * MiB);
    std::memset(small.k(0), 0x77, small.bytes_reserved());
  }
  KvPool::instance().settle();
  KvCache big(30, 192, 4096);  // grown: the old pages, then fresh ones
  EXPECT_EQ(KvPool::instance().stats().ready_regions, 0u);
  EXPECT_TRUE(all_zero(big));
  big.v(29, 4095)[191] = 0x3c00;  // the grown tail is writable
  EXPECT_EQ(big.v(29, 4095)[191], 0x3c00);
}

bool huge_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % (2 * MiB) == 0; }

// Huge pages stay mapped whole only where KV memory starts on a 2 MiB boundary: a cache, the
// pooled region a release moves its pages to, and a region grown for a larger cache all do.
TEST(KvPool, KvMemoryStartsOnHugePageBoundariesThroughThePool) {
  reset_pool(256 * MiB);
  KvCache a(30, 192, 2047);  // a size that is not a multiple of 2 MiB
  EXPECT_TRUE(huge_aligned(a.k(0)));
  std::memset(a.k(0), 0x11, a.bytes_reserved());
  a.release();
  KvPool::instance().settle();
  KvCache b(30, 192, 2047);  // the pooled pages
  EXPECT_EQ(KvPool::instance().stats().ready_regions, 0u);
  EXPECT_TRUE(huge_aligned(b.k(0)));
  std::memset(b.k(0), 0x22, b.bytes_reserved());
  b.release();
  KvPool::instance().settle();
  KvCache c(30, 192, 3000);  // grown from them
  EXPECT_EQ(KvPool::instance().stats().ready_regions, 0u);
  EXPECT_TRUE(huge_aligned(c.k(0)));
  EXPECT_TRUE(all_zero(c));

  void* r = ctx::reserve_huge_aligned(3 * MiB + 4096);
  ASSERT_NE(r, MAP_FAILED);
  EXPECT_TRUE(huge_aligned(r));
  munmap(r, 3 * MiB + 4096);
}

TEST(KvPool, KeepsAtMostItsLimitAndNothingWhenOff) {
  reset_pool(64 * MiB);
  for (int i = 0; i < 3; ++i) {
    KvCache a(30, 192, 2048);  // 45 MiB each: one fits
    std::memset(a.k(0), 1, a.bytes_reserved());
  }
  KvPool::instance().settle();
  KvPool::Stats s = KvPool::instance().stats();
  EXPECT_EQ(s.ready_regions, 1u);
  EXPECT_LE(s.ready_resident_bytes, 64 * MiB);

  KvPool::instance().set_limit(0);  // off: what it held goes, and nothing new comes in
  EXPECT_EQ(KvPool::instance().stats().ready_regions, 0u);
  {
    KvCache a(30, 192, 2048);
    std::memset(a.k(0), 1, a.bytes_reserved());
    a.release();
    EXPECT_TRUE(all_zero(a));
  }
  KvPool::instance().settle();
  s = KvPool::instance().stats();
  EXPECT_EQ(s.ready_regions, 0u);
  const size_t misses = s.misses;
  KvCache b(30, 192, 2048);
  EXPECT_EQ(KvPool::instance().stats().misses, misses + 1);
  EXPECT_TRUE(all_zero(b));
}

TEST(KvPool, MappingsHoldingLittleAreNotKept) {
  reset_pool(256 * MiB);
  { KvCache untouched(30, 192, 8192); }  // 180 MiB reserved, nothing written
  KvPool::instance().settle();
  EXPECT_EQ(KvPool::instance().stats().ready_regions, 0u);
}

}  // namespace
