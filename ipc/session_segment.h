// SPDX-License-Identifier: Apache-2.0
// A session's shared segment: header, request ring, completion ring, scratch.
// The daemon creates it (Create); the client maps the fd it received and
// checks it (Open). Both then build ring views over the same memory.
#ifndef KVTIER_IPC_SESSION_SEGMENT_H_
#define KVTIER_IPC_SESSION_SEGMENT_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "core/unique_fd.h"
#include "ipc/abi.h"
#include "ipc/ring.h"
#include "os/shm.h"

namespace kvtier::ipc {

struct SegmentOptions {
  uint32_t sq_entries = 256;  // rounded up to a power of two
  uint32_t cq_entries = 256;
  uint64_t scratch_bytes = 4ull << 20;
  uint32_t max_keys_per_op = 65536;
};

class SessionSegment {
 public:
  SessionSegment() = default;
  SessionSegment(SessionSegment&&) = default;
  SessionSegment& operator=(SessionSegment&&) = default;

  // Daemon side: a new sealed memfd laid out and initialised.
  static absl::StatusOr<SessionSegment> Create(uint64_t session_id, const SegmentOptions& opts);
  // Client side: maps fd and validates magic, ABI version and layout.
  static absl::StatusOr<SessionSegment> Open(UniqueFd fd);

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(region_.data()); }
  int fd() const { return fd_.get(); }
  uint64_t size() const { return region_.size(); }
  uint32_t max_keys_per_op() const { return layout_.max_keys_per_op; }

  RequestRecord* sq_slots() const;
  CompletionRecord* cq_slots() const;
  std::span<std::byte> scratch() const;

  // Ring ends for each side.
  RingProducer<RequestRecord> ClientSq() const;
  RingConsumer<CompletionRecord> ClientCq() const;
  RingConsumer<RequestRecord> DaemonSq() const;
  RingProducer<CompletionRecord> DaemonCq() const;

 private:
  // A private copy of the layout, taken when the segment was created or
  // validated: the header is writable by the peer, so it is never re-read.
  struct Layout {
    uint64_t sq_offset = 0, cq_offset = 0, scratch_offset = 0, scratch_bytes = 0;
    uint32_t sq_entries = 0, cq_entries = 0, max_keys_per_op = 0;
  };
  void TakeLayout();

  UniqueFd fd_;
  os::MappedRegion region_;
  Layout layout_;
};

// Wakes the daemon's session thread if it sleeps (see SegmentHeader): for
// whoever just gave it work. Thread-safe.
void RingDaemonDoorbell(SegmentHeader* h);

// The bytes a segment with these options occupies.
uint64_t SegmentBytes(const SegmentOptions& opts);

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_SESSION_SEGMENT_H_
