// SPDX-License-Identifier: Apache-2.0
#include "tiers/slot_allocator.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {
namespace {

// Why 2 MiB: a typical KV block (16 tokens of an 8B model in bf16) is 2 MiB,
// and blocks of 64 KiB..1 MiB get 2..32 slots per segment, so a segment
// drains (and can go to another class) after a few dozen frees, while a 1 GiB
// arena has at most 512 segments to keep track of. Larger classes get one
// slot per segment, which is then a plain best-fit allocation.
constexpr uint64_t kSegmentBytes = 2ull << 20;
// A small arena still has this many segments, so one class does not take all
// of it in one go.
constexpr uint64_t kMinSegmentsPerArena = 64;

}  // namespace

SlotAllocator::SlotAllocator(uint64_t capacity_bytes, uint64_t alignment)
    : alignment_(alignment),
      capacity_(std::min<uint64_t>(capacity_bytes / alignment, std::numeric_limits<uint32_t>::max()) * alignment),
      segment_target_(std::max(alignment, std::min(kSegmentBytes, capacity_ / kMinSegmentsPerArena) / alignment *
                                              alignment)) {
  Reset();
}

absl::StatusOr<uint16_t> SlotAllocator::ClassFor(uint64_t rounded) {
  auto it = class_of_bytes_.find(rounded);
  if (it != class_of_bytes_.end()) return it->second;
  if (classes_.size() >= std::numeric_limits<uint16_t>::max()) {
    return absl::ResourceExhaustedError("too many block sizes in one arena");
  }
  const uint16_t cls = static_cast<uint16_t>(classes_.size());
  classes_.push_back(Class{.bytes = rounded});
  class_of_bytes_.emplace(rounded, cls);
  return cls;
}

absl::StatusOr<uint32_t> SlotAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate a slot of 0 bytes");
  const uint64_t rounded = RoundUp(bytes);
  if (bytes > capacity_ || rounded > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", FormatBytes(bytes),
                                                   " is larger than the whole tier (",
                                                   FormatBytes(capacity_), ")"));
  }
  absl::StatusOr<uint16_t> cls = ClassFor(rounded);
  if (!cls.ok()) return cls.status();
  {
    const Class& c = classes_[*cls];
    // A segment that has live slots first, so empty ones stay empty and can go back.
    if (!c.partial.empty()) return TakeSlot(c.partial.back());
    if (!c.empty.empty()) return TakeSlot(c.empty.back());
  }
  const uint64_t class_pages = rounded / alignment_;
  const uint64_t per_segment = std::max<uint64_t>(1, segment_target_ / rounded);
  const uint64_t want_pages = per_segment * class_pages;
  auto fits = runs_by_length_.lower_bound({want_pages, 0});
  if (fits == runs_by_length_.end()) {
    ReleaseEmptySegments();
    fits = runs_by_length_.lower_bound({want_pages, 0});
  }
  uint32_t sg;
  if (fits != runs_by_length_.end()) {
    sg = CarveSegment(*cls, fits->second, static_cast<uint32_t>(per_segment));
  } else if (!runs_by_length_.empty() && runs_by_length_.rbegin()->first >= class_pages) {
    // No run takes a whole segment: a shorter one from the longest run.
    const auto [pages, start] = *runs_by_length_.rbegin();
    sg = CarveSegment(*cls, start, static_cast<uint32_t>(pages / class_pages));
  } else {
    return absl::ResourceExhaustedError(absl::StrCat("no free slot of ", FormatBytes(rounded)));
  }
  if (sg == kNoSegment) return absl::ResourceExhaustedError("segment table full");
  return TakeSlot(sg);
}

absl::StatusOr<uint32_t> SlotAllocator::TakeSlot(uint32_t sg) {
  Segment& s = segments_[sg];
  Class& c = classes_[s.cls];
  uint32_t h;
  if (!s.free.empty()) {
    h = s.free.back();
    s.free.pop_back();
  } else {
    if (!free_handles_.empty()) {
      h = free_handles_.back();
      free_handles_.pop_back();
    } else {
      if (slots_.size() >= std::numeric_limits<uint32_t>::max() - 1) {
        return absl::ResourceExhaustedError("slot handles exhausted");
      }
      h = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    slots_[h].page = static_cast<uint32_t>(s.first_page + uint64_t{s.carved} * (c.bytes / alignment_));
    slots_[h].segment = sg;
    ++s.carved;
  }
  slots_[h].used = 1;
  ++s.live;
  --c.free_slots;
  used_bytes_ += c.bytes;
  ++used_slots_;
  Relist(sg);
  return h;
}

absl::Status SlotAllocator::Free(uint32_t slot) {
  if (!IsAllocated(slot)) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not allocated"));
  }
  const uint32_t sg = slots_[slot].segment;
  Segment& s = segments_[sg];
  Class& c = classes_[s.cls];
  slots_[slot].used = 0;
  --s.live;
  s.free.push_back(slot);
  ++c.free_slots;
  used_bytes_ -= c.bytes;
  --used_slots_;
  // Nothing left in place: the whole range is one run again, for any class.
  if (used_slots_ == 0) {
    Reset();
  } else {
    Relist(sg);
  }
  return absl::OkStatus();
}

uint32_t SlotAllocator::CarveSegment(uint16_t cls, uint64_t run, uint32_t n) {
  uint32_t sg;
  if (!free_segments_.empty()) {
    sg = free_segments_.back();
    free_segments_.pop_back();
  } else {
    if (segments_.size() >= kNoSegment) return kNoSegment;
    sg = static_cast<uint32_t>(segments_.size());
    segments_.emplace_back();
  }
  Class& c = classes_[cls];
  const uint64_t pages = uint64_t{n} * (c.bytes / alignment_);
  TakeRun(run, pages);
  Segment& s = segments_[sg];
  s = Segment{};
  s.first_page = static_cast<uint32_t>(run);
  s.slots = n;
  s.cls = cls;
  c.free_slots += n;
  carved_bytes_ += pages * alignment_;
  carved_slots_ += n;
  ++segment_count_;
  Relist(sg);
  return sg;
}

void SlotAllocator::Relist(uint32_t sg) {
  Segment& s = segments_[sg];
  const List want = s.live == 0 ? List::kEmpty : s.live < s.slots ? List::kPartial : List::kNone;
  if (s.list == want) return;
  Unlist(sg);
  if (want == List::kNone) return;
  std::vector<uint32_t>& v = want == List::kEmpty ? classes_[s.cls].empty : classes_[s.cls].partial;
  s.list = want;
  s.pos = static_cast<uint32_t>(v.size());
  v.push_back(sg);
}

void SlotAllocator::Unlist(uint32_t sg) {
  Segment& s = segments_[sg];
  if (s.list == List::kNone) return;
  std::vector<uint32_t>& v = s.list == List::kEmpty ? classes_[s.cls].empty : classes_[s.cls].partial;
  const uint32_t last = v.back();
  v[s.pos] = last;
  segments_[last].pos = s.pos;
  v.pop_back();
  s.list = List::kNone;
}

void SlotAllocator::ReleaseEmptySegments() {
  for (Class& c : classes_) {
    while (!c.empty.empty()) ReleaseSegment(c.empty.back());
  }
}

void SlotAllocator::ReleaseSegment(uint32_t sg) {
  Unlist(sg);
  Segment& s = segments_[sg];
  Class& c = classes_[s.cls];
  for (uint32_t h : s.free) {
    slots_[h].segment = kNoSegment;
    free_handles_.push_back(h);
  }
  const uint64_t pages = uint64_t{s.slots} * (c.bytes / alignment_);
  c.free_slots -= s.slots;
  carved_bytes_ -= pages * alignment_;
  carved_slots_ -= s.slots;
  --segment_count_;
  AddRun(s.first_page, pages);
  s = Segment{};  // drops the free list's memory too
  free_segments_.push_back(sg);
}

void SlotAllocator::Reset() {
  slots_.clear();
  free_handles_.clear();
  segments_.clear();
  free_segments_.clear();
  for (Class& c : classes_) {
    c.free_slots = 0;
    c.partial.clear();
    c.empty.clear();
  }
  carved_bytes_ = carved_slots_ = segment_count_ = 0;
  runs_.clear();
  runs_by_length_.clear();
  uncarved_pages_ = 0;
  if (capacity_ > 0) AddRun(0, capacity_ / alignment_);
}

void SlotAllocator::AddRun(uint64_t page, uint64_t pages) {
  uncarved_pages_ += pages;
  auto next = runs_.lower_bound(page);
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == page) {
      page = prev->first;
      pages += prev->second;
      runs_by_length_.erase({prev->second, prev->first});
      runs_.erase(prev);
    }
  }
  if (next != runs_.end() && page + pages == next->first) {
    pages += next->second;
    runs_by_length_.erase({next->second, next->first});
    runs_.erase(next);
  }
  runs_.emplace(page, pages);
  runs_by_length_.emplace(pages, page);
}

void SlotAllocator::TakeRun(uint64_t page, uint64_t pages) {
  auto it = runs_.find(page);
  const uint64_t len = it->second;
  runs_by_length_.erase({len, page});
  runs_.erase(it);
  uncarved_pages_ -= pages;
  if (len > pages) {
    runs_.emplace(page + pages, len - pages);
    runs_by_length_.emplace(len - pages, page + pages);
  }
}

uint64_t SlotAllocator::FreeBytesInClass(uint64_t bytes) const {
  auto it = class_of_bytes_.find(RoundUp(bytes));
  if (it == class_of_bytes_.end()) return 0;
  const Class& c = classes_[it->second];
  return c.free_slots * c.bytes;
}

std::vector<SlotAllocator::ClassUsage> SlotAllocator::Classes() const {
  std::vector<ClassUsage> by_class(classes_.size());
  for (const Segment& s : segments_) {
    if (s.slots == 0) continue;  // not a segment now
    const uint64_t slot_bytes = classes_[s.cls].bytes;
    ClassUsage& u = by_class[s.cls];
    ++u.segments;
    u.carved_bytes += uint64_t{s.slots} * slot_bytes;
    u.used_bytes += uint64_t{s.live} * slot_bytes;
    if (s.live != 0) u.stranded_bytes += uint64_t{s.slots - s.live} * slot_bytes;
  }
  std::vector<ClassUsage> out;
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (by_class[c].segments == 0) continue;
    by_class[c].slot_bytes = classes_[c].bytes;
    out.push_back(by_class[c]);
  }
  std::sort(out.begin(), out.end(), [](const ClassUsage& a, const ClassUsage& b) { return a.slot_bytes < b.slot_bytes; });
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> SlotAllocator::LiveSlotsOutsideClass(uint64_t bytes) const {
  auto it = class_of_bytes_.find(RoundUp(bytes));
  const int keep = it == class_of_bytes_.end() ? -1 : it->second;
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (uint32_t h = 0; h < slots_.size(); ++h) {
    if (!slots_[h].used) continue;
    const uint32_t sg = slots_[h].segment;
    if (segments_[sg].cls != keep) out.emplace_back(sg, h);
  }
  return out;
}

uint64_t SlotAllocator::largest_uncarved_bytes() const {
  return runs_by_length_.empty() ? 0 : runs_by_length_.rbegin()->first * alignment_;
}

}  // namespace kvtier
