// SPDX-License-Identifier: Apache-2.0
// The shared tiers' side of the store, in one place (the redis and fs
// kinds: lower tiers whose shared() is true, which other nodes write too):
// - which lanes of the chain are shared;
// - the probe: where the local tiers end a lookup's hit prefix, each shared
//   lane is asked which of the next blocks it holds, within a budget, a
//   per-tenant rate and busy bound, and size bounds; the present run is
//   adopted as copies in the lanes that hold them;
// - the write policy (tiers.remote.write_policy): which blocks a node
//   publishes for the others besides what the cascade moves down (the
//   cascade itself is the migrator's), through the lane's admission gate,
//   paused per tenant after a failed write.
// BlockStore holds one and calls it from its lookups and commits.
#ifndef KVTIER_STORE_SHARED_TIERS_H_
#define KVTIER_STORE_SHARED_TIERS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "core/units.h"
#include "kvtier/types.h"
#include "store/host_residency.h"
#include "store/shared_writes.h"
#include "store/store_books.h"
#include "tiers/block_tier.h"

namespace kvtier {

class Migrator;
struct SessionHoldings;

class SharedTiers {
 public:
  struct Options {
    // Reloadable (SetPolicy).
    uint32_t probe_budget_us = 2000;  // 0: lookups never ask
    SharedWrites writes = SharedWrites::kDemoted;
    uint32_t probe_max_blocks = 256;       // blocks one probe asks about
    uint32_t probe_blocks_per_s = 50000;   // per tenant: a token bucket, one second deep
    uint32_t records_per_tenant = 262144;  // per tenant: blocks indexed in the shared lanes
    uint64_t min_block_bytes = 4096;       // smaller blocks never go there
  };
  SharedTiers(StoreBooks& books, Migrator& migrator, const Options& opts);

  // Setup (AttachLowerTier, before sessions start): lane `index` is shared.
  void AddLane(uint8_t index) { lanes_.push_back(index); }
  // In chain order. The first takes publishes; lookups ask every one.
  const std::vector<uint8_t>& lanes() const { return lanes_; }
  bool empty() const { return lanes_.empty(); }
  bool IsShared(uint8_t i) const { return i < books_.lanes.size() && books_.lanes[i]->tier->shared(); }

  // A config reload of the probe budget and write policy. Thread-safe.
  void SetPolicy(uint32_t probe_budget_us, SharedWrites writes) {
    budget_us_.store(probe_budget_us, std::memory_order_relaxed);
    writes_.store(writes, std::memory_order_relaxed);
  }
  uint32_t budget_us() const { return budget_us_.load(std::memory_order_relaxed); }
  // Whether the write policy is `w` and there is a lane to write to.
  bool Publishes(SharedWrites w) const { return !lanes_.empty() && writes_.load(std::memory_order_relaxed) == w; }

  // --- the probe
  // How many blocks from `from` to ask about (0: none; otherwise the
  // tenant's busy slot is taken: the answer's handler gives it back).
  size_t ProbeBlocks(SessionHoldings& s, std::span<const BlockKey> keys, size_t from);
  // Asks every shared lane that takes blocks of this size at once about n
  // blocks from `from`; `answered` runs once, with each block's holder (the
  // first lane in the chain that said so, kNoLane where none did), when the
  // last answered or the deadline passed. Returns what the lanes that
  // answered so far say, callable any time.
  static constexpr uint8_t kNoLane = 0xff;
  std::function<std::vector<uint8_t>()> Ask(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                            size_t n, uint64_t deadline_ns,
                                            absl::AnyInvocable<void(std::vector<uint8_t>) &&> answered);
  // Asks and waits up to the budget (tests and tools; a session asks first
  // and keeps serving), then adopts what was found. Returns how many.
  uint32_t ProbeAndAdopt(SessionHoldings& s, std::span<const BlockKey> keys, size_t from);
  // Indexes the present run that starts at `from` as copies in the lanes
  // that hold them (within each lane's room and the tenant's record bound).
  // Returns how many.
  uint32_t Adopt(SessionHoldings& s, std::span<const BlockKey> keys, size_t from, const std::vector<uint8_t>& holder);

  // --- the write policy
  // Queues r (io_ref taken here) for a write to the shared tier after the
  // reply, unless it was written there already; under r's shard lock.
  void QueuePublishLocked(SessionHoldings& s, BlockRecord* r);
  // Starts the writes QueuePublishLocked queued, to the first shared lane.
  void StartPublishes(SessionHoldings& s);
  // Thread-safe. Whether tenant t's publishes are paused: one of its
  // writes failed (the cluster down or full, or t's user refused) within
  // the last second, so its hits do not queue copies that would fail too.
  // Per tenant: one tenant's wrong password pauses nobody else.
  static bool PublishPaused(const HostResidency& t) {
    return MonotonicNanos() < t.publish_paused_until_ns.load(std::memory_order_relaxed);
  }

 private:
  std::vector<BlockMeta> ProbeMetas(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                    size_t n) const;
  // Writes r's host copy to `lane` for other nodes, as a value this node
  // keeps no copy handle on (the tier's eviction decides how long it
  // stays); marks r published once it landed. Takes over the io_ref the
  // caller took on r. Skipped (counted) when r is no longer a ready host
  // block, was published already, or too many such writes are in flight.
  // Clears r->publishing.
  void Publish(HostResidency& t, BlockRecord* r, LowerLane& lane);
  static void PausePublishes(HostResidency& t);

  StoreBooks& books_;
  Migrator& migrator_;  // lower slots for adopted blocks
  const Options opts_;
  std::vector<uint8_t> lanes_;  // in chain order
  std::atomic<uint32_t> budget_us_;
  std::atomic<SharedWrites> writes_;
  // Publishes in flight, at most kMaxPublishing (each holds its block's
  // host slot and a copy of its bytes in a write command).
  static constexpr uint32_t kMaxPublishing = 256;
  std::atomic<uint32_t> publishing_{0};
  static constexpr uint64_t kPublishPauseNs = 1'000'000'000;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_SHARED_TIERS_H_
