// Fixed-size slots carved from a byte range, by size class.
//
// Each namespace fixes its block size, and a tenant's arena serves several
// namespaces, so slots come in size classes (the block size rounded up to the
// alignment). A slot is carved from the unused end of the range the first time
// its class needs one; freed slots go to their class's free list and are
// reused by that class only. Blocks are never split across slots.
//
// Memory: 8 bytes per slot (offset in pages, class, state).
#ifndef KVTIER_TIERS_SLOT_ALLOCATOR_H_
#define KVTIER_TIERS_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvtier {

class SlotAllocator {
 public:
  // Thread contract: not thread-safe; the owner serializes calls.
  SlotAllocator(uint64_t capacity_bytes, uint64_t alignment = 4096);

  // A slot of at least `bytes`. ResourceExhausted when neither the class's
  // free list nor the uncarved rest of the range can serve it.
  absl::StatusOr<uint32_t> Allocate(uint64_t bytes);
  // InvalidArgument for a slot that is not allocated.
  absl::Status Free(uint32_t slot);

  bool IsAllocated(uint32_t slot) const { return slot < slots_.size() && slots_[slot].used; }
  uint64_t Offset(uint32_t slot) const { return uint64_t{slots_[slot].page} * alignment_; }
  uint64_t Bytes(uint32_t slot) const { return class_bytes_[slots_[slot].size_class]; }

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t used_slots() const { return used_slots_; }
  uint64_t carved_bytes() const { return carved_; }
  uint64_t free_slots() const;
  // Slots carved so far (allocated or free); handles are below this.
  uint32_t slot_count() const { return static_cast<uint32_t>(slots_.size()); }
  uint64_t RoundUp(uint64_t bytes) const { return (bytes + alignment_ - 1) / alignment_ * alignment_; }

 private:
  struct Slot {
    uint32_t page;        // offset / alignment
    uint16_t size_class;  // index into class_bytes_
    uint8_t used;
    uint8_t pad;
  };
  static_assert(sizeof(Slot) == 8);

  const uint64_t capacity_;
  const uint64_t alignment_;
  uint64_t carved_ = 0;
  uint64_t used_bytes_ = 0;
  uint64_t used_slots_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint64_t> class_bytes_;
  std::vector<std::vector<uint32_t>> free_by_class_;
  absl::flat_hash_map<uint64_t, uint16_t> class_of_bytes_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_SLOT_ALLOCATOR_H_
