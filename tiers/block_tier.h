// SPDX-License-Identifier: Apache-2.0
// The block-tier interface: a tier below host memory whose blocks are copied
// in and out whole, asynchronously (NVMe now; a remote store next; an
// in-memory tier for tests). The store holds its lower tiers through this
// interface only, so a new kind of tier implements it and is assembled in
// one place.
//
// Beyond Tier: every read and write may carry a deadline and a cancellation
// token (an op not yet started when either hits fails with DeadlineExceeded
// or Cancelled, and is not counted as an error); Sync makes written blocks
// durable where the tier is durable; statistics in one shape for every tier;
// a read observer that feeds the cost model the tier's own time per read.
// Recovery is the implementation's factory's: it hands back the blocks that
// survived (RecoveredBlock) for the store to index.
#ifndef KVTIER_TIERS_BLOCK_TIER_H_
#define KVTIER_TIERS_BLOCK_TIER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "core/cancel.h"
#include "tiers/io_engine.h"
#include "tiers/tier.h"

namespace kvtier {

// How one read or write may be abandoned.
struct IoOptions {
  IoPriority prio = IoPriority::kLoad;
  // MonotonicNanos() by which the op must have started; 0: no deadline.
  uint64_t deadline_ns = 0;
  CancelToken cancel;
};

// What an abandoned op reports: Cancelled or DeadlineExceeded for
// AbandonReason's kIoCancelled and kIoDeadlinePassed, naming `what`; OK for 0.
absl::Status AbandonedStatus(int32_t reason, absl::string_view what);

// A stable 64-bit hash of a tenant's name, kept with a block in a durable
// tier (BlockMeta::tenant_hash) so recovery knows whose block it is.
uint64_t TenantHash(absl::string_view tenant);

// A block a tier kept across a restart, for the store to index again.
struct RecoveredBlock {
  SlotHandle slot;
  BlockMeta meta;
};

// The same figures from every block tier.
struct BlockTierStats {
  uint64_t capacity_bytes = 0, used_bytes = 0, used_slots = 0;
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t in_flight = 0, queued = 0;
  uint64_t checksum_failures = 0;  // reads refused: the copy was not the block asked for, intact
  uint64_t io_errors = 0;
  uint64_t writes_refused = 0;     // full or out of staging
  uint64_t abandoned = 0;          // ops that hit their deadline or were cancelled before they started
};

class BlockTier : public Tier {
 public:
  // Thread-safe. Short lowercase name for logs, status and metrics ("nvme").
  virtual std::string_view name() const = 0;
  // Thread-safe. Whether a block written and synced survives a restart.
  virtual bool durable() const = 0;
  // Thread-safe. The largest payload one slot takes.
  virtual uint64_t max_block_bytes() const = 0;
  // What a block of `payload_bytes` costs the tier's capacity (header and
  // rounding included): SlotBytes of the slot Allocate would give it.
  virtual uint64_t SlotBytesFor(uint64_t payload_bytes) const { return payload_bytes; }
  // Thread-safe. Tier::Write with a deadline and cancellation; `done` runs
  // exactly once. src may be reused once Write returns.
  virtual void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                     IoCallback done) = 0;
  // Thread-safe. Tier::Read with a deadline and cancellation; DataLoss when
  // the slot does not hold exactly that block intact.
  virtual void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                    IoCallback done) = 0;
  // Thread-safe. Waits until every write so far is durable (at once for a
  // tier that is not durable, once its writes have landed).
  virtual absl::Status Sync() = 0;
  // Thread-safe, but not from one of the tier's callbacks. Returns once every
  // op submitted before the call, reads included, has completed and its
  // callback has returned (Sync waits for writes only). Before the tier's
  // owner tears down what those callbacks touch.
  virtual void Drain() = 0;
  // Thread-safe. Someone now waits for a write: make pending writes durable
  // without a batching delay. Does not wait.
  virtual void CommitSoon() = 0;
  // Thread-safe.
  virtual BlockTierStats BlockStats() const = 0;
  // Called on a tier thread after every read that succeeded: bytes read and
  // the tier's own time for them (not the queue wait before). Set before the
  // first read.
  using ReadObserver = std::function<void(uint64_t bytes, const IoTiming& timing)>;
  virtual void SetReadObserver(ReadObserver observer) = 0;
  // Thread-safe. Reads up to `count` blocks only to time the tier (the
  // observer sees them); does not wait. Returns how many were started.
  virtual uint32_t CalibrationRead(uint32_t count) = 0;
  // Thread-safe. Whether other kvtier nodes write this tier too (a shared
  // remote tier): it may hold blocks this node never wrote, so the store
  // asks it (Exists) where its own books end a lookup's hit prefix, and a
  // block it already holds is not written again.
  virtual bool shared() const { return false; }
  // Thread-safe. A handle for one write whose value the tier keeps on its
  // own after the write (a shared tier's value belongs to the cluster, not to
  // this node): the caller Frees it once the write is done, and a shared
  // tier does not count it against its capacity, so writes for other nodes
  // never wait for this node's own handles to be evicted. Other tiers: an
  // Allocate.
  virtual absl::StatusOr<SlotHandle> AllocateTransient(uint64_t bytes) { return Allocate(bytes); }
  // Thread-safe. Which of `metas` the tier holds now; `done` runs once, at
  // once or on a tier thread, by deadline_ns (MonotonicNanos; 0: the
  // tier's own timeout), and an unanswered one counts as absent. A tier
  // that is not shared answers none.
  virtual void Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
                      uint64_t deadline_ns) {
    (void)deadline_ns;
    std::move(done)(std::vector<bool>(metas.size(), false));
  }

  // Thread-safe. The tier's own figures beyond BlockStats (a file tier's
  // scans and misses by cause), each by a short lowercase name, for status
  // ("counters") and metrics (kvtier_lower_tier_counter): what a tier kind
  // adds is shown without the caller knowing the kind.
  virtual void VisitCounters(absl::FunctionRef<void(std::string_view name, uint64_t value)> visit) const {
    (void)visit;
  }

  // Tier's forms: no deadline, no cancellation.
  void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio,
             IoCallback done) final {
    Write(slot, meta, src, IoOptions{.prio = prio}, std::move(done));
  }
  void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio,
            IoCallback done) final {
    Read(slot, meta, dst, IoOptions{.prio = prio}, std::move(done));
  }
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_BLOCK_TIER_H_
