// SPDX-License-Identifier: Apache-2.0
// An annotated mutex for kvtier's own locking.
//
// Why not absl::Mutex: Debian's libabsl is not built with ThreadSanitizer, so
// TSan cannot see absl::Mutex's happens-before edges and reports false races
// (checked: a counter under absl::MutexLock is reported as racy). This wrapper
// keeps Abseil's thread-safety annotations (clang -Wthread-safety) on top of
// std::mutex, which TSan understands.
#ifndef KVTIER_CORE_MUTEX_H_
#define KVTIER_CORE_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvtier {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // Waits on cv until pred() holds; the lock is held on entry and on return.
  template <typename Pred>
  void Await(std::condition_variable_any& cv, Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    cv.wait(mu_, pred);
  }
  // As Await, but gives up after `timeout`; returns pred().
  template <typename Rep, typename Period, typename Pred>
  bool AwaitFor(std::condition_variable_any& cv, std::chrono::duration<Rep, Period> timeout,
                Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return cv.wait_for(mu_, timeout, pred);
  }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace kvtier

#endif  // KVTIER_CORE_MUTEX_H_
