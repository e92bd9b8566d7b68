// SPDX-License-Identifier: Apache-2.0
// One block tier below host memory and what the store keeps about it: the
// handles of the blocks this node placed there and their owners, its
// eviction policy, each tenant's use of it (for quotas and fair shares) and
// the loads waiting for a write to it to land. A handle is the tier's own
// locator where the tier has private room (an NVMe slot); for a tier
// addressed by key alone (a shared tier) it is a number of the lane's own,
// and the lane bounds what this node places there by the tier's capacity. Lane 0 takes
// demotions from host memory (NVMe in the daemon); lane i + 1 takes what lane
// i's cascade moves down (migrator_cascade.cc). The migrator decides what
// moves; the lane keeps the books and states the fair-share rule.
#ifndef KVTIER_STORE_LOWER_LANE_H_
#define KVTIER_STORE_LOWER_LANE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "core/mutex.h"
#include "store/block_index.h"
#include "policies/eviction_policy.h"
#include "tiers/block_tier.h"

namespace kvtier {

class LowerLane {
 public:
  // A tenant's use of the lane.
  struct Use {
    uint64_t bytes = 0, tokens = 0;  // payload, for quotas
    uint64_t slot_bytes = 0;         // slots as the tier spends them (header included), for fair shares
    uint64_t blocks = 0;             // copies (records this node keeps on the lane)
  };

  // `tenants`: how many tenant indices the store hands out (use() is indexed
  // by them); each tenant's fair share is the tier's capacity divided among
  // `configured_tenants`.
  LowerLane(uint8_t index, std::unique_ptr<BlockTier> tier, std::unique_ptr<EvictionPolicy> policy,
            size_t tenants, size_t configured_tenants);
  LowerLane(const LowerLane&) = delete;
  LowerLane& operator=(const LowerLane&) = delete;

  const uint8_t index;
  // Set at construction. The store deletes the tier in place at shutdown
  // (ops the tier gives up in its destructor complete through it).
  std::unique_ptr<BlockTier> tier;
  // Each tenant's fair share of the tier, in slot bytes: its capacity over
  // the configured tenants, again after a reload changed the capacity
  // (RefreshFairShare).
  std::atomic<uint64_t> fair_share_bytes;
  void RefreshFairShare();
  // Its admission gate: a block goes there only when leased lookups asked
  // for it this many times (StoreBooks::Admits); 1: every block. Set when
  // the store attaches the lane, before sessions start.
  uint32_t admit_min_uses = 1;

  // The lane lock (docs/architecture.md, "Lock order": lanes in index order,
  // after the tenant tier lock, before block-index shard locks).
  mutable Mutex mu;
  std::unique_ptr<EvictionPolicy> policy ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<SlotHandle, BlockRecord*> owner ABSL_GUARDED_BY(mu);
  // Loads waiting for a demotion to land before they read it back.
  absl::flat_hash_map<BlockRecord*, std::vector<absl::AnyInvocable<void(bool) &&>>> write_waiters
      ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> blocks{0};  // ready copies
  std::atomic<uint64_t> hits{0};    // blocks of leased lookups' hit prefixes found here

  // A tenant index the lane has not seen uses nothing.
  Use use(uint16_t tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return tenant < use_.size() ? use_[tenant] : Use{};
  }
  // Room in the books for tenant indices below `tenants` (a tenant added
  // after the lane; its fair share stays as set at construction).
  void GrowTenantsLocked(size_t tenants) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (tenants > use_.size()) use_.resize(tenants);
  }
  // Whether the tier is addressed by key alone (handles are the lane's own).
  bool keyed() const { return keyed_; }
  // The locator to hand the tier for the block under `handle`.
  BlockLocator LocatorOf(SlotHandle handle) const { return keyed_ ? kKeyAddressed : handle; }
  // Room for the block `meta` describes: its handle. ResourceExhausted when
  // the tier (or, for a tier addressed by key, this node's share of it) is
  // full; InvalidArgument for a block the tier cannot take. Not charged to
  // anyone until ChargeLocked.
  absl::StatusOr<SlotHandle> ReserveLocked(const BlockMeta& meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The handle for a block the tier kept across a restart at `at`.
  absl::StatusOr<SlotHandle> AdoptRecoveredLocked(BlockLocator at, const BlockMeta& meta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What the block under `handle` costs the tier's capacity; 0 for a handle
  // not reserved.
  uint64_t CostOfLocked(SlotHandle handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Adds (sign +1) or removes (-1) a block of `payload_bytes` and `tokens`
  // under `handle` from `tenant`'s use.
  void ChargeLocked(uint16_t tenant, SlotHandle handle, uint64_t payload_bytes, uint64_t tokens, int sign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Lets go of `handle` (the tier frees private room; a shared value stays)
  // and forgets its owner, uncharging `tenant`.
  void ReleaseLocked(uint16_t tenant, SlotHandle handle, const BlockMeta& meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The block under `handle` is ready there: the policy files it (`key`;
  // at `position_tokens` in its chain, or without one: depth unknown, as
  // after a restart) and it counts among the lane's blocks.
  void ReadyLocked(SlotHandle handle, uint64_t key, std::optional<uint64_t> position_tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The ready block under `handle` leaves the policy and the count (before
  // its handle is released).
  void UnreadyLocked(SlotHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Lets go of a handle reserved but never charged or owned.
  void DropReservedLocked(SlotHandle handle, const BlockMeta& meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Thread-safe, without the lane lock (the cascade asks it from under
  // it). Capacity and what this node's handles hold: the tier's own figures
  // for a tier with private room, the lane's books for one addressed by key.
  TierUsage Usage() const;

  // Fair shares. Without them, one tenant that keeps demoting (and pins what
  // it wants kept) pushes every other tenant's blocks out of a shared tier
  // whose policy is LRU across tenants. The rule:
  //  - A tenant's fair share is the tier's capacity divided equally among
  //    the configured tenants, counted in slot bytes (header and rounding
  //    included, as the tier spends them). Quotas (nvme_bytes / nvme_tokens)
  //    stay hard limits on top of it.
  //  - A tenant's demotion may evict another tenant's block only if that
  //    tenant still holds at least its fair share without it: a tenant
  //    within its share is protected. Nothing is reserved: a tenant alone
  //    may fill the tier, and gives back what is over its share when others
  //    need room.
  //  - Room for a block comes from: over its quota, the tenant's own blocks
  //    only; over its fair share once the block is in, its own blocks first,
  //    then those of tenants over their share; within its share, the
  //    coldest of tenants over their share first, then its own.
  //  - Pinned and busy blocks never go (evictable() says which may).
  struct Victim {
    std::optional<SlotHandle> slot;
    // An evictable block was passed over to keep its tenant's fair share.
    bool held_back = false;
  };
  // Where room for `tenant`'s block of `bytes` comes from, by the rule
  // above; evictable(r) is asked of candidates only (under the lane lock).
  Victim PickVictimLocked(uint16_t tenant, uint64_t bytes, bool over_quota,
                          absl::FunctionRef<bool(BlockRecord*)> evictable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  // A block's handle on a tier addressed by key: a number of the lane's
  // own, and what the block costs the tier's capacity.
  absl::StatusOr<SlotHandle> NewKeyedHandleLocked(uint64_t cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const size_t configured_tenants_;  // at least 1
  const bool keyed_;
  std::vector<Use> use_ ABSL_GUARDED_BY(mu);  // by tenant index
  // Tiers addressed by key: cost by handle (0: free), free handles, totals.
  std::vector<uint64_t> keyed_cost_ ABSL_GUARDED_BY(mu);
  std::vector<SlotHandle> keyed_free_ ABSL_GUARDED_BY(mu);
  // Changed under mu, read by Usage without it.
  std::atomic<uint64_t> keyed_used_bytes_{0}, keyed_used_{0};
};

}  // namespace kvtier

#endif  // KVTIER_STORE_LOWER_LANE_H_
