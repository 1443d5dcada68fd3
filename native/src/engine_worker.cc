#include "engine_worker.h"

#include "device.h"

#include <exception>

namespace ctx {

EngineWorker::EngineWorker(Napi::Env env) : tsfn_closed_(std::make_shared<std::atomic<bool>>(false)) {
  // At environment teardown Node finalizes the function itself; releasing it afterwards aborts.
  // The flag outlives this object (a normal release finalizes later, asynchronously).
  auto closed = tsfn_closed_;
  tsfn_ = Napi::ThreadSafeFunction::New(env, Napi::Function(), "ctxbank-engine", 0, 1, [closed](Napi::Env) { closed->store(true); });
  tsfn_.Unref(env);  // an idle engine must not keep the process alive
  thread_ = std::thread([this] { loop(); });
}

EngineWorker::~EngineWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Job* j : queue_) delete j;  // never started; their promises are unreachable by now
  if (!tsfn_closed_->load()) tsfn_.Release();
}

Napi::Promise EngineWorker::submit(Napi::Env env, std::function<void()> run, std::function<Napi::Value(Napi::Env)> settle,
                                   std::function<void()> finally, Napi::Object keep_alive) {
  auto* job = new Job{
      std::move(run), std::move(settle), std::move(finally), Napi::Promise::Deferred::New(env), Napi::Persistent(keep_alive), this, {}};
  Napi::Promise promise = job->deferred.Promise();
  if (pending_++ == 0) tsfn_.Ref(env);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(job);
  }
  cv_.notify_one();
  return promise;
}

void EngineWorker::loop() {
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    try {
      job->run();
    } catch (const DeviceError& e) {  // a GPU failure: the rejection carries its code
      job->error = e.what();
      job->code = e.code();
    } catch (const std::exception& e) {
      job->error = e.what();
    } catch (...) {
      job->error = "engine: unknown error";
    }
    if (tsfn_.BlockingCall(job, deliver) != napi_ok) delete job;
  }
}

void EngineWorker::deliver(Napi::Env env, Napi::Function, Job* job) {
  std::unique_ptr<Job> owned(job);
  if (env == nullptr) return;  // environment shutting down
  Napi::HandleScope scope(env);
  // keep_alive holds the engine's JS object, so the worker outlives every delivery.
  if (--job->owner->pending_ == 0) job->owner->tsfn_.Unref(env);
  if (job->finally) job->finally();
  if (!job->error.empty()) {
    Napi::Error err = Napi::Error::New(env, job->error);
    if (!job->code.empty()) err.Set("code", Napi::String::New(env, job->code));
    job->deferred.Reject(err.Value());
  } else {
    try {
      job->deferred.Resolve(job->settle(env));
    } catch (const Napi::Error& e) {
      job->deferred.Reject(e.Value());
    }
  }
}

}  // namespace ctx
