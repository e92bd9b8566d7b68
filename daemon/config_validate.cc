// SPDX-License-Identifier: Apache-2.0
// Config validation: what ParseConfig's types cannot say (names, ranges
// that depend on other keys, the tenants' uids and gids, the remote tier's
// credentials). config.cc parses and prints.
#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/units.h"
#include "tiers/remote_tier.h"
#include "core/block_key.h"
#include "core/fmt_absl.h"
#include "daemon/config.h"
#include "daemon/config_text.h"
#include "daemon/lower_kinds.h"
#include "store/shared_writes.h"
#include "fmt/format.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

using config_text::Cat;

// [tiers.remote], when it has seeds: each a host:port, and every tenant with
// its own ACL user and a password file (the server keeps tenants apart).
template <typename Fail>
void ValidateRemote(const Config& c, Fail& fail) {
  if (!SharedWritesNamed(c.remote.write_policy)) {
    fail("tiers.remote.write_policy", Cat("tiers.remote.write_policy: \"", c.remote.write_policy.substr(0, 40),
                                          "\" is not one of demoted, reused, committed"));
  }
  if (c.remote.seeds.empty()) {
    for (size_t i = 0; i < c.tenants.size(); ++i) {
      if (!c.tenants[i].remote_user.empty() || !c.tenants[i].remote_password_file.empty() ||
          !c.tenants[i].remote_key_file.empty() || !c.tenants[i].remote_seeds.empty() ||
          c.tenants[i].remote_budget != 0) {
        fail(Cat("tenants[", i, "].remote_user"),
             Cat("tenant \"", c.tenants[i].name, "\" has remote credentials but tiers.remote.seeds is empty"));
      }
    }
    return;
  }
  auto check_seeds = [&](const std::vector<std::string>& seeds, const std::string& key) {
    for (const std::string& seed : seeds) {
      const size_t colon = seed.rfind(':');
      uint64_t port = 0;
      if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(seed.substr(colon + 1), &port) || port == 0 ||
          port > 65535) {
        fail(key, Cat(key, ": \"", seed.substr(0, 80), "\" is not host:port"));
      }
    }
  };
  check_seeds(c.remote.seeds, "tiers.remote.seeds");
  // A budget under one block of min_block_bytes refuses every write.
  const uint64_t least = std::max<uint64_t>(c.remote.min_block_bytes, 1) + sizeof(RemoteValueHeader) + kLedgerEntryBytes;
  auto check_budget = [&](uint64_t budget, const std::string& key) {
    if (budget != 0 && budget < least) {
      fail(key, Cat(key, " = ", budget, " is smaller than one block of tiers.remote.min_block_bytes (", least,
                    " bytes with its header and ledger entry): every write would be refused"));
    }
  };
  check_budget(c.remote.tenant_budget, "tiers.remote.tenant_budget");
  for (size_t i = 0; i < c.tenants.size(); ++i) check_budget(c.tenants[i].remote_budget, Cat("tenants[", i, "].remote_budget"));
  for (size_t i = 0; i < c.tenants.size(); ++i) check_seeds(c.tenants[i].remote_seeds, Cat("tenants[", i, "].remote_seeds"));
  if (c.remote.key_prefix.empty() || c.remote.key_prefix.find_first_of(":{} \t\r\n") != std::string::npos) {
    fail("tiers.remote.key_prefix", "tiers.remote.key_prefix must be a non-empty word (no ':', '{', '}' or spaces)");
  }
  if (c.remote.tls && c.remote.tls_ca_file.empty()) {
    fail("tiers.remote.tls", "tiers.remote.tls needs tls_ca_file: the CA the nodes' certificates chain to");
  }
  if (c.remote.tls_cert_file.empty() != c.remote.tls_key_file.empty()) {
    fail("tiers.remote.tls_cert_file", "tiers.remote.tls_cert_file and tls_key_file go together");
  }
  if (!c.remote.tls && !(c.remote.tls_ca_file.empty() && c.remote.tls_cert_file.empty())) {
    fail("tiers.remote.tls", "tiers.remote has TLS files but tls = false: set tls = true, or remove them");
  }
  for (size_t i = 0; i < c.tenants.size(); ++i) {
    const TenantConfig& t = c.tenants[i];
    if (t.remote_user.empty() || t.remote_password_file.empty() || t.remote_key_file.empty()) {
      fail(Cat("tenants[", i, "]"), Cat("tenant \"", t.name, "\" needs remote_user, remote_password_file and "
                                        "remote_key_file: with tiers.remote.seeds each tenant reads and writes the "
                                        "cluster as its own ACL user and seals its values with its own key "
                                        "(docs/remote-tier.md)"));
    }
  }
}

// Two directories as one tier would see them: the same once "." and ".."
// and repeated or trailing slashes go, or one inside the other. Lexical
// only: validation runs on the control loop at SIGHUP, and a hung mount
// must not stall it (a symbolic link or bind mount between two is not seen).
bool DirsOverlap(const std::string& a, const std::string& b) {
  auto norm = [](const std::string& d) {
    std::string s = std::filesystem::path(d).lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  };
  const std::string x = norm(a), y = norm(b);
  auto inside = [](const std::string& in, const std::string& dir) {
    return in.size() > dir.size() && in.compare(0, dir.size(), dir) == 0 && (dir == "/" || in[dir.size()] == '/');
  };
  return x == y || inside(x, y) || inside(y, x);
}

// The lower tiers' chain: the shared tiers after every local one (blocks
// move down from local tiers to shared ones, never back); no two tiers of a
// kind over one directory (LowerTierKind::distinct_dir_key); each entry's
// kind's own musts, a later entry of a kind checked on its own options.
template <typename Fail>
void ValidateChain(const Config& c, Fail& fail) {
  const std::vector<Config::LowerEntry> chain = c.LowerChain();
  std::vector<std::string> names;
  std::vector<Config> options;  // each entry's
  for (const Config::LowerEntry& e : chain) {
    names.push_back(e.name);
    options.push_back(c.OptionsOf(e));
  }
  std::optional<size_t> first_shared;
  for (size_t i = 0; i < chain.size(); ++i) {
    const LowerTierKind* k = FindLowerTierKind(chain[i].kind);
    if (k == nullptr) continue;
    if (k->shared) {
      if (!first_shared) first_shared = i;
    } else if (first_shared) {
      fail(Cat("tiers.lower[", i, "].kind"),
           Cat("the local tier \"", chain[i].name, "\" comes after the shared tier \"", chain[*first_shared].name,
               "\" (", absl::StrJoin(names, " -> "), "): blocks move down from local tiers to shared ones, so "
               "shared tiers end the chain"));
    }
    if (k->distinct_dir_key.empty()) continue;
    for (const ConfigKey& key : k->keys) {
      if (key.name != k->distinct_dir_key) continue;
      const std::string& dir = std::get<ConfigRef<std::string>>(key.field).at(options[i]);
      for (size_t j = 0; j < i; ++j) {
        const std::string& other = std::get<ConfigRef<std::string>>(key.field).at(options[j]);
        if (chain[j].kind == chain[i].kind && !dir.empty() && !other.empty() && DirsOverlap(dir, other)) {
          fail(Cat("tiers.lower[", i, "].kind"),
               Cat("the tiers \"", chain[j].name, "\" and \"", chain[i].name, "\" have one ", key.name, " (\"",
                   other.substr(0, 200), "\", \"", dir.substr(0, 200), "\": the same, or one inside the other): "
                   "each tier of kind \"", chain[i].kind, "\" needs a directory of its own, or its capacity scan "
                   "deletes the other's files"));
        }
      }
    }
  }
  // Each kind in the chain checks its own; a later entry of a kind, its own
  // options, each message led by where that entry set the key (or where
  // the entry starts).
  for (size_t i = 0; i < chain.size(); ++i) {
    const Config::LowerEntry& e = chain[i];
    const LowerTierKind* k = FindLowerTierKind(e.kind);
    if (k == nullptr || k->validate == nullptr) continue;
    if (!e.own) {
      k->validate(c, fail);
      continue;
    }
    const Config& own = options[i];
    k->validate(own, [&](std::string_view key, std::string message) {
      std::string where;
      if (auto it = own.key_source.find(std::string(key)); it != own.key_source.end()) {
        where = Cat(it->second, ": ");
      } else if (auto at = c.key_source.find(Cat("tiers.lower[", i, "].kind")); at != c.key_source.end()) {
        where = Cat(at->second, ": ");
      }
      fail("", Cat(where, "the tier \"", e.name, "\": ", message));
    });
  }
}

}  // namespace

bool TenantNameIsSafe(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') return false;
  }
  return true;
}

absl::Status ValidateConfig(const Config& c) {
  std::vector<std::string> errors;
  // A message about `key`, led by the file and line it was read from.
  auto fail = [&](std::string_view key, std::string message) {
    auto it = c.key_source.find(std::string(key));
    errors.push_back(it == c.key_source.end() ? std::move(message) : Cat(it->second, ": ", message));
  };
  if (c.run_dir.empty()) fail("daemon.run_dir", "daemon.run_dir must not be empty");
  if (c.data_dir.empty()) fail("daemon.data_dir", "daemon.data_dir must not be empty");
  static const absl::flat_hash_set<std::string> kLevels = {"trace", "debug", "info", "warn",
                                                           "error", "critical", "off"};
  if (!kLevels.contains(c.log_level)) {
    fail("daemon.log_level", Cat("daemon.log_level = \"", c.log_level,
                                 "\"; use one of trace, debug, info, warn, error, critical, off"));
  }
  if (c.device != "auto" && c.device != "cuda" && c.device != "sim") {
    fail("daemon.device", Cat("daemon.device = \"", c.device, "\"; use \"auto\", \"cuda\" or \"sim\""));
  }
  if (c.tenants.empty()) fail("", "no tenants configured");
  ValidateChain(c, fail);
  if (c.hash == HashAlgorithm::kXxh3_128 && c.tenants.size() > 1) {
    fail("daemon.hash", Cat("daemon.hash = \"xxh3-128\" is only for a single trusted tenant, and this config has ",
                            c.tenants.size(), " tenants: keys that collide would hand one tenant's K/V to another; "
                            "use hash = \"sha256\""));
  }
  if (c.events_block_hash != "int64" && c.events_block_hash != "bytes") {
    fail("events.block_hash", Cat("events.block_hash = \"", c.events_block_hash, "\"; use \"int64\" or \"bytes\""));
  }
  if (c.events_enabled) {
    size_t publishing = 0;
    for (const TenantConfig& t : c.tenants) {
      if (c.events_tenants.empty() ||
          std::find(c.events_tenants.begin(), c.events_tenants.end(), t.name) != c.events_tenants.end()) {
        ++publishing;
      }
    }
    for (const std::string& name : c.events_tenants) {
      if (std::none_of(c.tenants.begin(), c.tenants.end(), [&](const TenantConfig& t) { return t.name == name; })) {
        fail("events.tenants", Cat("events.tenants names \"", name, "\", which is no [[tenants]] entry"));
      }
    }
    // Events say which prefixes a tenant holds: one endpoint per tenant.
    for (const auto& [key, ep] : {std::pair<std::string_view, const std::string*>{"events.endpoint", &c.events_endpoint},
                                  {"events.replay_endpoint", &c.events_replay_endpoint}}) {
      if (ep->empty() || *ep == "off" || publishing < 2 || ep->find("{tenant}") != std::string::npos) continue;
      fail(key, Cat(key, " = \"", *ep, "\" is one endpoint for ", publishing,
                    " publishing tenants: put {tenant} in it (each tenant's events go to its own endpoint), or list "
                    "one tenant in events.tenants"));
    }
    for (const auto& [key, ep] : {std::pair<std::string_view, const std::string*>{"events.endpoint", &c.events_endpoint},
                                  {"events.replay_endpoint", &c.events_replay_endpoint}}) {
      if (ep->empty() || *ep == "off") continue;
      if (!absl::StartsWith(*ep, "ipc:///") && !absl::StartsWith(*ep, "tcp://")) {
        // ipc://@name would be an abstract socket: no file, so no permissions.
        fail(key, Cat(key, " = \"", *ep, "\"; use ipc:///ABSOLUTE/PATH or tcp://ADDRESS:PORT"));
      }
    }
    // Every publishing tenant's endpoints, expanded, are its own.
    absl::flat_hash_set<std::string> seen;
    for (const TenantConfig& t : c.tenants) {
      if (!c.events_tenants.empty() &&
          std::find(c.events_tenants.begin(), c.events_tenants.end(), t.name) == c.events_tenants.end()) {
        continue;
      }
      for (const auto& [key, pattern, fallback] :
           {std::tuple<std::string_view, const std::string*, std::string>{"events.endpoint", &c.events_endpoint,
                                                                          "ipc:///kvtier-events-{tenant}.sock"},
            {"events.replay_endpoint", &c.events_replay_endpoint, "ipc:///kvtier-replay-{tenant}.sock"}}) {
        if (*pattern == "off") continue;
        const std::string p = pattern->empty() ? fallback : *pattern;
        if (p.find("{tenant}") != std::string::npos && (t.name == "." || t.name == "..")) {
          fail(key, Cat(key, ": tenant \"", t.name, "\" cannot name a file; rename the tenant"));
        }
        const std::string expanded = absl::StrReplaceAll(p, {{"{tenant}", t.name}});
        if (absl::StartsWith(expanded, "ipc:///") && expanded.size() - 6 > 107) {
          fail(key, Cat(key, " gives tenant \"", t.name, "\" a socket path of ", expanded.size() - 6,
                        " characters; a Unix socket path has at most 107"));
        }
        if (expanded == "ipc://" + c.DataSocketPath() || expanded == "ipc://" + c.AdminSocketPath()) {
          fail(key, Cat(key, " gives tenant \"", t.name, "\" kvtierd's own socket ", expanded.substr(6)));
        }
        if (!seen.insert(expanded).second) {
          fail(key, Cat(key, " gives tenant \"", t.name, "\" the endpoint ", expanded,
                        ", which another socket has; each tenant's event and replay sockets are its own"));
        }
      }
    }
    if (c.events_publisher_memory < (256ull << 20)) {
      fail("events.publisher_memory", "events.publisher_memory must be at least 256MiB (an idle publisher reserves "
                                      "about 64 MiB of address space)");
    } else if (c.events_buffer_bytes > c.events_publisher_memory / 2) {
      fail("events.buffer_bytes", "events.buffer_bytes must be at most half of events.publisher_memory");
    }
  }
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<uid_t> uids;
  absl::flat_hash_set<gid_t> gids;
  for (size_t i = 0; i < c.tenants.size(); ++i) {
    const TenantConfig& t = c.tenants[i];
    const std::string at = Cat("tenants[", i, "]");
    if (t.name.empty() || t.name.size() > 64) {
      fail(at, "every [[tenants]] entry needs a name of 1..64 characters");
    } else if (!TenantNameIsSafe(t.name)) {
      // A name becomes part of keys, ACL patterns ("~kvtier:al*:*" would be
      // every tenant whose name starts "al"), metric labels and logs.
      fail(at + ".name", Cat("tenant name \"", absl::CHexEscape(t.name.substr(0, 64)),
                             "\" may hold only letters, digits, '_', '-' and '.' (no glob, separator or space)"));
    } else if (!names.insert(t.name).second) {
      fail(at + ".name", Cat("tenant \"", t.name, "\" is defined twice"));
    }
    if (t.uids.empty() && t.gids.empty()) fail(at, Cat("tenant \"", t.name, "\" admits nobody: give it uids or gids"));
    for (uid_t u : t.uids) {
      if (!uids.insert(u).second) fail(at + ".uids", Cat("uid ", u, " belongs to two tenants"));
    }
    for (gid_t g : t.gids) {
      if (!gids.insert(g).second) fail(at + ".gids", Cat("gid ", g, " belongs to two tenants"));
    }
    // (A tenant without host_bytes takes tiers.host.capacity, checked below.)
    if (t.host_bytes != 0 && t.host_bytes < (1u << 20)) {
      fail(at + ".host_bytes", Cat("tenant \"", t.name, "\" host arena of ", FormatBytes(t.host_bytes),
                                   " is below the 1 MiB minimum"));
    }
  }
  if (c.host_capacity < (1u << 20)) {
    fail("tiers.host.capacity",
         Cat("tiers.host.capacity = ", FormatBytes(c.host_capacity), " is below the 1 MiB minimum"));
  }
  if (auto p = MakeEvictionPolicy(c.nvme.policy); !p.ok()) {
    fail("tiers.nvme.policy", Cat("tiers.nvme.policy: ", p.status().message()));
  } else if (IsHostOnlyPolicy(c.nvme.policy)) {
    fail("tiers.nvme.policy", Cat("tiers.nvme.policy = \"", c.nvme.policy,
                                  "\" is host-only (it learns from host lookups); use lru, s3fifo, s3fifo-deep, "
                                  "tinylfu or arc"));
  }
  if (c.host_low_watermark > c.host_high_watermark) {
    fail("tiers.host.low_watermark", Cat("tiers.host.low_watermark = ", c.host_low_watermark,
                                         " is above tiers.host.high_watermark = ", c.host_high_watermark,
                                         "; background reclaim frees down to the low mark"));
  }
  if (auto p = MakeEvictionPolicy(c.host_policy); !p.ok()) {
    fail("tiers.host.policy", Cat("tiers.host.policy: ", p.status().message()));
  }
  if (c.scratch_bytes < (64u << 10) || c.scratch_bytes > (1ull << 30)) {
    fail("ipc.scratch_bytes", "ipc.scratch_bytes must be 64KiB..1GiB");
  }
  if (c.nvme.capacity_bytes > 0) {
    if (c.nvme.segment_bytes < (1u << 20) || c.nvme.segment_bytes % 4096 != 0 || c.nvme.segment_bytes > (4ull << 30)) {
      fail("tiers.nvme.segment_bytes", "tiers.nvme.segment_bytes must be a multiple of 4 KiB in 1MiB..4GiB");
    }
    if (c.nvme.io_engine != "auto" && c.nvme.io_engine != "io_uring" && c.nvme.io_engine != "threads") {
      fail("tiers.nvme.io_engine", Cat("tiers.nvme.io_engine = \"", c.nvme.io_engine,
                                       "\"; use \"auto\", \"io_uring\" or \"threads\""));
    }
    if (c.nvme.staging_bytes < (4u << 20)) {
      fail("tiers.nvme.staging_bytes", "tiers.nvme.staging_bytes must be at least 4MiB");
    }
  }
  ValidateRemote(c, fail);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}


}  // namespace kvtier
