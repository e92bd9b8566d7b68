// SPDX-License-Identifier: Apache-2.0
// kvtierd's parts built from its config, apart from the control loop that
// runs them: the cost model's options, and the tier below host memory (the
// NVMe tier: sized, checked, opened and recovered). Daemon::Open calls these
// and wires what they return into the store; a tier added below NVMe is
// opened here and attached in one more line there.
#ifndef KVTIER_DAEMON_ASSEMBLY_H_
#define KVTIER_DAEMON_ASSEMBLY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "store/cost_tracker.h"
#include "tiers/nvme_tier.h"
#include "tiers/remote_tier.h"

namespace kvtier {

// [cost_model]: the model shape (a Hugging Face config.json, or the default
// shape), the priors, and whether it decides.
absl::StatusOr<CostTracker::Options> CostOptionsFrom(const Config& c);

// Each tenant's remote credentials and sealing keys, read from their files
// (each a regular file of kvtierd's user, not a link, mode 0600 or
// stricter, at most 4 KiB, not empty; never logged). A key file holds 64
// hex digits a line, the current key first; the key may not be the
// password, nor another tenant's. --check-config runs this too.
absl::StatusOr<std::vector<RemoteTenant>> RemoteTenantsFrom(const Config& c);

// [tiers.remote]: a RemoteTier on the cluster the seeds name, each tenant
// with its ACL user, password and keys (RemoteTenantsFrom).
// nullptr without seeds. The cluster need not be up: the tier starts
// degraded and heals when it answers. `name`: the tier's, in status and
// metrics (Config::LowerEntry).
absl::StatusOr<std::unique_ptr<RemoteTier>> OpenRemoteFrom(const Config& c, std::string_view name = "remote");

struct OpenedNvme {
  std::unique_ptr<NvmeTier> tier;  // null: no NVMe tier (capacity 0, or no room for the default)
  std::vector<RecoveredBlock> recovered;
  uint64_t requested_bytes = 0;    // the capacity asked of the tier (the default may have shrunk)
};
// [tiers.nvme]: the default capacity shrinks to half the free space (with a
// warning), a directory in RAM is warned about, the tier is opened and its
// journal replayed (progress logged), and the engine it runs is logged.
absl::StatusOr<OpenedNvme> OpenNvmeFrom(const Config& c, std::string_view name = "nvme");
// The log lines of an opened NVMe tier once its recovered blocks are indexed:
// a resize, a damaged journal, a capacity rounded down, then the summary.
// requested_bytes: as OpenedNvme has it; recovered: how many blocks the tier handed back.
void LogNvmeOpened(const Config& c, uint64_t requested_bytes, uint64_t recovered, const NvmeStats& stats,
                   uint64_t indexed);

}  // namespace kvtier

#endif  // KVTIER_DAEMON_ASSEMBLY_H_
