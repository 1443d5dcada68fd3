#include "membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "thread_pool.h"

namespace ctx {

namespace {

// Sums the 64-bit words of [p, p + n) in four independent chains (the compiler widens them to
// vector loads); the sum keeps the loads from being optimised away.
uint64_t read_words(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

struct FreeAligned {
  void operator()(uint64_t* p) const { std::free(p); }
};

}  // namespace

ReadBandwidth measure_read_bandwidth(int threads, size_t bytes, int passes) {
  if (threads < 1 || threads > 256) throw std::invalid_argument("read bandwidth: threads must be 1..256");
  if (passes < 1) throw std::invalid_argument("read bandwidth: passes must be >= 1");
  const size_t share = bytes / threads / 64 * 64;  // whole cache lines per thread
  if (share == 0) throw std::invalid_argument("read bandwidth: too few bytes for the threads");
  const size_t total = share * threads;
  std::unique_ptr<uint64_t, FreeAligned> buf(static_cast<uint64_t*>(std::aligned_alloc(64, total)));
  if (!buf) throw std::runtime_error("read bandwidth: cannot allocate the buffer");
  std::memset(buf.get(), 1, total);  // commit every page before timing
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads);
  double best_s = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(threads, [&](int task, int) { sums[task] += read_words(buf.get() + task * (share / 8), share / 8); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass == 0 || s < best_s) best_s = s;
  }
  if (std::find(sums.begin(), sums.end(), 0u) != sums.end()) throw std::logic_error("read bandwidth: a share read nothing");
  return {static_cast<double>(total) / best_s / 1e9, total, passes, threads};
}

}  // namespace ctx
