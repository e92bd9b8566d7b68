// SPDX-License-Identifier: Apache-2.0
// A block tier in a directory that several kvtier nodes mount (NFS, CephFS,
// Lustre, a FUSE file system, or a local disk for one node): each block is
// one file, so any node that mounts the directory can load what another
// wrote.
//
// Layout: <dir>/<tenant>/<xx>/<namespace hex>-<key hex>.kvb, where <xx> is
// the key's first byte (256 folders, so no folder grows past what network
// file systems list well). Each tenant's folder is created mode 0700 and
// its files 0600: another uid on a node cannot read a tenant's blocks, and
// kvtierd refuses a tenant folder another uid owns or can open.
//
// Every level below the directory is opened without following links and
// checked on its descriptor (kvtierd's uid, closed to others); files are
// opened O_NOFOLLOW and must be regular files of kvtierd's uid. A write
// goes to a temporary name in the same folder, is fsync'ed, and is renamed
// over the block's name, so a reader sees the old file, the new one or
// none, never half a block. Every file starts with a self-checking header
// (magic, version, tenant, namespace, key, payload length, XXH3 of the
// payload and of the header); a read checks all of it and the file's size
// before it says OK: a file truncated or damaged is DataLoss (counted,
// deleted if it is still the file read), never served; a file of another
// format version is a miss left in place for the nodes that read it. A read
// moves the file's mtime to now (at most once a second), so every node's
// eviction scan sees one recency order.
//
// Trust: the checks catch accidents, not forgery. Whoever can write files
// as kvtierd's uid on the share (every node's kvtierd; on NFS with AUTH_SYS,
// root on any client) can write a block that passes them. Export the share
// only to kvtier's nodes, with root squashed; docs/security.md says so.
//
// Capacity: the directory's files, from every node, may take capacity_bytes.
// A background scan lists the directory (at most every scan_interval_ms, or
// at once when this node wrote an eighth of the capacity since the last),
// and when the files pass capacity it deletes the least recently used
// (oldest mtime) down to low_watermark of it. Files other nodes delete under
// it are skipped, not errors. A temporary file older than an hour (a writer
// that died) is deleted too. The scan counts the tenants this node serves:
// nodes that share a directory should list the same tenants.
//
// Errors: a directory that vanished, a full file system (ENOSPC, EDQUOT), an
// I/O error (a write's deferred error at close included): the op fails with
// a status saying so, is counted, and the tier reports itself degraded until
// an op succeeds again. Nothing is retried behind the caller's back; a read
// that fails is a miss.
//
// I/O runs on a pool of io_threads threads, loads before demotions; an op
// not started by its deadline (op_timeout_ms when the caller gives none)
// fails with DeadlineExceeded, even when every thread is stuck in a call the
// file system does not return from (a reaper thread fails it; a call stuck
// for 5 s, or four deadlines, degrades the tier). The op in that call
// completes only when the file system answers. Like the remote tier, it is
// addressed by the block's identity alone: the file belongs to the
// directory, and what this node placed there is in the store's books.
#ifndef KVTIER_TIERS_FS_FS_TIER_H_
#define KVTIER_TIERS_FS_FS_TIER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "tiers/block_tier.h"
#include "tiers/fs/fs_settings.h"

namespace kvtier {

// A block file's header, little-endian, in front of the payload.
struct FsBlockHeader {
  static constexpr uint32_t kMagic = 0x4246564b;  // "KVFB"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t header_bytes = sizeof(FsBlockHeader);
  uint64_t tenant_hash = 0;
  uint8_t ns[32] = {};
  uint8_t key[32] = {};
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload
  uint64_t header_check = 0;  // XXH3-64 of the bytes above
};
static_assert(sizeof(FsBlockHeader) == kFsBlockHeaderBytes, "the fs block header is 104 bytes on disk");

// Whether `h` (read from a file of `file_bytes`) is the header of the block
// `meta` names: OK or DataLoss saying why not. The payload's checksum is
// checked by the caller once it is read.
absl::Status CheckFsHeader(const FsBlockHeader& h, uint64_t file_bytes, const BlockMeta& meta);
FsBlockHeader MakeFsHeader(const BlockMeta& meta, std::span<const std::byte> payload);

struct FsTenant {
  std::string name;  // as in kvtierd's [[tenants]]: its folder's name
  uint64_t hash = 0;  // TenantHash(name), as BlockMeta::tenant_hash
};

// The settings (fs_settings.h: directory, capacity, threads, timeouts)
// and what kvtierd fills in.
struct FsTierOptions : FsTierSettings {
  std::vector<FsTenant> tenants;
  std::string name = "fs";
  uint64_t max_block_bytes = 64ull << 20;
  // A lasting failure (directory gone, file system full): at most once every
  // 10 s, on a tier thread; never a key or a block.
  std::function<void(const std::string& why)> on_failure;
};

class FsTier final : public KeyAddressedBlockTier {
 public:
  // InvalidArgument for bad options; FailedPrecondition when the directory
  // does not exist or a tenant folder is not safe (another uid owns it, or
  // others may open it).
  static absl::StatusOr<std::unique_ptr<FsTier>> Create(const FsTierOptions& opts);
  ~FsTier() override;  // runs what is queued, then stops

  // The file a block of `meta` lives in (for tools and tests); empty for a
  // tenant the tier does not know.
  std::string PathFor(const BlockMeta& meta) const;

  TierKind kind() const override { return TierKind::kFile; }
  // Addressed by key alone (KeyAddressedBlockTier): the store keeps the
  // books of what this node placed here against capacity_bytes.
  uint64_t CostFor(uint64_t payload_bytes) const override { return payload_bytes + sizeof(FsBlockHeader); }
  using BlockTier::Get;
  using BlockTier::Put;
  void Put(BlockLocator at, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
           IoCallback done) override;
  // NotFound when no node's file holds the block (evicted, never written);
  // DataLoss when the file does not prove itself (then it is deleted).
  void Get(BlockLocator at, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
           IoCallback done) override;
  // Which of `metas` have a file now (one stat each, on a tier thread).
  void Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
              uint64_t deadline_ns) override;
  bool shared() const override { return true; }
  // Capacity only: what this node claims is in the store's books.
  TierUsage Usage() const override { return TierUsage{.capacity_bytes = capacity_bytes_.load(std::memory_order_relaxed)}; }
  TierHealth Health() const override;

  std::string_view name() const override { return opts_.name; }
  bool durable() const override { return false; }  // this node keeps no index of it across restarts
  uint64_t max_block_bytes() const override { return opts_.max_block_bytes; }
  absl::Status Sync() override;  // waits for the writes in flight (each is fsync'ed before it completes)
  void Drain() override;
  void CommitSoon() override {}
  BlockTierStats BlockStats() const override;
  void SetReadObserver(ReadObserver observer) override { read_observer_ = std::move(observer); }
  uint32_t CalibrationRead(uint32_t) override { return 0; }  // every read is timed
  // scans, files, bytes, evicted, vanished, stale_temps, scan_failures, and
  // misses_{not_found,bad_file,io,deadline}.
  void VisitCounters(absl::FunctionRef<void(std::string_view, uint64_t)> visit) const override;

  // The directory as the last scan found it, and what scans did.
  struct ScanStats {
    uint64_t scans = 0;
    uint64_t files = 0, bytes = 0;   // block files and their bytes, every node's
    uint64_t evicted = 0;            // files this node's scans deleted for capacity
    uint64_t vanished = 0;           // files gone between listing and deleting (another node)
    uint64_t stale_temps = 0;        // temporary files of dead writers deleted
    uint64_t failures = 0;           // scans that could not list the directory
  };
  ScanStats scan_stats() const;
  // Per cause, for status and metrics.
  struct Misses {
    uint64_t not_found = 0;  // no file
    uint64_t bad_file = 0;   // failed its checks (deleted)
    uint64_t io = 0;         // the file system failed the read
    uint64_t deadline = 0;   // not started in time
  };
  Misses misses() const;
  // Scans now, on the caller's thread (tests, kvtierctl).
  void ScanNow();

  // Applies new settings while the tier runs (a reload): capacity_bytes,
  // low_watermark, op_timeout_ms, scan_interval_ms and fsync take effect for
  // the next op and scan; a smaller capacity scans at once. The directory and
  // io_threads are the tier's for life: a change of either, or a value
  // Create would refuse, is InvalidArgument and changes nothing.
  absl::Status Retune(const FsTierSettings& next);
  // The settings in effect.
  FsTierSettings settings() const;

 private:
  explicit FsTier(const FsTierOptions& opts);
  struct Job {
    IoPriority prio;
    uint64_t deadline_ns;
    CancelToken cancel;
    absl::AnyInvocable<void(absl::Status abandoned) &&> run;  // OK: run it; else why it was abandoned
  };
  void Submit(Job job);
  void Worker(uint32_t index);
  // Runs `job` (or tells it why it was abandoned) and counts it done.
  void RunJob(Job job, absl::Status abandoned);
  // Fails queued ops past their deadlines when no worker takes them, and
  // degrades the tier when a worker is stuck in a call.
  void ReapLoop();
  void ScanLoop();
  const FsTenant* TenantFor(uint64_t tenant_hash) const;
  static std::string FileName(const BlockMeta& meta);
  // The folder the block's file lives in (<dir>/<tenant>/<xx>), each level
  // opened without following links and checked to be kvtierd's own and
  // closed to others; created (0700) below the directory when `create`.
  absl::StatusOr<UniqueFd> OpenBlockFolder(const FsTenant& t, const BlockMeta& meta, bool create) const;
  absl::Status WriteFile(const BlockMeta& meta, std::span<const std::byte> src);
  absl::Status ReadFile(const BlockMeta& meta, std::span<std::byte> dst);
  // A failure that says the tier cannot work (vanished, full, I/O): degrade and report.
  void Failed(const absl::Status& s);
  void Succeeded();

  const FsTierOptions opts_;  // its settings as created; those Retune changes live below
  std::atomic<uint64_t> capacity_bytes_, op_timeout_ms_, scan_interval_ms_;
  std::atomic<double> low_watermark_;
  std::atomic<bool> fsync_;
  ReadObserver read_observer_;  // set before the first read

  mutable Mutex mu_;
  std::condition_variable_any work_cv_, idle_cv_, scan_cv_, reap_cv_;
  std::deque<Job> queue_[kIoPriorities] ABSL_GUARDED_BY(mu_);
  uint64_t reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0, writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t jobs_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or running, reads, writes and probes
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool scan_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool retuned_ ABSL_GUARDED_BY(mu_) = false;  // Retune ran: the scanner waits anew, for the new interval
  ScanStats scan_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
  std::vector<std::atomic<uint64_t>> worker_started_ns_;  // when each worker's op began; 0: idle
  std::thread reaper_, scanner_;
  Mutex scan_mu_;  // one scan at a time

  std::atomic<uint64_t> written_since_scan_{0};
  std::atomic<bool> degraded_{false};
  std::atomic<uint64_t> failure_reported_ns_{0};
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0};
  std::atomic<uint64_t> io_errors_{0}, writes_refused_{0}, abandoned_{0}, checksum_failures_{0};
  std::atomic<uint64_t> miss_not_found_{0}, miss_io_{0}, miss_deadline_{0};
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_FS_FS_TIER_H_
