// SPDX-License-Identifier: Apache-2.0
#include "tiers/nvme_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"
#include "tiers/nvme_format.h"

namespace kvtier {
namespace {

constexpr uint64_t kFullBackoffNs = 5'000'000'000;  // after ENOSPC, no demotion for 5 s
constexpr uint32_t kMaxSegments = 0xffff;

std::string SlabPath(const std::string& dir) { return dir + "/kvtier-slab.kvt"; }

}  // namespace

NvmeTier::NvmeTier(const NvmeTierOptions& opts) : opts_(opts) {}

NvmeTier::~NvmeTier() {
  if (engine_) engine_->Drain();
  if (journal_) (void)journal_->Sync();
  engine_.reset();   // joins I/O threads before the staging memory goes
  journal_.reset();  // joins the commit thread
}

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeTierOptions& opts,
                                                        std::vector<RecoveredBlock>* recovered) {
  if (opts.dirs.empty()) return absl::InvalidArgumentError("tiers.nvme.dirs is empty");
  if (opts.segment_bytes < (1u << 20) || opts.segment_bytes % kSectorBytes != 0) {
    return absl::InvalidArgumentError("tiers.nvme.segment_bytes must be a multiple of 4 KiB and at least 1 MiB");
  }
  const uint64_t per_dir = opts.capacity_bytes / opts.dirs.size() / opts.segment_bytes;
  if (per_dir == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tiers.nvme.capacity (", FormatBytes(opts.capacity_bytes), ") must give each of the ", opts.dirs.size(),
        " directories at least one segment of ", FormatBytes(opts.segment_bytes)));
  }
  if (per_dir * opts.dirs.size() > kMaxSegments) {
    return absl::InvalidArgumentError("tiers.nvme.capacity / segment_bytes exceeds 65535 segments; raise segment_bytes");
  }
  std::unique_ptr<NvmeTier> t(new NvmeTier(opts));
  {
    MutexLock l(&t->mu_);
    t->segments_.resize(per_dir * opts.dirs.size());
    for (uint32_t s = 0; s < t->segments_.size(); ++s) {
      t->segments_[s].file = static_cast<uint32_t>(s % opts.dirs.size());
      t->segments_[s].file_offset = (s / opts.dirs.size()) * opts.segment_bytes;
    }
  }
  RETURN_IF_ERROR(t->OpenFiles());
  ASSIGN_OR_RETURN(t->staging_, StagingPool::Create(opts.staging_bytes));
  RETURN_IF_ERROR(t->OpenEngine());
  RETURN_IF_ERROR(t->Recover(recovered));
  return t;
}

absl::Status CheckNvmeSpace(const std::vector<std::string>& dirs, uint64_t capacity_bytes, uint64_t segment_bytes) {
  if (dirs.empty() || segment_bytes == 0) return absl::OkStatus();
  const uint64_t file_bytes = capacity_bytes / dirs.size() / segment_bytes * segment_bytes;
  // What each file system must still give: the slabs' growth, plus room for
  // the journal (a record per block at most, and a rewrite beside it).
  struct Need {
    std::string dirs;
    uint64_t need = 0, free = 0;
  };
  absl::flat_hash_map<uint64_t, Need> by_fs;
  for (const std::string& dir : dirs) {
    // The nearest existing ancestor tells the file system the folder will be on.
    std::filesystem::path probe = std::filesystem::absolute(dir);
    struct stat st;
    while (stat(probe.c_str(), &st) != 0 && probe.has_parent_path() && probe != probe.parent_path()) {
      probe = probe.parent_path();
    }
    struct statvfs vfs;
    if (statvfs(probe.c_str(), &vfs) != 0) continue;  // the open will say what is wrong
    Need& n = by_fs[st.st_dev];
    n.free = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    absl::StrAppend(&n.dirs, n.dirs.empty() ? "" : ", ", dir);
    struct stat slab;
    const uint64_t have = stat(SlabPath(dir).c_str(), &slab) == 0 ? static_cast<uint64_t>(slab.st_size) : 0;
    if (file_bytes > have) n.need += file_bytes - have;
    if (&dir == &dirs.front()) n.need += 2 * (file_bytes * dirs.size() / (64 << 10) + 1) * sizeof(JournalRecord);
  }
  for (const auto& [dev, n] : by_fs) {
    if (n.need > n.free) {
      const uint64_t fits = (capacity_bytes > n.need - n.free ? capacity_bytes - (n.need - n.free) : 0);
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("tiers.nvme.capacity = ", FormatBytes(capacity_bytes), " needs ",
                                      FormatBytes(n.need), " more on the file system of ", n.dirs, ", which has ",
                                      FormatBytes(n.free), " free; lower tiers.nvme.capacity (at most about ",
                                      FormatBytes(fits / segment_bytes * segment_bytes),
                                      " fits) or free space there. Nothing was allocated"));
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::OpenFiles() {
  const uint64_t file_bytes = opts_.capacity_bytes / opts_.dirs.size() / opts_.segment_bytes * opts_.segment_bytes;
  dirty_ = std::vector<std::atomic<bool>>(opts_.dirs.size());
  for (const std::string& dir : opts_.dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("NVMe directory ", dir, " is missing or not writable",
                                                        ec ? ": " + ec.message() : std::string(),
                                                        "; fix tiers.nvme.dirs or its permissions"));
    }
  }
  // Checked before anything is taken: a start that cannot have its space
  // leaves the disk as it found it. Except when the slab files are already
  // whole (the disk filled up after they were made, e.g. before a kill -9):
  // then the blocks on them are served read-only rather than lost to a
  // daemon that will not start.
  if (absl::Status space = CheckNvmeSpace(opts_.dirs, opts_.capacity_bytes, opts_.segment_bytes); !space.ok()) {
    bool whole = true;
    for (const std::string& dir : opts_.dirs) {
      struct stat st;
      whole = whole && stat(SlabPath(dir).c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= file_bytes;
    }
    struct stat journal;
    whole = whole && stat((opts_.dirs[0] + "/kvtier.journal").c_str(), &journal) == 0 && journal.st_size > 0;
    if (!whole || ToErrorCode(space) != KVTIER_ENOSPC) return space;
    read_only_ = true;
    recovery_.read_only_full = true;
  }
  for (const std::string& dir : opts_.dirs) {
    const std::string path = SlabPath(dir);
    struct stat before;
    const bool existed = stat(path.c_str(), &before) == 0;
    const off_t size_before = existed ? before.st_size : 0;
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    UniqueFd fd(open(path.c_str(), flags | O_DIRECT, 0600));
    bool direct_ok = fd.valid();
    if (fd.valid()) {
      // Some file systems accept O_DIRECT at open and refuse it at I/O.
      void* probe = aligned_alloc(kSectorBytes, kSectorBytes);
      std::memset(probe, 0, kSectorBytes);
      struct stat st;
      fstat(fd.get(), &st);
      if (st.st_size == 0 && pwrite(fd.get(), probe, kSectorBytes, 0) < 0 && errno == EINVAL) direct_ok = false;
      if (direct_ok && pread(fd.get(), probe, kSectorBytes, 0) < 0 && errno == EINVAL) direct_ok = false;
      free(probe);
    } else if (errno != EINVAL) {
      return ErrnoStatus(errno, absl::StrCat("opening ", path));
    }
    if (!direct_ok) {
      if (!opts_.allow_buffered) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the file system of ", dir, " does not support O_DIRECT; put tiers.nvme.dirs on a local disk, or set "
            "tiers.nvme.allow_buffered = true to accept buffered I/O (slower, uses the page cache)"));
      }
      fd = UniqueFd(open(path.c_str(), flags, 0600));
      if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("opening ", path));
      buffered_ = true;
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", path));
    if (static_cast<uint64_t>(st.st_size) < file_bytes) {
      if (fallocate(fd.get(), 0, 0, static_cast<off_t>(file_bytes)) != 0) {
        const int err = errno;
        if (err != EOPNOTSUPP || ftruncate(fd.get(), static_cast<off_t>(file_bytes)) != 0) {
          // Give back what this start took: a slab it created goes, one it
          // grew returns to its size.
          if (!existed) {
            unlink(path.c_str());
          } else {
            (void)!ftruncate(fd.get(), size_before);
          }
          if (err == ENOSPC) {
            return CodedStatus(KVTIER_ENOSPC,
                               absl::StrCat("not enough free space in ", dir, " for ", FormatBytes(file_bytes),
                                            "; lower tiers.nvme.capacity. Nothing was allocated"));
          }
          return ErrnoStatus(err, absl::StrCat("preallocating ", FormatBytes(file_bytes), " in ", path));
        }
      }
    }
    files_.push_back(std::move(fd));
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::OpenEngine() {
  IoEngineOptions o;
  for (const UniqueFd& f : files_) o.fds.push_back(f.get());
  o.registered_base = staging_->base();
  o.registered_bytes = staging_->size();
  o.queue_depth = opts_.queue_depth;
  o.workers = opts_.io_workers;
  std::unique_ptr<IoEngine> engine;
  if (opts_.io_engine == "threads") {
    engine = MakeThreadEngine(o);
    engine_reason_ = "tiers.nvme.io_engine = \"threads\"";
  } else if (opts_.io_engine == "auto" || opts_.io_engine == "io_uring") {
    absl::Status probe = ProbeIoUring();
    absl::StatusOr<std::unique_ptr<IoEngine>> uring =
        probe.ok() ? MakeUringEngine(o) : absl::StatusOr<std::unique_ptr<IoEngine>>(probe);
    if (uring.ok()) {
      engine = std::move(*uring);
    } else if (opts_.io_engine == "io_uring") {
      return absl::FailedPreconditionError(absl::StrCat(
          "tiers.nvme.io_engine = \"io_uring\" but ", uring.status().message(),
          "; set io_engine = \"auto\" to fall back to a pread/pwrite thread pool"));
    } else {
      engine = MakeThreadEngine(o);
      engine_reason_ = absl::StrCat("io_uring unavailable (", uring.status().message(), ")");
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tiers.nvme.io_engine = \"", opts_.io_engine,
                                                   "\"; use \"auto\", \"io_uring\" or \"threads\""));
  }
  engine_ = opts_.wrap_engine ? opts_.wrap_engine(std::move(engine)) : std::move(engine);
  return absl::OkStatus();
}

JournalRecord NvmeTier::RecordFor(JournalType type, uint32_t segment, uint32_t slot) const {
  JournalRecord r{};
  r.type = static_cast<uint8_t>(type);
  r.segment = segment;
  r.slot = slot;
  return r;
}

void NvmeTier::CutSegment(Segment& seg, uint64_t slot_bytes) {
  seg.slot_bytes = slot_bytes;
  const uint32_t n = static_cast<uint32_t>(NvmeSlotsPerSegment(opts_.segment_bytes, slot_bytes));
  seg.slots.assign(n, SlotState{});
  seg.free.clear();
  for (uint32_t i = n; i > 0; --i) seg.free.push_back(i - 1);
  seg.used = 0;
}

void NvmeTier::ApplyRecord(const JournalRecord& r) {
  if (r.segment >= segments_.size()) return;  // a record from a larger layout cannot occur (format check)
  Segment& seg = segments_[r.segment];
  switch (static_cast<JournalType>(r.type)) {
    case JournalType::kSegment:
      if (seg.used == 0) CutSegment(seg, r.slot_bytes);
      seg.segment_seq = r.seq;
      break;
    case JournalType::kAssign: {
      if (r.slot >= seg.slots.size()) break;
      SlotState& s = seg.slots[r.slot];
      if (!s.allocated) ++seg.used;
      s.allocated = true;
      s.durable = true;
      s.generation = r.generation;
      last_generation_ = std::max(last_generation_, r.generation);
      s.assign_seq = r.seq;
      std::memcpy(s.meta.ns.bytes.data(), r.ns, 32);
      std::memcpy(s.meta.key.bytes.data(), r.key, 32);
      s.meta.payload_bytes = r.payload_bytes;
      s.meta.tenant_hash = r.tenant_hash;
      s.meta.block_tokens = r.block_tokens;
      break;
    }
    case JournalType::kFree:
      if (r.slot < seg.slots.size() && seg.slots[r.slot].allocated) {
        seg.slots[r.slot].allocated = false;
        seg.slots[r.slot].durable = false;
        --seg.used;
      }
      break;
    default:
      break;
  }
}

absl::Status NvmeTier::Recover(std::vector<RecoveredBlock>* recovered) {
  const uint64_t t0 = MonotonicNanos();
  JournalRecord format{};
  format.slot_bytes = opts_.segment_bytes;
  format.slot = static_cast<uint32_t>(segments_.size());
  format.tenant_hash = opts_.dirs.size();
  JournalReplay replay;
  JournalOptions jo{opts_.dirs[0] + "/kvtier.journal", format, opts_.group_commit};
  jo.allow_resize = true;
  ASSIGN_OR_RETURN(journal_, Journal::Open(jo, &replay));
  recovery_.resized_from_segments = replay.resized_from_segments;
  if (replay.resized_from_segments != 0) {
    // Blocks in segments the new layout does not have: their newest record
    // assigns them.
    size_t nseg;
    {
      MutexLock l(&mu_);
      nseg = segments_.size();
    }
    absl::flat_hash_map<uint64_t, bool> assigned;
    for (const JournalRecord& r : replay.records) {
      if (r.segment < nseg || r.type == static_cast<uint8_t>(JournalType::kSegment)) continue;
      assigned[uint64_t{r.segment} << 32 | r.slot] = r.type == static_cast<uint8_t>(JournalType::kAssign);
    }
    for (const auto& [where, live] : assigned) recovery_.dropped_by_resize += live;
  }
  recovery_.journal_bytes_cut = replay.bytes_cut;
  recovery_.journal_records_cut = replay.records_cut;
  recovery_.journal_records_damaged = replay.records_damaged;
  recovery_.journal_format_damaged = replay.format_damaged;
  if (replay.records_damaged > 0) {
    RETURN_IF_ERROR(RecoverByScan(replay, recovered));
  } else {
    RETURN_IF_ERROR(RecoverFromJournal(replay, recovered));
  }
  std::vector<JournalRecord> snapshot;
  uint64_t generation = 0;
  {
    MutexLock l(&mu_);
    for (Segment& seg : segments_) {
      seg.free.clear();
      for (uint32_t i = static_cast<uint32_t>(seg.slots.size()); i > 0; --i) {
        if (!seg.slots[i - 1].allocated) seg.free.push_back(i - 1);
      }
      used_slots_ += seg.used;
      used_bytes_ += uint64_t{seg.used} * seg.slot_bytes;
    }
    if (recovery_.scanned || recovery_.resized_from_segments != 0) {
      snapshot = SnapshotLocked();
      generation = last_generation_;
    }
  }
  if (recovery_.scanned) {
    // The journal now says what the slab proved, and nothing damaged. On
    // failure the damaged journal stays and the next start checks again.
    (void)journal_->Rewrite(std::move(snapshot), generation);
  } else if (recovery_.resized_from_segments != 0) {
    // The new layout's format record, and only what it still holds; then
    // the slab files shrink to it (they grew already, when they had to).
    RETURN_IF_ERROR(journal_->Rewrite(std::move(snapshot), generation));
    const uint64_t file_bytes = opts_.capacity_bytes / opts_.dirs.size() / opts_.segment_bytes * opts_.segment_bytes;
    for (size_t i = 0; i < files_.size(); ++i) {
      struct stat st;
      if (fstat(files_[i].get(), &st) == 0 && static_cast<uint64_t>(st.st_size) > file_bytes &&
          ftruncate(files_[i].get(), static_cast<off_t>(file_bytes)) != 0) {
        return ErrnoStatus(errno, absl::StrCat("shrinking ", SlabPath(opts_.dirs[i]), " to the new tiers.nvme.capacity"));
      }
    }
  }
  recovery_.blocks = recovered->size();
  recovery_.seconds = static_cast<double>(MonotonicNanos() - t0) / 1e9;
  journal_->SetPreCommitHook([this] { return SyncDirtyFiles(); });
  return journal_->Sync();
}

absl::Status NvmeTier::RecoverFromJournal(const JournalReplay& replay, std::vector<RecoveredBlock>* recovered) {
  // What the journal says is live, then its headers checked on the device.
  struct Check {
    uint32_t segment, slot;
    bool ok = false;
  };
  std::vector<Check> checks;
  {
    MutexLock l(&mu_);
    last_generation_ = replay.format.generation;  // covers blocks compacted away
    for (const JournalRecord& r : replay.records) ApplyRecord(r);
    for (uint32_t s = 0; s < segments_.size(); ++s) {
      for (uint32_t i = 0; i < segments_[s].slots.size(); ++i) {
        if (segments_[s].slots[i].allocated) checks.push_back({s, i});
      }
    }
  }
  // One read per run of neighbouring small slots (headers and payloads
  // together, up to kMaxRunBytes), one header sector per large slot: for 100k
  // blocks of 4 KiB a header read each cost more in per-I/O work than the
  // device took to stream the whole slab (0.80x of fio's 4 KiB random
  // reads of the same headers).
  constexpr uint64_t kMaxRunBytes = 1ull << 20, kSmallSlotBytes = 64ull << 10;
  const uint64_t run_limit = std::max<uint64_t>(kSectorBytes, std::min(kMaxRunBytes, staging_->size() / 4));
  struct Run {
    size_t first = 0, count = 0;  // checks[first, first + count)
    uint32_t file = 0;
    uint64_t offset = 0, slot_bytes = 0, read_bytes = 0;
    std::vector<SlotState> expect;
  };
  std::vector<Run> runs;
  {
    MutexLock l(&mu_);
    for (size_t c = 0; c < checks.size(); ++c) {
      const Segment& seg = segments_[checks[c].segment];
      const bool small = seg.slot_bytes <= kSmallSlotBytes && seg.slot_bytes <= run_limit;
      if (small && !runs.empty()) {
        Run& r = runs.back();
        const Check& prev = checks[r.first + r.count - 1];
        if (prev.segment == checks[c].segment && prev.slot + 1 == checks[c].slot &&
            r.read_bytes + seg.slot_bytes <= run_limit && r.slot_bytes == seg.slot_bytes) {
          ++r.count;
          r.read_bytes += seg.slot_bytes;
          r.expect.push_back(seg.slots[checks[c].slot]);
          continue;
        }
      }
      runs.push_back(Run{c, 1, seg.file, seg.file_offset + checks[c].slot * seg.slot_bytes, seg.slot_bytes,
                         small ? seg.slot_bytes : kSectorBytes, {seg.slots[checks[c].slot]}});
    }
  }
  std::atomic<uint64_t> checked{0};
  const uint64_t batch = std::max<uint32_t>(opts_.queue_depth, 1) * std::max<uint32_t>(opts_.io_workers, 1);
  // A window of reads kept in flight, refilled as each completes (draining
  // after every batch let the device's queue run dry), bounded in bytes too.
  Mutex window_mu;
  std::condition_variable_any window_cv;
  uint64_t in_flight = 0, in_flight_bytes = 0;
  const uint64_t window = 4 * batch;
  const uint64_t window_bytes = std::max<uint64_t>(run_limit, staging_->size() / 2);
  const uint64_t report_every = 64 * batch;
  uint64_t next_report = report_every;
  for (Run& run : runs) {
    {
      MutexLock w(&window_mu);
      window_mu.Await(window_cv, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return in_flight < window && (in_flight == 0 || in_flight_bytes + run.read_bytes <= window_bytes);
      });
      ++in_flight;
      in_flight_bytes += run.read_bytes;
    }
    std::byte* buf = staging_->Acquire(run.read_bytes);
    Run* r = &run;
    engine_->Submit(IoOp{false, run.file, run.offset, buf, static_cast<uint32_t>(run.read_bytes), IoPriority::kLoad,
                         [this, r, buf, &checks, &checked, &window_mu, &window_cv, &in_flight,
                          &in_flight_bytes](int32_t res) {
                           for (size_t i = 0; i < r->count; ++i) {
                             Check* chk = &checks[r->first + i];
                             const SlotState& expect = r->expect[i];
                             SlotHeader h;
                             std::memcpy(&h, buf + i * r->slot_bytes, sizeof(h));
                             chk->ok = res == static_cast<int32_t>(r->read_bytes) && h.magic == kSlotHeaderMagic &&
                                       Intact(h) && h.generation == expect.generation &&
                                       h.segment == chk->segment && h.slot == chk->slot &&
                                       h.payload_bytes == expect.meta.payload_bytes &&
                                       std::memcmp(h.ns, expect.meta.ns.bytes.data(), 32) == 0 &&
                                       std::memcmp(h.key, expect.meta.key.bytes.data(), 32) == 0;
                           }
                           staging_->Release(buf);
                           checked.fetch_add(r->count, std::memory_order_relaxed);
                           MutexLock w(&window_mu);
                           --in_flight;
                           in_flight_bytes -= r->read_bytes;
                           window_cv.notify_one();
                         }});
    if (opts_.progress && checked.load(std::memory_order_relaxed) >= next_report) {
      opts_.progress(checked.load(), checks.size());
      next_report += report_every;
    }
  }
  engine_->Drain();
  if (opts_.progress) opts_.progress(checked.load(), checks.size());
  {
    MutexLock l(&mu_);
    for (const Check& c : checks) {
      Segment& seg = segments_[c.segment];
      SlotState& s = seg.slots[c.slot];
      if (!c.ok) {
        ++recovery_.dropped;
        s.allocated = false;
        s.durable = false;
        --seg.used;
        journal_->Append(RecordFor(JournalType::kFree, c.segment, c.slot));
        continue;
      }
      ++live_durable_;
      recovered->push_back(RecoveredBlock{Handle(c.segment, c.slot), s.meta});
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::RecoverByScan(const JournalReplay& replay, std::vector<RecoveredBlock>* recovered) {
  // Some records are damaged and what they said is unknown: a segment cut, an
  // assignment, a free. So the journal's state is not replayed; instead every
  // block an intact kAssign record names (the newest record of its slot, not
  // older than its segment's newest intact cut) is read whole from the slab
  // and kept only when its header is intact and matches the record and its
  // payload matches the header's checksum. The record is still needed: it
  // holds the block's tenant and token count, which the slot header does not,
  // so a block whose record is the damaged one cannot be attributed and is
  // not recovered. A block freed by a damaged kFree record comes back (its
  // bytes are proven to be that block's).
  recovery_.scanned = true;
  uint32_t nseg;
  {
    MutexLock l(&mu_);
    nseg = static_cast<uint32_t>(segments_.size());
  }
  std::vector<uint64_t> cut_seq(nseg, 0), cut_bytes(nseg, 0);
  absl::flat_hash_map<uint64_t, size_t> newest;  // (segment, slot) -> index of its newest record
  uint64_t max_generation = replay.format_damaged ? 0 : replay.format.generation;
  for (size_t i = 0; i < replay.records.size(); ++i) {
    const JournalRecord& r = replay.records[i];
    max_generation = std::max(max_generation, r.generation);
    if (r.segment >= nseg) continue;
    if (r.type == static_cast<uint8_t>(JournalType::kSegment)) {
      cut_seq[r.segment] = r.seq;
      cut_bytes[r.segment] = r.slot_bytes;
    } else {
      newest[uint64_t{r.segment} << 32 | r.slot] = i;  // records are in seq order
    }
  }
  struct Probe {
    const JournalRecord* rec;
    uint64_t cut;   // slot size the segment is taken to be cut into
    uint64_t next;  // another slot size to try when this one fails (0: none)
    bool ok = false;
  };
  std::vector<Probe> probes;
  for (const auto& [where, i] : newest) {
    const JournalRecord& r = replay.records[i];
    if (r.type != static_cast<uint8_t>(JournalType::kAssign) || r.seq < cut_seq[r.segment]) continue;
    if (r.payload_bytes == 0 || r.payload_bytes > max_block_bytes()) continue;
    // The slot size is the segment's newest intact cut; if that record is
    // lost, the size the block's own length asks for.
    const uint64_t own = SlotBytesFor(r.payload_bytes);
    const uint64_t cut = cut_bytes[r.segment] >= own ? cut_bytes[r.segment] : own;
    probes.push_back(Probe{&r, cut, cut == own ? 0 : own});
  }
  auto check = [&](std::vector<Probe*>& batch_probes) {
    const uint64_t batch = std::max<uint32_t>(opts_.queue_depth, 1) * std::max<uint32_t>(opts_.io_workers, 1);
    for (size_t begin = 0; begin < batch_probes.size(); begin += batch) {
      const size_t end = std::min(batch_probes.size(), begin + batch);
      for (size_t c = begin; c < end; ++c) {
        Probe* p = batch_probes[c];
        const JournalRecord& r = *p->rec;
        const uint64_t total = SlotBytesFor(r.payload_bytes);
        const uint64_t slots = NvmeSlotsPerSegment(opts_.segment_bytes, p->cut);
        if (r.slot >= slots || total > p->cut) continue;
        uint32_t file;
        uint64_t off;
        {
          MutexLock l(&mu_);
          file = segments_[r.segment].file;
          off = segments_[r.segment].file_offset + r.slot * p->cut;
        }
        ++recovery_.scan_checked;
        // nullptr: larger than the whole staging pool, so it was never written.
        std::byte* buf = staging_->Acquire(total);
        if (buf == nullptr) continue;
        engine_->Submit(IoOp{false, file, off, buf, static_cast<uint32_t>(total), IoPriority::kLoad,
                             [this, p, buf, total](int32_t res) {
                               const JournalRecord& r = *p->rec;
                               SlotHeader h;
                               std::memcpy(&h, buf, sizeof(h));
                               p->ok = res == static_cast<int32_t>(total) && h.magic == kSlotHeaderMagic &&
                                       Intact(h) && h.version == kNvmeFormatVersion &&
                                       h.generation == r.generation && h.segment == r.segment && h.slot == r.slot &&
                                       h.payload_bytes == r.payload_bytes && std::memcmp(h.ns, r.ns, 32) == 0 &&
                                       std::memcmp(h.key, r.key, 32) == 0 &&
                                       (r.payload_xxh3 == 0 || r.payload_xxh3 == h.payload_xxh3) &&
                                       XXH3_64bits(buf + kSectorBytes, h.payload_bytes) == h.payload_xxh3;
                               staging_->Release(buf);
                             }});
      }
      engine_->Drain();
      if (opts_.progress) opts_.progress(end, batch_probes.size());
    }
  };
  std::vector<Probe*> todo;
  for (Probe& p : probes) todo.push_back(&p);
  check(todo);
  todo.clear();
  for (Probe& p : probes) {
    if (!p.ok && p.next != 0) {
      p.cut = p.next;
      todo.push_back(&p);
    }
  }
  check(todo);

  // A segment holds one slot size: the one of its newest proven block.
  std::vector<uint64_t> seg_cut(nseg, 0), seg_newest(nseg, 0);
  for (const Probe& p : probes) {
    if (!p.ok) continue;
    max_generation = std::max(max_generation, p.rec->generation);
    if (p.rec->generation >= seg_newest[p.rec->segment]) {
      seg_newest[p.rec->segment] = p.rec->generation;
      seg_cut[p.rec->segment] = p.cut;
    }
  }
  MutexLock l(&mu_);
  // Damaged records may have held newer generations than any intact one; a
  // margin keeps a slot header they left from ever matching a new block.
  last_generation_ = max_generation + (uint64_t{1} << 32);
  for (uint32_t sg = 0; sg < nseg; ++sg) {
    if (seg_cut[sg] == 0) continue;
    CutSegment(segments_[sg], seg_cut[sg]);
    segments_[sg].segment_seq = journal_->ReserveSeq();
  }
  for (const Probe& p : probes) {
    const JournalRecord& r = *p.rec;
    if (!p.ok || p.cut != seg_cut[r.segment]) {
      ++recovery_.dropped;
      continue;
    }
    Segment& seg = segments_[r.segment];
    SlotState& s = seg.slots[r.slot];
    s.allocated = true;
    s.durable = true;
    s.generation = r.generation;
    s.assign_seq = journal_->ReserveSeq();
    std::memcpy(s.meta.ns.bytes.data(), r.ns, 32);
    std::memcpy(s.meta.key.bytes.data(), r.key, 32);
    s.meta.payload_bytes = r.payload_bytes;
    s.meta.tenant_hash = r.tenant_hash;
    s.meta.block_tokens = r.block_tokens;
    ++seg.used;
    ++live_durable_;
    ++recovery_.scan_recovered;
    recovered->push_back(RecoveredBlock{Handle(r.segment, r.slot), s.meta});
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::SyncDirtyFiles() {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (dirty_[i].exchange(false) && fdatasync(files_[i].get()) != 0) {
      dirty_[i] = true;
      return ErrnoStatus(errno, absl::StrCat("fdatasync of ", SlabPath(opts_.dirs[i])));
    }
  }
  return absl::OkStatus();
}

bool NvmeTier::DeviceFull() const {
  return read_only_ || MonotonicNanos() < full_until_ns_.load(std::memory_order_relaxed);
}

absl::StatusOr<BlockLocator> NvmeTier::Reserve(const BlockMeta& meta) {
  const uint64_t bytes = meta.payload_bytes;
  const uint64_t need = CostFor(bytes);
  if (bytes == 0 || need > opts_.segment_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", FormatBytes(bytes),
                                                   " does not fit an NVMe segment of ",
                                                   FormatBytes(opts_.segment_bytes), " (tiers.nvme.segment_bytes)"));
  }
  if (read_only_) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    return CodedStatus(KVTIER_ENOSPC, "the NVMe tier is read-only: its file system was full at start (free space "
                                      "there and restart kvtierd)");
  }
  MutexLock l(&mu_);
  int32_t pick = -1;
  for (uint32_t s = 0; s < segments_.size() && pick < 0; ++s) {
    if (segments_[s].slot_bytes == need && !segments_[s].free.empty()) pick = static_cast<int32_t>(s);
  }
  // A segment not cut yet, else an empty one of another size, is cut for this size.
  for (uint32_t s = 0; s < segments_.size() && pick < 0; ++s) {
    if (segments_[s].slot_bytes == 0) pick = static_cast<int32_t>(s);
  }
  for (uint32_t s = 0; s < segments_.size() && pick < 0; ++s) {
    if (segments_[s].used == 0) pick = static_cast<int32_t>(s);
  }
  if (pick < 0) return absl::ResourceExhaustedError("NVMe tier is full");
  Segment& seg = segments_[pick];
  if (seg.slot_bytes != need) {
    CutSegment(seg, need);
    JournalRecord r = RecordFor(JournalType::kSegment, pick, 0);
    r.slot_bytes = need;
    seg.segment_seq = journal_->Append(r);
  }
  const uint32_t idx = seg.free.back();
  seg.free.pop_back();
  SlotState& s = seg.slots[idx];
  s.generation = ++last_generation_;
  s.allocated = true;
  s.durable = false;
  s.meta = BlockMeta{};
  ++seg.used;
  ++used_slots_;
  used_bytes_ += seg.slot_bytes;
  return Handle(pick, idx);
}

absl::Status NvmeTier::Remove(BlockLocator slot, const BlockMeta&) {
  const uint32_t sg = SegmentOf(slot), idx = IndexOf(slot);
  MutexLock l(&mu_);
  if (sg >= segments_.size() || idx >= segments_[sg].slots.size() || !segments_[sg].slots[idx].allocated) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe slot ", slot, " is not allocated"));
  }
  Segment& seg = segments_[sg];
  SlotState& s = seg.slots[idx];
  if (s.durable) --live_durable_;
  s.allocated = false;
  s.durable = false;
  seg.free.push_back(idx);
  --seg.used;
  --used_slots_;
  used_bytes_ -= seg.slot_bytes;
  journal_->Append(RecordFor(JournalType::kFree, sg, idx));
  return absl::OkStatus();
}

uint64_t NvmeTier::CostOf(BlockLocator slot) const {
  const uint32_t sg = SegmentOf(slot), idx = IndexOf(slot);
  MutexLock l(&mu_);
  if (sg >= segments_.size() || idx >= segments_[sg].slots.size() || !segments_[sg].slots[idx].allocated) return 0;
  return segments_[sg].slot_bytes;
}

std::optional<NvmeTier::SlotPlace> NvmeTier::Locate(SlotHandle slot) const {
  const uint32_t sg = SegmentOf(slot), idx = IndexOf(slot);
  MutexLock l(&mu_);
  if (sg >= segments_.size() || idx >= segments_[sg].slots.size() || !segments_[sg].slots[idx].allocated) {
    return std::nullopt;
  }
  const Segment& seg = segments_[sg];
  return SlotPlace{seg.slots[idx].generation, seg.file_offset + idx * seg.slot_bytes, seg.slot_bytes, seg.file};
}

void NvmeTier::Put(BlockLocator slot, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                     IoCallback done) {
  const IoPriority prio = io.prio;
  const uint32_t sg = SegmentOf(slot), idx = IndexOf(slot);
  const std::optional<SlotPlace> place = Locate(slot);
  if (!place) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("write to NVMe slot ", slot, ", which is not allocated")));
    return;
  }
  const uint64_t gen = place->generation, off = place->offset, slot_bytes = place->slot_bytes;
  const uint32_t file = place->file;
  const uint64_t total = kSectorBytes + RoundUpSector(src.size());
  if (src.empty() || total > slot_bytes || meta.payload_bytes != src.size()) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("a block of ", src.size(), " bytes does not fit NVMe slot ",
                                                            slot, " of ", slot_bytes, " bytes")));
    return;
  }
  if (DeviceFull()) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(CodedStatus(KVTIER_ENOSPC, "the NVMe device is full (ENOSPC); demotion is paused"));
    return;
  }
  if (const int32_t abandon = AbandonReason(io.deadline_ns, io.cancel); abandon != 0) {
    abandoned_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(AbandonedStatus(abandon, "NVMe write"));
    return;
  }
  // Demotions take staging only while a quarter stays free for loads; those
  // whose caller waits for room when refused (the background reclaim, a
  // flush) only while half does, so a burst of them leaves room to the
  // demotions of stores, which are dropped when refused. (A block larger
  // than half of staging may take three quarters, as any demotion.)
  std::byte* buf = nullptr;
  if (prio == IoPriority::kDemote) {
    const uint64_t share =
        io.may_wait && total <= staging_->size() / 2 ? staging_->size() / 2 : staging_->size() / 4 * 3;
    if (staging_->used() + total <= share) buf = staging_->TryAcquire(total);
  } else {
    buf = staging_->Acquire(total);
  }
  if (buf == nullptr) {
    // A write that will be tried again once staging frees is not counted:
    // its caller counts it if it gives up.
    if (!io.may_wait) writes_refused_.fetch_add(1, std::memory_order_relaxed);
    // KVTIER_EBUSY: a transient refusal (a flush, and the background
    // reclaim, wait for room: AwaitWriteRoom, and try again).
    std::move(done)(CodedStatus(KVTIER_EBUSY, "NVMe staging memory is busy; block not demoted"));
    return;
  }
  SlotHeader h{};
  h.magic = kSlotHeaderMagic;
  h.version = kNvmeFormatVersion;
  h.header_bytes = kSectorBytes;
  h.generation = gen;
  h.segment = sg;
  h.slot = idx;
  h.payload_bytes = src.size();
  h.payload_xxh3 = XXH3_64bits(src.data(), src.size());
  std::memcpy(h.ns, meta.ns.bytes.data(), 32);
  std::memcpy(h.key, meta.key.bytes.data(), 32);
  Seal(&h);
  std::memset(buf, 0, kSectorBytes);
  std::memcpy(buf, &h, sizeof(h));
  std::memcpy(buf + kSectorBytes, src.data(), src.size());
  std::memset(buf + kSectorBytes + src.size(), 0, total - kSectorBytes - src.size());

  JournalRecord rec = RecordFor(JournalType::kAssign, sg, idx);
  rec.generation = gen;
  rec.payload_bytes = src.size();
  rec.payload_xxh3 = h.payload_xxh3;
  std::memcpy(rec.ns, meta.ns.bytes.data(), 32);
  std::memcpy(rec.key, meta.key.bytes.data(), 32);
  rec.tenant_hash = meta.tenant_hash;
  rec.block_tokens = meta.block_tokens;
  IoOp op{
      true, file, off, buf, static_cast<uint32_t>(total), prio,
      [this, buf, file, slot, sg, idx, gen, meta, rec, prio, done = std::move(done)](int32_t res) mutable {
        staging_->Release(buf);
        if (IsAbandoned(res)) {
          std::move(done)(AbandonedStatus(res, "NVMe write"));
          return;
        }
        if (res < 0) {
          io_errors_.fetch_add(1, std::memory_order_relaxed);
          if (res == -ENOSPC) full_until_ns_.store(MonotonicNanos() + kFullBackoffNs, std::memory_order_relaxed);
          std::move(done)(ErrnoStatus(-res, absl::StrCat("NVMe write of slot ", slot)));
          return;
        }
        dirty_[file].store(true, std::memory_order_release);
        {
          // Freed (or freed and reused) while writing: nothing to record.
          MutexLock l(&mu_);
          const SlotState& s = segments_[sg].slots[idx];
          if (!s.allocated || s.generation != gen) {
            std::move(done)(absl::CancelledError("NVMe slot was freed during the write"));
            return;
          }
        }
        // Demotions are write-back: their records wait for the next batch.
        // Anything else has someone waiting on it.
        const bool urgent = prio != IoPriority::kDemote;
        journal_->Append(rec, [this, sg, idx, gen, meta, done = std::move(done)](absl::Status s, uint64_t seq) mutable {
          if (s.ok()) {
            MutexLock l(&mu_);
            SlotState& st = segments_[sg].slots[idx];
            if (st.allocated && st.generation == gen && !st.durable) {
              st.durable = true;
              st.assign_seq = seq;
              st.meta = meta;
              ++live_durable_;
            }
          }
          std::move(done)(s);
          if (s.ok()) MaybeCompact();
        }, urgent);
      }};
  op.deadline_ns = io.deadline_ns;
  op.cancel = io.cancel;
  engine_->Submit(std::move(op));
}

void NvmeTier::Get(BlockLocator slot, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                    IoCallback done) {
  const IoPriority prio = io.prio;
  const uint32_t sg = SegmentOf(slot), idx = IndexOf(slot);
  const std::optional<SlotPlace> place = Locate(slot);
  if (!place) {
    std::move(done)(absl::NotFoundError(absl::StrCat("NVMe slot ", slot, " holds no block")));
    return;
  }
  const uint64_t gen = place->generation, off = place->offset, slot_bytes = place->slot_bytes;
  const uint32_t file = place->file;
  const uint64_t total = kSectorBytes + RoundUpSector(dst.size());
  if (dst.empty() || total > slot_bytes) {
    std::move(done)(absl::InvalidArgumentError("read larger than the NVMe slot"));
    return;
  }
  if (const int32_t abandon = AbandonReason(io.deadline_ns, io.cancel); abandon != 0) {
    abandoned_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(AbandonedStatus(abandon, "NVMe read"));
    return;
  }
  // Straight into dst when it can take direct I/O (page-aligned, whole
  // sectors: the host arena's slots): only the header goes through staging.
  const bool direct = reinterpret_cast<uintptr_t>(dst.data()) % kSectorBytes == 0 && dst.size() % kSectorBytes == 0;
  std::byte* buf = staging_->Acquire(direct ? kSectorBytes : total);
  IoOp op{false, file, off, buf, static_cast<uint32_t>(direct ? kSectorBytes : total), prio};
  if (direct) {
    op.tail = dst.data();
    op.tail_len = static_cast<uint32_t>(dst.size());
  }
  auto timing = std::make_unique<IoTiming>();
  op.timing = timing.get();
  op.deadline_ns = io.deadline_ns;
  op.cancel = io.cancel;
  op.done = [this, buf, dst, direct, sg, idx, gen, meta, slot, total, timing = std::move(timing),
             done = std::move(done)](int32_t res) mutable {
        if (IsAbandoned(res)) {
          staging_->Release(buf);
          std::move(done)(AbandonedStatus(res, "NVMe read"));
          return;
        }
        if (res < 0) {
          staging_->Release(buf);
          io_errors_.fetch_add(1, std::memory_order_relaxed);
          std::move(done)(ErrnoStatus(-res, absl::StrCat("NVMe read of slot ", slot)));
          return;
        }
        SlotHeader h;
        std::memcpy(&h, buf, sizeof(h));
        const bool header_ok = h.magic == kSlotHeaderMagic && Intact(h) && h.version == kNvmeFormatVersion &&
                               h.generation == gen && h.segment == sg && h.slot == idx &&
                               h.payload_bytes == dst.size() &&
                               std::memcmp(h.ns, meta.ns.bytes.data(), 32) == 0 &&
                               std::memcmp(h.key, meta.key.bytes.data(), 32) == 0;
        const std::byte* payload = direct ? dst.data() : buf + kSectorBytes;
        const bool payload_ok = header_ok && XXH3_64bits(payload, dst.size()) == h.payload_xxh3;
        if (!payload_ok) {
          staging_->Release(buf);
          checksum_failures_.fetch_add(1, std::memory_order_relaxed);
          std::move(done)(absl::DataLossError(
              absl::StrCat("NVMe slot ", slot, header_ok ? " failed its payload checksum" : " has a damaged or stale header",
                           "; the block is not served")));
          return;
        }
        if (!direct) std::memcpy(dst.data(), buf + kSectorBytes, dst.size());
        staging_->Release(buf);
        if (read_observer_) read_observer_(total, *timing);
        std::move(done)(absl::OkStatus());
      };
  engine_->Submit(std::move(op));
}

uint32_t NvmeTier::CalibrationRead(uint32_t count) {
  struct Target {
    uint32_t file;
    uint64_t offset, bytes;
  };
  std::vector<Target> targets;
  {
    MutexLock l(&mu_);
    uint64_t cursor = calibration_cursor_;
    // At most one pass over the slots from the cursor.
    uint64_t slots_total = 0;
    for (const Segment& seg : segments_) slots_total += seg.slots.size();
    for (uint64_t looked = 0; looked < slots_total && targets.size() < count; ++looked) {
      uint32_t sg = static_cast<uint32_t>(cursor >> 32), idx = static_cast<uint32_t>(cursor);
      if (sg >= segments_.size()) {
        sg = 0;
        idx = 0;
      }
      while (sg < segments_.size() && idx >= segments_[sg].slots.size()) {
        ++sg;
        idx = 0;
      }
      if (sg >= segments_.size()) {
        cursor = 0;
        continue;
      }
      const Segment& seg = segments_[sg];
      const SlotState& s = seg.slots[idx];
      if (s.allocated && s.durable && s.meta.payload_bytes > 0) {
        // At most 1 MiB of it: enough to time the device, and a bound on
        // what calibration costs when blocks are large (64 MiB for 512
        // tokens of a Llama-3.1-8B).
        targets.push_back(Target{seg.file, seg.file_offset + uint64_t{idx} * seg.slot_bytes,
                                 std::min<uint64_t>(kSectorBytes + RoundUpSector(s.meta.payload_bytes), 1 << 20)});
      }
      cursor = uint64_t{sg} << 32 | (idx + 1);
    }
    calibration_cursor_ = cursor;
  }
  uint32_t submitted = 0;
  for (const Target& t : targets) {
    std::byte* buf = staging_->TryAcquire(t.bytes);
    if (buf == nullptr) break;  // staging is busy with real work: measure another time
    auto timing = std::make_unique<IoTiming>();
    IoOp op{false, t.file, t.offset, buf, static_cast<uint32_t>(t.bytes), IoPriority::kPrefetch};
    op.timing = timing.get();
    op.done = [this, buf, bytes = t.bytes, timing = std::move(timing)](int32_t res) {
      staging_->Release(buf);
      if (res == static_cast<int32_t>(bytes) && read_observer_) read_observer_(bytes, *timing);
    };
    calibration_reads_.fetch_add(1, std::memory_order_relaxed);
    engine_->Submit(std::move(op));
    ++submitted;
  }
  return submitted;
}

std::vector<JournalRecord> NvmeTier::SnapshotLocked() const {
  std::vector<JournalRecord> out;
  for (uint32_t sg = 0; sg < segments_.size(); ++sg) {
    const Segment& seg = segments_[sg];
    if (seg.slot_bytes == 0) continue;
    JournalRecord r = RecordFor(JournalType::kSegment, sg, 0);
    r.slot_bytes = seg.slot_bytes;
    r.seq = seg.segment_seq;
    out.push_back(r);
    for (uint32_t i = 0; i < seg.slots.size(); ++i) {
      const SlotState& s = seg.slots[i];
      if (!s.allocated || !s.durable) continue;
      JournalRecord a = RecordFor(JournalType::kAssign, sg, i);
      a.seq = s.assign_seq;
      a.generation = s.generation;
      a.payload_bytes = s.meta.payload_bytes;
      std::memcpy(a.ns, s.meta.ns.bytes.data(), 32);
      std::memcpy(a.key, s.meta.key.bytes.data(), 32);
      a.tenant_hash = s.meta.tenant_hash;
      a.block_tokens = s.meta.block_tokens;
      out.push_back(a);
    }
  }
  return out;
}

void NvmeTier::MaybeCompact() {
  uint64_t live;
  {
    MutexLock l(&mu_);
    live = live_durable_;
  }
  const uint64_t limit =
      std::max<uint64_t>(opts_.journal_compact_bytes, 8 * (live + segments_.size()) * sizeof(JournalRecord));
  if (journal_->Stats().bytes < limit || compacting_.exchange(true)) return;
  std::vector<JournalRecord> snapshot;
  uint64_t generation;
  {
    MutexLock l(&mu_);
    generation = last_generation_;
    snapshot = SnapshotLocked();
  }
  (void)journal_->Rewrite(std::move(snapshot), generation);  // on failure the old journal stays valid
  compacting_.store(false);
}

void NvmeTier::CommitSoon() { journal_->CommitSoon(); }

// Demotions are refused only for staging memory, which each write gives
// back when its I/O completes (not when its journal record is durable).
uint64_t NvmeTier::WriteRoomEpoch() const { return staging_->releases(); }

std::chrono::nanoseconds NvmeTier::LastSyncRound() const {
  return std::chrono::nanoseconds(journal_->Stats().last_round_ns);
}

bool NvmeTier::AwaitWriteRoom(uint64_t epoch, std::chrono::nanoseconds timeout) {
  return staging_->AwaitRelease(epoch, timeout);
}

absl::Status NvmeTier::Sync() {
  engine_->Drain();
  return journal_->Sync();
}

TierUsage NvmeTier::Usage() const {
  MutexLock l(&mu_);
  uint64_t free_slots = 0;
  for (const Segment& s : segments_) free_slots += s.free.size();
  return TierUsage{segments_.size() * opts_.segment_bytes, used_bytes_, used_slots_, free_slots};
}

TierHealth NvmeTier::Health() const {
  if (DeviceFull()) return TierHealth::kDegraded;
  return TierHealth::kHealthy;
}

BlockTierStats NvmeTier::BlockStats() const {
  const NvmeStats n = Stats();
  return BlockTierStats{.capacity_bytes = n.capacity_bytes,
                        .used_bytes = n.used_bytes,
                        .used_slots = n.used_slots,
                        .reads = n.reads,
                        .writes = n.writes,
                        .bytes_read = n.bytes_read,
                        .bytes_written = n.bytes_written,
                        .in_flight = n.in_flight,
                        .queued = n.queued,
                        .checksum_failures = n.checksum_failures,
                        .io_errors = n.io_errors,
                        .writes_refused = n.writes_refused,
                        .abandoned = n.abandoned};
}

NvmeStats NvmeTier::Stats() const {
  NvmeStats s;
  s.io_engine = engine_->name();
  s.io_engine_reason = engine_reason_;
  s.buffered = buffered_;
  const TierUsage u = Usage();
  s.capacity_bytes = u.capacity_bytes;
  s.used_bytes = u.used_bytes;
  s.used_slots = u.used_slots;
  const IoEngineStats e = engine_->Stats();
  s.bytes_read = e.bytes_read;
  s.bytes_written = e.bytes_written;
  s.reads = e.reads;
  s.writes = e.writes;
  s.in_flight = e.in_flight;
  s.queued = e.queued;
  s.queue_depth = uint64_t{opts_.queue_depth} * std::max<uint32_t>(opts_.io_workers, 1);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  s.io_errors = io_errors_.load(std::memory_order_relaxed);
  s.writes_refused = writes_refused_.load(std::memory_order_relaxed);
  s.abandoned = abandoned_.load(std::memory_order_relaxed) + e.abandoned;
  s.calibration_reads = calibration_reads_.load(std::memory_order_relaxed);
  s.device_full = DeviceFull();
  const JournalStats j = journal_->Stats();
  s.journal_records = j.records;
  s.journal_commits = j.commits;
  s.journal_bytes = j.bytes;
  s.journal_rewrites = j.rewrites;
  s.recovery = recovery_;
  return s;
}

}  // namespace kvtier
