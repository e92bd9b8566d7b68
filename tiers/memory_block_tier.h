// SPDX-License-Identifier: Apache-2.0
// A block tier in process memory: what the store's chain of lower tiers is
// tested with (a tier below NVMe, a stand-in for a remote store), and a model
// of what a block tier must do. Blocks are copied in and out whole on one
// tier thread, in priority order, each op taking at least `op_latency_ns`;
// every read checks the namespace, key, length and an XXH3 checksum of the
// payload, so a damaged or stale copy is DataLoss, never served. Not durable:
// its blocks are gone when it is.
#ifndef KVTIER_TIERS_MEMORY_BLOCK_TIER_H_
#define KVTIER_TIERS_MEMORY_BLOCK_TIER_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "tiers/block_tier.h"

namespace kvtier {

struct MemoryBlockTierOptions {
  uint64_t capacity_bytes = 0;  // payload bytes of allocated slots, at most (not shared: see below)
  uint64_t max_block_bytes = 64ull << 20;
  // What lookups report a block here as. The client ABI names no lower tier
  // but NVMe yet, and to an engine both mean the same: Load brings it back.
  TierKind kind = TierKind::kNvme;
  std::string name = "memory";
  uint64_t op_latency_ns = 0;   // each op takes at least this long
  // Stands for a tier other nodes write too, addressed by key alone
  // (shared(), addressed_by_key()): values are kept by the block's identity
  // (tenant, namespace, key), as a cluster's keys are; Reserve only checks
  // the size, Remove leaves the value, and capacity_bytes is not enforced
  // here (the store keeps the books of what this node claims). Exists
  // answers from the values written (after op_latency_ns, on the caller's
  // thread).
  bool shared = false;
};

class MemoryBlockTier final : public BlockTier {
 public:
  static absl::StatusOr<std::unique_ptr<MemoryBlockTier>> Create(const MemoryBlockTierOptions& opts);
  ~MemoryBlockTier() override;  // runs what is queued first

  TierKind kind() const override { return opts_.kind; }
  // ResourceExhausted when the block would pass the capacity (not shared).
  absl::StatusOr<BlockLocator> Reserve(const BlockMeta& meta) override;
  absl::Status Remove(BlockLocator at, const BlockMeta& meta) override;
  uint64_t CostOf(BlockLocator at) const override;
  bool addressed_by_key() const override { return opts_.shared; }
  using BlockTier::Get;
  using BlockTier::Put;
  void Put(BlockLocator at, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
           IoCallback done) override;
  void Get(BlockLocator at, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
           IoCallback done) override;
  TierUsage Usage() const override;
  TierHealth Health() const override { return TierHealth::kHealthy; }

  std::string_view name() const override { return opts_.name; }
  bool durable() const override { return false; }
  uint64_t max_block_bytes() const override { return opts_.max_block_bytes; }
  // Waits until every write queued before the call has landed (never
  // returns while paused with such a write queued).
  absl::Status Sync() override;
  void Drain() override;  // waits forever while paused
  void CommitSoon() override {}
  BlockTierStats BlockStats() const override;
  void SetReadObserver(ReadObserver observer) override { read_observer_ = std::move(observer); }
  // Nothing to calibrate: every read is timed, and reads cost what memcpy does.
  uint32_t CalibrationRead(uint32_t) override { return 0; }

  // For tests. Flips one byte of the payload at `at` (a damaged copy).
  absl::Status CorruptPayload(BlockLocator at, uint64_t offset);
  // For tests, a shared tier. Flips one byte of the value under `meta`'s
  // identity.
  absl::Status CorruptValue(const BlockMeta& meta, uint64_t offset);
  // For tests. While set, every write fails (Unavailable), as a cluster
  // that is down or full answers; with `tenant_hash`, only that tenant's
  // (as a cluster answers a tenant whose user was revoked).
  void FailWrites(bool fail, uint64_t tenant_hash = 0) {
    fail_writes_tenant_.store(tenant_hash, std::memory_order_relaxed);
    fail_writes_.store(fail, std::memory_order_relaxed);
  }
  bool shared() const override { return opts_.shared; }
  void Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
              uint64_t deadline_ns) override;
  // For tests. While paused, ops queue and do not run (deadlines pass).
  void Pause();
  void Resume();
  // For tests. While held, Exists answers nobody (as a file system hung in
  // a stat): its answers are kept, and given when released.
  void HoldExists(bool hold);

 private:
  struct Slot {
    uint64_t bytes = 0;
    uint64_t generation = 0;
    bool allocated = false;
    bool written = false;
    BlockMeta meta;
    uint64_t xxh3 = 0;
    std::vector<std::byte> data;
  };
  struct Op {
    bool write = false;
    BlockLocator slot = 0;
    uint64_t generation = 0;
    BlockMeta meta;
    std::vector<std::byte> src;  // a write's copy of the caller's bytes
    std::span<std::byte> dst;
    IoOptions io;
    IoCallback done;
    uint64_t write_seq = 0;  // writes: order of Write calls, for Sync
  };

  explicit MemoryBlockTier(const MemoryBlockTierOptions& opts);
  void Enqueue(Op op);
  void Run();
  absl::Status Execute(Op& op);
  bool LiveLocked(BlockLocator slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  using ValueKey = std::tuple<uint64_t, BlockKey, BlockKey>;  // tenant hash, namespace, key
  static ValueKey KeyOf(const BlockMeta& m) { return {m.tenant_hash, m.ns, m.key}; }

  const MemoryBlockTierOptions opts_;
  ReadObserver read_observer_;

  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockLocator> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ValueKey, Slot> values_ ABSL_GUARDED_BY(mu_);  // shared: by identity
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_slots_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<std::deque<Op>, kIoPriorities> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_write_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> unfinished_writes_ ABSL_GUARDED_BY(mu_);  // queued or running, by write_seq
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_exists_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<absl::AnyInvocable<void(std::vector<bool>) &&>, std::vector<bool>>> held_exists_
      ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the worker holds an op (until its callback returned)

  // Counted on the tier thread, read by BlockStats without the lock.
  std::atomic<bool> fail_writes_{false};
  std::atomic<uint64_t> fail_writes_tenant_{0};  // 0: every tenant
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0}, checksum_failures_{0},
      abandoned_{0}, in_flight_{0};
  std::thread worker_;  // last: started once everything above is built
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_MEMORY_BLOCK_TIER_H_
