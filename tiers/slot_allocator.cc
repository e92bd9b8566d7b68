#include "tiers/slot_allocator.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {

SlotAllocator::SlotAllocator(uint64_t capacity_bytes, uint64_t alignment)
    : capacity_(capacity_bytes / alignment * alignment), alignment_(alignment) {}

absl::StatusOr<uint32_t> SlotAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate a slot of 0 bytes");
  const uint64_t rounded = RoundUp(bytes);
  if (rounded > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", FormatBytes(bytes),
                                                   " is larger than the whole tier (",
                                                   FormatBytes(capacity_), ")"));
  }
  auto it = class_of_bytes_.find(rounded);
  if (it != class_of_bytes_.end() && !free_by_class_[it->second].empty()) {
    std::vector<uint32_t>& fl = free_by_class_[it->second];
    const uint32_t slot = fl.back();
    fl.pop_back();
    slots_[slot].used = 1;
    used_bytes_ += rounded;
    ++used_slots_;
    return slot;
  }
  if (capacity_ - carved_ < rounded) {
    return absl::ResourceExhaustedError(absl::StrCat("no free slot of ", FormatBytes(rounded)));
  }
  if (slots_.size() >= std::numeric_limits<uint32_t>::max() - 1) {
    return absl::ResourceExhaustedError("slot handles exhausted");
  }
  uint16_t cls;
  if (it == class_of_bytes_.end()) {
    if (class_bytes_.size() >= std::numeric_limits<uint16_t>::max()) {
      return absl::ResourceExhaustedError("too many block sizes in one arena");
    }
    cls = static_cast<uint16_t>(class_bytes_.size());
    class_bytes_.push_back(rounded);
    free_by_class_.emplace_back();
    class_of_bytes_.emplace(rounded, cls);
  } else {
    cls = it->second;
  }
  const uint32_t slot = static_cast<uint32_t>(slots_.size());
  slots_.push_back(Slot{static_cast<uint32_t>(carved_ / alignment_), cls, 1, 0});
  carved_ += rounded;
  used_bytes_ += rounded;
  ++used_slots_;
  return slot;
}

absl::Status SlotAllocator::Free(uint32_t slot) {
  if (!IsAllocated(slot)) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not allocated"));
  }
  Slot& s = slots_[slot];
  s.used = 0;
  used_bytes_ -= class_bytes_[s.size_class];
  --used_slots_;
  free_by_class_[s.size_class].push_back(slot);
  return absl::OkStatus();
}

uint64_t SlotAllocator::free_slots() const { return slots_.size() - used_slots_; }

}  // namespace kvtier
