// SPDX-License-Identifier: Apache-2.0
// A FIFO of the identities of evicted blocks ("ghosts": S3-FIFO's keys
// evicted young, ARC's B1 and B2), kept compact. A ghost is a 32-bit
// fingerprint of its key in a ring, in the order it arrived, found through
// an open-addressed table of ring positions (linear probing, deletion by
// backward shift): 4 to 4.5 bytes in the ring and 4.5 to 5 in the table
// (80-88% full), where a hash map of 64-bit keys beside a deque of (key,
// stamp) entries cost ~40-60 bytes a ghost. The policies keep up to 1.5
// (S3-FIFO) and 1 (ARC) ghosts per block the tier holds: in a tier that
// evicts, ghosts were the largest part of what the daemon spends per block
// on policy (kvtier-bench lookup, after churn).
//
// Two keys with the same fingerprint are one ghost: a block may be taken
// for a ghost it is not (n / 2^32 of lookups with n ghosts held: ~4e-4 at
// 1.8M), and pushing one forgets the other. Either changes where a policy
// puts a block, never what it serves.
//
// Not thread-safe: the owning policy's caller holds its lock.
#ifndef KVTIER_POLICIES_GHOST_FIFO_H_
#define KVTIER_POLICIES_GHOST_FIFO_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class GhostFifo {
 public:
  // Ghosts beyond this many (~50M): the oldest is forgotten. Ring indexes
  // have 26 bits in the table, and the ring keeps an eighth more entries
  // than it holds ghosts.
  static constexpr size_t kMaxRing = (size_t{1} << 26) - 1;
  static constexpr size_t kMaxGhosts = kMaxRing * 3 / 4;

  bool Contains(uint64_t key) const;
  // Forgets the key; true if it was a ghost.
  bool Erase(uint64_t key);
  // The key becomes the newest ghost (moved there if it was one already).
  void Push(uint64_t key);
  // Forgets the oldest ghost; false when there is none.
  bool DropOldest();
  size_t size() const { return live_; }
  // Bytes held (ring and table), for tests and bookkeeping.
  size_t memory_bytes() const { return (ring_.capacity() + table_.capacity()) * sizeof(uint32_t); }

 private:
  static constexpr size_t kMinRing = 64;
  static constexpr size_t kNpos = ~size_t{0};
  // A table entry: the ring index + 1 in its low 26 bits (0: empty), 6 bits
  // of the fingerprint above them, so most probes past other ghosts do not
  // read the ring. Its low bits: the home slot comes from its high bits, so
  // neighbours in the table share those (a review measured the top 6 bits
  // as the tag: every probe read the ring; the low 6: 1.6% of them).
  static constexpr int kIndexBits = 26;
  static constexpr uint32_t kIndexMask = (uint32_t{1} << kIndexBits) - 1;
  static uint32_t Fingerprint(uint64_t key);  // never 0
  static uint32_t Tag(uint32_t fp) { return fp & ((uint32_t{1} << (32 - kIndexBits)) - 1); }
  size_t Home(uint32_t fp) const {  // in [0, table size)
    return static_cast<size_t>((uint64_t{fp} * table_.size()) >> 32);
  }
  size_t Next(size_t i) const { return i + 1 == table_.size() ? 0 : i + 1; }
  size_t RingNext(size_t i) const { return i + 1 == ring_.size() ? 0 : i + 1; }
  size_t Find(uint32_t fp) const;  // its table index, or kNpos
  void EraseAt(size_t t);          // the ghost at table index t
  void Insert(size_t ring_index);
  // Room for one more ghost at the ring's end and in the table.
  void Reserve();
  // Lays the live ghosts out in order at the start of a new ring with room
  // for an eighth more and rebuilds the table for them (80% full).
  void Relayout();
  void ShrinkIfSparse() {
    if (ring_.size() > 4 * kMinRing && live_ * 8 < ring_.size()) Relayout();
  }

  std::vector<uint32_t> ring_;  // fingerprints, oldest at head_; 0: erased
  size_t head_ = 0;             // ring index of the oldest entry
  size_t used_ = 0;             // entries from head_ on, erased ones included
  std::vector<uint32_t> table_;
  size_t live_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_GHOST_FIFO_H_
