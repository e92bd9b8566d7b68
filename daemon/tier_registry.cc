// SPDX-License-Identifier: Apache-2.0
#include "daemon/tier_registry.h"

#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/fmt_absl.h"
#include "core/status.h"
#include "core/units.h"
#include "daemon/assembly.h"
#include "spdlog/spdlog.h"
#include "tiers/lower_kind_openers.h"  // generated: the kinds in folders of their own

namespace kvtier {
namespace {

// The shared tier as each tenant's connections see it, summed: a node is
// connected when every tenant's connection to it is.
RemoteStatus RemoteStatusOf(const RemoteTier& tier, const Config& config) {
  RemoteStatus r{.write_policy = config.remote.write_policy,
                 .probe_budget_us = config.remote.probe_budget_us,
                 .misses = tier.misses(),
                 .budget = tier.budget(),
                 .slots_covered = RedisCluster::kSlots};
  absl::flat_hash_map<std::string, size_t> node_at;
  size_t counted = 0;
  for (const TenantConfig& t : config.tenants) {
    const RedisCluster::Stats c = tier.ClusterStats(t.name);
    r.auth_failures += c.auth_failures;
    // A tenant whose user the cluster refuses (a wrong password, a revoked
    // user) has no slot map and no connection: counted apart, so the tier
    // does not read as down for the tenants it serves.
    if (c.auth_failures > 0 && c.slots_covered == 0) {
      ++r.tenants_refused;
      continue;
    }
    ++counted;
    r.slots_covered = std::min(r.slots_covered, c.slots_covered);
    r.moved += c.moved;
    r.ask += c.ask;
    r.tryagain += c.tryagain;
    r.clusterdown += c.clusterdown;
    r.refreshes += c.refreshes;
    r.refresh_failures += c.refresh_failures;
    for (const RedisCluster::NodeStats& n : c.nodes) {
      auto [it, added] = node_at.emplace(n.address, r.nodes.size());
      if (added) r.nodes.push_back({.address = n.address, .connected = true});
      RemoteStatus::Node& out = r.nodes[it->second];
      out.connected = out.connected && n.connected;
      out.slots = std::max(out.slots, n.slots);
      out.commands += n.commands;
      out.errors += n.errors;
      out.connects += n.connects;
    }
  }
  if (counted == 0) r.slots_covered = 0;
  return r;
}


absl::StatusOr<OpenedLowerTier> OpenNvmeKind(const Config& c, std::string_view name) {
  ASSIGN_OR_RETURN(OpenedNvme opened, OpenNvmeFrom(c, name));
  OpenedLowerTier out;
  if (opened.tier == nullptr) return out;
  const NvmeStats st = opened.tier->Stats();
  out.recovered = std::move(opened.recovered);
  out.attached = [&c, st, requested = opened.requested_bytes, recovered = out.recovered.size()](uint64_t indexed) {
    LogNvmeOpened(c, requested, recovered, st, indexed);
  };
  out.describe = [nvme = opened.tier.get()](StatusSnapshot::Lower& l) { l.nvme = nvme->Stats(); };
  out.tier = std::move(opened.tier);
  return out;
}

absl::StatusOr<OpenedLowerTier> OpenRedisKind(const Config& c, std::string_view name) {
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteTier> tier, OpenRemoteFrom(c, name));
  OpenedLowerTier out;
  out.describe = [remote = tier.get(), &c](StatusSnapshot::Lower& l) { l.remote = RemoteStatusOf(*remote, c); };
  out.tier = std::move(tier);
  return out;
}

struct Opener {
  std::string_view kind;
  absl::StatusOr<OpenedLowerTier> (*open)(const Config&, std::string_view name);
};

const Opener kOpeners[] = {
    {"nvme", &OpenNvmeKind},
    {"redis", &OpenRedisKind},
    KVTIER_LOWER_KIND_OPENERS
};

}  // namespace

absl::StatusOr<OpenedLowerTier> OpenLowerTier(const Config::LowerEntry& e, const Config& c) {
  for (const Opener& o : kOpeners) {
    if (o.kind == e.kind) return o.open(c, e.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("no lower tier of kind \"", e.kind, "\""));
}

}  // namespace kvtier
