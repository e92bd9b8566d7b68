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
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "core/units.h"

namespace kvtier {
namespace {

constexpr uint64_t kStaleTempNs = 3600ull * 1'000'000'000;  // a temporary file this old lost its writer
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
absl::Status FsErrno(int err, absl::string_view what) {
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

// A folder kvtierd keeps a tenant's blocks in: a real directory of this uid
// that no one else may open (checked on the open descriptor, so a folder
// replaced by a link or another uid's folder is refused, never followed).
absl::Status CheckPrivateFolder(int fd, absl::string_view what) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return FsErrno(errno, what);
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(what, " is not a directory"));
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " belongs to uid ", st.st_uid, ", not kvtierd's (", geteuid(), "): chown it or remove it"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " may be opened by other users (mode ", absl::Hex(st.st_mode & 0777), "): chmod 700 it"));
  }
  return absl::OkStatus();
}

// Opens `name` in `dir` (AT_FDCWD with an absolute name) as a private
// folder, creating it (0700) first when `create`; never through a link.
absl::StatusOr<UniqueFd> OpenPrivateFolder(int dir, const std::string& name, bool create, absl::string_view what) {
  if (create && mkdirat(dir, name.c_str(), 0700) != 0 && errno != EEXIST) {
    const int err = errno;
    return FsErrno(err, absl::StrCat("creating ", what));
  }
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(what, " is a link or not a directory: refused"));
    }
    return FsErrno(errno, what);
  }
  RETURN_IF_ERROR(CheckPrivateFolder(fd.get(), what));
  return fd;
}

// A block file's name ("<64 hex>-<64 hex>.kvb") or a temporary one
// (".tmp-..."): the only names the scan counts or deletes.
bool IsBlockFileName(absl::string_view n) {
  if (n.size() != 64 + 1 + 64 + 4 || n[64] != '-' || n.substr(129) != ".kvb") return false;
  for (size_t i = 0; i < 129; ++i) {
    if (i != 64 && !std::isxdigit(static_cast<unsigned char>(n[i]))) return false;
  }
  return true;
}
bool IsTempFileName(absl::string_view n) { return n.substr(0, 5) == ".tmp-"; }

// The entry names of a directory open at `fd` (the descriptor is not consumed).
std::vector<std::string> ListFolder(int fd) {
  std::vector<std::string> names;
  const int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return names;
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return names;
  }
  rewinddir(d);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
    names.emplace_back(e->d_name);
  }
  closedir(d);
  return names;
}

// Unlinks `name` in `dir` only while it is still the file `held` (an open
// descriptor's stat): a good file another node renamed into its place
// meanwhile is left alone.
// Best effort: POSIX has no conditional unlink, so a rename in the moment
// between the check and the unlink can still lose a good file (a miss).
bool UnlinkIfSame(int dir, const std::string& name, const struct stat& held) {
  struct stat now {};
  return fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == held.st_ino &&
         now.st_dev == held.st_dev && unlinkat(dir, name.c_str(), 0) == 0;
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
    : opts_(opts),
      capacity_bytes_(opts.capacity_bytes),
      op_timeout_ms_(opts.op_timeout_ms),
      scan_interval_ms_(opts.scan_interval_ms),
      low_watermark_(opts.low_watermark),
      fsync_(opts.fsync) {}

namespace {

// What Create and Retune both refuse.
absl::Status CheckTunables(const FsTierSettings& s) {
  if (s.capacity_bytes == 0) return absl::InvalidArgumentError("the fs tier's capacity is 0");
  if (!(s.low_watermark > 0 && s.low_watermark <= 1)) {
    return absl::InvalidArgumentError("the fs tier's low_watermark must be in (0, 1]");
  }
  if (s.op_timeout_ms == 0 || s.op_timeout_ms > 3'600'000) {
    return absl::InvalidArgumentError("the fs tier's op_timeout_ms must be 1 to 3600000");
  }
  if (s.scan_interval_ms > 86'400'000) {
    return absl::InvalidArgumentError("the fs tier's scan_interval_ms must be at most 86400000");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FsTier::Retune(const FsTierSettings& next) {
  if (next.dir != opts_.dir || next.io_threads != opts_.io_threads) {
    return absl::InvalidArgumentError(
        "the fs tier's dir and io_threads are fixed while it runs: restart kvtierd to change them");
  }
  if ((next.scan_interval_ms == 0) != (opts_.scan_interval_ms == 0)) {
    return absl::InvalidArgumentError("the fs tier's background scan is turned on or off only at start");
  }
  RETURN_IF_ERROR(CheckTunables(next));
  const uint64_t before = capacity_bytes_.exchange(next.capacity_bytes, std::memory_order_relaxed);
  low_watermark_.store(next.low_watermark, std::memory_order_relaxed);
  op_timeout_ms_.store(next.op_timeout_ms, std::memory_order_relaxed);
  scan_interval_ms_.store(next.scan_interval_ms, std::memory_order_relaxed);
  fsync_.store(next.fsync, std::memory_order_relaxed);
  {
    // The scanner waits on the interval it read: wake it for the new one,
    // and to delete at once past a smaller capacity.
    MutexLock l(&mu_);
    if (next.capacity_bytes < before) scan_wanted_ = true;
    retuned_ = true;
  }
  scan_cv_.notify_all();
  return absl::OkStatus();
}

FsTierSettings FsTier::settings() const {
  FsTierSettings s = opts_;
  s.capacity_bytes = capacity_bytes_.load(std::memory_order_relaxed);
  s.low_watermark = low_watermark_.load(std::memory_order_relaxed);
  s.op_timeout_ms = op_timeout_ms_.load(std::memory_order_relaxed);
  s.scan_interval_ms = scan_interval_ms_.load(std::memory_order_relaxed);
  s.fsync = fsync_.load(std::memory_order_relaxed);
  return s;
}

absl::StatusOr<std::unique_ptr<FsTier>> FsTier::Create(const FsTierOptions& opts) {
  if (opts.dir.empty() || opts.dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("the fs tier's dir must be an absolute path (got \"", opts.dir, "\")"));
  }
  if (opts.tenants.empty()) return absl::InvalidArgumentError("the fs tier has no tenants");
  RETURN_IF_ERROR(CheckTunables(opts));
  if (opts.io_threads == 0 || opts.io_threads > 256) {
    return absl::InvalidArgumentError("the fs tier's io_threads must be 1 to 256");
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
    if (absl::StatusOr<UniqueFd> fd = OpenPrivateFolder(AT_FDCWD, folder, true, folder); !fd.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the fs tier's folder for tenant \"", tenant.name, "\": ",
                                                        fd.status().message()));
    }
  }
  t->worker_started_ns_ = std::vector<std::atomic<uint64_t>>(opts.io_threads);
  for (uint32_t i = 0; i < opts.io_threads; ++i) t->workers_.emplace_back([p = t.get(), i] { p->Worker(i); });
  t->reaper_ = std::thread([p = t.get()] { p->ReapLoop(); });
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
  reap_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  for (std::thread& w : workers_) w.join();
  if (scanner_.joinable()) scanner_.join();
}

const FsTenant* FsTier::TenantFor(uint64_t tenant_hash) const {
  for (const FsTenant& t : opts_.tenants) {
    if (t.hash == tenant_hash) return &t;
  }
  return nullptr;
}

std::string FsTier::FileName(const BlockMeta& meta) {
  return absl::StrCat(Hex(meta.ns.bytes.data(), meta.ns.bytes.size()), "-",
                      Hex(meta.key.bytes.data(), meta.key.bytes.size()), ".kvb");
}

std::string FsTier::PathFor(const BlockMeta& meta) const {
  const FsTenant* t = TenantFor(meta.tenant_hash);
  if (t == nullptr) return "";
  return absl::StrCat(opts_.dir, "/", t->name, "/", Hex(meta.key.bytes.data(), 1), "/", FileName(meta));
}

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
    if (!stop_) {
      queue_[q < kIoPriorities ? q : kIoPriorities - 1].push_back(std::move(job));
      work_cv_.notify_one();
      return;
    }
  }
  // The tier is going (an op submitted from a callback while it stops):
  // no worker may be left to take it.
  RunJob(std::move(job), absl::CancelledError(absl::StrCat("the ", opts_.name, " tier is shutting down")));
}

void FsTier::Worker(uint32_t index) {
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
    worker_started_ns_[index].store(MonotonicNanos(), std::memory_order_relaxed);
    RunJob(std::move(job), absl::OkStatus());
    worker_started_ns_[index].store(0, std::memory_order_relaxed);
  }
}

void FsTier::RunJob(Job job, absl::Status abandoned) {
  if (abandoned.ok() && job.cancel.cancelled()) {
    abandoned = absl::CancelledError(absl::StrCat("the ", opts_.name, " tier's op was cancelled before it started"));
  } else if (abandoned.ok() && job.deadline_ns != 0 && MonotonicNanos() > job.deadline_ns) {
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

void FsTier::ReapLoop() {
  // Every worker may be stuck in a call the file system does not return
  // from (a hard NFS mount while its server is away): queued ops still fail
  // by their deadlines, and the tier says it is degraded.
  constexpr auto kPeriod = std::chrono::milliseconds(20);
  for (;;) {
    // Each round: a reload may have changed op_timeout_ms.
    const uint64_t stuck_ns =
        std::max<uint64_t>(5'000'000'000ull, 4 * op_timeout_ms_.load(std::memory_order_relaxed) * 1'000'000);
    std::vector<Job> expired;
    {
      MutexLock l(&mu_);
      if (mu_.AwaitFor(reap_cv_, kPeriod, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; })) return;
      const uint64_t now = MonotonicNanos();
      for (auto& q : queue_) {
        for (auto it = q.begin(); it != q.end();) {
          if (it->deadline_ns != 0 && now > it->deadline_ns) {
            expired.push_back(std::move(*it));
            it = q.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (Job& j : expired) {
      RunJob(std::move(j), absl::DeadlineExceededError(absl::StrCat(
                                "the ", opts_.name, " tier's op waited past its deadline (every I/O thread busy)")));
    }
    const uint64_t now = MonotonicNanos();
    for (const std::atomic<uint64_t>& started : worker_started_ns_) {
      const uint64_t t = started.load(std::memory_order_relaxed);
      if (t != 0 && now > t + stuck_ns) {
        Failed(absl::UnavailableError(absl::StrCat("a file-system call of the ", opts_.name, " tier has not returned for ",
                                                   (now - t) / 1'000'000'000, " s")));
        break;
      }
    }
  }
}

absl::StatusOr<UniqueFd> FsTier::OpenBlockFolder(const FsTenant& t, const BlockMeta& meta, bool create) const {
  // The directory itself is the operator's (a mount point): it may be a
  // link, but it is never created here.
  UniqueFd root(open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    const int err = errno;
    return FsErrno(err, absl::StrCat("the fs tier's directory ", opts_.dir));
  }
  ASSIGN_OR_RETURN(UniqueFd tenant, OpenPrivateFolder(root.get(), t.name, create, absl::StrCat("tenant folder ", t.name)));
  return OpenPrivateFolder(tenant.get(), Hex(meta.key.bytes.data(), 1), create,
                           absl::StrCat("tenant folder ", t.name, "/", Hex(meta.key.bytes.data(), 1)));
}

absl::Status FsTier::WriteFile(const BlockMeta& meta, std::span<const std::byte> src) {
  const FsTenant* t = TenantFor(meta.tenant_hash);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("the ", opts_.name, " tier has no folder for the block's tenant"));
  ASSIGN_OR_RETURN(UniqueFd folder, OpenBlockFolder(*t, meta, /*create=*/true));
  const std::string name = FileName(meta);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = absl::StrCat(".tmp-", getpid(), "-", rng());
  const int fd = openat(folder.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return FsErrno(errno, "creating a temporary block file");
  FsBlockHeader h = MakeFsHeader(meta, src);
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<std::byte*>(src.data()), src.size()}};
  absl::Status s;
  errno = 0;
  if (!WritevAll(fd, iov, 2)) {
    s = FsErrno(errno == 0 ? EIO : errno, "writing a block file");
  } else if (fsync_.load(std::memory_order_relaxed) && fsync(fd) != 0) {
    s = FsErrno(errno, "fsync of a block file");
  }
  // A network file system may report a deferred write error only here.
  if (close(fd) != 0 && s.ok()) s = FsErrno(errno, "closing a block file");
  if (s.ok() && renameat(folder.get(), tmp.c_str(), folder.get(), name.c_str()) != 0) {
    s = FsErrno(errno, "renaming a block file into place");
  }
  if (!s.ok()) unlinkat(folder.get(), tmp.c_str(), 0);
  return s;
}

absl::Status FsTier::ReadFile(const BlockMeta& meta, std::span<std::byte> dst) {
  const FsTenant* t = TenantFor(meta.tenant_hash);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("the ", opts_.name, " tier has no folder for the block's tenant"));
  absl::StatusOr<UniqueFd> folder = OpenBlockFolder(*t, meta, /*create=*/false);
  if (!folder.ok()) {
    if (absl::IsNotFound(folder.status())) {
      return absl::NotFoundError(absl::StrCat("the block is not in the ", opts_.name, " tier (", folder.status().message(), ")"));
    }
    return folder.status();
  }
  const std::string name = FileName(meta);
  const int fd = openat(folder->get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("the block is not in the ", opts_.name, " tier (evicted there)"));
    }
    const int err = errno;
    if (err == ELOOP) {
      // The link itself, never what it names, and only while it is a link.
      struct stat lst {};
      if (fstatat(folder->get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode)) {
        unlinkat(folder->get(), name.c_str(), 0);
      }
      return absl::DataLossError("the file is not the block: a symbolic link");
    }
    return FsErrno(err, "opening a block file");
  }
  absl::Status s;
  bool ours = true;  // a file of this format: one that fails its checks is deleted
  struct stat st {};
  FsBlockHeader h;
  const size_t want = sizeof(h) + meta.payload_bytes;
  if (fstat(fd, &st) != 0) {
    s = FsErrno(errno, "stat of a block file");
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    s = absl::DataLossError("the file is not the block: not a regular file of kvtierd's user");
  } else if (static_cast<uint64_t>(st.st_size) != want) {
    // Never read whole. A file of another version (a node upgraded before
    // this one) is a miss here, and left for the nodes that read it.
    errno = 0;
    const bool read = PreadAll(fd, &h, std::min<size_t>(sizeof(h), static_cast<size_t>(st.st_size)), 0);
    const int err = errno;
    if (!read && err != 0) {
      s = FsErrno(err, "reading a block file");  // an I/O error deletes nothing
    } else {
      // Only "our magic, another version" is kept; garbage goes.
      const bool known = read && static_cast<uint64_t>(st.st_size) >= 6;
      ours = !known || h.magic != FsBlockHeader::kMagic || h.version == FsBlockHeader::kVersion;
      s = absl::DataLossError(!ours ? "the file is not the block: a block file of another version"
                              : static_cast<uint64_t>(st.st_size) < want ? "the file is not the block: truncated"
                                                                        : "the file is not the block: too long");
    }
  } else {
    // Header and payload in one read, the payload straight into dst.
    iovec iov[2] = {{&h, sizeof(h)}, {dst.data(), meta.payload_bytes}};
    size_t got = 0;
    int err = 0;  // the failing call's errno; 0: the file ended early
    while (got < want) {
      const ssize_t r = preadv(fd, iov, 2, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) err = errno;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
      // A short read (rare on a local file): finish the rest with plain preads.
      if (got < want) {
        errno = 0;
        if (got < sizeof(h)) {
          if (!PreadAll(fd, reinterpret_cast<char*>(&h) + got, sizeof(h) - got, static_cast<off_t>(got))) {
            err = errno;
            break;
          }
          got = sizeof(h);
        }
        if (!PreadAll(fd, dst.data() + (got - sizeof(h)), want - got, static_cast<off_t>(got))) {
          err = errno;
          break;
        }
        got = want;
      }
    }
    if (got < want) {
      s = err != 0 ? FsErrno(err, "reading a block file")
                   : absl::DataLossError("the file is not the block: it shrank while read");
    } else if (h.magic != FsBlockHeader::kMagic || h.version != FsBlockHeader::kVersion) {
      ours = h.magic != FsBlockHeader::kMagic;  // garbage goes; another version stays
      s = absl::DataLossError(ours ? "the file is not the block: not a kvtier block file"
                                   : "the file is not the block: a block file of another version");
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
  // Never served, by any node: the next store writes it again. Only while
  // it is still the file read (another node may have renamed a good one in).
  if (absl::IsDataLoss(s) && ours) UnlinkIfSame(folder->get(), name, st);
  return s;
}

void FsTier::Put(BlockLocator, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                 IoCallback done) {
  if (src.empty() || src.size() != meta.payload_bytes || src.size() > opts_.max_block_bytes ||
      TenantFor(meta.tenant_hash) == nullptr) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "a write of ", src.size(), " bytes to the ", opts_.name, " tier: a length not the block's (1 to ",
        opts_.max_block_bytes, " bytes), or no folder for its tenant")));
    return;
  }
  // src may be reused once Put returns.
  auto copy = std::make_shared<std::vector<std::byte>>(src.begin(), src.end());
  {
    MutexLock l(&mu_);
    ++writes_in_flight_;
  }
  const uint64_t deadline = io.deadline_ns != 0 ? io.deadline_ns : MonotonicNanos() + op_timeout_ms_.load(std::memory_order_relaxed) * 1'000'000;
  Submit({io.prio, deadline, io.cancel,
          [this, meta, copy, done = std::move(done)](absl::Status abandoned) mutable {
            absl::Status s = abandoned;
            if (s.ok()) {
              s = WriteFile(meta, *copy);
              if (s.ok()) {
                writes_.fetch_add(1, std::memory_order_relaxed);
                bytes_written_.fetch_add(copy->size(), std::memory_order_relaxed);
                Succeeded();
                const uint64_t since = written_since_scan_.fetch_add(CostFor(copy->size())) + CostFor(copy->size());
                if (since >= capacity_bytes_.load(std::memory_order_relaxed) / 8) {
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

void FsTier::Get(BlockLocator, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                 IoCallback done) {
  if (meta.payload_bytes == 0 || meta.payload_bytes > opts_.max_block_bytes || dst.size() < meta.payload_bytes ||
      TenantFor(meta.tenant_hash) == nullptr) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "a read of ", meta.payload_bytes, " bytes from the ", opts_.name, " tier: a length out of range, a buffer "
        "too small, or no folder for the block's tenant")));
    return;
  }
  {
    MutexLock l(&mu_);
    ++reads_in_flight_;
  }
  const uint64_t deadline = io.deadline_ns != 0 ? io.deadline_ns : MonotonicNanos() + op_timeout_ms_.load(std::memory_order_relaxed) * 1'000'000;
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
                if (stat(opts_.dir.c_str(), &st) != 0) Failed(FsErrno(errno, opts_.dir));
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
  std::vector<BlockMeta> asked(metas.begin(), metas.end());
  const uint64_t deadline = deadline_ns != 0 ? deadline_ns : MonotonicNanos() + op_timeout_ms_.load(std::memory_order_relaxed) * 1'000'000;
  Submit({IoPriority::kLoad, deadline, CancelToken{},
          [this, asked = std::move(asked), deadline, done = std::move(done)](absl::Status abandoned) mutable {
            std::vector<bool> found(asked.size(), false);
            // Every block is asked about, not only the run from the first:
            // another shared tier in the chain may hold the blocks this one
            // lacks (a prefix spread over the cluster and the directory).
            // The deadline ends the answer. The metas of one probe are one
            // tenant's.
            const FsTenant* t = asked.empty() ? nullptr : TenantFor(asked[0].tenant_hash);
            UniqueFd root(open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            absl::StatusOr<UniqueFd> tenant = absl::NotFoundError("");
            if (t != nullptr && root.valid()) tenant = OpenPrivateFolder(root.get(), t->name, false, t->name);
            for (size_t i = 0; abandoned.ok() && tenant.ok() && i < asked.size(); ++i) {
              if (MonotonicNanos() > deadline || asked[i].tenant_hash != t->hash) break;  // the rest count as absent
              absl::StatusOr<UniqueFd> folder =
                  OpenPrivateFolder(tenant->get(), Hex(asked[i].key.bytes.data(), 1), false, "a block folder");
              struct stat st {};
              found[i] = folder.ok() &&
                         fstatat(folder->get(), FileName(asked[i]).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                         S_ISREG(st.st_mode) && st.st_uid == geteuid();
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
  s.capacity_bytes = capacity_bytes_.load(std::memory_order_relaxed);  // what this node claims is in the store's books
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
      const bool woken =
          mu_.AwaitFor(scan_cv_, std::chrono::milliseconds(scan_interval_ms_.load(std::memory_order_relaxed)),
                       [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || scan_wanted_ || retuned_; });
      if (stop_) return;
      if (woken && retuned_ && !scan_wanted_) {
        retuned_ = false;  // a new interval: wait again, from now, for it
        continue;
      }
      retuned_ = false;
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
    uint32_t tenant;
    std::string sub, name;
    struct stat st;
  };
  std::vector<File> files;
  uint64_t total = 0, stale = 0;
  const int64_t now_real = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  UniqueFd root(open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    const int err = errno;
    Failed(FsErrno(err, absl::StrCat("the fs tier's directory ", opts_.dir)));
    MutexLock l(&mu_);
    ++scan_.failures;
    return;
  }
  // Only this tier's own names, in folders checked on their descriptors:
  // a link or another uid's folder put in a tenant folder's place is
  // neither followed nor emptied.
  auto is_sub = [](const std::string& n) {
    return n.size() == 2 && std::isxdigit(static_cast<unsigned char>(n[0])) &&
           std::isxdigit(static_cast<unsigned char>(n[1]));
  };
  for (uint32_t ti = 0; ti < opts_.tenants.size(); ++ti) {
    const FsTenant& t = opts_.tenants[ti];
    absl::StatusOr<UniqueFd> tenant = OpenPrivateFolder(root.get(), t.name, false, absl::StrCat("tenant folder ", t.name));
    if (!tenant.ok()) {
      if (!absl::IsNotFound(tenant.status())) Failed(tenant.status());
      continue;
    }
    for (const std::string& sub : ListFolder(tenant->get())) {
      if (!is_sub(sub)) continue;
      absl::StatusOr<UniqueFd> folder = OpenPrivateFolder(tenant->get(), sub, false, sub);
      if (!folder.ok()) continue;
      for (const std::string& name : ListFolder(folder->get())) {
        const bool temp = IsTempFileName(name);
        if (!temp && !IsBlockFileName(name)) continue;
        struct stat st {};
        if (fstatat(folder->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid()) {
          continue;  // gone, or not ours to count
        }
        const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
        if (temp) {
          // A writer that died (this node's clock against the server's:
          // an hour covers any sane skew).
          if (now_real - mtime > static_cast<int64_t>(kStaleTempNs) && UnlinkIfSame(folder->get(), name, st)) ++stale;
          continue;
        }
        total += static_cast<uint64_t>(st.st_size);
        files.push_back({mtime, static_cast<uint64_t>(st.st_size), ti, sub, name, st});
      }
    }
  }
  uint64_t evicted = 0, vanished = 0, left = total;
  const uint64_t capacity = capacity_bytes_.load(std::memory_order_relaxed);
  if (total > capacity) {
    const uint64_t target =
        static_cast<uint64_t>(static_cast<double>(capacity) * low_watermark_.load(std::memory_order_relaxed));
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime_ns < b.mtime_ns; });
    std::string open_where;
    absl::StatusOr<UniqueFd> folder = absl::NotFoundError("");
    for (const File& f : files) {
      if (left <= target) break;
      const FsTenant& t = opts_.tenants[f.tenant];
      if (const std::string where = absl::StrCat(t.name, "/", f.sub); where != open_where) {
        absl::StatusOr<UniqueFd> tenant = OpenPrivateFolder(root.get(), t.name, false, t.name);
        folder = tenant.ok() ? OpenPrivateFolder(tenant->get(), f.sub, false, f.sub) : tenant.status();
        open_where = where;
      }
      if (!folder.ok()) continue;
      // Only while it is the file listed (best effort: POSIX has no
      // conditional unlink): one a node wrote since is newer.
      struct stat now {};
      if (fstatat(folder->get(), f.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno != ENOENT) continue;  // cannot tell (ESTALE, EIO): counted as still there
        ++vanished;                     // another node's scan, or a read that found it damaged
      } else if (now.st_ino != f.st.st_ino || now.st_dev != f.st.st_dev) {
        ++vanished;  // replaced by a newer copy: the listed file is gone
      } else if (unlinkat(folder->get(), f.name.c_str(), 0) == 0) {
        ++evicted;
      } else if (errno == ENOENT) {
        ++vanished;
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
