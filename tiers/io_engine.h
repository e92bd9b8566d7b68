// SPDX-License-Identifier: Apache-2.0
// Block I/O for the NVMe tier: asynchronous reads and writes at offsets of a
// fixed set of files, in three priorities.
//
// Two engines: io_uring (one ring per worker thread, fixed files, registered
// buffers, batched submission, bounded queue depth) and a thread pool of
// pread/pwrite for where io_uring is refused (kernel.io_uring_disabled, a
// container's seccomp profile). FaultInjectingIoEngine wraps either for tests.
#ifndef KVTIER_TIERS_IO_ENGINE_H_
#define KVTIER_TIERS_IO_ENGINE_H_

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "core/cancel.h"
#include "core/units.h"
#include "tiers/tier.h"

namespace kvtier {

// How long the device took with an op, apart from the time it waited in the
// engine's queue: from the op's hand-over to the device to its completion,
// and how many ops the device held meanwhile (the mean of the counts at both
// ends, itself included). service_ns / in_flight is the op's share of the
// device's time; a cost model learns device speed from that, never from the
// queue wait in front of it.
struct IoTiming {
  uint64_t service_ns = 0;
  double in_flight = 1;
  double share_s() const { return double(service_ns) / 1e9 / (in_flight < 1 ? 1 : in_flight); }
};

struct IoOp {
  bool write = false;
  uint32_t file = 0;    // index into IoEngineOptions::fds
  uint64_t offset = 0;  // aligned for O_DIRECT
  std::byte* buf = nullptr;
  uint32_t len = 0;
  IoPriority priority = IoPriority::kDemote;
  // Runs exactly once, on an engine thread: len + tail_len on success, else -errno.
  // A short transfer is retried for the rest; one that makes no progress is -EIO.
  absl::AnyInvocable<void(int32_t) &&> done;
  // Optional: the transfer continues into a second buffer (a vectored read
  // or write of len + tail_len contiguous bytes on disk).
  std::byte* tail = nullptr;
  uint32_t tail_len = 0;
  // Optional: filled before `done` runs (on success and on error).
  IoTiming* timing = nullptr;
  // Optional: an op still queued when its deadline passes (MonotonicNanos;
  // 0: none) or its token is cancelled is not started: `done` gets
  // kIoDeadlinePassed or kIoCancelled, and the engine counts it as
  // abandoned, not as an error.
  uint64_t deadline_ns = 0;
  CancelToken cancel;
};

// What `done` gets for an op given up before it started: values no system
// call returns, so a device's own -ECANCELED or -ETIME stays an I/O error.
inline constexpr int32_t kIoCancelled = INT32_MIN + 1;
inline constexpr int32_t kIoDeadlinePassed = INT32_MIN + 2;
inline bool IsAbandoned(int32_t res) { return res == kIoCancelled || res == kIoDeadlinePassed; }

// Whether a queued op must be given up instead of started: 0 if not, else
// kIoCancelled or kIoDeadlinePassed. Engines ask when they take an op off
// their queue.
inline int32_t AbandonReason(uint64_t deadline_ns, const CancelToken& cancel) {
  if (cancel.cancelled()) return kIoCancelled;
  if (deadline_ns != 0 && MonotonicNanos() >= deadline_ns) return kIoDeadlinePassed;
  return 0;
}
inline int32_t AbandonReason(const IoOp& op) { return AbandonReason(op.deadline_ns, op.cancel); }

struct IoEngineStats {
  uint64_t reads = 0, writes = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t errors = 0;
  uint64_t abandoned = 0;  // given up before they started (AbandonReason)
  uint64_t in_flight = 0;  // submitted to the device, not yet completed
  uint64_t queued = 0;     // waiting for a free queue slot
};

struct IoEngineOptions {
  std::vector<int> fds;  // the engine does not own them
  // A region ops' buffers usually lie in: registered with io_uring, so ops
  // inside it use READ_FIXED/WRITE_FIXED. May be empty.
  std::byte* registered_base = nullptr;
  size_t registered_bytes = 0;
  uint32_t queue_depth = 32;  // per worker
  uint32_t workers = 1;
};

class IoEngine {
 public:
  IoEngine() = default;
  virtual ~IoEngine() = default;  // implementations drain first
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Thread-safe. "io_uring" or "threads" (and a wrapper's name around it).
  virtual std::string name() const = 0;
  // Thread-safe. Queues the op; never blocks on the device.
  virtual void Submit(IoOp op) = 0;
  // Thread-safe. Returns once every op submitted before the call completed.
  virtual void Drain() = 0;
  // Thread-safe.
  virtual IoEngineStats Stats() const = 0;
};

// io_uring, or an error saying why not (the caller may fall back).
absl::StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(const IoEngineOptions& opts);
// pread/pwrite on `workers` threads (queue_depth unused beyond 1 per thread).
std::unique_ptr<IoEngine> MakeThreadEngine(const IoEngineOptions& opts);

// Checks whether this process may use io_uring at all; the reason if not.
absl::Status ProbeIoUring();

}  // namespace kvtier

#endif  // KVTIER_TIERS_IO_ENGINE_H_
