// SPDX-License-Identifier: Apache-2.0
// A priority queue of I/O ops shared by the I/O engines: loads before
// prefetches before demotions, FIFO within a priority.
#ifndef KVTIER_TIERS_IO_QUEUE_H_
#define KVTIER_TIERS_IO_QUEUE_H_

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <vector>

#include "core/mutex.h"
#include "tiers/io_engine.h"

namespace kvtier {

class IoQueue {
 public:
  // Thread-safe.
  void Push(IoOp op) {
    {
      MutexLock l(&mu_);
      q_[static_cast<int>(op.priority)].push_back(std::move(op));
      ++size_;
      approx_size_.store(size_, std::memory_order_release);
    }
    cv_.notify_one();
  }
  // Without the lock, for polling: may be momentarily stale.
  bool LooksEmpty() const { return approx_size_.load(std::memory_order_acquire) == 0; }
  // Thread-safe. Up to `max` ops, highest priority first; never blocks.
  size_t TakeUpTo(size_t max, std::vector<IoOp>* out) {
    MutexLock l(&mu_);
    size_t n = 0;
    for (auto& q : q_) {
      while (n < max && !q.empty()) {
        out->push_back(std::move(q.front()));
        q.pop_front();
        ++n;
      }
    }
    size_ -= n;
    approx_size_.store(size_, std::memory_order_release);
    return n;
  }
  // Thread-safe. Waits until an op is queued or `stop` is set (under the lock
  // of Stop()), then takes one. False when stopped and empty.
  bool TakeOneBlocking(IoOp* out) {
    MutexLock l(&mu_);
    mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return size_ > 0 || stopped_; });
    for (auto& q : q_) {
      if (!q.empty()) {
        *out = std::move(q.front());
        q.pop_front();
        --size_;
        approx_size_.store(size_, std::memory_order_release);
        return true;
      }
    }
    return false;
  }
  void Stop() {
    {
      MutexLock l(&mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  size_t size() {
    MutexLock l(&mu_);
    return size_;
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  std::array<std::deque<IoOp>, kIoPriorities> q_ ABSL_GUARDED_BY(mu_);
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> approx_size_{0};  // size_, published for LooksEmpty()
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// The iovecs of what is left of an op after `done` bytes; returns how many.
inline int RemainingIov(const IoOp& op, uint32_t done, iovec out[2]) {
  int n = 0;
  if (done < op.len) {
    out[n++] = iovec{op.buf + done, op.len - done};
    done = 0;
  } else {
    done -= op.len;
  }
  if (op.tail_len > done) out[n++] = iovec{op.tail + done, op.tail_len - done};
  return n;
}

// Counts outstanding ops so Drain() can wait for zero.
class Outstanding {
 public:
  void Add() {
    MutexLock l(&mu_);
    ++n_;
  }
  void Done() {
    bool zero;
    {
      MutexLock l(&mu_);
      zero = --n_ == 0;
    }
    if (zero) cv_.notify_all();
  }
  void WaitZero() {
    MutexLock l(&mu_);
    mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return n_ == 0; });
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  uint64_t n_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_IO_QUEUE_H_
