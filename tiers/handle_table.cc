// SPDX-License-Identifier: Apache-2.0
#include "tiers/handle_table.h"

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {

absl::StatusOr<SlotHandle> HandleTable::Allocate(uint64_t payload_bytes, uint64_t cost, bool transient) {
  if (payload_bytes == 0 || payload_bytes > max_block_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", payload_bytes, " bytes does not fit the ", name_,
                                                   " tier (1 to ", max_block_bytes_, " bytes)"));
  }
  MutexLock l(&mu_);
  if (!transient && used_bytes_ + cost > capacity_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the ", name_, " tier's handles are full (", FormatBytes(capacity_bytes_), ")"));
  }
  SlotHandle s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (slot_bytes_.size() >= UINT32_MAX - 1) return absl::ResourceExhaustedError("out of slot handles");
    s = static_cast<SlotHandle>(slot_bytes_.size());
    slot_bytes_.push_back(0);
  }
  if (transient) {
    slot_bytes_[s] = cost | kTransient;
    return s;
  }
  slot_bytes_[s] = cost;
  used_bytes_ += cost;
  ++used_slots_;
  return s;
}

absl::Status HandleTable::Free(SlotHandle slot) {
  MutexLock l(&mu_);
  if (slot >= slot_bytes_.size() || slot_bytes_[slot] == 0) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " of the ", name_, " tier is not allocated"));
  }
  if ((slot_bytes_[slot] & kTransient) == 0) {
    used_bytes_ -= slot_bytes_[slot];
    --used_slots_;
  }
  slot_bytes_[slot] = 0;
  free_slots_.push_back(slot);
  return absl::OkStatus();
}

uint64_t HandleTable::SlotBytes(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slot < slot_bytes_.size() ? slot_bytes_[slot] & ~kTransient : 0;
}

TierUsage HandleTable::Usage() const {
  MutexLock l(&mu_);
  return {capacity_bytes_, used_bytes_, used_slots_, free_slots_.size()};
}

}  // namespace kvtier
