// SPDX-License-Identifier: Apache-2.0
// Writes to the shared tier (tiers.remote) that are not moves: a block's
// host copy published for other nodes on the write policy ("reused",
// "committed"). The node keeps no handle on such a value (the block's copy
// stays where it was), so the tier's own eviction alone decides how long it
// stays there; published marks the record so it is not written again.
#include <cassert>

#include "store/migrator.h"

namespace kvtier {

void Migrator::Publish(HostResidency& t, BlockRecord* r, LowerLane& lane) {
  uint64_t offset = 0;
  bool go;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    go = !r->removed && r->state == BlockState::kReady && !r->published;
    offset = r->arena_offset();
    if (!go) r->publishing = false;
  }
  // Clears r->publishing after a write that did not start or ended.
  auto done_with = [this](BlockRecord* r, bool published) {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->publishing = false;
    if (published) r->published = true;
  };
  const BlockMeta meta = books_.MetaOf(r);
  if (go && (meta.payload_bytes > lane.tier->max_block_bytes() || meta.payload_bytes < shared_min_block_bytes_)) go = false;
  const bool admitted = !go || books_.Admits(lane, r);
  if (!admitted) go = false;
  if (go && publishing_.fetch_add(1, std::memory_order_relaxed) >= kMaxPublishing) {
    publishing_.fetch_sub(1, std::memory_order_relaxed);
    go = false;
  }
  if (!go) {
    done_with(r, false);
    // Each refusal counted once, by why (the metric sums them).
    (admitted ? books_.stats->remote_publishes_skipped : books_.stats->remote_publishes_not_admitted).Add();
    books_.ReleaseIoRef(t, r);
    return;
  }
  // Put by key alone, not counted against the lane's capacity (which this
  // node's own copies fill, evicting only on demand): the value stays in
  // the cluster, and the lane keeps no handle on it.
  assert(lane.keyed());  // AttachLowerTier takes a shared tier only addressed by key
  if (absl::StatusOr<BlockLocator> at = lane.tier->Reserve(meta); !at.ok()) {
    publishing_.fetch_sub(1, std::memory_order_relaxed);
    done_with(r, false);
    PausePublishes(t);
    books_.stats->remote_publishes_failed.Add();
    books_.ReleaseIoRef(t, r);
    return;
  }
  // The io_ref keeps the host slot (and so the bytes at offset) until the
  // write has copied them; a tier copies them before Put returns.
  lane.tier->Put(kKeyAddressed, meta, {t.host->arena_base() + offset, meta.payload_bytes}, IoOptions{IoPriority::kDemote},
                 [this, &t, r, done_with](absl::Status s) {
                     done_with(r, s.ok());
                     if (!s.ok()) PausePublishes(t);
                     (s.ok() ? books_.stats->remote_publishes : books_.stats->remote_publishes_failed).Add();
                     publishing_.fetch_sub(1, std::memory_order_relaxed);
                     books_.ReleaseIoRef(t, r);
                   });
}

void Migrator::PausePublishes(HostResidency& t) {
  t.publish_paused_until_ns.store(MonotonicNanos() + kPublishPauseNs, std::memory_order_relaxed);
}

}  // namespace kvtier
