// SPDX-License-Identifier: Apache-2.0
// The migrator: every move of a block's copy between tiers.
//
//   - Host eviction (EvictHostCopyLocked): a victim's host copy is let go
//     when the block has a lower copy, demoted into the first lower tier
//     when it is worth keeping (the cost model's call), or dropped.
//   - Write-through and durable commits (WriteThrough): a committed block's
//     host copy is written to the first lower tier as well.
//   - Promotion (Promote): a block without a host copy is read back into a
//     host slot from whichever lower tier holds it, as a state machine
//     (migrator_promotion.cc).
//   - The drain (Flush): every host block without a durable lower copy is
//     written down, with flow control (migrator_flush.cc).
//   - The cascade (migrator_cascade.cc): cold copies move one tier down
//     the chain; lower-tier eviction makes room on the allocating path.
//
// Room in a host tier is the tenant's HostResidency's (AllocateSlotLocked,
// host_room.cc): it chooses the victims and calls the migrator, its
// HostEvictor, to move each one's copy out.
//
// It works on the store's books (store_books.h). An operation with a tier I/O in flight on a block holds an
// io_ref on its record: such a block is neither evicted nor destroyed until
// the I/O completes, whatever happens to it meanwhile.
//
// Thread-safe; callbacks never run under a tier lock. Lock order:
// docs/architecture.md, "Lock order".
#ifndef KVTIER_STORE_MIGRATOR_H_
#define KVTIER_STORE_MIGRATOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/cascade.h"
#include "store/store_books.h"
#include "tiers/block_tier.h"

namespace kvtier {

using StatusCallback = absl::AnyInvocable<void(absl::Status) &&>;

// What a drain did (Migrator::Flush).
struct FlushResult {
  uint64_t written = 0, failed = 0, already_on_nvme = 0;
  // The budget ran out: blocks were not started for lack of time (in
  // `failed`, with writes that never landed), or writes landed after the
  // deadline (in `written` or `failed`, and in `landed_late`).
  bool timed_out = false;
  uint64_t landed_late = 0;
  absl::Status sync;
  // The final sync's time: writes under way landing, the journal made durable.
  std::chrono::nanoseconds sync_time{0};
};

// A demotion whose copy into the first lower tier waits until the tier
// lock is released: its block is invisible in host memory and out of the
// policy, and its host slot stays allocated until Migrator::FinishDemotion.
struct PendingDemotion {
  BlockRecord* r = nullptr;
  uint8_t lane = 0;  // the lane written: the first, or one below it when the first was full
  SlotHandle host_slot = 0, lower_slot = 0;
  uint64_t offset = 0;
  BlockMeta meta;
};

class Migrator final : public HostEvictor {
 public:
  struct Options {
    // The cascade between lower tiers (with two or more): above
    // cascade_high of a tier's capacity, its coldest copies move one tier
    // down until it is at cascade_low.
    double cascade_high = 0.9;
    double cascade_low = 0.8;
    // Blocks smaller than this never go to a shared tier.
    uint64_t shared_min_block_bytes = 0;
  };
  Migrator(StoreBooks& books, const Options& opts);
  ~Migrator();  // stops the cascade
  Migrator(const Migrator&) = delete;
  Migrator& operator=(const Migrator&) = delete;

  // --- host eviction (migrator.cc)
  using PendingDemotion = ::kvtier::PendingDemotion;
  using EvictResult = HostEvictor::Result;
  // Takes a host victim's copy away: kept below, demoted, or dropped (then
  // the block leaves the store). kSkipped when it may not go now (pinned,
  // busy, not ready). With `deferred`, a demotion's write is left to
  // FinishDemotion (appended there) instead of copying under the tier lock.
  // HostResidency calls it for the victims it chooses.
  // The cascade's victim r on `from` is not admitted to the tier below:
  // drops that copy as the tier's eviction would. False (nothing done) when
  // r changed since the policy chose it.
  bool DropUnadmittedLocked(LowerLane& from, BlockRecord* r, SlotHandle slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(from.mu);
  EvictResult EvictHostCopyLocked(HostResidency& t, BlockRecord* r, std::vector<PendingDemotion>* deferred) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Starts a deferred demotion's write (the background reclaim's), then
  // frees its host slot. With a `wait`, the write takes the first tier's
  // smaller staging share (IoOptions::may_wait), and one the tier refuses
  // for a burst faster than its device waits up to `wait` for room and goes
  // again; false when it was refused even so (the block then went a tier
  // down, or was lost and counted in demotions_failed): the caller should
  // stop evicting for now.
  bool FinishDemotion(HostResidency& t, const PendingDemotion& d, std::chrono::nanoseconds wait = {})
      ABSL_LOCKS_EXCLUDED(t.mu);

  // --- write-through (migrator.cc)
  // Writes r's committed host copy to the first lower tier; `done` gets the
  // write's status (FailedPrecondition when the block is already kept on a
  // tier that is not durable, Unavailable while it is moving).
  void WriteThrough(HostResidency& t, BlockRecord* r, const IoOptions& io, StatusCallback done);

  // --- promotion (migrator_promotion.cc)
  // Brings r's lower copy into a host slot; `done(ok)` when it is there or
  // failed. parent_key: PolicyKeyOf the block before r in its chain (0:
  // none or unknown), for the host policy's chain order.
  void Promote(HostResidency& t, BlockRecord* r, IoPriority prio, absl::AnyInvocable<void(bool) &&> done,
               uint64_t parent_key = 0);

  // --- the drain (migrator_flush.cc)
  // Writes every committed host block without a durable lower copy to the
  // first lower tier and syncs it, waiting at most `timeout` for the writes.
  FlushResult Flush(std::chrono::nanoseconds timeout);

  // --- lower tiers (migrator.cc)
  // Drops r's lower copy if it is still `slot` in lane `lane` (a copy that
  // failed its check); with sole_holder, only if the caller's io_ref is r's only one.
  void DropLowerCopy(BlockRecord* r, uint8_t lane, SlotHandle slot, bool sole_holder = false);
  // A lane slot for r's bytes, evicting while the tier is full or r's
  // tenant would go over its quota there (then from its own blocks). Never
  // evicts another tenant's block if that would leave the other below its
  // fair share (the rule: LowerLane::PickVictimLocked). Charges r's tenant
  // and makes r the handle's owner.
  // Quotas apply to lane 0 only. With `full`, a tier too full for r
  // (r's tenant within its quota) evicts nothing: ResourceExhausted, and
  // *full set.
  absl::StatusOr<SlotHandle> AllocateLowerSlotLocked(LowerLane& lane, BlockRecord* r, uint64_t bytes,
                                                     bool* full = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  // When the cost model has been deciding against the first lower tier
  // without reads to learn from, reads a few of its blocks to time it.
  // Returns the reads submitted.
  uint32_t CalibrateFirstTier(uint64_t now_ns);

  // --- the cascade (migrator_cascade.cc)
  void StartCascade() { cascade_.Start(); }  // with two lanes or more; main thread
  void StopCascade() { cascade_.Stop(); }
  bool cascade_settled() const { return cascade_.settled(); }

 private:
  // Evictions the cost model would drop; every kCalibrationDemotionEvery-th
  // is demoted anyway (3%: the tier keeps blocks to measure it on).
  static constexpr uint64_t kCalibrationDemotionEvery = 32;

  // EvictHostCopyLocked's choices for a block without a lower copy. Whether
  // its reload would be slower than recomputing it (then it is dropped; one
  // in kCalibrationDemotionEvery is demoted anyway).
  bool DropForCost(const BlockRecord* r, const BlockMeta& meta);
  // Demotes r (kEvicting, with the eviction's io_ref) into the first lower
  // tier; false (r untouched, *why_not the counter of the reason) without
  // one, too large for it, or no room. When the first tier is full and the
  // next one down has room now (and admits r), r goes there instead of
  // making the first tier drop its coldest block: nothing is lost while the
  // chain has room (DemotionSlot).
  bool DemoteLocked(HostResidency& t, BlockRecord* r, SlotHandle host_slot, uint64_t offset, const BlockMeta& meta,
                    std::vector<PendingDemotion>* deferred, Counter** why_not) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // A warning at most every 10 s while host evictions are dropped for want
  // of a place below (not by the cost model), with the counts by reason.
  void SayDropped();
  std::atomic<uint64_t> drops_said_ns_{0};
  // A slot for a demotion of r: in the first lane if it has room now, else
  // in the second if that has room now and takes r, else in the first,
  // evicting there. Sets *lane to the lane's index.
  absl::StatusOr<SlotHandle> DemotionSlot(BlockRecord* r, const BlockMeta& meta, uint8_t* lane);
  // Demotions written past a full first tier and not landed yet.
  static constexpr uint32_t kMaxPastFullInFlight = 64;
  std::atomic<uint32_t> past_full_in_flight_{0};
  // Whether the second lane's tier answered healthy, asked at most every 100 ms.
  bool NextTierHealthy(const LowerLane& next);
  std::atomic<uint64_t> next_health_at_ns_{0};
  std::atomic<bool> next_healthy_{false};
  // Starts the write of a demotion into `lane` from host memory at `offset`.
  // `wait`, and what it returns, as for FinishDemotion (true whenever the
  // write was not refused). A wait may be given only without t.mu held.
  bool WriteDemotion(HostResidency& t, BlockRecord* r, uint8_t lane, SlotHandle lower_slot, uint64_t offset,
                     const BlockMeta& meta, std::chrono::nanoseconds wait = {});
  // A demotion the first lane's tier refused inside Put (KVTIER_EBUSY:
  // no staging memory) goes to the next lane's room now, if it takes r;
  // false (nothing changed) if not.
  bool RedirectRefusedDemotion(HostResidency& t, BlockRecord* r, SlotHandle first_slot, uint64_t offset,
                               const BlockMeta& meta);
  // A write into `lane` (a demotion or a write-through) ended: the copy is
  // ready, or gone; whoever waited on it is told.
  void OnLowerWritten(uint8_t lane, BlockRecord* r, absl::Status s);
  void RecordWriteLocked(LowerLane& lane, BlockRecord* r, const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);

  // Promotion's states (migrator_promotion.cc, above PlanPromotionLocked).
  struct PromotionPlan {
    enum Next { kAlreadyReady, kWaiting, kAfterWrite, kFail, kRead } next = kFail;
    bool drop_ref = false;  // kFail after the io_ref was taken
    uint8_t lane = 0;       // kRead: where the copy is
    SlotHandle lower_slot = kNoSlot, host_slot = kNoSlot;
    uint64_t offset = 0;    // of host_slot in the arena
  };
  PromotionPlan PlanPromotionLocked(HostResidency& t, BlockRecord* r, const BlockMeta& meta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Queues `done` (moved from) to decide again once r's demotion write
  // lands; false (done untouched) when it already has.
  bool AwaitDemotionLocked(HostResidency& t, BlockRecord* r, IoPriority prio, absl::AnyInvocable<void(bool) &&>& done,
                           uint64_t parent_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  void FinishPromotion(HostResidency& t, BlockRecord* r, const PromotionPlan& p, const absl::Status& s,
                       uint64_t parent_key, uint32_t block_tokens, absl::AnyInvocable<void(bool) &&> done);

  // Flush's parts (migrator_flush.cc). The tenant's committed host blocks
  // without a durable lower copy, each with an io_ref (a copy on a tier that
  // is not durable is dropped); the others are counted.
  std::vector<BlockRecord*> FlushCandidates(HostResidency& t, uint64_t* already_durable) ABSL_LOCKS_EXCLUDED(t.mu);
  struct FlushJob;
  // Writes r, waiting for room in the staging memory while writes are in flight.
  void FlushBlock(HostResidency& t, BlockRecord* r, const std::shared_ptr<FlushJob>& job) ABSL_LOCKS_EXCLUDED(t.mu);

  // The cascade's driver sees the chain through these: its length, each
  // lane's fullness, a batch of moves.
  Cascade::Hooks CascadeHooks();
  // Moves up to `max` of lane i's coldest blocks into lane i + 1; returns how many moved.
  uint32_t CascadeBatch(size_t i, uint32_t max);
  // CascadeBatch's steps (migrator_cascade.cc's header): the copies picked
  // (each with an io_ref), their room below, read and write, and the swap.
  struct CascadeMove {
    BlockRecord* r = nullptr;
    SlotHandle slot = kNoSlot, to_slot = kNoSlot;
    BlockMeta meta;
    std::unique_ptr<std::byte[]> staging;
    absl::Status read, wrote;
    bool already_below = false;  // a shared tier below holds it already: nothing to copy
  };
  std::vector<CascadeMove> PickCascadeMoves(LowerLane& from, const LowerLane& to, uint32_t max)
      ABSL_LOCKS_EXCLUDED(from.mu);
  void CopyCascadeMoves(LowerLane& from, LowerLane& to, std::vector<CascadeMove>& moves)
      ABSL_LOCKS_EXCLUDED(from.mu, to.mu);
  // Reads each move `which` picks from `lane` under `slot_of` into its own
  // staging memory (m.read: how it went); returns when all have finished.
  static void ReadIntoStaging(const LowerLane& lane, std::vector<CascadeMove>& moves,
                              absl::FunctionRef<bool(const CascadeMove&)> which,
                              absl::FunctionRef<SlotHandle(const CascadeMove&)> slot_of);
  // Points the record at its new copy and frees the old one, or gives the
  // new slot back; true when it moved. The caller drops the move's io_ref.
  bool FinishCascadeMove(LowerLane& from, LowerLane& to, CascadeMove& m) ABSL_LOCKS_EXCLUDED(from.mu, to.mu);

  StoreBooks& books_;
  std::atomic<uint64_t> cost_demotions_{0};  // a counter only: no lock
  const uint64_t shared_min_block_bytes_;
  // Last: stopped first, before anything its passes touch goes.
  Cascade cascade_;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_MIGRATOR_H_
