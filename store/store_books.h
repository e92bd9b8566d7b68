// SPDX-License-Identifier: Apache-2.0
// The books the store's parts share, and a block record's life.
//
// The store is several objects over one set of books: the operations
// (BlockStore: lookups, leases, stores, loads, invalidation), each tenant's
// host residency (HostResidency), one lane per lower tier (LowerLane), the
// migrator that moves copies between them (Migrator), the reclaimer and the
// cascade. They all index blocks through the same BlockIndex, charge the
// same tenants and lanes, and follow the same rules for when a record may
// go. Those books and rules are here, once:
//
//   - A record leaves the index once (UnindexLocked), and its GPU copy with
//     it; a later record of the same key may be indexed by then.
//   - A removed record is destroyed by whoever drops its last pin or I/O
//     reference (ReleaseIoRef, the operations' unpin), with whatever host or
//     lower slot it still owns (DestroyRecord, DestroyDetached).
//   - What the store knows of a namespace (its block shape, for tier
//     headers and the cost model) and how many records name it, so a
//     namespace handle is reused only when none does.
//
// Lock order: docs/architecture.md, "Lock order".
#ifndef KVTIER_STORE_STORE_BOOKS_H_
#define KVTIER_STORE_STORE_BOOKS_H_

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/mutex.h"
#include "store/block_index.h"
#include "store/cost_tracker.h"
#include "store/host_residency.h"
#include "store/lower_lane.h"
#include "store/namespace_registry.h"
#include "store/stats.h"
#include "policies/reuse_gate.h"
#include "tiers/tier.h"

namespace kvtier {

class KvEvents;

// The members are the store's shared state, not an interface: each part
// of the store reads and changes them under the locks their comments name.
// Filled before sessions start (tenants and lanes are not resized after).
class StoreBooks {
 public:
  StoreBooks(DaemonStats* stats, const CostTracker::Options& cost);
  StoreBooks(const StoreBooks&) = delete;
  StoreBooks& operator=(const StoreBooks&) = delete;

  DaemonStats* const stats;
  CostTracker cost;
  BlockIndex index;
  std::vector<std::unique_ptr<HostResidency>> tenants;  // by tenant index
  absl::flat_hash_map<uint64_t, uint16_t> tenant_by_hash;
  std::vector<std::unique_ptr<LowerLane>> lanes;  // the chain below host memory, lane 0 first
  // KV events (events/kv_events.h), or nullptr; set before sessions start.
  // A lower copy is announced when its slot is charged and withdrawn when
  // the slot is freed (ChargeLocked, FreeLowerSlotLocked).
  KvEvents* events = nullptr;
  // Uses of blocks, for the lanes' admission gates; nullptr when no lane
  // has one. Set before sessions start; thread-safe.
  std::unique_ptr<ReuseGate> reuse;

  LowerLane& LaneOf(const BlockRecord* r) const { return *lanes[r->lower]; }
  // Whether the lane's admission gate lets r in (always, without a gate).
  bool Admits(const LowerLane& lane, const BlockRecord* r) const {
    return lane.admit_min_uses <= 1 || reuse == nullptr || reuse->Admit(PolicyKeyOf(*r), lane.admit_min_uses);
  }

  // --- namespaces (thread-safe)
  // Makes a namespace's shape known for tier headers and the cost model
  // (logs once per block shape the cost model cannot price).
  void RegisterNamespace(const NamespaceInfo& info);
  // Forgets a namespace no record names any more; false while one does.
  bool ForgetNamespace(uint32_t handle);
  uint64_t RecordsOf(uint32_t handle) const;
  // A record of namespace `ns` was created (+1) or deleted (-1).
  void CountRecords(uint32_t ns, int64_t delta);
  // What a tier stores with r's copy: its namespace id, key, size, tenant.
  BlockMeta MetaOf(const BlockRecord* r) const;
  // What the store knows of namespace `ns` (empty when nothing).
  NamespaceInfo InfoOf(uint32_t ns) const;
  // The tensor-parallel degree the namespace's blocks are computed at (1 unknown).
  uint32_t TpSizeOf(uint32_t ns) const;

  // --- a record's life
  // Every record leaves the index here: erased (once), marked removed, and
  // its GPU copy dropped (GpuCache's lock is a leaf).
  void UnindexLocked(BlockIndex::Shard& sh, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  // Frees whatever copies a removed, unreferenced record still owns, then
  // deletes it. DestroyDetached is for a record without a host slot.
  void DestroyRecord(HostResidency& t, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  void DestroyDetached(BlockRecord* r);
  // Drops the I/O reference an operation held; destroys the record if it was
  // the last thing keeping a removed record alive. Without t's lock.
  void ReleaseIoRef(HostResidency& t, BlockRecord* r);
  // Adds (sign +1) or removes (-1) r's bytes, tokens and slot (allocated)
  // from its tenant's use of the lane.
  void ChargeLocked(LowerLane& lane, const BlockRecord* r, SlotHandle slot, int sign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  // Frees lane slot `slot` (owned by r), uncharging r's tenant.
  void FreeLowerSlotLocked(LowerLane& lane, const BlockRecord* r, SlotHandle slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);

 private:
  mutable Mutex ns_mu_;
  std::vector<NamespaceInfo> ns_info_ ABSL_GUARDED_BY(ns_mu_);  // by handle
  // Live BlockRecords by namespace handle: from `new` to `delete`, so a
  // namespace is freed only when nothing can still name its handle.
  std::vector<uint64_t> ns_records_ ABSL_GUARDED_BY(ns_mu_);
  absl::flat_hash_set<std::tuple<uint64_t, uint32_t, uint32_t>> unpriced_logged_ ABSL_GUARDED_BY(ns_mu_);
};

}  // namespace kvtier

#endif  // KVTIER_STORE_STORE_BOOKS_H_
