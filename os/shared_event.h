// SPDX-License-Identifier: Apache-2.0
// Events that live in shared memory, so another process can wait on them:
// the host-simulated device's events (and so the simulated form of CUDA IPC
// event handles). Each is two 32-bit counters in a memfd page: `recorded`
// counts records, `completed` is the latest generation whose work finished.
// Waiters sleep on `completed` with a process-shared futex.
//
// The semantics follow CUDA's: a wait (or a stream wait) captures the
// generation recorded when it is issued and is satisfied once that one
// completes; an event never recorded is complete.
#ifndef KVTIER_OS_SHARED_EVENT_H_
#define KVTIER_OS_SHARED_EVENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "os/shm.h"

namespace kvtier::os {

struct SharedEventState {
  std::atomic<uint32_t> recorded;
  std::atomic<uint32_t> completed;
};
static_assert(sizeof(SharedEventState) == 8);

// The generation a wait issued now must see complete.
inline uint32_t EventTarget(const SharedEventState& e) { return e.recorded.load(std::memory_order_acquire); }
// A new record: returns its generation.
uint32_t EventRecord(SharedEventState& e);
// Generation `gen`'s work is done (generations complete in order on one
// stream; a late, older completion never moves `completed` back).
void EventComplete(SharedEventState& e, uint32_t gen);
// True once generation `gen` (or a later one) completed. Counters wrap.
bool EventReached(const SharedEventState& e, uint32_t gen);
// Sleeps until EventReached(e, gen) or `timeout`; false on the timeout.
bool EventWait(SharedEventState& e, uint32_t gen, std::chrono::nanoseconds timeout);

// Memfd pages of event states, handed out one at a time (the simulated
// device's pool). Thread-safe.
class SharedEventPool {
 public:
  static constexpr uint64_t kPageBytes = 4096;
  static constexpr uint32_t kPerPage = kPageBytes / sizeof(SharedEventState);

  struct Slot {
    SharedEventState* state = nullptr;
    uint32_t page = 0;
    uint32_t index = 0;
  };
  // A slot on a page that holds only `group`'s events (a page is unmapped
  // and closed once all its slots are free: never reused by another group,
  // since whoever it was exported to may still map it). Pages are
  // sealed against new writable mappings: whoever the page is exported to
  // can only read it, and sees no other group's events.
  absl::StatusOr<Slot> Allocate(uint64_t group = 0);
  void Free(const Slot& slot);
  // The page's memfd (not a duplicate) and the slot's byte offset in it.
  int PageFd(uint32_t page) const;
  static uint64_t OffsetOf(const Slot& slot) { return uint64_t{slot.index} * sizeof(SharedEventState); }

 private:
  struct Page {
    UniqueFd fd;
    MappedRegion region;
    uint64_t group = 0;
    std::vector<uint32_t> free;    // free slot indices
  };
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Page>> pages_ ABSL_GUARDED_BY(mu_);
};

// An event state another process exported: its memfd mapped here.
class ImportedEvent {
 public:
  // InvalidArgument unless fd is a memfd page holding a state at `offset`.
  // The page is mapped read-only: an importer waits for the event, only its
  // exporter records it.
  static absl::StatusOr<ImportedEvent> Open(int fd, uint64_t offset);
  SharedEventState& state() const { return *state_; }

 private:
  std::shared_ptr<MappedRegion> region_;
  SharedEventState* state_ = nullptr;
};

}  // namespace kvtier::os

#endif  // KVTIER_OS_SHARED_EVENT_H_
