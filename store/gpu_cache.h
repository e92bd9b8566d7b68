// SPDX-License-Identifier: Apache-2.0
// The GPU tier as the daemon uses it: one tenant's device-memory arena
// (tiers.gpu.capacity, 0 = off) holding copies of that tenant's blocks,
// least recently used first out.
//
// The GPU tier sits above the host tier and includes it: a daemon-driven
// store gathers the engine's pages into a GPU slot and demotes the block to
// its host slot before the store commits; a daemon-driven load scatters from
// the GPU copy when there is one (device to device), and promotes the blocks
// it had to bring from host memory into the GPU tier after the engine has
// them. Dropping a GPU copy therefore never loses a block; the store
// (BlockStore, which owns each tenant's GpuCache) drops a block's copy when
// the block leaves its index, so no copy outlives its block. Copies are pinned
// while a device operation reads or writes them; eviction skips pinned ones.
#ifndef KVTIER_STORE_GPU_CACHE_H_
#define KVTIER_STORE_GPU_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "store/stats.h"
#include "kvtier/types.h"
#include "tiers/gpu_tier.h"

namespace kvtier {

class KvEvents;

class GpuCache {
 public:
  explicit GpuCache(std::unique_ptr<GpuTier> tier) : tier_(std::move(tier)) {}

  struct Pin {
    SlotHandle slot = 0;
    std::byte* data = nullptr;  // device address of the copy
  };

  // Thread-safe. The block's published copy, pinned and made most recent;
  // counted as a hit unless count_hit is false (a lookup pinning it for the
  // engine: the load that reads it counts).
  std::optional<Pin> Acquire(uint32_t ns, const BlockKey& key, bool count_hit = true);
  // Thread-safe. A new slot for a block that has no copy yet, pinned and not
  // yet visible; evicts unpinned copies to make room. nullopt when the block
  // already has a copy (or one in the making) or nothing can be evicted.
  // `tokens`: the block's, for KV events (SetEvents).
  std::optional<Pin> Reserve(uint32_t ns, const BlockKey& key, uint64_t bytes, uint32_t tokens = 0);
  // KV events (events/kv_events.h): a copy is announced (medium GPU) when it
  // is published and withdrawn when it stops being visible. Before sessions.
  void SetEvents(KvEvents* events, uint16_t tenant) {
    MutexLock l(&mu_);
    events_ = events;
    tenant_ = tenant;
  }
  // Thread-safe. A reserved copy whose bytes are in place becomes visible.
  void Publish(uint32_t ns, const BlockKey& key);
  // Thread-safe. Unpins; a reserved copy that was never published, or one
  // dropped while pinned, is freed.
  void Release(uint32_t ns, const BlockKey& key);
  // Thread-safe. True when a published copy exists.
  bool Contains(uint32_t ns, const BlockKey& key) const;
  // Thread-safe. Removes the block's copy (now, or when its last pin goes).
  void Drop(uint32_t ns, const BlockKey& key);
  // Thread-safe. Drops every copy of namespace ns.
  void DropNamespace(uint32_t ns);

  struct Usage {
    uint64_t capacity_bytes = 0, used_bytes = 0, blocks = 0, pinned = 0;
    uint64_t hits = 0, promotions = 0, demotions = 0, evictions = 0;
  };
  // Thread-safe.
  Usage usage() const;
  TierHealth health() const { return tier_->Health(); }
  // Thread-safe. Where a pinned copy lies in the arena, and the arena for
  // engines (leased lookups hand them offsets into it).
  uint64_t OffsetOf(const Pin& pin) const { return tier_->ArenaOffset(pin.slot); }
  absl::StatusOr<IpcMemHandle> ExportArena() const { return tier_->ExportArena(); }
  uint64_t arena_bytes() const { return tier_->arena_bytes(); }
  // Thread-safe: counted by the session that did the copy.
  void CountPromotion() { promotions_.Add(); }
  void CountDemotion() { demotions_.Add(); }

 private:
  struct Id {
    uint32_t ns;
    BlockKey key;
    bool operator==(const Id& o) const { return ns == o.ns && key == o.key; }
    template <typename H>
    friend H AbslHashValue(H h, const Id& id) {
      return H::combine(std::move(h), id.ns, id.key);
    }
  };
  struct Entry {
    Id id;
    SlotHandle slot;
    uint32_t pins = 0;
    bool visible = false;
    bool dropped = false;
    bool announced = false;  // a KV event said it is here
    uint32_t tokens = 0;
  };
  using List = std::list<Entry>;  // most recent at the front

  void EraseLocked(List::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy stops being visible: withdraw its announcement.
  void WithdrawLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<GpuTier> tier_;
  mutable Mutex mu_;
  List lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Id, List::iterator> index_ ABSL_GUARDED_BY(mu_);
  Counter hits_, promotions_, demotions_, evictions_;
  KvEvents* events_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint16_t tenant_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_GPU_CACHE_H_
