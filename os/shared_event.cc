// SPDX-License-Identifier: Apache-2.0
#include "os/shared_event.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "os/futex.h"

namespace kvtier::os {

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

absl::StatusOr<SharedEventPool::Slot> SharedEventPool::Allocate(uint64_t group) {
  MutexLock l(&mu_);
  Page* page = nullptr;
  uint32_t page_index = 0;
  // A page of this group with room, else a page nobody owns, else a new one.
  for (uint32_t i = 0; i < pages_.size() && page == nullptr; ++i) {
    Page* p = pages_[i].get();
    if (p != nullptr && p->group == group && !p->free.empty()) page = p, page_index = i;
  }
  if (page == nullptr) {
    auto p = std::make_unique<Page>();
    ASSIGN_OR_RETURN(p->fd, CreateResizeSealedMemfd("kvtier-events", kPageBytes));
    ASSIGN_OR_RETURN(p->region, MappedRegion::Map(p->fd.get(), kPageBytes));
    RETURN_IF_ERROR(SealFutureWrites(p->fd.get()));  // ours stays writable; no one else's will be
    for (uint32_t i = kPerPage; i-- > 0;) p->free.push_back(i);
    // A fresh page each time: a page a group gave back may still be mapped
    // by the engine it was exported to, so it never serves another group.
    page_index = static_cast<uint32_t>(pages_.size());
    for (uint32_t i = 0; i < pages_.size(); ++i) {
      if (pages_[i] == nullptr) {
        page_index = i;
        break;
      }
    }
    page = p.get();
    p->group = group;
    if (page_index == pages_.size()) {
      pages_.push_back(std::move(p));
    } else {
      pages_[page_index] = std::move(p);
    }
  }
  const uint32_t index = page->free.back();
  page->free.pop_back();
  auto* states = reinterpret_cast<SharedEventState*>(page->region.data());
  Slot s{&states[index], page_index, index};
  // A fresh event is complete: whoever reuses the slot starts level.
  s.state->recorded.store(0, std::memory_order_relaxed);
  s.state->completed.store(0, std::memory_order_release);
  return s;
}

void SharedEventPool::Free(const Slot& slot) {
  MutexLock l(&mu_);
  Page& p = *pages_[slot.page];
  p.free.push_back(slot.index);
  if (p.free.size() == kPerPage) pages_[slot.page].reset();  // unmapped and closed: never handed to another group
}

int SharedEventPool::PageFd(uint32_t page) const {
  MutexLock l(&mu_);
  return page < pages_.size() && pages_[page] != nullptr ? pages_[page]->fd.get() : -1;
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
  ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::MapReadOnly(fd, size));
  ImportedEvent e;
  e.region_ = std::make_shared<MappedRegion>(std::move(region));
  e.state_ = reinterpret_cast<SharedEventState*>(e.region_->data() + offset);
  return e;
}

}  // namespace kvtier::os
