// SPDX-License-Identifier: Apache-2.0
#include "tiers/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {
namespace {

constexpr size_t kRec = sizeof(JournalRecord);

absl::Status WriteFull(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing the NVMe journal");
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& file) {
  const std::string dir = std::filesystem::path(file).parent_path().string();
  UniqueFd d(open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || fsync(d.get()) != 0) return ErrnoStatus(errno, absl::StrCat("fsync of directory ", dir));
  return absl::OkStatus();
}

bool SameLayout(const JournalRecord& a, const JournalRecord& b) {
  return a.slot_bytes == b.slot_bytes && a.slot == b.slot && a.tenant_hash == b.tenant_hash &&
         a.version == b.version;
}

JournalRecord FormatRecord(const JournalRecord& f) {
  JournalRecord r = f;
  r.magic = kJournalMagic;
  r.type = static_cast<uint8_t>(JournalType::kFormat);
  r.version = kNvmeFormatVersion;
  r.seq = 0;
  Seal(&r);
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& opts, JournalReplay* replay) {
  *replay = JournalReplay{};
  UniqueFd fd(open(opts.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("opening the NVMe journal ", opts.path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat of the NVMe journal");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  const JournalRecord format = FormatRecord(opts.format);

  uint64_t good = 0;  // bytes up to the end of the last intact record
  uint64_t last_seq = 0;
  if (file_size >= kRec) {
    JournalRecord first;
    if (pread(fd.get(), &first, kRec, 0) != static_cast<ssize_t>(kRec)) {
      return ErrnoStatus(errno, "reading the NVMe journal");
    }
    const bool format_ok = first.magic == kJournalMagic && Intact(first) &&
                           first.type == static_cast<uint8_t>(JournalType::kFormat);
    // Only the segment count differs (tiers.nvme.capacity changed, same
    // directories and segment size): segment s stays where it was, so the
    // owner keeps what lies in the segments both layouts have.
    const bool resized = format_ok && !SameLayout(first, format) && opts.allow_resize &&
                         first.slot_bytes == format.slot_bytes && first.tenant_hash == format.tenant_hash &&
                         first.version == format.version;
    if (resized) replay->resized_from_segments = first.slot;
    if (format_ok && !resized && !SameLayout(first, format)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the NVMe journal ", opts.path, " was written for another layout (format v", first.version,
          ", segments of ", first.slot_bytes, " bytes x ", first.slot,
          "): restore the previous tiers.nvme settings, or remove the NVMe tier's files to start empty"));
    }
    if (format_ok) {
      good = kRec;
      replay->format = first;
    } else {
      replay->format = format;
    }
    // Stream the rest in chunks. A damaged record is skipped; whether it was
    // the torn tail or damage is known once an intact record follows or not.
    uint64_t damaged_since_good = format_ok ? 0 : 1;
    std::vector<JournalRecord> chunk(4096);
    for (uint64_t off = kRec; off + kRec <= file_size;) {
      const size_t want = std::min<uint64_t>(chunk.size(), (file_size - off) / kRec);
      const ssize_t got = pread(fd.get(), chunk.data(), want * kRec, static_cast<off_t>(off));
      if (got < static_cast<ssize_t>(kRec)) break;
      const size_t n = static_cast<size_t>(got) / kRec;
      for (size_t i = 0; i < n; ++i) {
        const JournalRecord& r = chunk[i];
        if (r.magic != kJournalMagic || !Intact(r) || r.version != kNvmeFormatVersion || r.seq <= last_seq ||
            r.type < static_cast<uint8_t>(JournalType::kSegment) || r.type > static_cast<uint8_t>(JournalType::kFree)) {
          ++damaged_since_good;
          continue;
        }
        last_seq = r.seq;
        replay->records.push_back(r);
        replay->records_damaged += damaged_since_good;
        damaged_since_good = 0;
        good = off + (i + 1) * kRec;
      }
      off += n * kRec;
    }
    // A damaged format record costs the journal only when nothing after it survived.
    replay->format_damaged = !format_ok && good > 0;
  }
  if (good == 0) {
    // Empty, or not even the format record survived: start fresh.
    replay->created = file_size == 0;
    if (file_size > 0) {
      replay->bytes_cut = file_size;
      replay->records_cut = (file_size + kRec - 1) / kRec;
    }
    if (ftruncate(fd.get(), 0) != 0) return ErrnoStatus(errno, "truncating the NVMe journal");
    RETURN_IF_ERROR(WriteFull(fd.get(), &format, kRec, 0));
    if (fdatasync(fd.get()) != 0) return ErrnoStatus(errno, "fdatasync of the NVMe journal");
    RETURN_IF_ERROR(SyncDir(opts.path));
    good = kRec;
  } else if (good < file_size) {
    replay->bytes_cut = file_size - good;
    replay->records_cut = (replay->bytes_cut + kRec - 1) / kRec;
    if (ftruncate(fd.get(), static_cast<off_t>(good)) != 0 || fdatasync(fd.get()) != 0) {
      return ErrnoStatus(errno, "cutting the damaged tail of the NVMe journal");
    }
  }
  return std::unique_ptr<Journal>(new Journal(opts, std::move(fd), last_seq + 1, good));
}

Journal::Journal(const JournalOptions& opts, UniqueFd fd, uint64_t next_seq, uint64_t size) : opts_(opts) {
  {
    MutexLock l(&write_mu_);
    fd_ = std::move(fd);
    size_ = size;
  }
  {
    MutexLock l(&mu_);
    next_seq_ = next_seq;
    stats_.bytes = size;
  }
  thread_ = std::thread([this] { Run(); });
}

Journal::~Journal() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Journal::SetPreCommitHook(std::function<absl::Status()> hook) { pre_commit_ = std::move(hook); }

uint64_t Journal::Append(JournalRecord record, DurableCallback durable, bool urgent) {
  uint64_t seq;
  bool wake;
  {
    MutexLock l(&mu_);
    // The committer waits for the first pending record, then for urgency:
    // only those changes wake it. Waking it for every record cost each
    // write completion a futex call and the committer a useless round.
    wake = pending_.empty() || (urgent && !urgent_);
    if (pending_.empty()) first_pending_ns_ = MonotonicNanos();
    urgent_ |= urgent;
    record.magic = kJournalMagic;
    record.version = kNvmeFormatVersion;
    record.seq = seq = next_seq_++;
    Seal(&record);
    pending_.push_back(record);
    pending_cbs_.push_back(std::move(durable));
    ++appended_;
  }
  if (wake) cv_.notify_all();
  return seq;
}

void Journal::CommitSoon() {
  {
    MutexLock l(&mu_);
    urgent_ = true;
  }
  cv_.notify_all();
}

absl::Status Journal::Sync() {
  MutexLock l(&mu_);
  urgent_ = true;
  cv_.notify_all();
  const uint64_t target = appended_;
  mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return durable_ >= target; });
  return last_error_;
}

absl::Status Journal::CommitLocked(std::vector<JournalRecord>& batch) {
  if (pre_commit_) RETURN_IF_ERROR(pre_commit_());
  RETURN_IF_ERROR(WriteFull(fd_.get(), batch.data(), batch.size() * kRec, size_));
  if (fdatasync(fd_.get()) != 0) return ErrnoStatus(errno, "fdatasync of the NVMe journal");
  size_ += batch.size() * kRec;
  return absl::OkStatus();
}

void Journal::Run() {
  std::vector<JournalRecord> batch;
  std::vector<DurableCallback> cbs;
  for (;;) {
    {
      MutexLock l(&mu_);
      mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      if (opts_.group_commit && !urgent_ && !stop_) {
        // Let more records join this round, unless someone waits.
        const uint64_t delay = std::clamp<uint64_t>(last_round_ns_ * 30, 1'000'000, 1'000'000'000);
        const uint64_t due = first_pending_ns_ + delay;
        const uint64_t now = MonotonicNanos();
        if (now < due) {
          mu_.AwaitFor(cv_, std::chrono::nanoseconds(due - now),
                       [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return urgent_ || stop_; });
        }
      }
      urgent_ = false;
      if (opts_.group_commit) {
        batch.swap(pending_);
        cbs.swap(pending_cbs_);
      } else {
        batch.assign(pending_.begin(), pending_.begin() + 1);
        cbs.clear();
        cbs.push_back(std::move(pending_cbs_.front()));
        pending_.erase(pending_.begin());
        pending_cbs_.erase(pending_cbs_.begin());
      }
    }
    absl::Status s;
    uint64_t size;
    const uint64_t round_start = MonotonicNanos();
    {
      MutexLock w(&write_mu_);
      s = CommitLocked(batch);
      size = size_;
    }
    {
      MutexLock l(&mu_);
      last_round_ns_ = MonotonicNanos() - round_start;
      if (s.ok()) stats_.records += batch.size();
      ++stats_.commits;
      stats_.bytes = size;
    }
    // Callbacks first, then the durable count: Sync() returns only after the
    // callbacks of what it waited for have run.
    for (size_t i = 0; i < cbs.size(); ++i) {
      if (cbs[i]) std::move(cbs[i])(s, batch[i].seq);
    }
    {
      MutexLock l(&mu_);
      durable_ += batch.size();
      if (!s.ok()) last_error_ = s;
    }
    cv_.notify_all();
    batch.clear();
    cbs.clear();
  }
}

absl::Status Journal::Rewrite(std::vector<JournalRecord> live, uint64_t generation) {
  std::sort(live.begin(), live.end(), [](const JournalRecord& a, const JournalRecord& b) { return a.seq < b.seq; });
  const std::string tmp = opts_.path + ".rewrite";
  UniqueFd fd(open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("creating ", tmp));
  std::vector<JournalRecord> out;
  out.reserve(live.size() + 1);
  JournalRecord format = opts_.format;
  format.generation = generation;
  out.push_back(FormatRecord(format));
  for (JournalRecord r : live) {
    r.magic = kJournalMagic;
    r.version = kNvmeFormatVersion;
    Seal(&r);  // keeps its original seq: records appended later are newer
    out.push_back(r);
  }
  MutexLock w(&write_mu_);
  RETURN_IF_ERROR(WriteFull(fd.get(), out.data(), out.size() * kRec, 0));
  if (fdatasync(fd.get()) != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync of ", tmp));
  if (rename(tmp.c_str(), opts_.path.c_str()) != 0) return ErrnoStatus(errno, "renaming the rewritten journal");
  RETURN_IF_ERROR(SyncDir(opts_.path));
  fd_ = std::move(fd);
  size_ = out.size() * kRec;
  MutexLock l(&mu_);
  ++stats_.rewrites;
  stats_.bytes = size_;
  return absl::OkStatus();
}

uint64_t Journal::ReserveSeq() {
  MutexLock l(&mu_);
  return next_seq_++;
}

JournalStats Journal::Stats() const {
  MutexLock l(&mu_);
  JournalStats s = stats_;
  s.last_round_ns = last_round_ns_;
  return s;
}

}  // namespace kvtier
