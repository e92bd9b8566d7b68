// SPDX-License-Identifier: Apache-2.0
// kvtierd's configuration: TOML at /etc/kvtier/kvtierd.toml (or --config).
// Every key has a default, so no file is needed; unknown keys and bad values
// are refused with a message naming the key. docs/configuration.md lists
// every key; `kvtierd --print-default-config` prints them with defaults.
#ifndef KVTIER_DAEMON_CONFIG_H_
#define KVTIER_DAEMON_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "store/shared_writes.h"
#include "kvtier/types.h"
#include "policies/eviction_policy.h"
#include "tiers/lower_kind_settings.h"  // generated: the kinds in folders of their own
#include "tiers/nvme_settings.h"
#include "tiers/remote_settings.h"

namespace kvtier {

struct TenantConfig {
  std::string name;
  std::vector<uid_t> uids;  // peers with one of these uids belong here
  std::vector<gid_t> gids;  // or with one of these primary gids
  std::string salt;         // mixed into namespace ids; secret, never logged
  uint64_t host_bytes = 0;  // host arena size; 0 = tiers.host.capacity
  // Quotas; 0 = none beyond the tier's size. Counted in resident blocks:
  // a store's blocks count from StoreBegin, a demoted block from its write.
  uint64_t host_tokens = 0;  // tokens resident in this tenant's host arena
  uint64_t nvme_bytes = 0;   // bytes of the shared NVMe tier
  uint64_t nvme_tokens = 0;  // tokens on the shared NVMe tier
  // The remote tier's ACL user for this tenant's keys, and a file holding its
  // password (mode 0600 or stricter; never logged).
  std::string remote_user;
  std::string remote_password_file;
  // And a file of the keys that seal its values there (value_seal.h): one of
  // 64 hex digits a line, the current first.
  std::string remote_key_file;
  // Its own cluster (host:port seeds), where tenants must not share one's
  // memory; empty: tiers.remote.seeds.
  std::vector<std::string> remote_seeds;
  // What its blocks may take in the cluster, every node together (a ledger
  // in the cluster); 0: tiers.remote.tenant_budget.
  uint64_t remote_budget = 0;
};

// The most lower tiers a chain holds: the store's lanes (kMaxLowerTiers,
// store/block_index.h; daemon.cc checks they agree).
inline constexpr size_t kMaxLowerChain = 8;

struct Config {
  // [daemon]
  std::string run_dir;   // sockets; default: see core/paths.h
  std::string data_dir;  // persistent data; default: see core/paths.h
  std::string log_level = "info";
  std::string device = "auto";  // "auto" | "cuda" | "sim"
  // SIGTERM: how long draining may take in all (open stores finishing, then
  // host blocks written to NVMe); then the daemon exits regardless.
  uint32_t drain_timeout_ms = 8000;
  HashAlgorithm hash = HashAlgorithm::kSha256;
  // [ipc]
  uint32_t ring_entries = 256;
  uint64_t scratch_bytes = 4ull << 20;
  uint32_t max_keys_per_op = 65536;
  uint32_t spin_us = 200;  // covers an engine's think time between calls (see docs)
  uint32_t max_sessions = 256;
  uint32_t max_leases_per_session = 65536;
  // [limits]: per-tenant and per-peer bounds that keep one tenant (or one
  // local user who is no tenant) from taking what the others need. Each
  // refusal counts in stats.refused (docs/security.md).
  uint32_t limit_sessions_per_tenant = 0;  // 0: an equal share, max_sessions / tenants (at least 1)
  uint32_t limit_kv_caches_per_tenant = 64;
  uint64_t limit_kv_cache_bytes_per_tenant = 4ull << 40;  // registered memory mapped into kvtierd
  uint32_t limit_leased_blocks_per_session = 262144;
  uint32_t limit_pending_connections = 256;          // unauthenticated connections, in all
  uint32_t limit_pending_connections_per_uid = 16;   // ... from one uid
  uint32_t limit_namespaces_per_tenant = 1024;
  uint32_t limit_log_lines_per_s = 20;  // per tenant (or uid): attach/detach/refusal lines; 0: no limit
  // Sessions a tenant may hold at once (the resolved default).
  uint32_t SessionsPerTenant() const;
  // [tiers.host]
  uint64_t host_capacity = 1ull << 30;
  bool host_prefault = false;
  std::string host_policy{kDefaultHostPolicy};
  // Background reclaim: above high_watermark (a fraction of a tenant's
  // arena, or of its host_tokens quota) a background thread evicts its
  // coldest blocks (demoting them) down to low_watermark, so stores find
  // free slots instead of evicting on their own path. 1 and 1: off.
  double host_high_watermark = 0.95;
  double host_low_watermark = 0.90;
  // [tiers.nvme]: the NVMe tier's settings and the store's use of it
  // (tiers/nvme_settings.h, defaults and all).
  NvmeSettings nvme;
  // [tiers.remote]: a shared Redis Cluster below NVMe, none without seeds
  // (tiers/remote_settings.h).
  RemoteSettings remote;
  // Each kind of lower tier in a folder of its own: its settings struct,
  // defaults and all, as the member its kvtier_lower_kind() names; the
  // struct holds its section's keys. Config::fs: [tiers.fs], a directory
  // several nodes mount, none without dir (tiers/fs/fs_settings.h).
  KVTIER_LOWER_KIND_SETTINGS
  // One lower tier of the chain.
  struct LowerEntry {
    std::string kind;  // "nvme", "redis", "fs"
    // Unique in the chain; the tier's name in status, metrics and logs. The
    // entry's `name`, else the kind's (LowerTierKind::default_name), with
    // "-<n>" for the n-th entry of a kind.
    std::string name;
    // For an entry after the first of its kind (a kind that may repeat,
    // LowerTierKind::repeatable): its kind's section as the entry sets it
    // (the rest of this Config at its defaults; key_source: where the entry
    // set those keys). Null: the section's values in the Config that holds
    // the entry, as for the first entry of each kind. OptionsOf merges.
    std::shared_ptr<const Config> own;
    // Which tier it is; `own`'s options compare key by key (Daemon::Reload).
    bool operator==(const LowerEntry& o) const { return kind == o.kind && name == o.name; }
  };
  // [[tiers.lower]]: the lower tiers in chain order, each entry's options
  // read as its kind's section. Empty (no [[tiers.lower]] in the file):
  // [tiers.nvme] when its capacity is not 0, then [tiers.remote] when it has
  // seeds, then [tiers.fs] when it has a dir.
  std::vector<LowerEntry> lower_chain;
  // The chain in effect: lower_chain, or the sections' order as above.
  std::vector<LowerEntry> LowerChain() const;
  // The options the entry opens with: this config, with the kind's section
  // (and where its keys were set) from the entry for a later entry of a
  // kind. Built when asked, so a later entry sees the rest of the config as
  // it is now (flags, a reload).
  Config OptionsOf(const LowerEntry& e) const;
  // Whether the chain holds a tier of `kind`.
  bool ChainHolds(std::string_view kind) const;
  // tiers.remote.write_policy as the store takes it (validated by
  // ValidateConfig; "demoted" for a name it would refuse).
  SharedWrites RemoteWritePolicy() const;
  // Per tenant: device memory for the GPU tier (0: no GPU tier).
  uint64_t gpu_capacity = 0;
  // [metrics]: Prometheus text over HTTP (GET /metrics).
  bool metrics_enabled = true;
  std::string metrics_address = "127.0.0.1";
  uint32_t metrics_port = 9464;  // 0: any free port (kvtierctl status shows which)
  // A file holding a bearer token every scrape must send; empty: none.
  std::string metrics_token_file;
  // Per-tenant series and node addresses without a token: every local user
  // who can reach the endpoint sees them (docs/security.md).
  bool metrics_per_tenant = false;
  // [cost_model]
  std::string cost_model_config;  // HF config.json; empty: ModelProfile::Default()
  double cost_prefill_tflops = 300;
  double cost_nvme_read_gbps = 3.0;
  double cost_nvme_read_latency_us = 100;
  bool cost_decide = true;
  // [events]: KV events for cache-aware routers, per tenant, in vLLM's
  // format (events/kv_events.h). Off by default.
  bool events_enabled = false;
  std::string events_endpoint;         // "{tenant}" expands; empty: ipc sockets in run_dir
  std::string events_replay_endpoint;  // likewise; "off": no replay socket
  std::vector<std::string> events_tenants;  // which tenants publish; empty: all
  std::string events_topic;
  std::string events_block_hash = "int64";  // "int64" (vLLM's default) or "bytes"
  uint32_t events_batch_ms = 10;
  uint32_t events_buffer_batches = 10000;
  uint64_t events_buffer_bytes = 64ull << 20;
  uint32_t events_max_pending = 100000;  // per tenant
  uint32_t events_max_connections = 256;  // per tenant's publisher process
  uint64_t events_publisher_memory = 1ull << 30;
  uint32_t events_replays_per_s = 10;
  uint32_t events_replay_max_batches = 1000;
  // [sim]
  uint64_t sim_bandwidth = 0;  // bytes/s; 0 = unlimited
  // [[tenants]]; empty in a file means the default tenant.
  std::vector<TenantConfig> tenants;

  // Where each key was read, "file:line" by its full name
  // ("tiers.host.capacity", "tenants[0].name"), for messages.
  std::map<std::string, std::string> key_source;

  // The NVMe directories in effect.
  std::vector<std::string> NvmeDirs() const;
  // Where the data and admin sockets live.
  std::string DataSocketPath() const;
  std::string AdminSocketPath() const;
};

// The embedded defaults: one tenant "default" admitting this process's uid.
Config DefaultConfig();

// Parses TOML text over the defaults and validates. `origin` names the source
// in messages. A file that parses as TOML gets every error it holds in one
// message ("; " between them), each as origin:line.
absl::StatusOr<Config> ParseConfig(std::string_view toml_text, std::string_view origin);

// Reads and parses a file; NotFound when it does not exist.
absl::StatusOr<Config> LoadConfigFile(const std::string& path);

// Cross-field checks (tenants, hash choice, sizes). Reports every problem,
// each with the file and line of its key where key_source knows them.
absl::Status ValidateConfig(const Config& c);
// A tenant name is 1..64 of [A-Za-z0-9_.-]: it becomes part of remote keys,
// ACL key patterns, metric labels and log lines.
bool TenantNameIsSafe(std::string_view name);

// A commented TOML file with every key at its default.
std::string DefaultConfigToml();

}  // namespace kvtier

#endif  // KVTIER_DAEMON_CONFIG_H_
