// SPDX-License-Identifier: Apache-2.0
// Gives the heap's free pages back to the kernel once the tiers have
// churned. Evictions free block records, index slots, policy entries and
// ghosts all over the heap (a demotion keeps the record but not the rest);
// glibc returns only the top of its heap by itself, so the holes between
// live allocations stay resident. kvtier-bench lookup, after 2M blocks
// churned through a 1.2M-block tier (RssAnon per block still indexed):
// 161.8-164.0 B without trimming, 156.0-156.4 B with it; a trim there took
// 0.1-0.5 ms. A trim's time grows with the heap's free chunks: status
// stats.heap_trim_ms says what they cost.
#ifndef KVTIER_DAEMON_HEAP_TRIM_H_
#define KVTIER_DAEMON_HEAP_TRIM_H_

#include <cstdint>
#include <optional>

namespace kvtier {

class HeapTrimmer {
 public:
  // A trim is due once the blocks evicted since the last one reach an eighth
  // of those still indexed, and at least kMinFreed: a churning tier is
  // trimmed about once per eighth of its contents, an idle one never.
  static constexpr uint64_t kMinFreed = 4096;
  // And at most once per kMinIntervalNs, however small the tier.
  static constexpr uint64_t kMinIntervalNs = 1'000'000'000;

  static bool Due(uint64_t freed_since, uint64_t indexed) {
    const uint64_t eighth = indexed / 8;
    return freed_since >= (eighth > kMinFreed ? eighth : kMinFreed);
  }

  // `freed_total`: evictions from any tier and invalidations so far (it only
  // grows);
  // `indexed`: blocks indexed now. Trims when due; returns how long the
  // trim took in nanoseconds, or nothing when none was due (or the C
  // library cannot trim).
  std::optional<uint64_t> MaybeTrim(uint64_t now_ns, uint64_t freed_total, uint64_t indexed);

 private:
  uint64_t freed_at_last_ = 0;
  uint64_t last_ns_ = 0;
  bool trimmed_ = false;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_HEAP_TRIM_H_
