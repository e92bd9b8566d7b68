// SPDX-License-Identifier: Apache-2.0
// The fallback I/O engine: pread/pwrite on a pool of threads.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include "core/units.h"
#include "tiers/io_engine.h"
#include "tiers/io_queue.h"

namespace kvtier {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoEngineOptions& opts) : fds_(opts.fds) {
    const uint32_t n = std::max<uint32_t>(opts.workers, 1);
    for (uint32_t i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadEngine() override {
    Drain();
    queue_.Stop();
    for (auto& t : threads_) t.join();
  }

  std::string name() const override { return "threads"; }

  void Submit(IoOp op) override {
    outstanding_.Add();
    queued_.fetch_add(1, std::memory_order_relaxed);
    queue_.Push(std::move(op));
  }

  void Drain() override { outstanding_.WaitZero(); }

  IoEngineStats Stats() const override {
    IoEngineStats s;
    s.reads = reads_.load(std::memory_order_relaxed);
    s.writes = writes_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
    s.errors = errors_.load(std::memory_order_relaxed);
    s.abandoned = abandoned_.load(std::memory_order_relaxed);
    s.in_flight = in_flight_.load(std::memory_order_relaxed);
    s.queued = queued_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void Run() {
    IoOp op;
    while (queue_.TakeOneBlocking(&op)) {
      queued_.fetch_sub(1, std::memory_order_relaxed);
      const uint64_t at_start = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
      const uint64_t start_ns = MonotonicNanos();
      const int32_t abandon = AbandonReason(op);
      const int32_t res = abandon != 0 ? abandon : Execute(op);
      const uint64_t at_end = in_flight_.fetch_sub(1, std::memory_order_relaxed);
      if (op.timing != nullptr) {
        op.timing->service_ns = MonotonicNanos() - start_ns;
        op.timing->in_flight = std::max(1.0, (double(at_start) + double(at_end)) / 2);
      }
      if (abandon != 0) {
        abandoned_.fetch_add(1, std::memory_order_relaxed);
      } else if (res < 0) {
        errors_.fetch_add(1, std::memory_order_relaxed);
      } else if (op.write) {
        writes_.fetch_add(1, std::memory_order_relaxed);
        bytes_written_.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
      } else {
        reads_.fetch_add(1, std::memory_order_relaxed);
        bytes_read_.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
      }
      std::move(op.done)(res);
      outstanding_.Done();
    }
  }

  int32_t Execute(const IoOp& op) {
    if (op.file >= fds_.size()) return -EBADF;
    const uint32_t total = op.len + op.tail_len;
    uint32_t done = 0;
    while (done < total) {
      iovec iov[2];
      const int n_iov = RemainingIov(op, done, iov);
      const ssize_t n = op.write ? pwritev(fds_[op.file], iov, n_iov, static_cast<off_t>(op.offset + done))
                                 : preadv(fds_[op.file], iov, n_iov, static_cast<off_t>(op.offset + done));
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -errno;
      }
      if (n == 0) return -EIO;  // no progress: past the end, or a broken device
      done += static_cast<uint32_t>(n);
    }
    return static_cast<int32_t>(done);
  }

  const std::vector<int> fds_;
  IoQueue queue_;
  Outstanding outstanding_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0}, errors_{0}, abandoned_{0},
      in_flight_{0}, queued_{0};
};

}  // namespace

std::unique_ptr<IoEngine> MakeThreadEngine(const IoEngineOptions& opts) {
  return std::make_unique<ThreadEngine>(opts);
}

}  // namespace kvtier
