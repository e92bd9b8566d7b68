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
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "store/shared_writes.h"
#include "kvtier/types.h"
#include "policies/eviction_policy.h"
#include "tiers/fs/fs_settings.h"
#include "tiers/remote_defaults.h"

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
  // [tiers.nvme]
  std::vector<std::string> nvme_dirs;    // empty: <data_dir>/nvme
  uint64_t nvme_capacity = 2ull << 30;   // 0: no NVMe tier
  bool nvme_capacity_explicit = false;   // set in a file (a default may shrink to fit)
  uint64_t nvme_segment_bytes = 256ull << 20;
  uint32_t nvme_queue_depth = 32;
  uint32_t nvme_io_workers = 1;
  std::string nvme_io_engine = "auto";
  bool nvme_allow_buffered = false;
  uint64_t nvme_staging_bytes = 64ull << 20;
  bool nvme_write_through = false;
  std::string nvme_policy = "lru";
  // Admission by evidence of reuse (policies/reuse_gate.h): a block goes to
  // the tier only once leased lookups asked for it this many times; 1: all.
  uint32_t nvme_admission_min_uses = 1;
  // [tiers.remote]: a shared Redis Cluster below NVMe (none without seeds).
  std::vector<std::string> remote_seeds;
  // Defaults: the tier's own (tiers/remote_defaults.h).
  std::string remote_key_prefix = remote_defaults::kKeyPrefix;
  uint64_t remote_capacity = remote_defaults::kCapacityBytes;  // handles on what this daemon wrote there
  uint32_t remote_op_timeout_ms = remote_defaults::kOpTimeoutMs;
  uint32_t remote_connect_timeout_ms = remote_defaults::kConnectTimeoutMs;
  uint32_t remote_io_timeout_ms = remote_defaults::kIoTimeoutMs;
  uint32_t remote_probe_budget_us = 2000;
  uint32_t remote_probe_max_blocks = 256;
  // Fair shares of the cluster among tenants (docs/remote-tier.md).
  uint32_t remote_probe_blocks_per_s = 50000;   // per tenant: blocks its lookups may ask about
  uint32_t remote_records_per_tenant = 262144;  // per tenant: cluster blocks this node indexes
  uint64_t remote_min_block_bytes = 4096;       // smaller blocks never go to the cluster
  uint64_t remote_tenant_budget = 0;            // per tenant: bytes its blocks may take there (0: none)
  std::string remote_write_policy = "demoted";
  uint32_t remote_admission_min_uses = 1;  // as nvme_admission_min_uses, for every write to the shared tier
  bool remote_encrypt = false;  // encrypt payloads at rest in the cluster (always sealed)
  // TLS to the cluster's nodes: their certificates chain to the CA file and
  // name the node (or tls_server_name); a client certificate when given.
  bool remote_tls = false;
  std::string remote_tls_ca_file, remote_tls_cert_file, remote_tls_key_file, remote_tls_server_name;
  // [tiers.fs]: a directory several nodes mount (none without dir); the
  // tier's own settings struct, defaults and all (tiers/fs/fs_settings.h).
  FsTierSettings fs;
  // [[tiers.lower]]: the lower tiers' kinds in chain order ("nvme", "redis",
  // "fs"), each entry's options read as its kind's section. Empty (no
  // [[tiers.lower]] in the file): [tiers.nvme] when its capacity is not 0,
  // then [tiers.remote] when it has seeds, then [tiers.fs] when it has a dir.
  std::vector<std::string> lower_chain;
  // The chain in effect: lower_chain, or the sections' order as above.
  std::vector<std::string> LowerChain() const;
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
