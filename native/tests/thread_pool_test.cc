// ThreadPool: every task runs exactly once, on a valid thread index, and parallel_for returns
// only after all of them finished -- with spinning workers, sleeping workers and tiny jobs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace {

using ctx::ThreadPool;

// Runs parallel_for(n) and checks that each task ran once, on a thread in [0, size).
void RunOnce(ThreadPool& pool, int n, bool slow = false) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> bad_thread{0};
  pool.parallel_for(n, [&](int task, int thread) {
    if (slow) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (thread < 0 || thread >= pool.size()) bad_thread.fetch_add(1);
    hits[task].fetch_add(1);
  });
  // Read right after return: a task still running would show up as a missing hit.
  for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i << " of " << n;
  EXPECT_EQ(bad_thread.load(), 0);
}

class ThreadPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolTest, EveryTaskExactlyOnce) {
  ThreadPool pool(GetParam());
  ASSERT_EQ(pool.size(), GetParam());
  for (int n : {0, 1, 2, 3, 4, 5, 7, 8, 64, 1000}) RunOnce(pool, n);
  for (int rep = 0; rep < 3; ++rep) RunOnce(pool, 16, /*slow=*/true);
}

// Fewer tasks than threads, back to back: a decode step issues hundreds of these.
TEST_P(ThreadPoolTest, ManyTinyCallsInARow) {
  ThreadPool pool(GetParam());
  std::atomic<long> total{0};
  long want = 0;
  // With more threads than cores every call waits until each spinning worker gets scheduled
  // (milliseconds), so the oversubscribed case runs fewer calls to stay quick.
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const int calls = GetParam() <= hw ? 20000 : 500;
  for (int i = 0; i < calls; ++i) {
    const int n = 1 + i % 3;
    pool.parallel_for(n, [&](int task, int) { total.fetch_add(task + 1); });
    want += n * (n + 1) / 2;
    if (i % 1000 == 0) ASSERT_EQ(total.load(), want) << "call " << i;
  }
  EXPECT_EQ(total.load(), want);
}

// Pauses longer than the spin phase make the workers sleep on the condition variable; every
// call must still wake them (no lost wake-up) and complete.
TEST_P(ThreadPoolTest, WakesSleepingWorkers) {
  ThreadPool pool(GetParam());
  for (int rep = 0; rep < 10; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    RunOnce(pool, 4 * GetParam());
  }
}

// The caller waits for tasks running on workers, not just for the task counter to run out.
TEST_P(ThreadPoolTest, ReturnsOnlyAfterSlowTasksFinish) {
  ThreadPool pool(GetParam());
  std::atomic<int> done{0};
  pool.parallel_for(2 * GetParam(), [&](int task, int) {
    if (task % 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done.fetch_add(1);
  });
  EXPECT_EQ(done.load(), 2 * GetParam());
}

TEST_P(ThreadPoolTest, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(GetParam());
    if (i % 2) RunOnce(pool, 3);
    if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // destroy while asleep
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "t" + std::to_string(i.param); });

TEST(ThreadPool, ClampsToOneThread) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), 1);
  RunOnce(pool, 5);
}

}  // namespace
