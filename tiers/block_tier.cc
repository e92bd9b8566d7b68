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

uint64_t TenantHash(absl::string_view tenant) { return XXH3_64bits(tenant.data(), tenant.size()); }

}  // namespace kvtier
