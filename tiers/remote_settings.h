// SPDX-License-Identifier: Apache-2.0
// What an operator sets of the shared Redis Cluster tier ([tiers.remote]):
// kvtierd's config holds RemoteSettings as Config::remote. The tier's own
// defaults come from tiers/remote_defaults.h, which RemoteTierOptions reads
// too. The config does not need the tier's header (or hiredis's) for them.
#ifndef KVTIER_TIERS_REMOTE_SETTINGS_H_
#define KVTIER_TIERS_REMOTE_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tiers/remote_defaults.h"

namespace kvtier {

struct RemoteSettings {
  std::vector<std::string> seeds;  // "host:port" of cluster nodes; none: no remote tier
  std::string key_prefix = remote_defaults::kKeyPrefix;
  uint64_t capacity_bytes = remote_defaults::kCapacityBytes;  // handles on what this daemon wrote there
  uint32_t op_timeout_ms = remote_defaults::kOpTimeoutMs;
  uint32_t connect_timeout_ms = remote_defaults::kConnectTimeoutMs;
  uint32_t io_timeout_ms = remote_defaults::kIoTimeoutMs;
  uint32_t probe_budget_us = 2000;
  uint32_t probe_max_blocks = 256;
  // Fair shares of the cluster among tenants (docs/remote-tier.md).
  uint32_t probe_blocks_per_s = 50000;   // per tenant: blocks its lookups may ask about
  uint32_t records_per_tenant = 262144;  // per tenant: cluster blocks this node indexes
  uint64_t min_block_bytes = 4096;       // smaller blocks never go to the cluster
  uint64_t tenant_budget = 0;            // per tenant: bytes its blocks may take there (0: none)
  std::string write_policy = "demoted";
  uint32_t admission_min_uses = 1;  // as tiers.nvme.admission_min_uses, for every write to the shared tier
  bool encrypt = false;             // encrypt payloads at rest in the cluster (always sealed)
  // TLS to the cluster's nodes: their certificates chain to the CA file and
  // name the node (or tls_server_name); a client certificate when given.
  bool tls = false;
  std::string tls_ca_file, tls_cert_file, tls_key_file, tls_server_name;

  bool operator==(const RemoteSettings&) const = default;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_REMOTE_SETTINGS_H_
