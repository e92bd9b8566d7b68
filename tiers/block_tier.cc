// SPDX-License-Identifier: Apache-2.0
#include "tiers/block_tier.h"

#include <xxhash.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace kvtier {

absl::Status AbandonedStatus(int32_t reason, absl::string_view what) {
  switch (reason) {
    case 0:
      return absl::OkStatus();
    case kIoCancelled:
      return absl::CancelledError(absl::StrCat(what, " cancelled before it started"));
    case kIoDeadlinePassed:
      return absl::DeadlineExceededError(absl::StrCat(what, " not started by its deadline"));
    default:
      return absl::InternalError(absl::StrCat(what, ": unexpected abandon reason ", reason));
  }
}

absl::Status CheckBlockBytes(std::string_view tier, uint64_t bytes, uint64_t max_bytes) {
  if (bytes != 0 && bytes <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("a block of ", bytes, " bytes does not fit the ", absl::string_view(tier.data(), tier.size()),
                   " tier (1 to ", max_bytes, " bytes)"));
}

absl::StatusOr<BlockLocator> KeyAddressedBlockTier::Reserve(const BlockMeta& meta) {
  if (absl::Status s = CheckBlockBytes(name(), meta.payload_bytes, max_block_bytes()); !s.ok()) return s;
  return kKeyAddressed;
}

uint64_t TenantHash(absl::string_view tenant) { return XXH3_64bits(tenant.data(), tenant.size()); }

}  // namespace kvtier
