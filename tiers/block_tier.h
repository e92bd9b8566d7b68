// SPDX-License-Identifier: Apache-2.0
// The block-tier interface: a tier below host memory whose blocks are copied
// in and out whole, asynchronously, addressed by block identity (NVMe, a
// Redis Cluster, a shared directory; an in-memory tier for tests). The store
// holds its lower tiers through this interface only, so a new kind of tier
// implements it and registers in daemon/tier_registry.cc.
//
// Every op may carry a deadline and a cancellation token (an op not yet
// started when either hits fails with DeadlineExceeded or Cancelled, and is
// not counted as an error); Sync makes written blocks durable where the tier
// is durable; statistics in one shape for every tier, and a tier's own
// counters through a visitor; a read observer feeds the cost model the
// tier's own time per read. Recovery is the implementation's factory's: it
// hands back the blocks that survived (RecoveredBlock) for the store to
// index.
#ifndef KVTIER_TIERS_BLOCK_TIER_H_
#define KVTIER_TIERS_BLOCK_TIER_H_

#include <chrono>
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
  // A write whose caller waits for room when refused (AwaitWriteRoom: the
  // background reclaim, a flush): a tier with staging memory refuses it
  // sooner, leaving room to the writes of callers that cannot wait.
  bool may_wait = false;
};

// What an abandoned op reports: Cancelled or DeadlineExceeded for
// AbandonReason's kIoCancelled and kIoDeadlinePassed, naming `what`; OK for 0.
absl::Status AbandonedStatus(int32_t reason, absl::string_view what);

// A stable 64-bit hash of a tenant's name, kept with a block in a durable
// tier (BlockMeta::tenant_hash) so recovery knows whose block it is.
uint64_t TenantHash(absl::string_view tenant);

// Where a tier with room of its own keeps a block (an NVMe slot), handed
// out by Reserve; a tier addressed by the block's identity alone (a shared
// tier) hands out kKeyAddressed and ignores the locator it is given.
using BlockLocator = uint32_t;
inline constexpr BlockLocator kKeyAddressed = UINT32_MAX;

// A block a tier kept across a restart, for the store to index again.
struct RecoveredBlock {
  BlockLocator at;
  BlockMeta meta;
};

// The same figures from every block tier.
struct BlockTierStats {
  uint64_t capacity_bytes = 0, used_bytes = 0, used_slots = 0;
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t in_flight = 0, queued = 0;
  uint64_t checksum_failures = 0;  // reads refused: the copy was not the block asked for, intact
  uint64_t io_errors = 0;
  uint64_t writes_refused = 0;     // full or out of staging (not writes that wait for room: IoOptions::may_wait)
  uint64_t abandoned = 0;          // ops that hit their deadline or were cancelled before they started
};

// A tier below host memory, addressed by block identity: Put, Get, Exists
// and Remove each name the block (BlockMeta: tenant, namespace, key,
// length), asynchronously, with deadlines, and every value carries the
// tier's self-checking format, so a tier never serves a block as another.
// A tier with private room (NVMe) also hands out a locator from Reserve,
// which the caller keeps with its record and passes back; the locator's
// meaning stays inside the tier.
class BlockTier {
 public:
  BlockTier() = default;
  virtual ~BlockTier() = default;
  BlockTier(const BlockTier&) = delete;
  BlockTier& operator=(const BlockTier&) = delete;

  // Thread-safe. What the tier is (status, metrics, the ABI).
  virtual TierKind kind() const = 0;
  // Thread-safe. Short lowercase name for logs, status and metrics ("nvme").
  virtual std::string_view name() const = 0;
  // Thread-safe. Whether a block written and synced survives a restart.
  virtual bool durable() const = 0;
  // Thread-safe. The largest payload one block may have.
  virtual uint64_t max_block_bytes() const = 0;
  // Thread-safe. What a block of `payload_bytes` costs the tier's capacity
  // (header and rounding included).
  virtual uint64_t CostFor(uint64_t payload_bytes) const { return payload_bytes; }
  // Thread-safe. Whether the tier is addressed by block identity alone: its
  // Reserve hands out kKeyAddressed, it keeps no room per block for this
  // node, and the caller keeps its own books of what it placed there
  // (capacity is then the share of the tier this node may claim).
  virtual bool addressed_by_key() const { return false; }
  // Thread-safe. Room for the block `meta` describes: its locator, or
  // kKeyAddressed for a tier addressed by key alone. InvalidArgument for a
  // block the tier cannot take (0 bytes, over max_block_bytes);
  // ResourceExhausted when the tier has no room (the caller evicts and
  // retries; with code KVTIER_ENOSPC when evicting would not help).
  virtual absl::StatusOr<BlockLocator> Reserve(const BlockMeta& meta) = 0;
  // Thread-safe. This node keeps the block no longer: a tier with private
  // room frees it (InvalidArgument for a locator not reserved); a tier
  // addressed by key leaves the value, which belongs to every node.
  virtual absl::Status Remove(BlockLocator at, const BlockMeta& meta) = 0;
  // Thread-safe. What the block at `at` costs the tier's capacity; 0 for a
  // locator not reserved or a tier addressed by key alone.
  virtual uint64_t CostOf(BlockLocator at) const {
    (void)at;
    return 0;
  }
  // Thread-safe. Stores src as the block `meta` describes (at `at`, for a
  // tier with private room); src may be reused once Put returns. `done` runs
  // exactly once, on a tier thread or inline: OK once the block is durable
  // where the tier is durable. An op not started by io's deadline, or
  // cancelled first, fails with DeadlineExceeded or Cancelled.
  virtual void Put(BlockLocator at, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                   IoCallback done) = 0;
  // Thread-safe. Copies the block `meta` describes into dst; `done` as for
  // Put. DataLoss when the tier does not hold exactly that block intact
  // (checksum, key, length): such a block is never served; NotFound where a
  // tier addressed by key holds no such block. On failure dst's contents
  // are unspecified.
  virtual void Get(BlockLocator at, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                   IoCallback done) = 0;
  // Thread-safe. Which of `metas` the tier holds now; `done` runs once, at
  // once or on a tier thread, by deadline_ns (MonotonicNanos; 0: the
  // tier's own timeout), and an unanswered one counts as absent. A tier
  // that is not shared answers none (its caller's books say what it holds).
  virtual void Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
                      uint64_t deadline_ns) {
    (void)deadline_ns;
    std::move(done)(std::vector<bool>(metas.size(), false));
  }
  // Thread-safe. Capacity, and for a tier with private room what is in use.
  virtual TierUsage Usage() const = 0;
  // Thread-safe.
  virtual TierHealth Health() const = 0;
  // Thread-safe. Waits until every write so far is durable (at once for a
  // tier that is not durable, once its writes have landed).
  virtual absl::Status Sync() = 0;
  // Thread-safe. What the durable part of Sync() took last time it ran
  // (a journal's last commit round): a caller with a deadline keeps that
  // much of it for the final Sync(). Zero where nothing is made durable.
  virtual std::chrono::nanoseconds LastSyncRound() const { return std::chrono::nanoseconds(0); }
  // Thread-safe, but not from one of the tier's callbacks. Returns once every
  // op submitted before the call, reads included, has completed and its
  // callback has returned (Sync waits for writes only). Before the tier's
  // owner tears down what those callbacks touch.
  virtual void Drain() = 0;
  // Thread-safe. Someone now waits for a write: make pending writes durable
  // without a batching delay. Does not wait.
  virtual void CommitSoon() = 0;
  // Thread-safe. Flow control for writes the tier refused with KVTIER_EBUSY
  // (a burst faster than the device: no staging memory for it now). Read
  // WriteRoomEpoch() before the Put; after the refusal, AwaitWriteRoom
  // waits until room may have freed since then (true: try again), or
  // until `timeout` (false). A tier that never refuses that way answers
  // false at once.
  virtual uint64_t WriteRoomEpoch() const { return 0; }
  virtual bool AwaitWriteRoom(uint64_t epoch, std::chrono::nanoseconds timeout) {
    (void)epoch;
    (void)timeout;
    return false;
  }
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

  // Thread-safe. The tier's own figures beyond BlockStats (a file tier's
  // scans and misses by cause), each by a short lowercase name, for status
  // ("counters") and metrics (kvtier_lower_tier_counter): what a tier kind
  // adds is shown without the caller knowing the kind.
  virtual void VisitCounters(absl::FunctionRef<void(std::string_view name, uint64_t value)> visit) const {
    (void)visit;
  }

  // Put and Get with a priority alone: no deadline, no cancellation.
  void Put(BlockLocator at, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio, IoCallback done) {
    Put(at, meta, src, IoOptions{.prio = prio}, std::move(done));
  }
  void Get(BlockLocator at, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio, IoCallback done) {
    Get(at, meta, dst, IoOptions{.prio = prio}, std::move(done));
  }
};

// A tier addressed by block identity alone (a Redis Cluster, a shared
// directory): Reserve only checks the size (1 to max_block_bytes) and
// hands out kKeyAddressed, Remove leaves the value (it belongs to every
// node), and the caller keeps the books of what it placed there against the
// tier's capacity.
class KeyAddressedBlockTier : public BlockTier {
 public:
  bool addressed_by_key() const final { return true; }
  absl::StatusOr<BlockLocator> Reserve(const BlockMeta& meta) override;
  absl::Status Remove(BlockLocator, const BlockMeta&) override { return absl::OkStatus(); }
};

// InvalidArgument, naming the tier, unless 1 <= bytes <= max_bytes.
absl::Status CheckBlockBytes(std::string_view tier, uint64_t bytes, uint64_t max_bytes);

}  // namespace kvtier

#endif  // KVTIER_TIERS_BLOCK_TIER_H_
