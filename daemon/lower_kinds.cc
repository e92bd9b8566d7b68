// SPDX-License-Identifier: Apache-2.0
// The config halves of the lower tiers' kinds: NVMe's and the Redis
// Cluster's, then the kinds that live in folders of their own, listed by
// the build (kvtier_lower_kind in the kind's CMakeLists.txt).
#include "daemon/lower_kinds.h"

#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "tiers/nvme_format.h"
#include "tiers/lower_kind_configs.h"  // generated

namespace kvtier {
namespace {

using T = ConfigType;

const ConfigKey kNvmeKeys[] = {
    {"tiers.nvme", "dirs", T::kStringList, Field<&Config::nvme, &NvmeSettings::dirs>(), 0, 0, false,
     "one directory per device; default: <data_dir>/nvme"},
    {"tiers.nvme", "capacity", T::kBytes, Field<&Config::nvme, &NvmeSettings::capacity_bytes>(), 0, 0, false,
     "across all dirs; 0: no NVMe tier; the default shrinks to the free space"},
    {"tiers.nvme", "segment_bytes", T::kBytes, Field<&Config::nvme, &NvmeSettings::segment_bytes>(), 0, 0, false,
     "slabs are cut into segments of one block size each"},
    {"tiers.nvme", "queue_depth", T::kInt, Field<&Config::nvme, &NvmeSettings::queue_depth>(), 1, 4096, false, "I/Os in flight per worker"},
    {"tiers.nvme", "io_workers", T::kInt, Field<&Config::nvme, &NvmeSettings::io_workers>(), 1, 64, false, "one io_uring each"},
    {"tiers.nvme", "io_engine", T::kString, Field<&Config::nvme, &NvmeSettings::io_engine>(), 0, 0, false,
     "auto (io_uring, else pread/pwrite threads), io_uring, threads"},
    {"tiers.nvme", "allow_buffered", T::kBool, Field<&Config::nvme, &NvmeSettings::allow_buffered>(), 0, 0, false,
     "accept file systems without O_DIRECT (page-cache I/O)"},
    {"tiers.nvme", "staging_bytes", T::kBytes, Field<&Config::nvme, &NvmeSettings::staging_bytes>(), 0, 0, false,
     "aligned bounce memory for direct I/O"},
    {"tiers.nvme", "admission_min_uses", T::kInt, Field<&Config::nvme, &NvmeSettings::admission_min_uses>(), 1, 15, false,
     "write a host eviction to NVMe only if leased lookups asked for the block this many times; 1: every block"},
    {"tiers.nvme", "write_through", T::kBool, Field<&Config::nvme, &NvmeSettings::write_through>(), 0, 0, false,
     "write committed blocks to NVMe at once, not only on eviction"},
    {"tiers.nvme", "policy", T::kString, Field<&Config::nvme, &NvmeSettings::policy>(), 0, 0, false,
     "eviction policy of the NVMe tier: arc, lru, s3fifo, s3fifo-deep, tinylfu"},
};

const ConfigKey kRedisKeys[] = {
    {"tiers.remote", "seeds", T::kStringList, Field<&Config::remote, &RemoteSettings::seeds>(), 0, 0, false,
     "host:port of Redis Cluster nodes; empty: no remote tier"},
    {"tiers.remote", "key_prefix", T::kString, Field<&Config::remote, &RemoteSettings::key_prefix>(), 0, 0, false,
     "keys are <prefix>:<tenant>:<namespace>:<block>"},
    {"tiers.remote", "capacity", T::kBytes, Field<&Config::remote, &RemoteSettings::capacity_bytes>(), 0, 0, false,
     "what this daemon tracks as written there (the cluster evicts on its own)"},
    {"tiers.remote", "op_timeout_ms", T::kInt, Field<&Config::remote, &RemoteSettings::op_timeout_ms>(), 1, 600000, false,
     "a remote read or write not answered by then is a miss"},
    {"tiers.remote", "connect_timeout_ms", T::kInt, Field<&Config::remote, &RemoteSettings::connect_timeout_ms>(), 1, 60000, false,
     "per connection attempt"},
    {"tiers.remote", "io_timeout_ms", T::kInt, Field<&Config::remote, &RemoteSettings::io_timeout_ms>(), 1, 600000, false,
     "a reply slower than this breaks its connection"},
    {"tiers.remote", "probe_budget_us", T::kInt, Field<&Config::remote, &RemoteSettings::probe_budget_us>(), 0, 1000000, true,
     "how long a lookup waits for the cluster past its local hit prefix; 0: never asks"},
    {"tiers.remote", "probe_max_blocks", T::kInt, Field<&Config::remote, &RemoteSettings::probe_max_blocks>(), 1, 65536, false,
     "blocks one lookup asks the cluster about"},
    {"tiers.remote", "probe_blocks_per_s", T::kInt, Field<&Config::remote, &RemoteSettings::probe_blocks_per_s>(), 1, 100000000, false,
     "per tenant: blocks its lookups may ask the cluster about per second (a flood costs the flooder)"},
    {"tiers.remote", "records_per_tenant", T::kInt, Field<&Config::remote, &RemoteSettings::records_per_tenant>(), 1, 1u << 30, false,
     "per tenant: blocks in the cluster this node indexes (each costs memory here)"},
    {"tiers.remote", "min_block_bytes", T::kBytes, Field<&Config::remote, &RemoteSettings::min_block_bytes>(), 0, 0, false,
     "blocks smaller than this are never probed, published or moved to the cluster"},
    {"tiers.remote", "tenant_budget", T::kBytes, Field<&Config::remote, &RemoteSettings::tenant_budget>(), 0, 0, false,
     "per tenant: bytes its blocks may take in the cluster, all nodes together; past it its own oldest go (0: none)"},
    {"tiers.remote", "encrypt", T::kBool, Field<&Config::remote, &RemoteSettings::encrypt>(), 0, 0, false,
     "encrypt payloads at rest in the cluster (AES-256-GCM); values are sealed either way"},
    {"tiers.remote", "tls", T::kBool, Field<&Config::remote, &RemoteSettings::tls>(), 0, 0, false,
     "TLS to every node (a production cluster should: passwords and blocks cross the network)"},
    {"tiers.remote", "tls_ca_file", T::kString, Field<&Config::remote, &RemoteSettings::tls_ca_file>(), 0, 0, false,
     "PEM CA file the nodes' certificates must chain to"},
    {"tiers.remote", "tls_cert_file", T::kString, Field<&Config::remote, &RemoteSettings::tls_cert_file>(), 0, 0, false,
     "PEM client certificate, for clusters that ask for one (tls-auth-clients yes)"},
    {"tiers.remote", "tls_key_file", T::kString, Field<&Config::remote, &RemoteSettings::tls_key_file>(), 0, 0, false,
     "its private key (mode 0600)"},
    {"tiers.remote", "tls_server_name", T::kString, Field<&Config::remote, &RemoteSettings::tls_server_name>(), 0, 0, false,
     "the name every node's certificate must carry; empty: the node's address"},
    {"tiers.remote", "write_policy", T::kString, Field<&Config::remote, &RemoteSettings::write_policy>(), 0, 0, true,
     "demoted (what leaves the last local tier), reused (also host blocks once hit), committed (every block)"},
    {"tiers.remote", "admission_min_uses", T::kInt, Field<&Config::remote, &RemoteSettings::admission_min_uses>(), 1, 15, false,
     "write a block to the shared tier (any write_policy) only if leased lookups asked for it this many times; 1: every block"},
};

LowerTierKind NvmeKind() {
  return {.kind = "nvme",
          .section = "tiers.nvme",
          .preamble = "",
          .shared = false,
          .default_name = "nvme",
          .keys = kNvmeKeys,
          .configured = [](const Config& c) { return c.nvme.capacity_bytes != 0; },
          .validate = [](const Config& c, ConfigFail fail) {
            // The section's capacity 0 means "no NVMe tier"; an entry that
            // names the kind and turns it off is a mistake.
            if (!c.lower_chain.empty() && c.nvme.capacity_bytes == 0) {
              fail("tiers.nvme.capacity",
                   "a [[tiers.lower]] entry of kind \"nvme\" with capacity 0: leave the entry out instead");
            }
          },
          // As the tier cuts it: whole segments, a header sector a slot.
          .fit = [](const Config& c, uint64_t block_bytes) {
            return LowerTierKind::Fit{
                .capacity_bytes = c.nvme.capacity_bytes,
                .blocks = NvmeBlocksThatFit(c.nvme.capacity_bytes, c.nvme.segment_bytes, c.NvmeDirs().size(),
                                            block_bytes)};
          }};
}

// Its credentials and seeds are checked with the tenants' (config_validate.cc).
LowerTierKind RedisKind() {
  return {.kind = "redis",
          .section = "tiers.remote",
          .preamble = "# A shared Redis Cluster below NVMe; each tenant reads and writes it as its own\n"
                      "# ACL user ([[tenants]] remote_user, remote_password_file) and seals its values with a\n"
                      "# key of its own ([[tenants]] remote_key_file).\n",
          .shared = true,
          .default_name = "remote",
          .keys = kRedisKeys,
          .configured = [](const Config& c) { return !c.remote.seeds.empty(); },
          .validate = nullptr,
          // What this node may place there (the cluster may hold more).
          .fit = [](const Config& c, uint64_t block_bytes) {
            return LowerTierKind::Fit{.capacity_bytes = c.remote.capacity_bytes,
                                      .blocks = block_bytes == 0 ? 0 : c.remote.capacity_bytes / block_bytes};
          }};
}

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

std::span<const LowerTierKind> LowerTierKinds() {
  static const LowerTierKind kKinds[] = {
      NvmeKind(),
      RedisKind(),
      KVTIER_LOWER_KIND_CONFIGS
  };
  return kKinds;
}

const LowerTierKind* FindLowerTierKind(std::string_view kind) {
  for (const LowerTierKind& k : LowerTierKinds()) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

}  // namespace kvtier
