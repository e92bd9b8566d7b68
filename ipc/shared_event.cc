#include "ipc/shared_event.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "ipc/doorbell.h"

namespace kvtier::ipc {

uint32_t EventRecord(SharedEventState& e) { return e.recorded.fetch_add(1, std::memory_order_acq_rel) + 1; }

void EventComplete(SharedEventState& e, uint32_t gen) {
  uint32_t cur = e.completed.load(std::memory_order_acquire);
  while (static_cast<int32_t>(gen - cur) > 0 &&
         !e.completed.compare_exchange_weak(cur, gen, std::memory_order_acq_rel, std::memory_order_acquire)) {
  }
  FutexWakeAll(&e.completed);
}

bool EventReached(const SharedEventState& e, uint32_t gen) {
  return static_cast<int32_t>(e.completed.load(std::memory_order_acquire) - gen) >= 0;
}

bool EventWait(SharedEventState& e, uint32_t gen, std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint32_t cur = e.completed.load(std::memory_order_acquire);
    if (static_cast<int32_t>(cur - gen) >= 0) return true;
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    // Slices, so a wake lost to a peer that died between its store and its
    // wake costs at most one slice.
    FutexWait(&e.completed, cur, std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(50)));
  }
}

absl::StatusOr<SharedEventPool::Slot> SharedEventPool::Allocate() {
  MutexLock l(&mu_);
  if (free_.empty()) {
    auto p = std::make_unique<Page>();
    ASSIGN_OR_RETURN(p->fd, CreateSealedMemfd("kvtier-events", kPageBytes));
    ASSIGN_OR_RETURN(p->region, MappedRegion::Map(p->fd.get(), kPageBytes));
    const auto page = static_cast<uint32_t>(pages_.size());
    auto* states = reinterpret_cast<SharedEventState*>(p->region.data());
    for (uint32_t i = kPerPage; i-- > 0;) free_.push_back(Slot{&states[i], page, i});
    pages_.push_back(std::move(p));
  }
  Slot s = free_.back();
  free_.pop_back();
  // A fresh event is complete: whoever reuses the slot starts level.
  s.state->recorded.store(0, std::memory_order_relaxed);
  s.state->completed.store(0, std::memory_order_release);
  return s;
}

void SharedEventPool::Free(const Slot& slot) {
  MutexLock l(&mu_);
  free_.push_back(slot);
}

int SharedEventPool::PageFd(uint32_t page) const {
  MutexLock l(&mu_);
  return page < pages_.size() ? pages_[page]->fd.get() : -1;
}

absl::StatusOr<ImportedEvent> ImportedEvent::Open(int fd, uint64_t offset) {
  if (fd < 0) return absl::InvalidArgumentError("event handle without its memfd");
  ASSIGN_OR_RETURN(uint64_t size, FdSize(fd));
  if (size != SharedEventPool::kPageBytes || offset % sizeof(SharedEventState) != 0 ||
      offset > size - sizeof(SharedEventState)) {
    return absl::InvalidArgumentError(absl::StrCat("event handle offset ", offset, " does not name an event in its ",
                                                   size, "-byte page"));
  }
  if (!IsSealedAgainstShrink(fd)) return absl::InvalidArgumentError("event page is not a sealed memfd");
  ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::Map(fd, size));
  ImportedEvent e;
  e.region_ = std::make_shared<MappedRegion>(std::move(region));
  e.state_ = reinterpret_cast<SharedEventState*>(e.region_->data() + offset);
  return e;
}

}  // namespace kvtier::ipc
