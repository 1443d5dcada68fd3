// The thread an Engine computes on. JS calls enqueue jobs and get promises; the job runs here,
// never on the event loop or libuv's pool, and its result is delivered back on the JS thread
// through a thread-safe function. One worker per engine serialises its forward passes.
#pragma once
#include <napi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ctx {

class EngineWorker {
 public:
  // run() executes on the worker thread; then, on the JS thread, finally() always runs and
  // settle() gives the resolved value unless run() threw.
  struct Job {
    std::function<void()> run;
    std::function<Napi::Value(Napi::Env)> settle;
    std::function<void()> finally;
    Napi::Promise::Deferred deferred;
    Napi::ObjectReference keep_alive;  // JS objects the job touches (buffers, the engine)
    EngineWorker* owner;
    std::string error;
    std::string code;  // DeviceError's code, set as the rejection's err.code
  };

  explicit EngineWorker(Napi::Env env);
  ~EngineWorker();
  Napi::Promise submit(Napi::Env env, std::function<void()> run, std::function<Napi::Value(Napi::Env)> settle,
                       std::function<void()> finally, Napi::Object keep_alive);
  size_t pending() const { return pending_; }

 private:
  void loop();
  static void deliver(Napi::Env env, Napi::Function, Job* job);

  Napi::ThreadSafeFunction tsfn_;
  std::shared_ptr<std::atomic<bool>> tsfn_closed_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  bool stop_ = false;
  size_t pending_ = 0;  // JS thread only
  std::thread thread_;
};

}  // namespace ctx
