// SPDX-License-Identifier: Apache-2.0
// Migrator::Flush: the drain at shutdown (and the admin flush).
// Every host block without a durable lower copy is written to the first
// lower tier, with flow control: a write the staging memory cannot take now
// waits for staging to free and goes again, so every block that fits is written.
#include "store/migrator.h"

#include <algorithm>
#include <condition_variable>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {

namespace {
// The most writes one flush has in flight: a tier without staging memory
// (file system, remote, memory) takes every write at once and copies its
// bytes, which for a large host tier would double the daemon's memory at
// shutdown. Above the NVMe tier's default staging share (32 MiB of 32 KiB
// blocks: ~900), so it does not pace NVMe.
constexpr uint64_t kFlushWindow = 1024;

std::chrono::nanoseconds Left(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   deadline - std::chrono::steady_clock::now()));
}
}  // namespace

// The writes of one drain: how many are still to land or in flight, and how
// they ended.
struct Migrator::FlushJob {
  FlushJob(std::chrono::steady_clock::time_point s, std::chrono::nanoseconds timeout, uint64_t epoch)
      : start(s),
        deadline(s + timeout),
        deadline_ns(MonotonicNanos() + static_cast<uint64_t>(std::max<int64_t>(0, timeout.count()))),
        sync_cap(timeout / 8),
        start_epoch(epoch) {}
  const std::chrono::steady_clock::time_point start, deadline;
  const uint64_t deadline_ns;  // the same, for the tier: a write still queued then is abandoned
  // The most of the budget kept for the final sync's journal round: one
  // slow round before the flush (a disk busy with someone else's writes)
  // must not leave every block unwritten.
  const std::chrono::nanoseconds sync_cap;
  const uint64_t start_epoch;  // the tier's WriteRoomEpoch() then: it counts writes whose I/O completed
  Mutex mu;
  std::condition_variable_any cv;
  uint64_t remaining ABSL_GUARDED_BY(mu) = 0;
  uint64_t written ABSL_GUARDED_BY(mu) = 0, failed ABSL_GUARDED_BY(mu) = 0;
  uint64_t late ABSL_GUARDED_BY(mu) = 0;  // landed (written or failed) after the deadline
  // Writes the tier took; those of them that ended inside the call without
  // I/O (refused for good, already below); and those that landed later.
  uint64_t launched ABSL_GUARDED_BY(mu) = 0, ended_without_io ABSL_GUARDED_BY(mu) = 0;
  uint64_t landed ABSL_GUARDED_BY(mu) = 0;
  bool out_of_time ABSL_GUARDED_BY(mu) = false;  // blocks were not started for lack of time

  struct Estimate {
    std::chrono::nanoseconds landing{0};  // what the final Sync() would take now
    uint64_t in_flight = 0;               // this flush's writes whose I/O is still to complete
    uint64_t epoch = 0, landed = 0;       // what it was made from: a wait for the next landing starts there
  };
  // If no more writes start: the I/O in flight completing at the pace this
  // flush has seen, and one journal round. The pace is that of the I/O
  // (the tier's write-room epoch, where it has one), not of the journal,
  // whose group commit holds thousands of written blocks that the sync's
  // urgent round makes durable at once; a tier without one lands its writes
  // as their I/O completes. An estimate: other I/O releasing staging
  // meanwhile (an admin flush beside loads) makes it smaller.
  Estimate Now(std::chrono::steady_clock::time_point now, const BlockTier& tier) {
    Estimate e;
    e.epoch = tier.WriteRoomEpoch();
    const uint64_t epochs = e.epoch - start_epoch;
    uint64_t io_done = 0;
    {
      MutexLock l(&mu);
      e.landed = landed;
      io_done = std::max(epochs, landed);
      const uint64_t with_io = launched - ended_without_io;
      e.in_flight = with_io > io_done ? with_io - io_done : 0;
    }
    if (io_done > 0) {
      e.landing = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start) / int64_t(io_done) *
                  int64_t(e.in_flight);
    }
    e.landing += std::min(tier.LastSyncRound(), sync_cap);
    return e;
  }
  // Waits until a write of this flush lands after `seen` (true), or for
  // `timeout` (false).
  bool AwaitLanding(uint64_t seen, std::chrono::nanoseconds timeout) {
    MutexLock l(&mu);
    return mu.AwaitFor(cv, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return landed != seen; });
  }
};

FlushResult Migrator::Flush(std::chrono::nanoseconds timeout) {
  FlushResult out;
  if (books_.lanes.empty()) return out;
  BlockTier& tier = *books_.lanes[0]->tier;
  const auto start = std::chrono::steady_clock::now();
  auto job = std::make_shared<FlushJob>(start, timeout, tier.WriteRoomEpoch());
  for (const auto& tp : books_.tenants) {
    HostResidency& t = *tp;
    std::vector<BlockRecord*> todo = FlushCandidates(t, &out.already_on_nvme);
    {
      MutexLock l(&job->mu);
      job->remaining += todo.size();
    }
    for (BlockRecord* r : todo) {
      FlushBlock(t, r, job);
      books_.ReleaseIoRef(t, r);
    }
  }
  // Every write has started or given up: the sync lands those in flight and
  // commits the journal at once (its group commit would hold the flush's
  // records for up to a second).
  const auto synced_from = std::chrono::steady_clock::now();
  out.sync = tier.Sync();
  out.sync_time = std::chrono::steady_clock::now() - synced_from;
  MutexLock l(&job->mu);
  // A tier whose Sync() returns before its writes' callbacks: they get what
  // is left of the budget. One still unfinished then is counted failed.
  const bool all_landed = job->mu.AwaitFor(job->cv, Left(job->deadline), [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return job->remaining == 0;
  });
  out.written = job->written;
  out.failed = job->failed + job->remaining;
  out.landed_late = job->late;
  out.timed_out = job->out_of_time || !all_landed || job->late > 0;
  return out;
}

std::vector<BlockRecord*> Migrator::FlushCandidates(HostResidency& t, uint64_t* already_durable) {
  std::vector<BlockRecord*> todo;
  // Blocks whose only lower copy is on a tier that forgets at a restart
  // (the cascade moved it there): that copy goes, the first tier gets one.
  std::vector<std::tuple<BlockRecord*, uint8_t, SlotHandle>> not_durable;
  {
    MutexLock l(&t.mu);
    t.slots.ForEachOwner([&](BlockRecord* r) {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->removed || r->state != BlockState::kReady) return;
      const bool durable_copy = r->lower_state == LowerState::kReady && books_.LaneOf(r).tier->durable();
      if (r->lower_state == LowerState::kNone || (r->lower_state == LowerState::kReady && !durable_copy)) {
        ++r->io_refs;  // held until WriteThrough took its own: r stays put meanwhile
        todo.push_back(r);
        if (r->lower_state == LowerState::kReady) not_durable.emplace_back(r, uint8_t{r->lower}, r->lower_slot);
      } else {
        ++*already_durable;
      }
    });
  }
  for (const auto& [r, lane, slot] : not_durable) DropLowerCopy(r, lane, slot, /*sole_holder=*/true);
  return todo;
}

void Migrator::FlushBlock(HostResidency& t, BlockRecord* r, const std::shared_ptr<FlushJob>& job) {
  // Flow control: a write the staging memory cannot take now (KVTIER_EBUSY)
  // waits until the tier gives staging back (each write does when its I/O
  // completes, before its journal record is durable) and goes again, so
  // every block that fits is written at the device's pace. The budget
  // bounds the whole flush, its final sync included: while the writes in
  // flight would need the rest of it to land, the next one waits for one of
  // them and looks again; it fails when none of ours is in flight, or at the
  // deadline, when the tier also abandons the writes still queued (their
  // deadline_ns), so that the final sync waits only for those under way.
  BlockTier& tier = *books_.lanes[0]->tier;
  auto give_up = [&job](bool for_time) {
    MutexLock l(&job->mu);
    ++job->failed;
    --job->remaining;
    job->out_of_time |= for_time;
  };
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= job->deadline) return give_up(true);
    const FlushJob::Estimate e = job->Now(now, tier);
    const bool no_time = job->deadline - now <= e.landing;
    if (no_time || e.in_flight >= kFlushWindow) {
      // Nothing of ours in flight: the final sync alone needs what is left.
      if (e.in_flight == 0) return give_up(true);
      // Else one of them lands (its staging, or a tier without staging: its
      // callback), and the estimate is made again.
      if (!tier.AwaitWriteRoom(e.epoch, Left(job->deadline)) && !job->AwaitLanding(e.landed, Left(job->deadline))) {
        return give_up(no_time || Left(job->deadline).count() == 0);
      }
      continue;
    }
    auto busy = std::make_shared<bool>(false);
    auto in_call = std::make_shared<bool>(true);
    const uint64_t epoch = tier.WriteRoomEpoch();
    {
      MutexLock l(&job->mu);
      ++job->launched;  // before the write: its callback may run first
    }
    const IoOptions io{.prio = IoPriority::kDemote, .deadline_ns = job->deadline_ns, .may_wait = true};
    WriteThrough(t, r, io, [job, busy, in_call](absl::Status s) {
      {
        MutexLock l(&job->mu);
        if (ToErrorCode(s) == KVTIER_EBUSY) {
          *busy = true;  // refused before it started: the submitter retries
          --job->launched;
        } else {
          // Inside WriteThrough: it ended without I/O (a write that did I/O
          // lands after its journal round, all but never before the call
          // returns; one that did is one write counted twice below).
          ++(*in_call ? job->ended_without_io : job->landed);
          (s.ok() ? job->written : job->failed) += 1;
          --job->remaining;
          // Not started by its deadline (the tier abandoned it): failed, not late.
          if (std::chrono::steady_clock::now() > job->deadline && s.code() != absl::StatusCode::kDeadlineExceeded) {
            ++job->late;
          }
        }
      }
      job->cv.notify_all();
    });
    {
      MutexLock l(&job->mu);
      *in_call = false;
      if (!*busy) return;
    }
    // False at once when nothing in flight is to free staging (the block
    // can never fit), else at the deadline.
    if (!tier.AwaitWriteRoom(epoch, Left(job->deadline))) return give_up(Left(job->deadline).count() == 0);
  }
}

}  // namespace kvtier
