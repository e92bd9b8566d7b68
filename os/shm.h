// SPDX-License-Identifier: Apache-2.0
// Anonymous shared memory: memfds (never names in /dev/shm) and mappings.
#ifndef KVTIER_OS_SHM_H_
#define KVTIER_OS_SHM_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/unique_fd.h"

namespace kvtier::os {

// A memfd of `bytes`, sealed against shrinking and growing, so a peer that
// holds it cannot truncate the memory under the other side's feet.
absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& name, uint64_t bytes);
// A memfd sealed against resizing only, so F_SEAL_FUTURE_WRITE can follow
// once its creator has mapped it (SealFutureWrites).
absl::StatusOr<UniqueFd> CreateResizeSealedMemfd(const std::string& name, uint64_t bytes);
// No new writable mapping of fd can be made, by anyone it is passed to;
// mappings made before keep their access. Then seals the seals.
absl::Status SealFutureWrites(int fd);
// True when fd can never be mapped writable again.
bool IsSealedAgainstWrites(int fd);

// Size of the file behind fd.
absl::StatusOr<uint64_t> FdSize(int fd);

// True when fd is a memfd sealed against shrinking (what the daemon hands out).
bool IsSealedAgainstShrink(int fd);

// An owned shared mapping.
class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion();
  MappedRegion(MappedRegion&& o) noexcept;
  MappedRegion& operator=(MappedRegion&& o) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps `bytes` of fd read-write and shared. populate pre-faults the pages.
  static absl::StatusOr<MappedRegion> Map(int fd, uint64_t bytes, bool populate = false);
  // Maps `bytes` of fd read-only and shared.
  static absl::StatusOr<MappedRegion> MapReadOnly(int fd, uint64_t bytes);

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool valid() const { return data_ != nullptr; }

 private:
  MappedRegion(std::byte* data, uint64_t size) : data_(data), size_(size) {}
  void Reset();
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kvtier::os

#endif  // KVTIER_OS_SHM_H_
