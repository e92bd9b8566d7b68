// SPDX-License-Identifier: Apache-2.0
// Admission by evidence of reuse: a lower tier (NVMe, the shared tier) takes
// a block only when requests have asked for it at least `min_uses` times.
// A write that is never read back costs bandwidth that loads need and wears
// the flash; whether the gate pays depends on the workload (docs/
// configuration.md, tiers.nvme.admission_min_uses, has the measurements).
//
// Uses are counted per block identity (EvictionPolicy key) in a count-min
// sketch of 4-bit counters, four per key, so the history outlives the block
// (a block evicted and asked for again still has its count) at half a byte
// per counter; counts saturate at 15 and every count is halved after
// counters / 8 uses (the TinyLFU reset), so the history follows the workload
// and a block asked for once rarely finds all four counters raised by others.
// An estimate may be too high (collisions), never too low.
//
// Thread-safe: counters are atomics, updated without a lock; a halving that
// races an increment may lose that increment (an estimate is approximate).
#ifndef KVTIER_POLICIES_REUSE_GATE_H_
#define KVTIER_POLICIES_REUSE_GATE_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace kvtier {

class ReuseGate {
 public:
  // min_uses <= 1 admits every block (no sketch is kept); counters: about
  // this many 4-bit counters (rounded up to a power of two, at least 1024).
  // The history is counters / 8 uses: give 8 per block the tiers hold for
  // a history of one tier's worth of uses (4 bytes per block).
  ReuseGate(uint32_t min_uses, uint64_t counters);

  // One request asked for the block (a lookup that names it, hit or miss).
  void Record(uint64_t key);
  // The block's estimated uses (0..15).
  uint32_t Estimate(uint64_t key) const;
  bool Admit(uint64_t key) const { return Admit(key, min_uses_); }
  // With another threshold (one sketch serving several tiers' gates); a
  // gate built disabled (min_uses <= 1) admits everything whatever is asked.
  bool Admit(uint64_t key, uint32_t min_uses) const {
    return min_uses <= 1 || !enabled() || Estimate(key) >= min_uses;
  }
  // The history both kvtierd and the simulator give the sketch, in uses:
  // about the blocks the tiers hold (`tier_bytes`, host memory and NVMe),
  // taken at 128 KiB a block (a block's uses must outlive its stay in host
  // memory), between 64K and 8M uses. The sketch takes 4 bytes per use of
  // history (8 counters of 4 bits): 256 KiB to 32 MiB.
  static uint64_t HistoryUsesFor(uint64_t tier_bytes) {
    const uint64_t uses = tier_bytes / (128 << 10);
    return uses < (1 << 16) ? (1 << 16) : uses > (1 << 23) ? (1 << 23) : uses;
  }
  uint32_t min_uses() const { return min_uses_; }
  bool enabled() const { return min_uses_ > 1; }
  // Bytes the sketch takes.
  uint64_t bytes() const { return words_ * sizeof(uint64_t); }

 private:
  // The counter positions of a key: four 4-bit fields, each in a word.
  void Positions(uint64_t key, uint64_t (&word)[4], uint32_t (&shift)[4]) const;
  void Halve();

  const uint32_t min_uses_;
  uint64_t words_ = 0;  // a power of two (16 counters each)
  std::unique_ptr<std::atomic<uint64_t>[]> table_;
  std::atomic<uint64_t> uses_{0};
  uint64_t reset_every_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_REUSE_GATE_H_
