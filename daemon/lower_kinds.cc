// SPDX-License-Identifier: Apache-2.0
#include "daemon/lower_kinds.h"

#include "daemon/config.h"

namespace kvtier {
namespace {

const LowerTierKind kKinds[] = {
    {"nvme", "tiers.nvme", false, [](const Config& c) { return c.nvme_capacity != 0; }},
    {"redis", "tiers.remote", true, [](const Config& c) { return !c.remote_seeds.empty(); }},
    {"fs", "tiers.fs", true, [](const Config& c) { return !c.fs.dir.empty(); }},
};

}  // namespace

bool IsSharedTierKey(std::string_view name) {
  static constexpr std::string_view kKeys[] = {"probe_budget_us",    "probe_max_blocks", "probe_blocks_per_s",
                                               "records_per_tenant", "min_block_bytes",  "write_policy",
                                               "admission_min_uses"};
  for (std::string_view k : kKeys) {
    if (k == name) return true;
  }
  return false;
}

std::span<const LowerTierKind> LowerTierKinds() { return kKinds; }

const LowerTierKind* FindLowerTierKind(std::string_view kind) {
  for (const LowerTierKind& k : kKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

}  // namespace kvtier
