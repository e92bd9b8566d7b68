// SPDX-License-Identifier: Apache-2.0
#include "os/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier::os {

absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& name, uint64_t bytes) {
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("memfd_create(", name, ")"));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sizing shared memory ", name, " to ", bytes, " bytes"));
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sealing shared memory ", name));
  }
  return fd;
}

absl::StatusOr<UniqueFd> CreateResizeSealedMemfd(const std::string& name, uint64_t bytes) {
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("memfd_create(", name, ")"));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sizing shared memory ", name, " to ", bytes, " bytes"));
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sealing shared memory ", name));
  }
  return fd;
}

absl::Status SealFutureWrites(int fd) {
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "sealing shared memory against writable mappings (F_SEAL_FUTURE_WRITE)");
  }
  return absl::OkStatus();
}

bool IsSealedAgainstWrites(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE)) != 0;
}

absl::StatusOr<uint64_t> FdSize(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat");
  return static_cast<uint64_t>(st.st_size);
}

bool IsSealedAgainstShrink(int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

MappedRegion::~MappedRegion() { Reset(); }

MappedRegion::MappedRegion(MappedRegion&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<MappedRegion> MappedRegion::Map(int fd, uint64_t bytes, bool populate) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot map 0 bytes");
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap of ", bytes, " bytes"));
  return MappedRegion(static_cast<std::byte*>(p), bytes);
}

absl::StatusOr<MappedRegion> MappedRegion::MapReadOnly(int fd, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot map 0 bytes");
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("read-only mmap of ", bytes, " bytes"));
  return MappedRegion(static_cast<std::byte*>(p), bytes);
}

}  // namespace kvtier::os
