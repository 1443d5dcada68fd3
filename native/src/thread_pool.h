// A persistent pool of compute threads. parallel_for hands out task indices through one atomic
// counter; the calling thread works too. Idle workers spin briefly (a decode step issues a few
// hundred small parallel_fors, and waking a sleeping thread costs more than the work), then
// sleep on a condition variable so an idle engine uses no CPU.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "function_ref.h"

namespace ctx {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // total threads, including the caller; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(task, thread) for every task in [0, n_tasks) and returns when all are done. Not
  // reentrant: one parallel_for at a time (the engine thread is the only caller). With
  // single_thread the caller runs every task itself and the workers stay asleep.
  void parallel_for(int n_tasks, FunctionRef<void(int task, int thread)> fn, bool single_thread = false);

 private:
  void worker_loop(int thread);
  void run_tasks(int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  const FunctionRef<void(int, int)>* job_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> busy_workers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace ctx
