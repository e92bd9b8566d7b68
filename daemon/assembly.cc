// SPDX-License-Identifier: Apache-2.0
#include "daemon/assembly.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <linux/magic.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/fmt_absl.h"
#include "core/units.h"
#include "spdlog/spdlog.h"

namespace kvtier {

absl::StatusOr<CostTracker::Options> CostOptionsFrom(const Config& c) {
  CostTracker::Options cost;
  if (!c.cost_model_config.empty()) {
    absl::StatusOr<ModelProfile> m = ModelProfile::FromHfConfigFile(c.cost_model_config);
    if (!m.ok()) {
      return absl::Status(m.status().code(), absl::StrCat("cost_model.model_config: ", m.status().message()));
    }
    cost.model = *std::move(m);
  }
  cost.prior_flops_per_s = c.cost_prefill_tflops * 1e12;
  cost.nvme_prior = TierSpeed{c.cost_nvme_read_gbps * 1e9, c.cost_nvme_read_latency_us * 1e-6};
  cost.decide = c.cost_decide;
  return cost;
}

namespace {

// A secret's file: ours, not readable by others, small, not empty.
absl::StatusOr<std::string> ReadSecretText(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is not set"));
  // O_NONBLOCK: a FIFO named here must not hang the start (fstat refuses it next).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(absl::StrCat(what, ": ", path, " is a symbolic link; name the file itself"));
    }
    return absl::NotFoundError(absl::StrCat(what, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string text(4097, '\0');
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0) {
    n = read(fd, text.data(), text.size());
  }
  close(fd);
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": ", path, " must be a regular file of kvtierd's user with "
                                                    "mode 0600 or stricter (chown, then chmod 600)"));
  }
  if (n < 0 || n > 4096) return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is unreadable or over 4 KiB"));
  text.resize(static_cast<size_t>(n));
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is empty"));
  }
  return text;
}

// Its first line.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  ASSIGN_OR_RETURN(std::string text, ReadSecretText(path, what));
  if (const size_t nl = text.find_first_of("\r\n"); nl != std::string::npos) text.resize(nl);
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, "'s first line is empty"));
  return text;
}

}  // namespace

absl::StatusOr<std::vector<RemoteTenant>> RemoteTenantsFrom(const Config& c) {
  std::vector<RemoteTenant> out;
  for (const TenantConfig& t : c.tenants) {
    const std::string who = absl::StrCat("tenant \"", t.name, "\"'s ");
    ASSIGN_OR_RETURN(std::string password, ReadSecretFile(t.remote_password_file, who + "remote_password_file"));
    ASSIGN_OR_RETURN(std::string key_text, ReadSecretText(t.remote_key_file, who + "remote_key_file"));
    absl::StatusOr<std::vector<SealKey>> keys = ParseSealKeys(key_text);
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "remote_key_file ", t.remote_key_file, ": ", keys.status().message()));
    }
    // The key must be worth more than the password: one who has the password
    // (the cluster's admin, a node's config) must not have the key too.
    if (absl::StatusOr<SealKey> as_key = ParseSealKey(password); as_key.ok()) {
      for (const SealKey& k : *keys) {
        if (k.id == as_key->id) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, "remote_key_file holds its remote password: the key must be a secret of its own (openssl rand -hex 32)"));
        }
      }
    }
    for (const RemoteTenant& other : out) {
      for (const SealKey& k : *keys) {
        for (const SealKey& o : other.keys) {
          if (k.id == o.id) {
            return absl::InvalidArgumentError(absl::StrCat(who, "remote_key_file holds a key of tenant \"", other.name,
                                                           "\": each tenant needs its own (openssl rand -hex 32)"));
          }
        }
      }
    }
    out.push_back({t.name, t.remote_user, std::move(password), *std::move(keys), t.remote_seeds,
                   t.remote_budget != 0 ? t.remote_budget : c.remote.tenant_budget});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RemoteTier>> OpenRemoteFrom(const Config& c, std::string_view name) {
  if (c.remote.seeds.empty()) {
    spdlog::info("event=remote_tier state=off detail=\"tiers.remote.seeds is empty\"");
    return nullptr;
  }
  RemoteTierOptions o;
  o.name = std::string(name);
  o.seeds = c.remote.seeds;
  o.key_prefix = c.remote.key_prefix;
  o.capacity_bytes = c.remote.capacity_bytes;
  o.op_timeout_ms = c.remote.op_timeout_ms;
  o.connect_timeout_ms = c.remote.connect_timeout_ms;
  o.io_timeout_ms = c.remote.io_timeout_ms;
  o.encrypt = c.remote.encrypt;
  o.tls = {.enabled = c.remote.tls,
           .ca_file = c.remote.tls_ca_file,
           .cert_file = c.remote.tls_cert_file,
           .key_file = c.remote.tls_key_file,
           .server_name = c.remote.tls_server_name};
  if (c.remote.tls && !c.remote.tls_key_file.empty()) {
    // The client key is a secret like the password: same file rules.
    RETURN_IF_ERROR(ReadSecretText(c.remote.tls_key_file, "tiers.remote.tls_key_file").status());
  }
  o.on_auth_failure = [](const std::string& tenant, const std::string& why) {
    spdlog::error("event=remote_auth_failed tenant=\"{}\" detail=\"{}\" hint=\"check this tenant's remote_user and "
                  "remote_password_file against the cluster's ACL (ACL LIST); its blocks are not read or written "
                  "there until AUTH succeeds\"",
                  LogQuoted(tenant), LogQuoted(why));
  };
  o.on_ledger_failure = [](const std::string& tenant, const std::string& why) {
    spdlog::error("event=remote_budget_failed tenant=\"{}\" detail=\"{}\" hint=\"the tenant's writes to the cluster "
                  "fail until its budget ledger works: the cluster needs kvtier's ledger library loaded (kvtierd --print-ledger-function) and its ACL user +fcall +zadd +zscore +zpopmin +hmget +hset "
                  "on its own keys (docs/remote-tier.md), and the node memory for the ledger\"",
                  LogQuoted(tenant), LogQuoted(why));
  };
  ASSIGN_OR_RETURN(o.tenants, RemoteTenantsFrom(c));
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteTier> tier, RemoteTier::Create(o));
  spdlog::info("event=remote_tier state=on seeds={} tenants={} health={} payloads={} tls={} detail=\"a Redis Cluster "
               "below NVMe; every value sealed with its tenant's key; misses there cost a recompute, never a wrong "
               "block\"",
               c.remote.seeds.size(), c.tenants.size(), TierHealthName(tier->Health()),
               c.remote.encrypt ? "encrypted" : "clear", c.remote.tls ? "on" : "off");
  size_t sharing = 0, unbudgeted = 0;
  for (const RemoteTenant& t : o.tenants) {
    if (!t.seeds.empty()) continue;
    ++sharing;
    if (t.budget_bytes == 0) ++unbudgeted;
  }
  if (sharing >= 2 && unbudgeted > 0) {
    spdlog::warn("event=remote_tier_unbudgeted tenants_sharing={} without_budget={} detail=\"tenants share one "
                 "cluster and some have no budget: the cluster's maxmemory policy evicts across every tenant's "
                 "keys, so one tenant's writes can push out the others' blocks\" hint=\"set tiers.remote.tenant_budget "
                 "(or [[tenants]] remote_budget) so the budgets add up to less than the cluster's memory "
                 "(docs/remote-tier.md)\"",
                 sharing, unbudgeted);
  }
  if (!c.remote.tls) {
    spdlog::warn("event=remote_tier_clear_text detail=\"tiers.remote.tls is off: passwords and blocks cross the "
                 "network in clear, and a process that takes a node's port gets every tenant's AUTH\" hint=\"set "
                 "tiers.remote.tls = true with tls_ca_file (docs/remote-tier.md)\"");
  }
  return tier;
}

absl::StatusOr<OpenedNvme> OpenNvmeFrom(const Config& c, std::string_view name) {
  if (c.nvme.capacity_bytes == 0) {
    spdlog::info("event=nvme_tier state=off detail=\"tiers.nvme.capacity = 0\"");
    return OpenedNvme{};
  }
  const std::vector<std::string> dirs = c.NvmeDirs();
  uint64_t capacity = c.nvme.capacity_bytes;
  if (!c.nvme.capacity_explicit) {
    // The default must not fail a start on a small disk: take at most half of
    // what is free (counting slab files already ours), or go without.
    uint64_t available = UINT64_MAX, existing = UINT64_MAX;
    for (const std::string& d : dirs) {
      std::error_code ec;
      std::filesystem::create_directories(d, ec);
      const auto space = std::filesystem::space(d, ec);
      if (ec) continue;
      const uint64_t ours = std::filesystem::file_size(d + "/kvtier-slab.kvt", ec);
      available = std::min<uint64_t>(available, (space.available + (ec ? 0 : ours)) / 2 * dirs.size());
      existing = std::min<uint64_t>(existing, ec ? 0 : ours * dirs.size());
    }
    // Slab files already there keep their size: a disk that filled up since
    // must not shrink the tier (and drop its blocks) at the next start.
    if (existing != UINT64_MAX) available = std::max(available, std::min(existing, capacity));
    if (available < capacity) {
      capacity = available / (c.nvme.segment_bytes * dirs.size()) * c.nvme.segment_bytes * dirs.size();
      spdlog::warn("event=nvme_tier detail=\"only {} free for the default NVMe tier; using {}\" hint=\"set "
                   "tiers.nvme.capacity explicitly to choose\"",
                   FormatBytes(available), FormatBytes(capacity));
      if (capacity == 0) return OpenedNvme{};
    }
  }
  // A RAM-backed file system accepts O_DIRECT on recent kernels, so the tier
  // opens there: say what it costs.
  for (const std::string& d : dirs) {
    struct statfs fs {};
    if (statfs(d.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
      spdlog::warn("event=nvme_on_tmpfs dir=\"{}\" detail=\"this NVMe directory is in RAM ({}): the tier takes "
                   "memory, not disk, and its blocks do not survive a reboot\" hint=\"point tiers.nvme.dirs at a "
                   "directory on the NVMe device\"",
                   LogQuoted(d), fs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
    }
  }
  NvmeTierOptions o;
  static_cast<NvmeTierSettings&>(o) = c.nvme;  // the tier's own keys, as set
  o.name = std::string(name);
  o.dirs = dirs;                               // resolved: <data_dir>/nvme when none
  o.capacity_bytes = capacity;                 // resolved: a default shrinks to fit
  uint64_t last_report = 0;
  o.progress = [&last_report](uint64_t done, uint64_t total) {
    const uint64_t now = MonotonicNanos();
    if (done == total || now - last_report > 1'000'000'000) {
      last_report = now;
      spdlog::info("event=nvme_recovery checked={} of={}", done, total);
    }
  };
  OpenedNvme opened;
  opened.requested_bytes = capacity;
  absl::StatusOr<std::unique_ptr<NvmeTier>> nvme = NvmeTier::Open(o, &opened.recovered);
  if (!nvme.ok()) {
    return absl::Status(nvme.status().code(), absl::StrCat("opening the NVMe tier: ", nvme.status().message()));
  }
  opened.tier = std::move(*nvme);
  const NvmeStats st = opened.tier->Stats();
  if (!st.io_engine_reason.empty()) {
    spdlog::warn("event=nvme_io_engine engine={} detail=\"{}\"", st.io_engine, LogQuoted(st.io_engine_reason));
  }
  if (st.buffered) {
    spdlog::warn("event=nvme_buffered detail=\"O_DIRECT refused; buffered I/O as tiers.nvme.allow_buffered permits\"");
  }
  return opened;
}

void LogNvmeOpened(const Config& c, uint64_t requested_bytes, uint64_t recovered, const NvmeStats& st,
                   uint64_t indexed) {
  if (st.recovery.read_only_full) {
    spdlog::error("event=nvme_read_only dirs=\"{}\" detail=\"the NVMe tier's file system has no room for its "
                  "journal: the tier serves the blocks it holds but stores nothing new (new blocks stay in host "
                  "memory)\" hint=\"free space on that file system, then restart kvtierd\"",
                  LogQuoted(absl::StrJoin(c.NvmeDirs(), ",")));
  }
  if (st.recovery.resized_from_segments != 0) {
    spdlog::warn("event=nvme_resized segments_before={} blocks_dropped={} detail=\"tiers.nvme.capacity changed: "
                 "blocks in the segments both sizes have were kept, the slab files were resized to the new "
                 "capacity\"",
                 st.recovery.resized_from_segments, st.recovery.dropped_by_resize);
  }
  if (st.recovery.journal_records_cut > 0 || st.recovery.journal_records_damaged > 0) {
    // Blocks may have been lost: say what was cut and what the slab proved.
    spdlog::warn("event=nvme_journal_damaged records_cut={} bytes_cut={} records_damaged={} format_damaged={} "
                 "scanned={} slots_checked={} recovered_by_scan={} dropped={} detail=\"{}\"",
                 st.recovery.journal_records_cut, st.recovery.journal_bytes_cut,
                 st.recovery.journal_records_damaged, st.recovery.journal_format_damaged, st.recovery.scanned,
                 st.recovery.scan_checked, st.recovery.scan_recovered, st.recovery.dropped,
                 LogQuoted(st.recovery.scanned ? "damaged records inside the journal: kept the blocks whose slab header and "
                                       "payload checksums prove them, and rewrote the journal"
                                     : "the journal's torn tail (a crash mid-commit) was cut"));
  }
  if (st.capacity_bytes < requested_bytes) {
    // The tier is whole segments per directory: say so, instead of logging
    // the configured figure as the tier's size.
    spdlog::warn("event=nvme_capacity_rounded configured=\"{}\" capacity=\"{}\" segment_bytes=\"{}\" dirs={} "
                 "detail=\"the NVMe tier holds whole segments in each directory\" hint=\"set tiers.nvme.capacity to "
                 "a multiple of {} to use all of it\"",
                 FormatBytes(requested_bytes), FormatBytes(st.capacity_bytes), FormatBytes(c.nvme.segment_bytes),
                 c.NvmeDirs().size(), FormatBytes(c.nvme.segment_bytes * c.NvmeDirs().size()));
  }
  spdlog::info("event=nvme_tier state=on dirs={} capacity=\"{}\" engine=\"{}\" recovered={} dropped={} "
               "journal_bytes_cut={} seconds={:.3f}",
               c.NvmeDirs().size(), FormatBytes(st.capacity_bytes), LogQuoted(st.io_engine), indexed,
               st.recovery.dropped + (recovered - indexed), st.recovery.journal_bytes_cut,
               st.recovery.seconds);
}

}  // namespace kvtier
