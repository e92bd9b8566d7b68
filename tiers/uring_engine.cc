// SPDX-License-Identifier: Apache-2.0
// The io_uring engine: one ring per worker thread, files registered as fixed
// files, the staging region registered as a fixed buffer, and submissions
// batched up to the queue depth. A worker sleeps in io_uring_submit_and_wait
// with a read of an eventfd always armed, so Submit() wakes it through the
// ring itself. On kernels that have it (6.1+) the ring is single-issuer with
// deferred task work: a completion wakes the sleeping worker directly, as a
// blocking pread would, and nothing interrupts a running thread. Completed
// ops' callbacks (checksums, copies) run after the next ops are submitted, so
// the device works while they run.
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"
#include "os/futex.h"
#include "tiers/completion_wait.h"
#include "tiers/io_engine.h"
#include "tiers/io_queue.h"

namespace kvtier {
namespace {

constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kIdleSpinNs = 50'000;
constexpr uint64_t kCompletionSpinNs = 200'000;
// Poll for completions only with this few ops in flight, and only where
// polling measured faster than sleeping (CompletionWaitChooser): that is where
// a wake-up is most of an op's latency. With more, completions arrive often and
// sleeping reaps them in batches; polling took one syscall per completion and
// cut 4 KiB reads at depth 32 from 127k to 86k per second here.
constexpr uint32_t kSpinMaxInFlight = 2;

struct Counters {
  std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0}, errors{0}, abandoned{0}, in_flight{0},
      queued{0};
};

class UringWorker {
 public:
  UringWorker(const IoEngineOptions& opts, Counters* counters, Outstanding* outstanding)
      : opts_(opts), counters_(counters), outstanding_(outstanding) {}

  ~UringWorker() {
    if (thread_.joinable()) {
      stop_.store(true, std::memory_order_seq_cst);
      Wake();
      thread_.join();
    }
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  absl::Status Init() {
    wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) return ErrnoStatus(errno, "eventfd");
    // The ring is made and registered on the worker thread: with a single
    // issuer the kernel runs completion work when that thread asks for
    // events, so a completion wakes the sleeping worker once instead of
    // interrupting it.
    std::promise<absl::Status> ready;
    std::future<absl::Status> result = ready.get_future();
    thread_ = std::thread([this, &ready] {
      absl::Status st = SetUpRing();
      const bool ok = st.ok();
      ready.set_value(std::move(st));
      if (ok) Run();
    });
    absl::Status st = result.get();
    if (!st.ok()) {
      thread_.join();
      return st;
    }
    return absl::OkStatus();
  }

  void Submit(IoOp op) {
    queue_.Push(std::move(op));
    if (sleeping_.load(std::memory_order_seq_cst)) Wake();
  }

  bool fixed_files() const { return fixed_files_; }
  bool fixed_buffers() const { return fixed_buffers_; }

 private:
  struct Pending {
    IoOp op;
    uint32_t done = 0;  // bytes transferred so far
    iovec iov[2];       // vectored ops: must live until the completion
    uint64_t start_ns = 0;      // handed to the ring (the first time)
    uint32_t in_flight_at_start = 0;
    bool abandoned = false;     // given up before it started (AbandonReason)
  };
  static Pending* Abandoned(IoOp op) {
    auto* p = new Pending{std::move(op)};
    p->abandoned = true;
    return p;
  }

  absl::Status SetUpRing() {
    const unsigned entries = std::max<uint32_t>(opts_.queue_depth, 1) * 2 + 2;
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    int rc = io_uring_queue_init_params(entries, &ring_, &p);
    if (rc == -EINVAL) {  // kernels before 6.1
      p = io_uring_params{};
      rc = io_uring_queue_init_params(entries, &ring_, &p);
    } else if (rc == 0) {
      defer_taskrun_ = true;
    }
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
    ring_ready_ = true;
    if (!opts_.fds.empty() &&
        io_uring_register_files(&ring_, opts_.fds.data(), static_cast<unsigned>(opts_.fds.size())) == 0) {
      fixed_files_ = true;
    }
    if (opts_.registered_base != nullptr && opts_.registered_bytes > 0) {
      iovec iov{opts_.registered_base, opts_.registered_bytes};
      // Pinning needs RLIMIT_MEMLOCK; without it ops use plain read/write.
      fixed_buffers_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
    }
    return absl::OkStatus();
  }

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void ArmWake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, wake_fd_, &wake_buf_, sizeof(wake_buf_), 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  bool InRegistered(const std::byte* p, uint32_t len) const {
    return fixed_buffers_ && p >= opts_.registered_base && p + len <= opts_.registered_base + opts_.registered_bytes;
  }

  void Prep(Pending* p) {
    if (p->start_ns == 0) {
      p->start_ns = MonotonicNanos();
      p->in_flight_at_start = in_flight_;
      last_bytes_ = uint64_t{p->op.len} + p->op.tail_len;
      last_write_ = p->op.write;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const IoOp& op = p->op;
    const int fd = fixed_files_ ? static_cast<int>(op.file) : opts_.fds[op.file];
    const uint64_t off = op.offset + p->done;
    if (op.tail != nullptr) {
      const int n = RemainingIov(op, p->done, p->iov);
      if (op.write) {
        io_uring_prep_writev(sqe, fd, p->iov, n, off);
      } else {
        io_uring_prep_readv(sqe, fd, p->iov, n, off);
      }
      if (fixed_files_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
      io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(p));
      return;
    }
    std::byte* buf = op.buf + p->done;
    const uint32_t len = op.len - p->done;
    if (InRegistered(buf, len)) {
      if (op.write) {
        io_uring_prep_write_fixed(sqe, fd, buf, len, off, 0);
      } else {
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, 0);
      }
    } else if (op.write) {
      io_uring_prep_write(sqe, fd, buf, len, off);
    } else {
      io_uring_prep_read(sqe, fd, buf, len, off);
    }
    if (fixed_files_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(p));
  }

  // Runs the op's callback. The caller has already taken it off in_flight_
  // (in_flight_at_end: the ring's count before that).
  void Finish(Pending* p, int32_t res, uint32_t in_flight_at_end = 1) {
    if (p->op.timing != nullptr) {
      p->op.timing->service_ns = p->start_ns != 0 ? MonotonicNanos() - p->start_ns : 0;
      p->op.timing->in_flight = std::max(1.0, (double(p->in_flight_at_start) + double(in_flight_at_end)) / 2);
    }
    counters_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (p->abandoned) {
      counters_->abandoned.fetch_add(1, std::memory_order_relaxed);
    } else if (res < 0) {
      counters_->errors.fetch_add(1, std::memory_order_relaxed);
    } else if (p->op.write) {
      counters_->writes.fetch_add(1, std::memory_order_relaxed);
      counters_->bytes_written.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
    } else {
      counters_->reads.fetch_add(1, std::memory_order_relaxed);
      counters_->bytes_read.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
    }
    std::move(p->op.done)(res);
    delete p;
    outstanding_->Done();
  }

  void Run() {
    ArmWake();
    std::vector<IoOp> batch;
    for (;;) {
      const bool stopping = stop_.load(std::memory_order_seq_cst);
      if (stopping && in_flight_ == 0 && queue_.size() == 0) break;
      batch.clear();
      const uint32_t room = opts_.queue_depth > in_flight_ ? opts_.queue_depth - in_flight_ : 0;
      queue_.TakeUpTo(room, &batch);
      for (IoOp& op : batch) {
        counters_->queued.fetch_sub(1, std::memory_order_relaxed);
        counters_->in_flight.fetch_add(1, std::memory_order_relaxed);
        if (op.file >= opts_.fds.size()) {
          Finish(new Pending{std::move(op)}, -EBADF);
          continue;
        }
        if (const int32_t abandon = AbandonReason(op); abandon != 0) {
          Finish(Abandoned(std::move(op)), abandon);
          continue;
        }
        ++in_flight_;
        Prep(new Pending{std::move(op)});
      }
      // With nothing in flight, poll the queue briefly before sleeping: an
      // engine that submits the next op right after a completion (queue
      // depth 1) then pays no thread wake-up.
      if (in_flight_ == 0 && !stopping) {
        const uint64_t spin_start = MonotonicNanos();
        while (queue_.LooksEmpty() && MonotonicNanos() - spin_start < kIdleSpinNs &&
               !stop_.load(std::memory_order_relaxed)) {
          os::PollPause(MonotonicNanos() - spin_start);
        }
        if (!queue_.LooksEmpty()) continue;
      }
      bool more = queue_.size() > 0 && in_flight_ < opts_.queue_depth;
      wait_ = Wait::kUntimed;
      if (!more && in_flight_ > 0 && in_flight_ <= kSpinMaxInFlight) {
        // Where it measured faster here, submit, then poll the completion
        // queue for a while before sleeping in the kernel: a thread woken
        // from sleep costs tens of microseconds on some machines, more when
        // the device interrupts another CPU. With deferred task work,
        // completions are posted only when we ask (get_events).
        wait_ = wait_chooser_.ShouldPoll(last_write_, last_bytes_) ? Wait::kPolled : Wait::kSlept;
        if (wait_ == Wait::kPolled) {
          io_uring_submit(&ring_);
          const uint64_t spin_start = MonotonicNanos();
          while (io_uring_cq_ready(&ring_) == 0 && MonotonicNanos() - spin_start < kCompletionSpinNs) {
            if (defer_taskrun_) {
              io_uring_get_events(&ring_);
            } else {
              os::CpuRelax();
            }
            if (!queue_.LooksEmpty()) break;
          }
          // Stopped for new work with nothing reaped: whatever completes
          // next was not waited for by polling (it sleeps below, or is
          // reaped after the new op is handed over), so it is not timed.
          // (Polling that ran out of time is: that is what polling costs.)
          if (io_uring_cq_ready(&ring_) == 0 && !queue_.LooksEmpty()) wait_ = Wait::kUntimed;
          more = queue_.size() > 0 && in_flight_ < opts_.queue_depth;
        }
      }
      // Sleep only with nothing left to submit: announce, re-check, wait.
      sleeping_.store(true, std::memory_order_seq_cst);
      if (!more) more = queue_.size() > 0 && in_flight_ < opts_.queue_depth;
      const int rc = io_uring_submit_and_wait(&ring_, more || io_uring_cq_ready(&ring_) > 0 ? 0 : 1);
      sleeping_.store(false, std::memory_order_seq_cst);
      if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
        // The ring itself failed; nothing sensible remains but to fail ops.
        FailEverything(rc);
        return;
      }
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      resubmit_.clear();
      finished_.clear();
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        const uint64_t tag = io_uring_cqe_get_data64(cqe);
        const int32_t res = cqe->res;
        if (tag == kWakeTag) {
          rearm_wake_ = true;
          continue;
        }
        auto* p = reinterpret_cast<Pending*>(tag);
        if (res == -EAGAIN || res == -EINTR) {
          resubmit_.push_back(p);
        } else if (res < 0) {
          finished_.emplace_back(p, res);
        } else if (res == 0 && p->done < p->op.len + p->op.tail_len) {
          finished_.emplace_back(p, -EIO);  // no progress
        } else {
          p->done += static_cast<uint32_t>(res);
          if (p->done < p->op.len + p->op.tail_len) {
            resubmit_.push_back(p);  // short transfer: the rest
          } else {
            finished_.emplace_back(p, static_cast<int32_t>(p->done));
          }
        }
      }
      io_uring_cq_advance(&ring_, seen);
      const uint32_t in_flight_at_end = in_flight_;
      if (wait_ != Wait::kUntimed && in_flight_at_end == 1) {
        // A lone op, waited for one way or the other: time it for the chooser.
        for (auto [p, res] : finished_) {
          if (res >= 0 && p->in_flight_at_start == 1) {
            wait_chooser_.Record(p->op.write, uint64_t{p->op.len} + p->op.tail_len, wait_ == Wait::kPolled,
                                 MonotonicNanos() - p->start_ns);
          }
        }
      }
      in_flight_ -= static_cast<uint32_t>(finished_.size());
      for (Pending* p : resubmit_) Prep(p);
      if (!finished_.empty()) {
        // Refill the device before running callbacks: they verify checksums
        // and copy payloads, and the next ops' I/O overlaps that work.
        batch.clear();
        queue_.TakeUpTo(opts_.queue_depth > in_flight_ ? opts_.queue_depth - in_flight_ : 0, &batch);
        for (IoOp& op : batch) {
          counters_->queued.fetch_sub(1, std::memory_order_relaxed);
          counters_->in_flight.fetch_add(1, std::memory_order_relaxed);
          if (op.file >= opts_.fds.size()) {
            finished_.emplace_back(new Pending{std::move(op)}, -EBADF);
            continue;
          }
          if (const int32_t abandon = AbandonReason(op); abandon != 0) {
            finished_.emplace_back(Abandoned(std::move(op)), abandon);
            continue;
          }
          ++in_flight_;
          Prep(new Pending{std::move(op)});
        }
        if (!batch.empty() || !resubmit_.empty()) io_uring_submit(&ring_);
        for (auto [p, res] : finished_) Finish(p, res, in_flight_at_end);
      }
      if (rearm_wake_ && !stop_.load(std::memory_order_seq_cst)) {
        ArmWake();
        rearm_wake_ = false;
      }
    }
  }

  void FailEverything(int rc) {
    std::vector<IoOp> rest;
    queue_.TakeUpTo(SIZE_MAX, &rest);
    for (IoOp& op : rest) {
      counters_->queued.fetch_sub(1, std::memory_order_relaxed);
      counters_->errors.fetch_add(1, std::memory_order_relaxed);
      std::move(op.done)(rc);
      outstanding_->Done();
    }
  }

  const IoEngineOptions& opts_;
  Counters* counters_;
  Outstanding* outstanding_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  bool defer_taskrun_ = false;  // completions are posted only when we enter the kernel
  int wake_fd_ = -1;
  uint64_t wake_buf_ = 0;
  bool rearm_wake_ = false;
  uint32_t in_flight_ = 0;  // worker thread only
  // How the worker waited for the completions it reaps next (worker thread
  // only): kUntimed with more than kSpinMaxInFlight in flight, and when a
  // poll was cut short by new work (the wait then timed neither way).
  enum class Wait : uint8_t { kUntimed, kPolled, kSlept };
  Wait wait_ = Wait::kUntimed;
  uint64_t last_bytes_ = 0;  // the size of the op submitted last
  bool last_write_ = false;  // and its direction
  CompletionWaitChooser wait_chooser_;
  std::vector<Pending*> resubmit_;                        // worker thread only
  std::vector<std::pair<Pending*, int32_t>> finished_;  // worker thread only
  IoQueue queue_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& opts) : opts_(opts) {}
  ~UringEngine() override {
    Drain();
    workers_.clear();  // each joins its thread
  }

  absl::Status Init() {
    for (uint32_t i = 0; i < std::max<uint32_t>(opts_.workers, 1); ++i) {
      auto w = std::make_unique<UringWorker>(opts_, &counters_, &outstanding_);
      RETURN_IF_ERROR(w->Init());
      workers_.push_back(std::move(w));
    }
    return absl::OkStatus();
  }

  std::string name() const override {
    std::string n = "io_uring";
    if (!workers_.empty() && !workers_[0]->fixed_buffers()) n += " (unregistered buffers)";
    return n;
  }

  void Submit(IoOp op) override {
    outstanding_.Add();
    counters_.queued.fetch_add(1, std::memory_order_relaxed);
    // Ops of one file go to one worker: its ring keeps them in submission
    // order within a priority.
    workers_[op.file % workers_.size()]->Submit(std::move(op));
  }

  void Drain() override { outstanding_.WaitZero(); }

  IoEngineStats Stats() const override {
    IoEngineStats s;
    s.reads = counters_.reads.load(std::memory_order_relaxed);
    s.writes = counters_.writes.load(std::memory_order_relaxed);
    s.bytes_read = counters_.bytes_read.load(std::memory_order_relaxed);
    s.bytes_written = counters_.bytes_written.load(std::memory_order_relaxed);
    s.errors = counters_.errors.load(std::memory_order_relaxed);
    s.abandoned = counters_.abandoned.load(std::memory_order_relaxed);
    s.in_flight = counters_.in_flight.load(std::memory_order_relaxed);
    s.queued = counters_.queued.load(std::memory_order_relaxed);
    return s;
  }

 private:
  const IoEngineOptions opts_;
  Counters counters_;
  Outstanding outstanding_;
  std::vector<std::unique_ptr<UringWorker>> workers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(const IoEngineOptions& opts) {
  auto e = std::make_unique<UringEngine>(opts);
  RETURN_IF_ERROR(e->Init());
  return std::unique_ptr<IoEngine>(std::move(e));
}

absl::Status ProbeIoUring() {
  io_uring ring;
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) {
    if (rc == -EPERM || rc == -ENOSYS) {
      return CodedStatus(KVTIER_EACCES,
                         absl::StrCat("io_uring is refused here (", std::strerror(-rc),
                                      "): the kernel.io_uring_disabled sysctl or a seccomp profile "
                                      "(common under Docker) blocks it"));
    }
    return ErrnoStatus(-rc, "io_uring_queue_init");
  }
  io_uring_queue_exit(&ring);
  return absl::OkStatus();
}

}  // namespace kvtier
