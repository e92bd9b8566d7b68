// SPDX-License-Identifier: Apache-2.0
// The client's end of one session: the attach handshake, the mapped segment
// and arena, submitting request records, reaping completions, waiting with
// spin-then-futex, and noticing a daemon that went away. Knows records, not
// operations (client.cc gives them meaning).
#ifndef KVTIER_CLIENT_INTERNAL_RING_SESSION_H_
#define KVTIER_CLIENT_INTERNAL_RING_SESSION_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/unique_fd.h"
#include "ipc/abi.h"
#include "ipc/attach.h"
#include "ipc/ring.h"
#include "ipc/session_segment.h"
#include "os/shm.h"
#include "ipc/unix_socket.h"

namespace kvtier::client_internal {

class ScratchAllocator;

class RingSession {
 public:
  // Connects to socket_path and attaches. Errors carry the daemon's reason.
  static absl::StatusOr<std::unique_ptr<RingSession>> Open(const std::string& socket_path,
                                                           const ipc::AttachRequest& request,
                                                           uint32_t spin_us);
  // Marks the session detached on purpose, so the daemon does not count the
  // hang-up that follows as a crashed client.
  ~RingSession();
  RingSession(const RingSession&) = delete;
  RingSession& operator=(const RingSession&) = delete;

  const ipc::AttachReply& reply() const { return reply_; }
  std::byte* arena() const { return arena_.data(); }
  uint64_t arena_bytes() const { return arena_.size(); }
  uint32_t max_in_flight() const { return slots_mask_ + 1; }
  uint32_t in_flight() const { return in_flight_; }
  uint32_t max_keys_per_op() const { return segment_.max_keys_per_op(); }

  // Scratch space in the shared segment for one operation's keys and
  // results; nullptr when the scratch region is full.
  std::byte* AllocScratch(size_t bytes);
  void FreeScratch(std::byte* p);
  uint64_t ScratchOffset(const std::byte* p) const;

  // Publishes a request (op_id is filled in) and rings the daemon if it
  // sleeps. kBusy when max_in_flight operations are outstanding.
  absl::StatusOr<uint64_t> Submit(ipc::RequestRecord record);
  // The op's completion if it arrived (reaping what is there); never blocks.
  std::optional<ipc::CompletionRecord> TryTake(uint64_t op);
  // Waits for the op's completion, spinning spin_us first, then sleeping on
  // the doorbell in slices, checking that the daemon is alive between them.
  absl::StatusOr<ipc::CompletionRecord> WaitTake(uint64_t op, std::chrono::nanoseconds timeout);

  // Sends one message (with descriptors) on the session socket and waits for
  // the daemon's reply there (KV-cache registration), with the descriptors
  // it carried (at most ipc::kMaxKvRegions).
  absl::StatusOr<ipc::ReceivedMessage> Exchange(std::span<const std::byte> message, std::span<const int> fds,
                                                std::chrono::milliseconds timeout);

  // OK while the session is usable; else why not.
  absl::Status health() const { return broken_; }

 private:
  RingSession() = default;
  void Drain();
  // Polls the socket and the segment's closed flag; false (and broken_ set)
  // when the daemon is gone or closed the session.
  bool CheckAlive();

  struct Slot {
    uint64_t op = 0;  // 0: free
    bool done = false;
    ipc::CompletionRecord completion{};
  };

  UniqueFd socket_;
  ipc::SessionSegment segment_;
  os::MappedRegion arena_;
  ipc::AttachReply reply_;
  ipc::RingProducer<ipc::RequestRecord> sq_;
  ipc::RingConsumer<ipc::CompletionRecord> cq_;
  std::unique_ptr<ScratchAllocator> scratch_;
  std::vector<Slot> slots_;
  uint32_t slots_mask_ = 0;
  uint32_t in_flight_ = 0;
  uint64_t next_op_ = 1;
  uint32_t spin_us_ = 20;
  absl::Status broken_;
};

}  // namespace kvtier::client_internal

#endif  // KVTIER_CLIENT_INTERNAL_RING_SESSION_H_
