// SPDX-License-Identifier: Apache-2.0
#include "tiers/fs/fs_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {
namespace {

constexpr uint64_t kStaleTempNs = 600ull * 1'000'000'000;  // a temporary file this old lost its writer
constexpr uint64_t kReportEveryNs = 10ull * 1'000'000'000;

std::string Hex(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

uint64_t HeaderCheck(const FsBlockHeader& h) { return XXH3_64bits(&h, offsetof(FsBlockHeader, header_check)); }

// errno as a status: a full file system is ResourceExhausted, a vanished
// directory NotFound (for the caller to tell from a missing block), the
// rest Unavailable.
absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM || err == ELOOP) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

// Whole-buffer I/O at `offset` (short reads and writes, EINTR).
bool PreadAll(int fd, void* buf, size_t n, off_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<size_t>(r), offset += r;
  }
  return true;
}

bool WritevAll(int fd, iovec* iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    while (n > 0 && static_cast<size_t>(w) >= iov->iov_len) {
      w -= static_cast<ssize_t>(iov->iov_len);
      ++iov, --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + w;
      iov->iov_len -= static_cast<size_t>(w);
    }
  }
  return true;
}

// A folder kvtierd may keep a tenant's blocks in: a real directory of this
// uid that no one else may open.
absl::Status CheckPrivateFolder(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return ErrnoStatus(errno, path);
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " belongs to uid ", st.st_uid, ", not kvtierd's (", geteuid(), "): chown it or remove it"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " may be opened by other users (mode ", absl::Hex(st.st_mode & 0777), "): chmod 700 it"));
  }
  return absl::OkStatus();
}

absl::Status MakeFolder(const std::string& path) {
  if (mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return absl::OkStatus();
  return ErrnoStatus(errno, absl::StrCat("creating ", path));
}

}  // namespace

FsBlockHeader MakeFsHeader(const BlockMeta& meta, std::span<const std::byte> payload) {
  FsBlockHeader h;
  h.tenant_hash = meta.tenant_hash;
  std::memcpy(h.ns, meta.ns.bytes.data(), sizeof(h.ns));
  std::memcpy(h.key, meta.key.bytes.data(), sizeof(h.key));
  h.payload_bytes = payload.size();
  h.checksum = XXH3_64bits(payload.data(), payload.size());
  h.header_check = HeaderCheck(h);
  return h;
}

absl::Status CheckFsHeader(const FsBlockHeader& h, uint64_t file_bytes, const BlockMeta& meta) {
  const char* why = nullptr;
  if (h.magic != FsBlockHeader::kMagic) {
    why = "not a kvtier block file";
  } else if (h.version != FsBlockHeader::kVersion || h.header_bytes != sizeof(FsBlockHeader)) {
    why = "a block file of another version";
  } else if (h.header_check != HeaderCheck(h)) {
    why = "its header is damaged";
  } else if (h.tenant_hash != meta.tenant_hash || std::memcmp(h.ns, meta.ns.bytes.data(), sizeof(h.ns)) != 0 ||
             std::memcmp(h.key, meta.key.bytes.data(), sizeof(h.key)) != 0) {
    why = "it holds another block";
  } else if (h.payload_bytes != meta.payload_bytes) {
    why = "its length is not the block's";
  } else if (file_bytes != sizeof(FsBlockHeader) + h.payload_bytes) {
    why = file_bytes < sizeof(FsBlockHeader) + h.payload_bytes ? "the file is truncated" : "the file is too long";
  }
  if (why == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("the file is not the block: ", why));
}

FsTier::FsTier(const FsTierOptions& opts)
    : opts_(opts), handles_(opts.name, opts.capacity_bytes, opts.max_block_bytes) {}

absl::StatusOr<std::unique_ptr<FsTier>> FsTier::Create(const FsTierOptions& opts) {
  if (opts.dir.empty() || opts.dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("the fs tier's dir must be an absolute path (got \"", opts.dir, "\")"));
  }
  if (opts.tenants.empty()) return absl::InvalidArgumentError("the fs tier has no tenants");
  if (opts.capacity_bytes == 0) return absl::InvalidArgumentError("the fs tier's capacity is 0");
  if (opts.io_threads == 0 || opts.io_threads > 256) {
    return absl::InvalidArgumentError("the fs tier's io_threads must be 1 to 256");
  }
  if (!(opts.low_watermark > 0 && opts.low_watermark <= 1)) {
    return absl::InvalidArgumentError("the fs tier's low_watermark must be in (0, 1]");
  }
  struct stat st {};
  if (stat(opts.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the fs tier's directory ", opts.dir,
        " does not exist or is not a directory: mount the shared file system there (kvtierd does not create it, so "
        "a missing mount is not mistaken for a local folder)"));
  }
  std::unique_ptr<FsTier> t(new FsTier(opts));
  for (const FsTenant& tenant : opts.tenants) {
    if (tenant.name.empty() || tenant.name.find('/') != std::string::npos || tenant.name[0] == '.') {
      return absl::InvalidArgumentError(absl::StrCat("tenant name \"", tenant.name, "\" cannot name a folder"));
    }
    const std::string folder = absl::StrCat(opts.dir, "/", tenant.name);
    if (absl::Status s = MakeFolder(folder); !s.ok()) return s;
    if (absl::Status s = CheckPrivateFolder(folder); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the fs tier's folder for tenant \"", tenant.name, "\": ",
                                                        s.message()));
    }
  }
  for (uint32_t i = 0; i < opts.io_threads; ++i) t->workers_.emplace_back([p = t.get()] { p->Worker(); });
  if (opts.scan_interval_ms != 0) t->scanner_ = std::thread([p = t.get()] { p->ScanLoop(); });
  return t;
}

FsTier::~FsTier() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  scan_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
  if (scanner_.joinable()) scanner_.join();
}

const FsTenant* FsTier::TenantFor(uint64_t tenant_hash) const {
  for (const FsTenant& t : opts_.tenants) {
    if (t.hash == tenant_hash) return &t;
  }
  return nullptr;
}

std::string FsTier::PathFor(const BlockMeta& meta) const {
  const FsTenant* t = TenantFor(meta.tenant_hash);
  if (t == nullptr) return "";
  return absl::StrCat(opts_.dir, "/", t->name, "/", Hex(meta.key.bytes.data(), 1), "/",
                      Hex(meta.ns.bytes.data(), meta.ns.bytes.size()), "-", Hex(meta.key.bytes.data(), meta.key.bytes.size()),
                      ".kvb");
}

absl::StatusOr<SlotHandle> FsTier::Allocate(uint64_t bytes) { return handles_.Allocate(bytes, SlotBytesFor(bytes), false); }
absl::StatusOr<SlotHandle> FsTier::AllocateTransient(uint64_t bytes) {
  return handles_.Allocate(bytes, SlotBytesFor(bytes), true);
}
absl::Status FsTier::Free(SlotHandle slot) { return handles_.Free(slot); }
uint64_t FsTier::SlotBytes(SlotHandle slot) const { return handles_.SlotBytes(slot); }

TierHealth FsTier::Health() const {
  return degraded_.load(std::memory_order_acquire) ? TierHealth::kDegraded : TierHealth::kHealthy;
}

void FsTier::Failed(const absl::Status& s) {
  degraded_.store(true, std::memory_order_release);
  const uint64_t now = MonotonicNanos();
  uint64_t last = failure_reported_ns_.load(std::memory_order_relaxed);
  if (opts_.on_failure && (last == 0 || now - last >= kReportEveryNs) &&
      failure_reported_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    opts_.on_failure(std::string(s.message()));
  }
}

void FsTier::Succeeded() {
  if (degraded_.load(std::memory_order_relaxed)) degraded_.store(false, std::memory_order_release);
}

void FsTier::Submit(Job job) {
  const size_t q = static_cast<size_t>(job.prio);
  {
    MutexLock l(&mu_);
    ++jobs_in_flight_;
    queue_[q < kIoPriorities ? q : kIoPriorities - 1].push_back(std::move(job));
  }
  work_cv_.notify_one();
}

void FsTier::Worker() {
  for (;;) {
    Job job;
    {
      MutexLock l(&mu_);
      mu_.Await(work_cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || std::any_of(std::begin(queue_), std::end(queue_), [](const auto& q) { return !q.empty(); });
      });
      auto it = std::find_if(std::begin(queue_), std::end(queue_), [](const auto& q) { return !q.empty(); });
      if (it == std::end(queue_)) return;  // stopping, nothing queued
      job = std::move(it->front());
      it->pop_front();
    }
    absl::Status abandoned;
    if (job.cancel.cancelled()) {
      abandoned = absl::CancelledError(absl::StrCat("the ", opts_.name, " tier's op was cancelled before it started"));
    } else if (job.deadline_ns != 0 && MonotonicNanos() > job.deadline_ns) {
      abandoned = absl::DeadlineExceededError(absl::StrCat("the ", opts_.name, " tier's op waited past its deadline"));
    }
    if (!abandoned.ok()) abandoned_.fetch_add(1, std::memory_order_relaxed);
    std::move(job.run)(std::move(abandoned));
    {
      MutexLock l(&mu_);
      --jobs_in_flight_;
    }
    idle_cv_.notify_all();
  }
}

absl::Status FsTier::EnsureFolders(const FsTenant& t, const BlockMeta& meta) const {
  const std::string sub = absl::StrCat(opts_.dir, "/", t.name, "/", Hex(meta.key.bytes.data(), 1));
  if (mkdir(sub.c_str(), 0700) == 0 || errno == EEXIST) return absl::OkStatus();
  if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("creating ", sub));
  // The tenant's folder went (another node's cleanup, an operator): make it
  // again, but never the directory itself (a vanished mount stays an error).
  if (absl::Status s = MakeFolder(absl::StrCat(opts_.dir, "/", t.name)); !s.ok()) return s;
  return MakeFolder(sub);
}

absl::Status FsTier::WriteFile(const BlockMeta& meta, std::span<const std::byte> src) {
  const FsTenant* t = TenantFor(meta.tenant_hash);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("the ", opts_.name, " tier has no folder for the block's tenant"));
  if (absl::Status s = EnsureFolders(*t, meta); !s.ok()) return s;
  const std::string path = PathFor(meta);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = absl::StrCat(path.substr(0, path.rfind('/') + 1), ".tmp-", getpid(), "-", rng());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating ", tmp));
  FsBlockHeader h = MakeFsHeader(meta, src);
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<std::byte*>(src.data()), src.size()}};
  absl::Status s;
  if (!WritevAll(fd, iov, 2)) {
    s = ErrnoStatus(errno == 0 ? EIO : errno, absl::StrCat("writing ", tmp));
  } else if (opts_.fsync && fsync(fd) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("fsync of ", tmp));
  }
  close(fd);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus(errno, absl::StrCat("renaming ", tmp));
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

absl::Status FsTier::ReadFile(const BlockMeta& meta, std::span<std::byte> dst) {
  const std::string path = PathFor(meta);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", opts_.name, " tier has no folder for the block's tenant"));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("the block is not in the ", opts_.name, " tier (evicted there)"));
    }
    if (errno == ELOOP) {
      unlink(path.c_str());
      return absl::DataLossError("the file is not the block: a symbolic link");
    }
    return ErrnoStatus(errno, "opening a block file");
  }
  absl::Status s;
  struct stat st {};
  FsBlockHeader h;
  if (fstat(fd, &st) != 0) {
    s = ErrnoStatus(errno, "stat of a block file");
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    s = absl::DataLossError("the file is not the block: not a regular file of kvtierd's user");
  } else if (static_cast<uint64_t>(st.st_size) != sizeof(h) + meta.payload_bytes) {
    // Checked again against the header below; a wrong size is never read.
    s = absl::DataLossError(static_cast<uint64_t>(st.st_size) < sizeof(h) + meta.payload_bytes
                                ? "the file is not the block: truncated"
                                : "the file is not the block: too long");
  } else {
    // Header and payload in one read, the payload straight into dst.
    iovec iov[2] = {{&h, sizeof(h)}, {dst.data(), meta.payload_bytes}};
    const size_t want = sizeof(h) + meta.payload_bytes;
    size_t got = 0;
    errno = 0;
    while (got < want) {
      ssize_t r = preadv(fd, iov, 2, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
      // A short read (rare on a local file): finish the rest with plain preads.
      if (got < want) {
        if (got < sizeof(h)) {
          if (!PreadAll(fd, reinterpret_cast<char*>(&h) + got, sizeof(h) - got, static_cast<off_t>(got))) break;
          got = sizeof(h);
        }
        if (!PreadAll(fd, dst.data() + (got - sizeof(h)), want - got, static_cast<off_t>(got))) break;
        got = want;
      }
    }
    if (got < want) {
      s = errno != 0 ? ErrnoStatus(errno, "reading a block file")
                     : absl::DataLossError("the file is not the block: it shrank while read");
    } else if (s = CheckFsHeader(h, static_cast<uint64_t>(st.st_size), meta); !s.ok()) {
      // Not the block: whatever landed in dst is not served.
    } else if (XXH3_64bits(dst.data(), meta.payload_bytes) != h.checksum) {
      s = absl::DataLossError("the file is not the block: its payload fails its checksum");
    } else {
      // Recency for every node's eviction scan; a second's resolution is
      // plenty, and each touch is an inode write.
      const int64_t now_s = static_cast<int64_t>(time(nullptr));
      if (now_s - static_cast<int64_t>(st.st_mtim.tv_sec) >= 1) futimens(fd, nullptr);
    }
  }
  close(fd);
  if (absl::IsDataLoss(s)) unlink(path.c_str());  // never served, by any node: the next store writes it again
  return s;
}

void FsTier::Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                   IoCallback done) {
  if (SlotBytes(slot) == 0 || src.size() != meta.payload_bytes || TenantFor(meta.tenant_hash) == nullptr) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "a write to slot ", slot, " of the ", opts_.name, " tier: no such slot, a length not the block's, or no "
        "folder for its tenant")));
    return;
  }
  // src may be reused once Write returns.
  auto copy = std::make_shared<std::vector<std::byte>>(src.begin(), src.end());
  {
    MutexLock l(&mu_);
    ++writes_in_flight_;
  }
  const uint64_t deadline = io.deadline_ns != 0 ? io.deadline_ns : MonotonicNanos() + opts_.op_timeout_ms * 1'000'000;
  Submit({io.prio, deadline, io.cancel,
          [this, meta, copy, done = std::move(done)](absl::Status abandoned) mutable {
            absl::Status s = abandoned;
            if (s.ok()) {
              s = WriteFile(meta, *copy);
              if (s.ok()) {
                writes_.fetch_add(1, std::memory_order_relaxed);
                bytes_written_.fetch_add(copy->size(), std::memory_order_relaxed);
                Succeeded();
                const uint64_t since = written_since_scan_.fetch_add(SlotBytesFor(copy->size())) + SlotBytesFor(copy->size());
                if (since >= opts_.capacity_bytes / 8) {
                  {
                    MutexLock l(&mu_);
                    scan_wanted_ = true;
                  }
                  scan_cv_.notify_one();
                }
              } else {
                if (absl::IsResourceExhausted(s)) {
                  writes_refused_.fetch_add(1, std::memory_order_relaxed);
                } else {
                  io_errors_.fetch_add(1, std::memory_order_relaxed);
                }
                Failed(s);
              }
            }
            std::move(done)(std::move(s));
            {
              MutexLock l(&mu_);
              --writes_in_flight_;
            }
            idle_cv_.notify_all();
          }});
}

void FsTier::Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                  IoCallback done) {
  if (SlotBytes(slot) == 0 || dst.size() < meta.payload_bytes || TenantFor(meta.tenant_hash) == nullptr) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "a read of slot ", slot, " of the ", opts_.name, " tier: no such slot, a buffer too small, or no folder for "
        "the block's tenant")));
    return;
  }
  {
    MutexLock l(&mu_);
    ++reads_in_flight_;
  }
  const uint64_t deadline = io.deadline_ns != 0 ? io.deadline_ns : MonotonicNanos() + opts_.op_timeout_ms * 1'000'000;
  Submit({io.prio, deadline, io.cancel, [this, meta, dst, done = std::move(done)](absl::Status abandoned) mutable {
            absl::Status s = abandoned;
            if (s.ok()) {
              const uint64_t start = MonotonicNanos();
              s = ReadFile(meta, dst);
              if (s.ok()) {
                reads_.fetch_add(1, std::memory_order_relaxed);
                bytes_read_.fetch_add(meta.payload_bytes, std::memory_order_relaxed);
                Succeeded();
                if (read_observer_) read_observer_(meta.payload_bytes, IoTiming{MonotonicNanos() - start, 1});
              } else if (absl::IsDataLoss(s)) {
                checksum_failures_.fetch_add(1, std::memory_order_relaxed);
              } else if (absl::IsNotFound(s)) {
                miss_not_found_.fetch_add(1, std::memory_order_relaxed);
                // A missing block file is a miss; a missing directory is a failure.
                struct stat st {};
                if (stat(opts_.dir.c_str(), &st) != 0) Failed(ErrnoStatus(errno, opts_.dir));
              } else {
                miss_io_.fetch_add(1, std::memory_order_relaxed);
                io_errors_.fetch_add(1, std::memory_order_relaxed);
                Failed(s);
              }
            } else if (absl::IsDeadlineExceeded(s)) {
              miss_deadline_.fetch_add(1, std::memory_order_relaxed);
            }
            std::move(done)(std::move(s));
            {
              MutexLock l(&mu_);
              --reads_in_flight_;
            }
            idle_cv_.notify_all();
          }});
}

void FsTier::Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
                    uint64_t deadline_ns) {
  std::vector<std::string> paths;
  paths.reserve(metas.size());
  for (const BlockMeta& m : metas) paths.push_back(PathFor(m));
  const uint64_t deadline = deadline_ns != 0 ? deadline_ns : MonotonicNanos() + opts_.op_timeout_ms * 1'000'000;
  Submit({IoPriority::kLoad, deadline, CancelToken{},
          [paths = std::move(paths), deadline, done = std::move(done)](absl::Status abandoned) mutable {
            std::vector<bool> found(paths.size(), false);
            for (size_t i = 0; abandoned.ok() && i < paths.size(); ++i) {
              if (MonotonicNanos() > deadline) break;  // the rest count as absent
              struct stat st {};
              found[i] = !paths[i].empty() && lstat(paths[i].c_str(), &st) == 0 && S_ISREG(st.st_mode);
            }
            std::move(done)(std::move(found));
          }});
}

absl::Status FsTier::Sync() {
  MutexLock l(&mu_);
  mu_.Await(idle_cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return writes_in_flight_ == 0; });
  return absl::OkStatus();
}

void FsTier::Drain() {
  MutexLock l(&mu_);
  mu_.Await(idle_cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return jobs_in_flight_ == 0; });
}

BlockTierStats FsTier::BlockStats() const {
  BlockTierStats s;
  const TierUsage u = handles_.Usage();
  s.capacity_bytes = u.capacity_bytes;
  s.used_bytes = u.used_bytes;
  s.used_slots = u.used_slots;
  s.reads = reads_.load(std::memory_order_relaxed);
  s.writes = writes_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  {
    MutexLock l(&mu_);
    s.in_flight = reads_in_flight_ + writes_in_flight_;
    for (const auto& q : queue_) s.queued += q.size();
  }
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  s.io_errors = io_errors_.load(std::memory_order_relaxed);
  s.writes_refused = writes_refused_.load(std::memory_order_relaxed);
  s.abandoned = abandoned_.load(std::memory_order_relaxed);
  return s;
}

FsTier::ScanStats FsTier::scan_stats() const {
  MutexLock l(&mu_);
  return scan_;
}

FsTier::Misses FsTier::misses() const {
  return {miss_not_found_.load(std::memory_order_relaxed), checksum_failures_.load(std::memory_order_relaxed),
          miss_io_.load(std::memory_order_relaxed), miss_deadline_.load(std::memory_order_relaxed)};
}

void FsTier::VisitCounters(absl::FunctionRef<void(std::string_view, uint64_t)> visit) const {
  const ScanStats s = scan_stats();
  const Misses m = misses();
  visit("scans", s.scans);
  visit("files", s.files);
  visit("bytes", s.bytes);
  visit("evicted", s.evicted);
  visit("vanished", s.vanished);
  visit("stale_temps", s.stale_temps);
  visit("scan_failures", s.failures);
  visit("misses_not_found", m.not_found);
  visit("misses_bad_file", m.bad_file);
  visit("misses_io", m.io);
  visit("misses_deadline", m.deadline);
}

void FsTier::ScanLoop() {
  for (;;) {
    {
      MutexLock l(&mu_);
      mu_.AwaitFor(scan_cv_, std::chrono::milliseconds(opts_.scan_interval_ms),
                   [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || scan_wanted_; });
      if (stop_) return;
      scan_wanted_ = false;
    }
    ScanNow();
  }
}

void FsTier::ScanNow() {
  MutexLock one(&scan_mu_);
  written_since_scan_.store(0, std::memory_order_relaxed);
  struct File {
    int64_t mtime_ns;
    uint64_t bytes;
    std::string path;
  };
  std::vector<File> files;
  uint64_t total = 0, stale = 0;
  const uint64_t now_real = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                      std::chrono::system_clock::now().time_since_epoch())
                                                      .count());
  struct stat root {};
  if (stat(opts_.dir.c_str(), &root) != 0 || !S_ISDIR(root.st_mode)) {
    const absl::Status s = ErrnoStatus(errno == 0 ? ENOTDIR : errno, absl::StrCat("the fs tier's directory ", opts_.dir));
    Failed(s);
    MutexLock l(&mu_);
    ++scan_.failures;
    return;
  }
  auto list = [](const std::string& path, auto&& each) {
    DIR* d = opendir(path.c_str());
    if (d == nullptr) return;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
      each(std::string(e->d_name));
    }
    closedir(d);
  };
  for (const FsTenant& t : opts_.tenants) {
    const std::string tdir = absl::StrCat(opts_.dir, "/", t.name);
    list(tdir, [&](const std::string& sub) {
      const std::string sdir = absl::StrCat(tdir, "/", sub);
      list(sdir, [&](const std::string& name) {
        const std::string path = absl::StrCat(sdir, "/", name);
        struct stat st {};
        if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;  // gone, or not ours to count
        const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
        if (name.rfind(".tmp-", 0) == 0) {
          if (mtime > 0 && now_real > static_cast<uint64_t>(mtime) + kStaleTempNs && unlink(path.c_str()) == 0) ++stale;
          return;
        }
        total += static_cast<uint64_t>(st.st_size);
        files.push_back({mtime, static_cast<uint64_t>(st.st_size), path});
      });
    });
  }
  uint64_t evicted = 0, vanished = 0, left = total;
  if (total > opts_.capacity_bytes) {
    const uint64_t target = static_cast<uint64_t>(static_cast<double>(opts_.capacity_bytes) * opts_.low_watermark);
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime_ns < b.mtime_ns; });
    for (const File& f : files) {
      if (left <= target) break;
      if (unlink(f.path.c_str()) == 0) {
        ++evicted;
      } else if (errno == ENOENT) {
        ++vanished;  // another node's scan, or a read that found it damaged
      } else {
        continue;
      }
      left -= f.bytes;
    }
  }
  MutexLock l(&mu_);
  ++scan_.scans;
  scan_.files = files.size() - evicted - vanished;
  scan_.bytes = left;
  scan_.evicted += evicted;
  scan_.vanished += vanished;
  scan_.stale_temps += stale;
}

}  // namespace kvtier
