// SPDX-License-Identifier: Apache-2.0
// On-disk formats of the NVMe tier. Plain data, little-endian, fixed sizes,
// each with a magic, a version and an xxh3 checksum of its own bytes. Changing
// a layout bumps kNvmeFormatVersion; a journal of another version is refused
// at start with a message saying what to do.
//
// Slab files hold fixed-size slots: [SlotHeader in a 4 KiB sector | payload
// rounded up to 4 KiB]. The journal is an append-only file of JournalRecords.
#ifndef KVTIER_TIERS_NVME_FORMAT_H_
#define KVTIER_TIERS_NVME_FORMAT_H_

#include <xxhash.h>

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvtier {

inline constexpr uint32_t kNvmeFormatVersion = 1;
inline constexpr uint64_t kSlotHeaderMagic = 0x31544f4c53545654ull;  // "TVTSLOT1"
inline constexpr uint32_t kJournalMagic = 0x4a54564bu;              // "KVTJ"
inline constexpr uint64_t kSectorBytes = 4096;

struct SlotHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t generation;
  uint32_t segment;
  uint32_t slot;
  uint64_t payload_bytes;
  uint64_t payload_xxh3;
  uint8_t ns[32];
  uint8_t key[32];
  uint64_t checksum;  // xxh3 of the bytes above
};
static_assert(sizeof(SlotHeader) == 120);
static_assert(std::is_trivially_copyable_v<SlotHeader>);

enum class JournalType : uint8_t {
  kFormat = 1,   // first record: segment_bytes in slot_bytes, segment count in slot
  kSegment = 2,  // segment is cut into slots of slot_bytes (0: unassigned again)
  kAssign = 3,   // a block was written to (segment, slot) with generation
  kFree = 4,     // (segment, slot) no longer holds a block
};

struct JournalRecord {
  uint32_t magic;
  uint8_t type;
  uint8_t version;
  uint16_t reserved0;
  uint64_t seq;  // set by the journal, strictly increasing
  uint32_t segment;
  uint32_t slot;
  uint64_t generation;
  uint64_t slot_bytes;
  uint64_t payload_bytes;
  uint64_t payload_xxh3;
  uint8_t ns[32];
  uint8_t key[32];
  uint64_t tenant_hash;
  uint32_t block_tokens;
  uint32_t reserved1;
  uint64_t checksum;  // xxh3 of the bytes above
};
static_assert(sizeof(JournalRecord) == 144);
static_assert(std::is_trivially_copyable_v<JournalRecord>);

template <typename T>
uint64_t ChecksumOf(const T& v) {
  return XXH3_64bits(&v, offsetof(T, checksum));
}
template <typename T>
void Seal(T* v) {
  v->checksum = ChecksumOf(*v);
}
template <typename T>
bool Intact(const T& v) {
  return v.checksum == ChecksumOf(v);
}

inline uint64_t RoundUpSector(uint64_t n) { return (n + kSectorBytes - 1) / kSectorBytes * kSectorBytes; }
// Bytes a slot needs for a payload: one header sector plus the payload.
inline uint64_t SlotBytesFor(uint64_t payload) { return kSectorBytes + RoundUpSector(payload); }

// A segment's slots are numbered in 16 bits.
inline constexpr uint32_t kMaxSlotsPerSegment = 0xffff;
// Slots of `slot_bytes` one segment is cut into.
inline uint64_t NvmeSlotsPerSegment(uint64_t segment_bytes, uint64_t slot_bytes) {
  return slot_bytes == 0 ? 0 : std::min<uint64_t>(segment_bytes / slot_bytes, kMaxSlotsPerSegment);
}
// Blocks of `payload` bytes an NVMe tier of `capacity` bytes over `dirs`
// directories holds: whole segments in each directory, whole slots (header
// sector included) in each segment. The tier and the planner (kvtierctl
// capacity) both count with this: the planner once said 150 blocks of
// 2 MiB fit where the tier held 126.
inline uint64_t NvmeBlocksThatFit(uint64_t capacity, uint64_t segment_bytes, uint64_t dirs, uint64_t payload) {
  // A block larger than a segment never fits (and its slot size could wrap).
  if (segment_bytes == 0 || dirs == 0 || payload == 0 || payload > segment_bytes) return 0;
  const uint64_t segments = capacity / dirs / segment_bytes * dirs;
  return segments * NvmeSlotsPerSegment(segment_bytes, SlotBytesFor(payload));
}

}  // namespace kvtier

#endif  // KVTIER_TIERS_NVME_FORMAT_H_
