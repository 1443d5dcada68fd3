// KvCache: the documented layout (layer-major, K then V, [token][kv_dim] rows), rings of rows, no overlap
// between rows, size bounds and byte accounting.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "kv_transfer.h"

namespace {

using ctx::KvCache;

TEST(KvCache, AddressesFollowTheDocumentedLayout) {
  const int L = 3, D = 24, C = 10;
  KvCache kv(L, D, C);
  EXPECT_EQ(kv.n_layer(), L);
  EXPECT_EQ(kv.kv_dim(), D);
  EXPECT_EQ(kv.capacity(), C);
  EXPECT_EQ(kv.row_elems(), static_cast<size_t>(D));
  const uint16_t* base = kv.k(0);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t) {
      // Layer l's K at element l*2*C*D, its V C*D later (the layout kvBuffer() exposes to JS).
      EXPECT_EQ(kv.k(l, t) - base, static_cast<ptrdiff_t>(l) * 2 * C * D + t * D);
      EXPECT_EQ(kv.v(l, t) - base, static_cast<ptrdiff_t>(l) * 2 * C * D + C * D + t * D);
      const KvCache& ckv = kv;
      EXPECT_EQ(ckv.k(l, t), kv.k(l, t));
      EXPECT_EQ(ckv.v(l, t), kv.v(l, t));
    }
}

TEST(KvCache, RowsAreDisjointAndStartZeroed) {
  const int L = 2, D = 16, C = 5;
  KvCache kv(L, D, C);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(kv.k(l, t)[i], 0);
        ASSERT_EQ(kv.v(l, t)[i], 0);
      }
  auto tag = [&](int l, int t, int which) { return static_cast<uint16_t>(1 + ((l * C + t) * 2 + which)); };
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        kv.k(l, t)[i] = tag(l, t, 0);
        kv.v(l, t)[i] = tag(l, t, 1);
      }
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(kv.k(l, t)[i], tag(l, t, 0));
        ASSERT_EQ(kv.v(l, t)[i], tag(l, t, 1));
      }
}

TEST(KvCache, SizeBoundsAndByteAccounting) {
  const int L = 30, D = 192, C = 100;
  KvCache kv(L, D, C);
  EXPECT_EQ(kv.size(), 0);
  EXPECT_EQ(kv.bytes_used(), 0u);
  EXPECT_EQ(kv.bytes_reserved(), static_cast<size_t>(L) * 2 * C * D * 2);
  EXPECT_EQ(kv.layer_bytes(0), static_cast<size_t>(2) * C * D * 2);
  kv.set_size(7);
  EXPECT_EQ(kv.size(), 7);
  // 30 layers x (K + V) x 192 f16 = 22.5 KiB per token, as for SmolLM2-135M.
  EXPECT_EQ(kv.bytes_used(), 7u * 23040);
  kv.set_size(C);
  EXPECT_EQ(kv.bytes_used(), kv.bytes_reserved());
  EXPECT_THROW(kv.set_size(C + 1), std::out_of_range);
  EXPECT_THROW(kv.set_size(-1), std::out_of_range);
  EXPECT_EQ(kv.size(), C);  // unchanged by the refused calls
  kv.set_size(0);
  EXPECT_EQ(kv.bytes_used(), 0u);
}

TEST(KvCache, RefusesNonPositiveDimensions) {
  EXPECT_THROW(KvCache(0, 8, 8), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 0, 8), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 8, 0), std::invalid_argument);
  EXPECT_THROW(KvCache(1, 8, -5), std::invalid_argument);
}

// The whole capacity is reserved up front without committing memory: a full 8192-token cache
// for SmolLM2 (180 MiB) is cheap until written.
TEST(KvCache, LargeReservationIsLazy) {
  KvCache kv(30, 192, 8192);
  EXPECT_EQ(kv.bytes_reserved(), 30u * 2 * 8192 * 192 * 2);
  kv.k(29, 8191)[191] = 0x3C00;
  kv.v(29, 8191)[191] = 0x3C00;
  EXPECT_EQ(kv.v(29, 8191) + 192, kv.k(0) + kv.bytes_reserved() / 2);  // last element ends the block
}

// The VmFlags line of /proc/self/smaps for the mapping holding p ("" when not found).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-')
      inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

// Both tiers ask for transparent huge pages ("hg" in VmFlags): a long import or prefill would
// otherwise fault once per 4 KiB. Skipped where the kernel has no THP.
TEST(KvCache, TiersAskForHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) GTEST_SKIP() << "this kernel has no transparent huge pages";
  KvCache kv(4, 64, 8192);
  EXPECT_NE(vm_flags_of(kv.k(0)).find(" hg"), std::string::npos) << vm_flags_of(kv.k(0));
  kv.offload({{2, 3}});
  EXPECT_NE(vm_flags_of(kv.k(2)).find(" hg"), std::string::npos) << vm_flags_of(kv.k(2));
}

// Pages of [p, p + bytes) that are resident (mincore).
size_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t n = (reinterpret_cast<uintptr_t>(p) + bytes - begin + page - 1) / page;
  std::vector<unsigned char> in(n);
  if (mincore(reinterpret_cast<void*>(begin), n * page, in.data()) != 0) return 0;
  size_t count = 0;
  for (unsigned char c : in) count += c & 1;
  return count;
}

// prefault commits the rows asked for, in both tiers, and leaves every value as it was; a
// prefault that starts after a release() (another generation) does nothing.
TEST(KvCache, PrefaultCommitsRowsAndKeepsTheirValues) {
  const int L = 4, D = 64, C = 4096;  // 512 KiB per layer's K
  KvCache kv(L, D, C);
  kv.k(1, 7)[3] = 0x1234;
  kv.offload({{2, 3}});
  kv.v(3, 9)[5] = 0x4321;
  const size_t rows = static_cast<size_t>(C) * D * sizeof(uint16_t);
  if (!kv.prefault(kv.row_spans(), 0, C, kv.generation())) GTEST_SKIP() << "no MADV_POPULATE_WRITE in this kernel";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_GE(resident_pages(kv.k(0), rows) * page, rows);
  EXPECT_GE(resident_pages(kv.v(1), rows) * page, rows);
  EXPECT_GE(resident_pages(kv.k(2), 2 * rows * 2) * page, 2 * rows * 2);  // the bank: 2 layers, K and V
  EXPECT_EQ(kv.k(1, 7)[3], 0x1234);
  EXPECT_EQ(kv.v(3, 9)[5], 0x4321);
  EXPECT_EQ(kv.k(0, 100)[0], 0);

  KvCache stale(L, D, C);
  const uint32_t gen = stale.generation();
  const auto spans = stale.row_spans();
  stale.release();
  EXPECT_TRUE(stale.prefault(spans, 0, C, gen));
  EXPECT_EQ(resident_pages(stale.k(0), rows), 0u);
}

// Offload: rows keep their values through k()/v() in either tier, the bank is token-major per
// group (ld = group layers x K|V x kv_dim), the bytes move from the device tier to the host tier,
// and restore() brings everything back.
TEST(KvCache, OffloadMovesGroupsToATokenMajorBankAndBack) {
  const int L = 6, D = 8, C = 12;
  KvCache kv(L, D, C);
  auto tag = [&](int l, int t, int which, int i) { return static_cast<uint16_t>(1 + ((l * C + t) * 2 + which) * D + i); };
  kv.set_size(9);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < 9; ++t)
      for (int i = 0; i < D; ++i) kv.k(l, t)[i] = tag(l, t, 0, i), kv.v(l, t)[i] = tag(l, t, 1, i);
  const size_t pair = 2 * D * 2;
  EXPECT_EQ(kv.device_bytes_used(), 9u * L * pair);
  kv.offload({{1, 2, 4}, {5}});
  EXPECT_EQ(kv.n_banks(), 2);
  EXPECT_EQ(kv.bank_of(0), -1);
  EXPECT_EQ(kv.bank_of(4), 0);
  EXPECT_EQ(kv.slot_in_bank(4), 2);
  EXPECT_EQ(kv.ld(0), static_cast<size_t>(D));
  EXPECT_EQ(kv.ld(2), static_cast<size_t>(3 * 2 * D));
  EXPECT_EQ(kv.ld(5), static_cast<size_t>(2 * D));
  EXPECT_EQ(kv.device_bytes_used(), 9u * 2 * pair);
  EXPECT_EQ(kv.host_bytes_used(), 9u * 4 * pair);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < 9; ++t)
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(kv.k(l, t)[i], tag(l, t, 0, i)) << l << " " << t;
        ASSERT_EQ(kv.v(l, t)[i], tag(l, t, 1, i)) << l << " " << t;
      }
  // Token-major within the bank: token t's rows of layers 1, 2, 4 (K then V each) are one run.
  EXPECT_EQ(kv.k(2, 3), kv.k(1, 3) + 2 * D);
  EXPECT_EQ(kv.k(1, 4), kv.k(1, 3) + 3 * 2 * D);
  kv.k(4, 10)[0] = 77;  // writes beyond the stored size land in the bank too
  kv.restore();
  EXPECT_EQ(kv.n_banks(), 0);
  EXPECT_EQ(kv.host_bytes_used(), 0u);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < 9; ++t) ASSERT_EQ(kv.v(l, t)[D - 1], tag(l, t, 1, D - 1));
  EXPECT_THROW(kv.offload({{1}, {1}}), std::invalid_argument);
}

// Offloading a layer returns its device pages without touching a neighbour's rows on a shared
// page (layer ranges are not page-aligned in general).
TEST(KvCache, OffloadLeavesNeighbouringLayersIntact) {
  const int L = 4, D = 192, C = 617;  // 473,856-byte layers: some start on a page, none end on one
  KvCache kv(L, D, C);
  kv.set_size(C);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t) kv.k(l, t)[0] = kv.v(l, t)[D - 1] = static_cast<uint16_t>(l * 1000 + t % 1000 + 1);
  kv.offload({{0}, {2}});
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t) {
      ASSERT_EQ(kv.k(l, t)[0], static_cast<uint16_t>(l * 1000 + t % 1000 + 1)) << l << " " << t;
      ASSERT_EQ(kv.v(l, t)[D - 1], static_cast<uint16_t>(l * 1000 + t % 1000 + 1)) << l << " " << t;
    }
  EXPECT_THROW(kv.offload({{6}}), std::invalid_argument);
  EXPECT_THROW(kv.offload({{}}), std::invalid_argument);
}

// OmniKV's packed load: one gather per group equals, row for row, gathering each layer of the
// group on its own.
TEST(KvCache, PackedGatherEqualsPerLayerGathers) {
  const int L = 5, D = 16, C = 40;
  KvCache kv(L, D, C);
  kv.set_size(C);
  uint16_t x = 1;
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < C; ++t)
      for (int i = 0; i < D; ++i) kv.k(l, t)[i] = x++, kv.v(l, t)[i] = x++;
  const std::vector<int> group = {1, 3, 4};
  kv.offload({group});
  const std::vector<int32_t> sel = {0, 3, 4, 17, 39};
  std::vector<uint16_t> packed(sel.size() * group.size() * 2 * D);
  kv.gather_bank(0, sel.data(), static_cast<int>(sel.size()), packed.data());
  for (size_t j = 0; j < sel.size(); ++j)
    for (size_t s = 0; s < group.size(); ++s) {
      const uint16_t* row = packed.data() + (j * group.size() + s) * 2 * D;
      for (int i = 0; i < D; ++i) {
        ASSERT_EQ(row[i], kv.k(group[s], sel[j])[i]);
        ASSERT_EQ(row[D + i], kv.v(group[s], sel[j])[i]);
      }
    }
}

}  // namespace

// Rings of rows (kv_cache.h): a ring layer's position t lives in row t % rows; the ring's memory
// and device bytes are its rows; a row remembers its position, so imports in any order leave the
// newest positions, exports and rollbacks of lost positions are refused, and a declared length
// must find the window whole.
namespace ring_test {

constexpr int kLayers = 2, kDim = 8, kCap = 300, kWindow = 5, kRows = 64;

KvCache make() { return KvCache(kLayers, kDim, kCap, ctx::KvRing{{true, false}, kWindow, kRows}); }

// What a forward pass at position t writes: every element of layer l's K row is l * 1000 + t % 1000.
void write(KvCache& kv, int from, int to) {
  for (int t = from; t < to; ++t)
    for (int l = 0; l < kLayers; ++l)
      for (int i = 0; i < kDim; ++i) kv.k(l, t)[i] = kv.v(l, t)[i] = static_cast<uint16_t>(l * 1000 + t % 1000);
  kv.wrote(from, to);
}

std::vector<uint8_t> payload(int layer, int from, int to) {  // rows as write() would leave them
  std::vector<uint16_t> rows(static_cast<size_t>(to - from) * 2 * kDim, static_cast<uint16_t>(0));
  for (int t = from; t < to; ++t)
    std::fill(rows.begin() + static_cast<size_t>(t - from) * 2 * kDim, rows.begin() + static_cast<size_t>(t - from + 1) * 2 * kDim,
              static_cast<uint16_t>(layer * 1000 + t % 1000));
  std::vector<uint8_t> bytes(rows.size() * 2);
  std::memcpy(bytes.data(), rows.data(), bytes.size());
  return bytes;
}

TEST(KvCacheRing, RowsWrapAndMemoryIsTheRing) {
  KvCache kv = make();
  EXPECT_EQ(kv.ring_rows(), kRows);
  EXPECT_EQ(kv.rows(0), kRows);
  EXPECT_EQ(kv.rows(1), kCap);
  EXPECT_EQ(kv.bytes_reserved(), static_cast<size_t>(kRows + kCap) * 2 * kDim * 2);
  write(kv, 0, 200);
  EXPECT_EQ(kv.k(0, 7), kv.k(0, 7 + kRows));
  EXPECT_EQ(kv.k(0, 199)[0], 199);
  EXPECT_EQ(kv.k(1, 7)[0], 1007);
  EXPECT_FALSE(kv.holds(0, 200 - kRows - 1));
  EXPECT_TRUE(kv.holds(0, 200 - kRows));
  EXPECT_TRUE(kv.holds(1, 0));
  EXPECT_EQ(kv.device_bytes_used(), static_cast<size_t>(kRows + 200) * kv.row_pair_bytes());
  EXPECT_THROW(kv.offload({{0}}), std::invalid_argument);
  // No ring when every row fits, or no layer asks for one.
  EXPECT_EQ(KvCache(kLayers, kDim, kRows, ctx::KvRing{{true, false}, kWindow, kRows}).ring_rows(), 0);
  EXPECT_THROW(KvCache(kLayers, kDim, kCap, ctx::KvRing{{true, false}, kWindow, 60}), std::invalid_argument);
}

TEST(KvCacheRing, RollbackKeepsTheWindowOrIsRefused) {
  KvCache kv = make();
  write(kv, 0, 200);
  kv.set_size(190);                // needs 186..189: held
  EXPECT_FALSE(kv.holds(0, 195));  // past the end: forgotten
  write(kv, 190, 195);
  EXPECT_EQ(kv.k(0, 194)[0], 194);
  EXPECT_THROW(kv.set_size(120), std::invalid_argument);  // 116..119 were overwritten
  EXPECT_EQ(kv.size(), 195);
  kv.set_size(0);
  EXPECT_EQ(kv.size(), 0);
}

TEST(KvCacheRing, ImportsInAnyOrderLeaveTheNewestPositions) {
  KvCache kv = make();
  const ctx::ChunkRows late{{0, 1}, 128, 72}, early{{0, 1}, 0, 128};
  auto both = [](int from, int to) {  // token-major: layer 0 then layer 1 per token
    std::vector<uint8_t> a = payload(0, from, to), b = payload(1, from, to), out;
    const size_t pair = 2 * kDim * 2;
    for (int t = 0; t < to - from; ++t) {
      out.insert(out.end(), a.begin() + t * pair, a.begin() + (t + 1) * pair);
      out.insert(out.end(), b.begin() + t * pair, b.begin() + (t + 1) * pair);
    }
    return out;
  };
  const auto late_bytes = both(128, 200), early_bytes = both(0, 128);
  ctx::import_chunk_rows(kv, late, late_bytes.data(), late_bytes.size());
  ctx::import_chunk_rows(kv, early, early_bytes.data(), early_bytes.size());  // older: left out of the ring
  kv.set_size(200);
  for (int t = 200 - kRows; t < 200; ++t) ASSERT_EQ(kv.k(0, t)[0], t) << t;
  for (int t = 0; t < 200; ++t) ASSERT_EQ(kv.k(1, t)[0], 1000 + t) << t;
  std::vector<uint8_t> out(payload(0, 150, 200).size());
  ctx::export_chunk_rows(kv, {{0}, 150, 50}, out.data(), out.size());
  EXPECT_EQ(out, payload(0, 150, 200));
  std::vector<uint8_t> lost(payload(0, 100, 150).size());
  EXPECT_THROW(ctx::export_chunk_rows(kv, {{0}, 100, 50}, lost.data(), lost.size()), std::invalid_argument);

  KvCache partial = make();  // the ring layer's last window never came
  const auto layer1 = payload(1, 0, 200);
  ctx::import_chunk_rows(partial, {{1}, 0, 200}, layer1.data(), layer1.size());
  EXPECT_THROW(partial.set_size(200), std::invalid_argument);
}

}  // namespace ring_test
