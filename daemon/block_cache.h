// The daemon's data plane without the IPC: lookups, leases (pins), stores,
// loads, invalidation and eviction over the block index and each tenant's
// host tier. Sessions call it from their own threads.
#ifndef KVTIER_DAEMON_BLOCK_CACHE_H_
#define KVTIER_DAEMON_BLOCK_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "daemon/block_index.h"
#include "daemon/namespace_registry.h"
#include "daemon/stats.h"
#include "policies/eviction_policy.h"
#include "tiers/host_tier.h"

namespace kvtier {

// Where a block is, for the engine.
struct BlockLocation {
  TierKind tier = TierKind::kNone;
  uint64_t arena_offset = 0;
  bool needed = false;  // StoreBegin: the engine must fill this slot
};

// What one session holds. Touched only by that session's thread; the
// atomics are read by the admin endpoint.
struct SessionHoldings {
  NamespaceInfo ns;
  uint64_t next_id = 1;
  absl::flat_hash_map<uint64_t, std::vector<BlockRecord*>> leases;
  absl::flat_hash_map<uint64_t, std::vector<BlockRecord*>> tickets;
  std::atomic<uint64_t> lease_count{0};
  std::atomic<uint64_t> pinned_blocks{0};
};

struct TenantUsage {
  std::string name;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;         // slots in use (ready or being written)
  uint64_t pinned_blocks = 0;  // blocks with at least one lease
  uint64_t evictions = 0;
};

class BlockCache {
 public:
  struct Options {
    uint32_t max_leases_per_session = 65536;
    std::string policy = "lru";
  };
  // InvalidArgument for an unknown policy name.
  static absl::StatusOr<std::unique_ptr<BlockCache>> Create(const Options& opts, DaemonStats* stats);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Not thread-safe: call before sessions start. Returns the tenant index.
  absl::StatusOr<uint16_t> AddTenant(std::string name, std::unique_ptr<HostTier> host);
  HostTier* host_tier(uint16_t tenant) const { return tenants_[tenant]->host.get(); }
  const std::string& tenant_name(uint16_t tenant) const { return tenants_[tenant]->name; }
  size_t tenant_count() const { return tenants_.size(); }

  // All below: thread-safe across sessions; one thread per SessionHoldings.

  // Longest present prefix of keys. With `lease`, pins that prefix and
  // returns a lease id in *lease_id (0 when nothing hit). out gets one entry
  // per key; entries past the prefix are TierKind::kNone.
  absl::StatusOr<uint32_t> Lookup(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                  uint64_t* lease_id, std::span<BlockLocation> out);
  // Locations of keys the lease pins (every key must be in it).
  absl::Status Load(SessionHoldings& s, uint64_t lease_id, std::span<const BlockKey> keys,
                    std::span<BlockLocation> out);
  // Reserves slots for keys not already cached (all or nothing: when the tier
  // cannot hold them all, even after evicting, nothing is reserved). Returns
  // how many the engine must fill; *ticket is 0 when none.
  absl::StatusOr<uint32_t> StoreBegin(SessionHoldings& s, std::span<const BlockKey> keys,
                                      uint64_t* ticket, std::span<BlockLocation> out);
  // Makes the ticket's blocks visible to lookups.
  absl::Status StoreCommit(SessionHoldings& s, uint64_t ticket);
  // Gives the ticket's slots back.
  absl::Status StoreAbort(SessionHoldings& s, uint64_t ticket);
  absl::Status Release(SessionHoldings& s, uint64_t lease_id);
  // Removes committed blocks of the session's namespace; pinned ones go when
  // their leases do. Returns how many were removed.
  absl::StatusOr<uint32_t> Invalidate(SessionHoldings& s, std::span<const BlockKey> keys);
  absl::StatusOr<uint32_t> InvalidateNamespace(SessionHoldings& s);
  // Aborts every ticket and releases every lease (a session ended).
  void CloseSession(SessionHoldings& s);

  std::vector<TenantUsage> Usage() const;
  uint64_t indexed_blocks() const { return index_.size(); }

 private:
  struct TenantState {
    std::string name;
    std::unique_ptr<HostTier> host;
    // The tenant's tier lock: allocation, eviction and policy updates.
    // Ordered before shard mutexes.
    Mutex mu;
    absl::flat_hash_map<uint64_t, std::unique_ptr<EvictionPolicy>> policy_by_size ABSL_GUARDED_BY(mu);
    std::vector<BlockRecord*> slot_owner ABSL_GUARDED_BY(mu);
    std::atomic<uint64_t> pinned{0};
    std::atomic<uint64_t> evictions{0};
  };

  BlockCache(const Options& opts, DaemonStats* stats);
  // A host slot for `owner`, evicting unpinned blocks of that size as needed.
  absl::StatusOr<SlotHandle> AllocateSlot(TenantState& t, uint64_t bytes, BlockRecord* owner);
  EvictionPolicy* PolicyFor(TenantState& t, uint64_t slot_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Frees a record's slot and deletes it; the record is out of the index and
  // unpinned.
  void FreeRecord(TenantState& t, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Unpins a lease's records, freeing removed ones that reach zero.
  void Unpin(SessionHoldings& s, const std::vector<BlockRecord*>& blocks);
  uint32_t RemoveLocked(TenantState& t, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);

  const Options opts_;
  DaemonStats* const stats_;
  BlockIndex index_;
  std::vector<std::unique_ptr<TenantState>> tenants_;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_BLOCK_CACHE_H_
