// SPDX-License-Identifier: Apache-2.0
// The policy factory: names (the config's tiers.host.policy and
// tiers.nvme.policy) to policies. In its own file so that no policy's file
// includes another's header (adaptive builds on the others through this).
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "policies/adaptive_policy.h"
#include "policies/eviction_policy.h"

namespace kvtier {

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(absl::string_view name) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "s3fifo") return MakeS3FifoPolicy();
  if (name == "s3fifo-deep") return MakeS3FifoPolicy(kDeepS3FifoOptions);
  if (name == "tinylfu") return MakeTinyLfuPolicy();
  if (name == "arc") return MakeArcPolicy();
  if (name == "arc-cutoff") return MakeArcPolicy(kArcCutoffOptions);
  if (name == "holds") return MakeHoldsPolicy();
  if (name == "adaptive") {
    ASSIGN_OR_RETURN(std::unique_ptr<AdaptivePolicy> p, AdaptivePolicy::Create({}));
    return std::unique_ptr<EvictionPolicy>(std::move(p));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy \"", name, "\"; available: adaptive, arc, arc-cutoff, holds, lru, s3fifo, s3fifo-deep, tinylfu"));
}

}  // namespace kvtier
