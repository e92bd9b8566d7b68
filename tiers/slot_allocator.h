// SPDX-License-Identifier: Apache-2.0
// Fixed-size slots carved from a byte range, by size class.
//
// Each namespace fixes its block size, and a tenant's arena serves several
// namespaces, so slots come in size classes (the block size rounded up to the
// alignment). Blocks are never split across slots.
//
// The range is handed to classes in segments: a run of whole slots of one
// class, about SegmentTarget() bytes (one slot when the class is larger).
// A class takes its slots from its own segments and carves a new segment only
// when those are full. A segment whose slots are all free stays with its class
// (so a block size that comes and goes does not re-carve) until some class
// finds no room: then every empty segment goes back to the uncarved range,
// where neighbours merge, and any class can carve it again. When the last
// live slot is freed the whole range is uncarved at once. Before segments, a
// class kept what it had carved forever: an arena once filled with one block
// size refused every other size until restart.
//
// Offsets never move: a live slot keeps its offset until it is freed. Handles
// of slots whose segment went back are reused.
//
// Memory: 8 bytes per carved slot (offset in pages, segment, state), 4 more
// while it is free, and ~64 bytes per segment.
#ifndef KVTIER_TIERS_SLOT_ALLOCATOR_H_
#define KVTIER_TIERS_SLOT_ALLOCATOR_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvtier {

class SlotAllocator {
 public:
  static constexpr uint32_t kNoSegment = 0x7fffffff;
  // One size class: what its segments hold.
  struct ClassUsage {
    uint64_t slot_bytes = 0;
    uint64_t segments = 0;
    uint64_t carved_bytes = 0;  // in its segments
    uint64_t used_bytes = 0;    // in its live slots
    // Free slots in segments that also hold live ones: room no other block
    // size can use until every block there is gone (empty segments go back
    // to any size when one needs room).
    uint64_t stranded_bytes = 0;
    uint64_t free_bytes() const { return carved_bytes - used_bytes; }
  };

  // Thread contract: not thread-safe; the owner serializes calls.
  // A capacity over 2^32 - 1 pages is cut to that (offsets are kept in pages).
  SlotAllocator(uint64_t capacity_bytes, uint64_t alignment = 4096);

  // A slot of at least `bytes`. ResourceExhausted when the class has no free
  // slot and no uncarved run of the range (after taking back every empty
  // segment) holds one.
  absl::StatusOr<uint32_t> Allocate(uint64_t bytes);
  // InvalidArgument for a slot that is not allocated.
  absl::Status Free(uint32_t slot);

  bool IsAllocated(uint32_t slot) const { return slot < slots_.size() && slots_[slot].used; }
  // Offset and size of an allocated slot; 0 for any other handle.
  uint64_t Offset(uint32_t slot) const {
    return IsAllocated(slot) ? uint64_t{slots_[slot].page} * alignment_ : 0;
  }
  uint64_t Bytes(uint32_t slot) const {
    return IsAllocated(slot) ? classes_[segments_[slots_[slot].segment].cls].bytes : 0;
  }

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t used_slots() const { return used_slots_; }
  // Bytes inside segments (allocated or free slots).
  uint64_t carved_bytes() const { return carved_bytes_; }
  // Slots inside segments that are free: what classes can take without carving.
  uint64_t free_slots() const { return carved_slots_ - used_slots_; }
  // Bytes the class of `bytes` holds in free slots of its segments.
  uint64_t FreeBytesInClass(uint64_t bytes) const;
  // Bytes in no segment, and the longest such run.
  uint64_t uncarved_bytes() const { return (uncarved_pages_) * alignment_; }
  uint64_t largest_uncarved_bytes() const;
  uint64_t segment_count() const { return segment_count_; }
  // Handles are below this.
  uint32_t slot_count() const { return static_cast<uint32_t>(slots_.size()); }
  uint64_t RoundUp(uint64_t bytes) const { return (bytes + alignment_ - 1) / alignment_ * alignment_; }
  // A segment's size for classes up to it: 2 MiB, or 1/64 of a smaller range
  // (at least one page), so a small arena still has room for several classes.
  uint64_t SegmentTarget() const { return segment_target_; }
  // Slots of `bytes` in one segment of its class (at least 1).
  uint64_t SlotsPerSegment(uint64_t bytes) const { return std::max<uint64_t>(1, segment_target_ / RoundUp(bytes)); }

  // Classes that hold at least one segment, smallest slots first.
  std::vector<ClassUsage> Classes() const;
  // Live slots of every class but that of `bytes`, as (segment, slot), for
  // emptying whole segments of one size to give them to another.
  std::vector<std::pair<uint32_t, uint32_t>> LiveSlotsOutsideClass(uint64_t bytes) const;

 private:
  struct Slot {
    uint32_t page;          // offset / alignment
    uint32_t segment : 31;  // kNoSegment: the handle is not in use
    uint32_t used : 1;
  };
  static_assert(sizeof(Slot) == 8);

  enum class List : uint8_t { kNone, kPartial, kEmpty };
  struct Segment {
    uint32_t first_page = 0;
    uint32_t slots = 0;    // slots it holds
    uint32_t carved = 0;   // slots given a handle so far (slot i at first_page + i * class pages)
    uint32_t live = 0;
    uint16_t cls = 0;
    List list = List::kNone;  // kNone: full, or not a segment now
    uint32_t pos = 0;         // index in its class's list
    std::vector<uint32_t> free;  // handles of free carved slots
  };
  struct Class {
    uint64_t bytes = 0;
    uint64_t free_slots = 0;        // over its segments
    std::vector<uint32_t> partial;  // segments with live and free slots
    std::vector<uint32_t> empty;    // segments without a live slot
  };

  absl::StatusOr<uint16_t> ClassFor(uint64_t rounded);
  // A free slot of segment `sg`, marked used.
  absl::StatusOr<uint32_t> TakeSlot(uint32_t sg);
  // A new segment of class `cls` from the uncarved run starting at `run`,
  // `n` slots long; kNoSegment when the segment table is full.
  uint32_t CarveSegment(uint16_t cls, uint64_t run, uint32_t n);
  // Puts `sg` on the list its live count calls for.
  void Relist(uint32_t sg);
  void Unlist(uint32_t sg);
  // Every empty segment goes back to the uncarved range.
  void ReleaseEmptySegments();
  void ReleaseSegment(uint32_t sg);
  // Back to one uncarved range (no live slot remains).
  void Reset();
  void AddRun(uint64_t page, uint64_t pages);
  // Takes `pages` from the front of the run starting at `page`.
  void TakeRun(uint64_t page, uint64_t pages);

  const uint64_t alignment_;
  const uint64_t capacity_;
  const uint64_t segment_target_;
  uint64_t used_bytes_ = 0;
  uint64_t used_slots_ = 0;
  uint64_t carved_bytes_ = 0;
  uint64_t carved_slots_ = 0;
  uint64_t segment_count_ = 0;
  uint64_t uncarved_pages_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_handles_;  // handles of slots whose segment went back
  std::vector<Segment> segments_;
  std::vector<uint32_t> free_segments_;  // unused indexes in segments_
  std::vector<Class> classes_;
  absl::flat_hash_map<uint64_t, uint16_t> class_of_bytes_;
  // Uncarved runs, in pages: by start, and by (length, start) for best fit.
  std::map<uint64_t, uint64_t> runs_;
  std::set<std::pair<uint64_t, uint64_t>> runs_by_length_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_SLOT_ALLOCATOR_H_
