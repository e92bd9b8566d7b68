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
std::chrono::nanoseconds Left(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   deadline - std::chrono::steady_clock::now()));
}
}  // namespace

// The writes of one drain: how many are still to land or in flight, and how
// they ended.
struct Migrator::FlushJob {
  Mutex mu;
  std::condition_variable_any cv;
  uint64_t remaining ABSL_GUARDED_BY(mu) = 0;
  uint64_t written ABSL_GUARDED_BY(mu) = 0, failed ABSL_GUARDED_BY(mu) = 0;
};

FlushResult Migrator::Flush(std::chrono::nanoseconds timeout) {
  FlushResult out;
  if (books_.lanes.empty()) return out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto job = std::make_shared<FlushJob>();
  for (const auto& tp : books_.tenants) {
    HostResidency& t = *tp;
    std::vector<BlockRecord*> todo = FlushCandidates(t, &out.already_on_nvme);
    {
      MutexLock l(&job->mu);
      job->remaining += todo.size();
    }
    for (BlockRecord* r : todo) {
      FlushBlock(t, r, job, deadline);
      books_.ReleaseIoRef(t, r);
    }
  }
  {
    MutexLock l(&job->mu);
    out.timed_out = !job->mu.AwaitFor(job->cv, Left(deadline), [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return job->remaining == 0;
    });
    out.written = job->written;
    out.failed = job->failed;
  }
  out.sync = books_.lanes[0]->tier->Sync();
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

void Migrator::FlushBlock(HostResidency& t, BlockRecord* r, const std::shared_ptr<FlushJob>& job,
                            std::chrono::steady_clock::time_point deadline) {
  // Flow control: a write the staging memory cannot take now (KVTIER_EBUSY)
  // waits until the tier gives staging back (each write does when its I/O
  // completes, before its journal record is durable) and goes again, so
  // every block that fits is written at the device's pace; it fails only
  // when nothing is in flight to free staging, or at the deadline, after
  // which no write starts.
  BlockTier& tier = *books_.lanes[0]->tier;
  auto give_up = [&job] {
    MutexLock l(&job->mu);
    ++job->failed;
    --job->remaining;
  };
  for (;;) {
    // Past the drain's budget nothing more is started: what is in flight
    // lands, and the final sync waits only for that.
    if (Left(deadline).count() == 0) return give_up();
    auto busy = std::make_shared<bool>(false);
    const uint64_t epoch = tier.WriteRoomEpoch();
    WriteThrough(t, r, IoOptions{.prio = IoPriority::kDemote, .may_wait = true}, [job, busy](absl::Status s) {
      {
        MutexLock l(&job->mu);
        if (ToErrorCode(s) == KVTIER_EBUSY) {
          *busy = true;  // refused before it started: the submitter retries
        } else {
          (s.ok() ? job->written : job->failed) += 1;
          --job->remaining;
        }
      }
      job->cv.notify_all();
    });
    {
      MutexLock l(&job->mu);
      if (!*busy) return;
    }
    if (!tier.AwaitWriteRoom(epoch, Left(deadline))) return give_up();
  }
}

}  // namespace kvtier
