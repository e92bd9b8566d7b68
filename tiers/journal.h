// SPDX-License-Identifier: Apache-2.0
// The NVMe tier's journal: an append-only, checksummed log of segment and slot
// assignments and frees, made durable by group commit: one committing thread
// takes every record appended since its last round, makes the data they
// describe durable (a hook fdatasyncs the slab files), writes them in one go,
// fdatasyncs the journal, and then tells each record's waiter. A record counts
// as durable only after that.
//
// When to commit: at once when someone waits (an urgent append, CommitSoon,
// Sync); otherwise once the oldest pending record is 30 times the last
// round's duration old (1 ms .. 1 s). A device whose flushes are cheap commits
// every millisecond; one whose flushes take 10 ms batches ~300 ms of writes
// per flush, so flushing (which also stalls the device's queue) stays a few
// percent of write-back time.
//
// Open() replays the file. Records have fixed size and place, so one damaged
// record costs only itself: every intact record is kept, in seq order. Damaged
// records after the last intact one are the torn tail of a crash: cut off
// (and counted), never fatal. Damaged records with intact ones after them are
// not a torn tail (a flipped bit, a bad sector): they are counted as damaged
// and left for the owner, who cannot trust the journal alone any more and
// rewrites it (Rewrite) once it has checked what it holds. Before, replay
// stopped at the first damaged record and cut everything after it.
#ifndef KVTIER_TIERS_JOURNAL_H_
#define KVTIER_TIERS_JOURNAL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "tiers/nvme_format.h"

namespace kvtier {

// Runs once the record is durable (or failed): the status and its seq.
using DurableCallback = absl::AnyInvocable<void(absl::Status, uint64_t seq) &&>;

struct JournalOptions {
  std::string path;
  // The kFormat record a new journal starts with; an existing journal whose
  // first record differs (another layout) is refused.
  JournalRecord format{};
  // true: group commit. false: one write and one fdatasync per record (the
  // baseline kvtier-bench measures group commit against).
  bool group_commit = true;
  // Accept a journal whose format record differs from `format` only in the
  // segment count (JournalReplay::resized_from_segments); the owner then
  // rewrites it with the new format.
  bool allow_resize = false;
};

struct JournalReplay {
  JournalRecord format{};              // the file's format record (the expected one when damaged)
  std::vector<JournalRecord> records;  // intact records after the format record, in seq order
  uint64_t bytes_cut = 0;              // damaged tail removed
  uint64_t records_cut = 0;
  // Damaged records followed by intact ones, the format record included: the
  // records that are missing from `records` are unknown.
  uint64_t records_damaged = 0;
  // The format record is damaged: its generation high-water mark is lost and
  // the layout could not be checked.
  bool format_damaged = false;
  bool created = false;                // no journal existed
  uint32_t resized_from_segments = 0;  // allow_resize: the file's segment count, when it differs
};

struct JournalStats {
  uint64_t records = 0;       // appended and durable
  uint64_t commits = 0;       // fdatasync rounds
  uint64_t bytes = 0;         // current file size
  uint64_t rewrites = 0;
  uint64_t last_round_ns = 0;  // the last commit round: its pre-commit hook, write and fdatasync
};

class Journal {
 public:
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const JournalOptions& opts, JournalReplay* replay);
  ~Journal();  // commits what is pending
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Called (on the commit thread) before each round's records are written:
  // makes the data those records describe durable. An error fails the round.
  void SetPreCommitHook(std::function<absl::Status()> hook);

  // Thread-safe. Queues a record (seq and checksum are set here) and returns
  // its seq; `durable` runs on the commit thread once it is synced, or with
  // the error. `urgent`: someone waits for it, commit without batching delay.
  uint64_t Append(JournalRecord record, DurableCallback durable = nullptr, bool urgent = false);
  // Thread-safe. Commits what is pending without the batching delay; does
  // not wait.
  void CommitSoon();
  // Thread-safe. Returns once everything appended before the call is durable
  // and the records' callbacks have run.
  absl::Status Sync();
  // Thread-safe. Replaces the journal atomically with the format record
  // (carrying `generation`, a high-water mark the owner reads back from
  // JournalReplay::format) plus `live` (compaction): a new file, fdatasync,
  // rename, fsync of the directory. Records appended meanwhile go to the new
  // file.
  absl::Status Rewrite(std::vector<JournalRecord> live, uint64_t generation = 0);

  JournalStats Stats() const;
  // Thread-safe. A seq no record has and below every later Append's: for
  // records the owner builds for Rewrite.
  uint64_t ReserveSeq();

 private:
  Journal(const JournalOptions& opts, UniqueFd fd, uint64_t next_seq, uint64_t size);
  void Run();
  absl::Status CommitLocked(std::vector<JournalRecord>& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  const JournalOptions opts_;
  // Serializes file writes: the commit thread and Rewrite.
  Mutex write_mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(write_mu_);
  uint64_t size_ ABSL_GUARDED_BY(write_mu_) = 0;
  std::function<absl::Status()> pre_commit_;  // set before use

  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::vector<JournalRecord> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<DurableCallback> pending_cbs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;  // records appended
  bool urgent_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t first_pending_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_round_ns_ ABSL_GUARDED_BY(mu_) = 0;  // duration of the last commit round
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;   // records made durable (or failed)
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  JournalStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_JOURNAL_H_
