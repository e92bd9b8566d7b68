// SPDX-License-Identifier: Apache-2.0
// The NVMe tier: preallocated slab files on one or more directories (one per
// device), cut into segments; each segment is cut into fixed-size slots of
// one size class the first time a block of that size needs room. A slot holds
// a 4 KiB header (magic, generation, namespace id, key, length, checksums) and
// the payload, written and read with O_DIRECT through an I/O engine (io_uring
// where allowed, else a pread/pwrite thread pool). The journal records every
// assignment after the data is durable; on start the journal is replayed and
// every live slot's header checked, so durable blocks are served again. A
// journal with damaged records (not just a torn tail) is not replayed: each
// block an intact record names is kept only when its header and payload on
// the slab verify, and the journal is rewritten (see RecoverByScan).
//
// A block whose header or checksum does not match what the index expects is
// dropped, counted, and reported as DataLoss: never served.
#ifndef KVTIER_TIERS_NVME_TIER_H_
#define KVTIER_TIERS_NVME_TIER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "tiers/io_engine.h"
#include "tiers/nvme_settings.h"
#include "tiers/journal.h"
#include "tiers/block_tier.h"
#include "tiers/staging_pool.h"

namespace kvtier {

// The operator's settings (tiers/nvme_settings.h: directories, capacity,
// segment size, queue depth, workers, engine, buffered I/O, staging) and
// what only code sets.
struct NvmeTierOptions : NvmeTierSettings {
  std::string name = "nvme";  // in status, metrics and logs
  bool group_commit = true;
  // Rewrite the journal once it exceeds this and 8x the live records.
  uint64_t journal_compact_bytes = 64ull << 20;
  // Wraps the I/O engine (tests inject faults through it).
  std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)> wrap_engine;
  // Called during recovery with (slots checked, slots to check).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct NvmeRecovery {
  uint64_t blocks = 0;              // served again
  uint64_t dropped = 0;             // header did not match the journal
  uint64_t journal_bytes_cut = 0;   // damaged journal tail
  uint64_t journal_records_cut = 0;
  // Damaged journal records that were not the torn tail (format record
  // included). When there are any, the journal alone is not trusted: every
  // block an intact record names is checked on the slab instead (header and
  // payload checksums, see Recover), and the journal is rewritten.
  uint64_t journal_records_damaged = 0;
  bool journal_format_damaged = false;
  bool scanned = false;             // recovered by checking the slab
  uint64_t scan_checked = 0;        // slots read (header and payload)
  uint64_t scan_recovered = 0;      // blocks that passed (also in `blocks`)
  // tiers.nvme.capacity changed since the journal was written (same
  // directories and segment size): the segment count before, and the blocks
  // that lay in segments the new capacity no longer has (gone). 0: unchanged.
  uint32_t resized_from_segments = 0;
  uint64_t dropped_by_resize = 0;
  // The file system had no room for the journal's reserve at open, but
  // the slab files were whole: the tier opened read-only (it serves what it
  // holds and takes no new block) until a restart with free space.
  bool read_only_full = false;
  double seconds = 0;
};

struct NvmeStats {
  std::string io_engine;          // what runs, e.g. "io_uring"
  std::string io_engine_reason;   // why a fallback was taken, if one was
  bool buffered = false;          // O_DIRECT refused, buffered fallback in use
  uint64_t capacity_bytes = 0, used_bytes = 0, used_slots = 0;
  uint64_t bytes_read = 0, bytes_written = 0, reads = 0, writes = 0;
  uint64_t in_flight = 0, queued = 0;
  uint64_t queue_depth = 0;
  uint64_t checksum_failures = 0;   // reads whose header or payload did not match
  uint64_t io_errors = 0;
  uint64_t abandoned = 0;           // ops past their deadline or cancelled before they started
  uint64_t writes_refused = 0;      // device full or staging full (not writes that wait for room)
  uint64_t calibration_reads = 0;   // reads made only to measure the device (CalibrationRead)
  bool device_full = false;
  uint64_t journal_records = 0, journal_commits = 0, journal_bytes = 0, journal_rewrites = 0;
  NvmeRecovery recovery;
};

class NvmeTier final : public BlockTier {
 public:
  // Opens or creates the slab files and the journal, replays the journal and
  // verifies the headers of live slots; `recovered` gets every block that
  // survived. Errors name the directory and what to change.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Open(const NvmeTierOptions& opts,
                                                        std::vector<RecoveredBlock>* recovered);
  ~NvmeTier() override;  // drains I/O, makes the journal durable

  TierKind kind() const override { return TierKind::kNvme; }
  // A slot for the block (its locator). ResourceExhausted when no segment
  // has room; InvalidArgument for a block larger than a segment.
  absl::StatusOr<BlockLocator> Reserve(const BlockMeta& meta) override;
  // Frees the slot (journalled); InvalidArgument for one not reserved.
  absl::Status Remove(BlockLocator slot, const BlockMeta& meta) override;
  uint64_t CostOf(BlockLocator slot) const override;
  // Writes header + payload through a staging run; done after the journal
  // record is durable. Demotions never wait for staging: they fail with
  // ResourceExhausted when it is short (or the device is full).
  // An op's deadline and token are checked when it is called and again when
  // the I/O engine takes it off its queue.
  using BlockTier::Get;
  using BlockTier::Put;
  void Put(BlockLocator slot, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
           IoCallback done) override;
  void Get(BlockLocator slot, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
           IoCallback done) override;
  TierUsage Usage() const override;
  TierHealth Health() const override;

  std::string_view name() const override { return opts_.name; }
  bool durable() const override { return true; }
  // Waits until every write so far is durable (journal and slab files).
  absl::Status Sync() override;
  // The I/O engine's ops, then the journal's: a write's callback runs once
  // its record is committed.
  void Drain() override { (void)Sync(); }
  // Makes pending demotions durable without the group-commit delay.
  void CommitSoon() override;
  uint64_t WriteRoomEpoch() const override;
  std::chrono::nanoseconds LastSyncRound() const override;
  bool AwaitWriteRoom(uint64_t epoch, std::chrono::nanoseconds timeout) override;
  BlockTierStats BlockStats() const override;
  // Everything BlockStats says, and the engine, journal and recovery.
  NvmeStats Stats() const;
  uint64_t max_block_bytes() const override { return opts_.segment_bytes - kSectorBytes; }
  uint64_t CostFor(uint64_t payload_bytes) const override { return kvtier::SlotBytesFor(payload_bytes); }

  // The observer sees block reads and calibration reads.
  void SetReadObserver(ReadObserver observer) override { read_observer_ = std::move(observer); }
  // Reads `count` durable blocks (the next ones in slot order after the last
  // calibration read; at most their first MiB) into staging. 0 when the tier
  // holds no durable block or staging is short.
  uint32_t CalibrationRead(uint32_t count) override;

 private:
  struct SlotState {
    uint64_t generation = 0;
    bool allocated = false;
    bool durable = false;
    uint64_t assign_seq = 0;  // journal seq of the durable assignment
    BlockMeta meta;
  };
  struct Segment {
    uint32_t file = 0;
    uint64_t file_offset = 0;
    uint64_t slot_bytes = 0;  // 0: not cut yet
    uint64_t segment_seq = 0;
    std::vector<SlotState> slots;
    std::vector<uint32_t> free;  // slot indexes
    uint32_t used = 0;
  };

  // Where an allocated slot lives on disk, and its current generation.
  struct SlotPlace {
    uint64_t generation = 0;
    uint64_t offset = 0;
    uint64_t slot_bytes = 0;
    uint32_t file = 0;
  };
  // nullopt when the slot is not allocated.
  std::optional<SlotPlace> Locate(SlotHandle slot) const;

  explicit NvmeTier(const NvmeTierOptions& opts);
  absl::Status OpenFiles();
  absl::Status OpenEngine();
  absl::Status Recover(std::vector<RecoveredBlock>* recovered);
  // The journal is intact but for a torn tail: replay it, check each live header.
  absl::Status RecoverFromJournal(const JournalReplay& replay, std::vector<RecoveredBlock>* recovered);
  // The journal has damaged records: keep only blocks the slab proves.
  absl::Status RecoverByScan(const JournalReplay& replay, std::vector<RecoveredBlock>* recovered);
  // Segment and live durable slot records, for Rewrite.
  std::vector<JournalRecord> SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRecord(const JournalRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CutSegment(Segment& seg, uint64_t slot_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SyncDirtyFiles();
  void MaybeCompact();
  JournalRecord RecordFor(JournalType type, uint32_t segment, uint32_t slot) const;
  bool DeviceFull() const;

  static SlotHandle Handle(uint32_t segment, uint32_t slot) { return segment << 16 | slot; }
  static uint32_t SegmentOf(SlotHandle h) { return h >> 16; }
  static uint32_t IndexOf(SlotHandle h) { return h & 0xffff; }

  const NvmeTierOptions opts_;
  std::vector<UniqueFd> files_;
  std::vector<std::atomic<bool>> dirty_;  // written since the last commit
  std::unique_ptr<StagingPool> staging_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<Journal> journal_;
  std::string engine_reason_;
  bool buffered_ = false;

  mutable Mutex mu_;
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_slots_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_durable_ ABSL_GUARDED_BY(mu_) = 0;
  // Generations only grow, across restarts too (seeded from the journal), so
  // a header left by an earlier use of a slot can never match a later one.
  uint64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  NvmeRecovery recovery_;

  std::atomic<uint64_t> checksum_failures_{0}, io_errors_{0}, writes_refused_{0}, calibration_reads_{0}, abandoned_{0};
  ReadObserver read_observer_;
  uint64_t calibration_cursor_ ABSL_GUARDED_BY(mu_) = 0;  // segment << 32 | slot of the next to try
  std::atomic<uint64_t> full_until_ns_{0};  // device reported ENOSPC: no writes until then
  bool read_only_ = false;  // set at open (recovery_.read_only_full): no writes at all
  std::atomic<bool> compacting_{false};
};

// Whether the file systems of `dirs` have room for an NVMe tier of
// `capacity_bytes` in segments of `segment_bytes` (slabs already there count
// as taken): KVTIER_ENOSPC saying how much is missing and what would fit.
// NvmeTier::Open checks it before it allocates; kvtierd --check-config too.
absl::Status CheckNvmeSpace(const std::vector<std::string>& dirs, uint64_t capacity_bytes, uint64_t segment_bytes);

}  // namespace kvtier

#endif  // KVTIER_TIERS_NVME_TIER_H_
