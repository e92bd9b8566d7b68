// SPDX-License-Identifier: Apache-2.0
// A background thread that runs a pass each time it is woken, and at least
// once per period otherwise (a backstop: a wake may race with the end of a
// pass), until it is stopped. The store's reclaimer and its cascade are two.
#ifndef KVTIER_CORE_BACKGROUND_LOOP_H_
#define KVTIER_CORE_BACKGROUND_LOOP_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "core/mutex.h"

namespace kvtier {

class BackgroundLoop {
 public:
  BackgroundLoop() = default;
  ~BackgroundLoop() { Stop(); }
  BackgroundLoop(const BackgroundLoop&) = delete;
  BackgroundLoop& operator=(const BackgroundLoop&) = delete;

  // Starts the thread; nothing when it runs already. One thread (the
  // owner's) starts and stops it.
  void Start(std::chrono::milliseconds period, absl::AnyInvocable<void()> pass) {
    if (thread_.joinable()) return;
    {
      MutexLock l(&mu_);
      stop_ = false;
      wanted_ = false;
    }
    pass_ = std::move(pass);
    running_.store(true, std::memory_order_release);
    thread_ = std::thread([this, period] { Run(period); });
  }
  // Makes running() false (a pass that checks it ends early), lets the
  // current pass finish and joins. Nothing when not running.
  void Stop() {
    if (!thread_.joinable()) return;
    running_.store(false, std::memory_order_release);
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Any thread: run a pass soon (another, if one is running now).
  void Wake() {
    {
      MutexLock l(&mu_);
      wanted_ = true;
    }
    cv_.notify_one();
  }
  // Any thread: between Start and Stop.
  bool running() const { return running_.load(std::memory_order_acquire); }

 private:
  void Run(std::chrono::milliseconds period) {
    for (;;) {
      {
        MutexLock l(&mu_);
        mu_.AwaitFor(cv_, period, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return wanted_ || stop_; });
        if (stop_) return;
        wanted_ = false;
      }
      pass_();
    }
  }

  Mutex mu_;  // a leaf: passes run without it
  std::condition_variable_any cv_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> running_{false};
  absl::AnyInvocable<void()> pass_;  // written before the thread starts
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_CORE_BACKGROUND_LOOP_H_
