// SPDX-License-Identifier: Apache-2.0
#include "daemon/status_snapshot.h"

#include "core/namespace.h"
#include "ipc/abi.h"

namespace kvtier {
namespace {

using nlohmann::json;

double Ratio(uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); }

json SessionJson(uint64_t id, const SessionInfo& info) {
  return json{{"id", id},
              {"pid", info.identity.peer.pid},
              {"uid", info.identity.peer.uid},
              {"tenant", info.tenant},
              {"client", info.identity.client_name},
              {"namespace", ShortId(info.ns.id)},
              {"model", info.ns.model_id},
              {"block_bytes", info.ns.block_bytes},
              {"block_tokens", info.ns.block_tokens},
              {"ops", info.ops},
              {"leases", info.leases},
              {"pinned_blocks", info.pinned_blocks},
              {"kv_caches", info.kv_caches},
              {"attached_unix_s", info.identity.attached_unix_s}};
}

json TenantJson(const StatusSnapshot::Tenant& t) {
  const TenantUsage& u = t.usage;
  json policies = json::array();
  for (const PolicyUsage& p : u.policies) {
    json scores = json::object();
    for (const auto& [name, score] : p.scores) scores[name] = score;
    policies.push_back(json{{"slot_bytes", p.slot_bytes},
                            {"blocks", p.blocks},
                            {"bookkeeping", p.bookkeeping},
                            {"leader", p.leader},
                            {"switches", p.switches},
                            {"scores", scores}});
  }
  json classes = json::array();
  for (const SlotAllocator::ClassUsage& c : u.classes) {
    classes.push_back(json{{"slot_bytes", c.slot_bytes},
                           {"segments", c.segments},
                           {"carved_bytes", c.carved_bytes},
                           {"used_bytes", c.used_bytes},
                           {"free_bytes", c.free_bytes()},
                           {"stranded_bytes", c.stranded_bytes}});
  }
  json out{{"name", u.name},
           {"policies", policies},
           {"host_by_block_size", classes},
           {"host_stranded_bytes", u.stranded_bytes},
           {"sessions", t.sessions},
           {"host_capacity_bytes", u.capacity_bytes},
           {"host_used_bytes", u.used_bytes},
           {"blocks", u.blocks},
           {"pinned_blocks", u.pinned_blocks},
           {"evictions", u.evictions},
           {"host_tokens", u.host_tokens},
           {"kv_caches", t.kv_caches},
           {"kv_cache_bytes", t.kv_cache_bytes},
           {"nvme_bytes", u.nvme_bytes},
           {"nvme_tokens", u.nvme_tokens},
           {"quota", json{{"host_tokens", u.quota.host_tokens},
                          {"nvme_bytes", u.quota.nvme_bytes},
                          {"nvme_tokens", u.quota.nvme_tokens}}}};
  if (t.gpu) {
    out["gpu"] = json{{"capacity_bytes", t.gpu->capacity_bytes}, {"used_bytes", t.gpu->used_bytes},
                      {"blocks", t.gpu->blocks}};
  }
  return out;
}

json HostJson(const StatusSnapshot::Host& h, const DaemonStats& s) {
  return json{{"tier", "host"},
              {"policy", h.policy},
              {"capacity_bytes", h.capacity_bytes},
              {"used_bytes", h.used_bytes},
              {"blocks", h.blocks},
              {"pinned_blocks", h.pinned_blocks},
              {"evictions", h.evictions},
              {"evictions_kept_on_nvme", s.evictions_kept_on_nvme.Get()},
              {"demotions", s.demotions.Get()},
              {"demotions_past_full_tier", s.demotions_past_full_tier.Get()},
              {"demotions_failed", s.demotions_failed.Get()},
              {"demotions_waited", s.demotions_waited.Get()},
              {"evictions_dropped", s.evictions_dropped.Get()},
              {"evictions_dropped_by_cost", s.evictions_dropped_by_cost.Get()},
              {"evictions_dropped_by_reason", json{{"cost", s.evictions_dropped_by_cost.Get()},
                                                   {"no_lower_tier", s.dropped_no_lower_tier.Get()},
                                                   {"too_large", s.dropped_too_large.Get()},
                                                   {"no_room", s.dropped_no_room.Get()},
                                                   {"tier_unwritable", s.dropped_tier_unwritable.Get()},
                                                   {"not_admitted", s.dropped_not_admitted.Get()}}},
              {"evictions_background", s.evictions_background.Get()},
              {"evictions_for_quota", s.evictions_for_quota.Get()},
              {"stranded_bytes", h.stranded_bytes},
              {"segments_reclaimed", s.host_segments_reclaimed.Get()},
              {"evictions_for_other_size", s.evictions_for_other_size.Get()},
              {"high_watermark", h.high_watermark},
              {"low_watermark", h.low_watermark},
              {"health", "healthy"}};
}

// What every lower tier reports; the first adds what only it does.
json LowerJson(const StatusSnapshot::Lower& l, const DaemonStats& s) {
  const BlockTierStats& b = l.io;
  json counters = json::object();
  for (const auto& [name, v] : l.counters) counters[name] = v;
  json tier{{"tier", l.name},
            {"kind", l.kind},
            {"chain_position", l.chain_position},
            {"counters", std::move(counters)},
            {"policy", l.policy},
            {"durable", l.durable},
            {"capacity_bytes", b.capacity_bytes},
            {"used_bytes", b.used_bytes},
            {"blocks", l.blocks},
            {"hits", l.hits},
            {"slots_used", b.used_slots},
            {"in_flight", b.in_flight},
            {"queued", b.queued},
            {"reads", b.reads},
            {"writes", b.writes},
            {"bytes_read", b.bytes_read},
            {"bytes_written", b.bytes_written},
            {"checksum_failures", b.checksum_failures},
            {"io_errors", b.io_errors},
            {"abandoned", b.abandoned},
            {"writes_refused", b.writes_refused},
            {"health", std::string(TierHealthName(l.health))}};
  if (l.shared) {
    // The store's side of the shared tiers, whatever their kind: one set of
    // figures over every shared tier (the same on each shared row).
    tier["shared"] = json{{"hits_loaded", s.blocks_hit_shared.Get()},
                          {"probes", s.remote_probes.Get()},
                          {"probe_blocks", s.remote_probe_blocks.Get()},
                          {"probe_found", s.remote_probe_found.Get()},
                          {"probes_late", s.remote_probes_late.Get()},
                          {"publishes", s.remote_publishes.Get()},
                          {"publishes_failed", s.remote_publishes_failed.Get()},
                          {"writes_avoided", s.remote_writes_avoided.Get()},
                          {"found_unproven", s.cascade_found_unproven.Get()}};
  }
  if (const std::optional<RemoteStatus>& r = l.remote) {
    json nodes = json::array();
    for (const RemoteStatus::Node& n : r->nodes) {
      nodes.push_back(json{{"address", n.address},
                           {"connected", n.connected},
                           {"slots", n.slots},
                           {"commands", n.commands},
                           {"errors", n.errors},
                           {"connects", n.connects}});
    }
    tier["remote"] = json{
        {"write_policy", r->write_policy},
        {"probe_budget_us", r->probe_budget_us},
        {"hits_loaded", l.hits},
        {"probes", s.remote_probes.Get()},
        {"probe_blocks", s.remote_probe_blocks.Get()},
        {"probe_found", s.remote_probe_found.Get()},
        {"probes_late", s.remote_probes_late.Get()},
        {"probes_busy", s.remote_probes_busy.Get()},
        {"probes_throttled", s.remote_probes_throttled.Get()},
        {"adoptions_refused", s.remote_adoptions_refused.Get()},
        {"probe_latency", HistogramJson(s.remote_probe_latency.Get())},
        {"publishes", s.remote_publishes.Get()},
        {"publishes_skipped", s.remote_publishes_skipped.Get()},
        {"publishes_not_admitted", s.remote_publishes_not_admitted.Get()},
        {"publishes_failed", s.remote_publishes_failed.Get()},
        {"writes_avoided", s.remote_writes_avoided.Get()},
        {"found_unproven", s.cascade_found_unproven.Get()},
        {"misses", json{{"not_found", r->misses.not_found},
                        {"bad_value", r->misses.bad_value},
                        {"forged", r->misses.forged},
                        {"unavailable", r->misses.unavailable},
                        {"deadline", r->misses.deadline},
                        {"other", r->misses.other}}},
        {"budget", json{{"ledger_updates", r->budget.updates},
                        {"evictions", r->budget.evictions},
                        {"refused", r->budget.refused},
                        {"failures", r->budget.failures},
                        {"touches", r->budget.touches},
                        {"touches_dropped", r->budget.touches_dropped},
                        {"bad_entries", r->budget.bad_entries}}},
        {"read_latency", HistogramJson(s.lower_read_latency.Get())},
        {"cluster", json{{"slots_covered", r->slots_covered},
                         {"moved", r->moved},
                         {"ask", r->ask},
                         {"tryagain", r->tryagain},
                         {"clusterdown", r->clusterdown},
                         {"refreshes", r->refreshes},
                         {"refresh_failures", r->refresh_failures},
                         {"auth_failures", r->auth_failures},
                         {"tenants_refused", r->tenants_refused}}},
        {"nodes", std::move(nodes)}};
  }
  if (l.chain_position != 0) return tier;
  tier.update(json{{"hits_loaded", l.hits},
                   {"hits_reported_recompute", s.blocks_recompute.Get()},
                   {"evictions", s.nvme_evictions.Get()},
                   {"evictions_for_quota", s.nvme_evictions_for_quota.Get()},
                   {"demotions_refused_quota", s.demotions_refused_quota.Get()},
                   {"demotions_refused_fair_share", s.demotions_refused_fair_share.Get()},
                   {"pins_refused_fair_share", s.pins_refused_fair_share.Get()},
                   {"promotions", s.promotions.Get()},
                   {"promotions_for_load", s.promotions_for_load.Get()},
                   {"promotions_failed", s.promotions_failed.Get()},
                   {"writes_through", s.writes_through.Get()},
                   {"demotions_for_calibration", s.demotions_for_calibration.Get()}});
  if (const std::optional<NvmeStats>& n = l.nvme) {
    tier.update(json{{"io_engine", n->io_engine},
                     {"io_engine_reason", n->io_engine_reason},
                     {"buffered_io", n->buffered},
                     {"queue_depth", n->queue_depth},
                     {"device_full", n->device_full},
                     {"calibration_reads", n->calibration_reads},
                     {"journal", json{{"records", n->journal_records},
                                      {"commits", n->journal_commits},
                                      {"bytes", n->journal_bytes},
                                      {"rewrites", n->journal_rewrites}}},
                     {"recovery", json{{"blocks", n->recovery.blocks},
                                       {"dropped", n->recovery.dropped + s.recovered_dropped.Get()},
                                       {"journal_bytes_cut", n->recovery.journal_bytes_cut},
                                       {"journal_records_cut", n->recovery.journal_records_cut},
                                       {"resized_from_segments", n->recovery.resized_from_segments},
                                       {"dropped_by_resize", n->recovery.dropped_by_resize},
                                       {"seconds", n->recovery.seconds}}}});
  }
  return tier;
}

json GpuJson(const StatusSnapshot::Gpu& g) {
  const GpuCache::Usage& u = g.usage;
  return json{{"tier", "gpu"},
              {"device", g.device},
              {"capacity_bytes", u.capacity_bytes},
              {"used_bytes", u.used_bytes},
              {"blocks", u.blocks},
              {"pinned_blocks", u.pinned},
              {"hits", u.hits},
              {"promotions", u.promotions},
              {"demotions", u.demotions},
              {"evictions", u.evictions},
              {"health", std::string(TierHealthName(g.health))}};
}

json EventsJson(const std::optional<StatusSnapshot::Events>& e) {
  if (!e) return json{{"enabled", false}};
  json tenants = json::array();
  for (const auto& [name, endpoint, replay] : e->tenants) {
    tenants.push_back(json{{"tenant", name}, {"endpoint", endpoint}, {"replay_endpoint", replay}});
  }
  return json{{"enabled", true},
              {"publishing", tenants},
              {"events", e->stats.events},
              {"batches", e->stats.batches},
              {"dropped", e->stats.dropped},
              {"replays", e->stats.replays},
              {"bad_replays", e->stats.bad_replays},
              {"replays_throttled", e->stats.replays_throttled},
              {"publisher_restarts", e->stats.publisher_restarts},
              {"publishers_up", e->stats.publishers_up}};
}

json StatsJson(const DaemonStats& s) {
  json stats{{"lookups", s.lookups.Get()},
             {"lookup_hits", s.lookup_hits.Get()},
             {"hit_rate", Ratio(s.lookup_hits.Get(), s.lookups.Get())},
             {"probes", s.probes.Get()},
             {"blocks_queried", s.blocks_queried.Get()},
             {"blocks_hit", s.blocks_hit.Get()},
             {"blocks_hit_host", s.blocks_hit.Get() - std::min(s.blocks_hit.Get(), s.blocks_hit_local.Get() +
                                                                                    s.blocks_hit_shared.Get())},
             {"blocks_hit_local", s.blocks_hit_local.Get()},
             {"blocks_hit_shared", s.blocks_hit_shared.Get()},
             {"blocks_missed", s.blocks_queried.Get() - s.blocks_hit.Get()},
             {"block_hit_rate", Ratio(s.blocks_hit.Get(), s.blocks_queried.Get())},
             {"tokens_queried", s.tokens_queried.Get()},
             {"tokens_hit", s.tokens_hit.Get()},
             {"reused_token_ratio", Ratio(s.tokens_hit.Get(), s.tokens_queried.Get())},
             {"stores", s.stores.Get()},
             {"blocks_stored", s.blocks_stored.Get()},
             {"bytes_stored", s.bytes_stored.Get()},
             {"blocks_already_present", s.blocks_already_present.Get()},
             {"store_aborts", s.store_aborts.Get()},
             {"store_refused_no_space", s.store_refused_no_space.Get()},
             {"stores_waited_for_busy_blocks", s.stores_waited_for_busy_blocks.Get()},
             {"loads", s.loads.Get()},
             {"blocks_loaded", s.blocks_loaded.Get()},
             {"bytes_loaded", s.bytes_loaded.Get()},
             {"load_failures", s.load_failures.Get()},
             {"prefetches", s.prefetches.Get()},
             {"blocks_recompute", s.blocks_recompute.Get()},
             {"prefill_reports", s.prefill_reports.Get()},
             {"prefill_reports_refused", s.prefill_reports_refused.Get()},
             {"evictions", s.evictions.Get()},
             {"invalidations", s.invalidations.Get()},
             {"kv_registrations", s.kv_registrations.Get()},
             {"kv_registrations_refused", s.kv_registrations_refused.Get()},
             {"device_stores", s.device_stores.Get()},
             {"device_blocks_stored", s.device_blocks_stored.Get()},
             {"device_loads", s.device_loads.Get()},
             {"device_blocks_loaded", s.device_blocks_loaded.Get()},
             {"device_errors", s.device_errors.Get()},
             {"reloads", s.reloads.Get()},
             {"reloads_failed", s.reloads_failed.Get()},
             {"store_refused_draining", s.store_refused_draining.Get()},
             {"sessions_attached", s.sessions_attached.Get()},
             {"sessions_detached", s.sessions_detached.Get()},
             {"attach_refused", s.attach_refused.Get()},
             {"sessions_closed_dead", s.sessions_closed_dead.Get()},
             {"protocol_errors", s.protocol_errors.Get()},
             {"log_lines_suppressed", s.log_lines_suppressed.Get()},
             {"namespaces_freed", s.namespaces_freed.Get()},
             {"heap_trims", s.heap_trims.Get()},
             {"heap_trim_ms", static_cast<double>(s.heap_trim_ns.Get()) / 1e6},
             {"cascades", s.cascades.Get()},
             {"cascades_failed", s.cascades_failed.Get()},
             {"lower_evictions", s.lower_evictions.Get()}};  // from tiers below the first
  json refused = json::object();
  for (size_t i = 0; i < s.refused.size(); ++i) refused[kRefusalNames[i]] = s.refused[i].Get();
  stats["refused"] = refused;
  return stats;
}

json LatencyJson(const DaemonStats& s) {
  json ops = json::object();
  for (size_t op = 1; op < s.op_latency.size(); ++op) ops[ipc::kOpcodes[op].name] = HistogramJson(s.op_latency[op].Get());
  return json{{"ops", ops},
              {"nvme_read", HistogramJson(s.nvme_read_latency.Get())},
              {"nvme_write", HistogramJson(s.nvme_write_latency.Get())},
              {"lower_read", HistogramJson(s.lower_read_latency.Get())}};
}

}  // namespace

json HistogramJson(const Histogram::Snapshot& h) {
  return {{"bounds_s", Histogram::kBounds}, {"counts", h.counts}, {"count", h.count}, {"sum_s", h.sum_s}};
}

json StatusJson(const StatusSnapshot& s) {
  json sessions = json::array();
  for (const StatusSnapshot::Session& x : s.sessions) sessions.push_back(SessionJson(x.id, x.info));
  json tenants = json::array();
  for (const StatusSnapshot::Tenant& t : s.tenants) tenants.push_back(TenantJson(t));
  json tiers = json::array();
  tiers.push_back(HostJson(s.host, s.stats));
  for (const StatusSnapshot::Lower& l : s.lower) tiers.push_back(LowerJson(l, s.stats));
  if (s.gpu) tiers.push_back(GpuJson(*s.gpu));
  return json{{"ok", true},
              {"version", s.version},
              {"pid", s.pid},
              {"uptime_s", s.uptime_s},
              {"device", s.device},
              {"hash", s.hash},
              {"socket", s.socket},
              {"namespaces", s.namespaces},
              {"indexed_blocks", s.indexed_blocks},
              {"sessions", sessions},
              {"tenants", tenants},
              {"tiers", tiers},
              {"cost_model", CostTracker::ReportJson(s.cost_model)},
              {"metrics", s.metrics_url ? json{{"enabled", true}, {"url", *s.metrics_url}, {"port", s.metrics_port}}
                                        : json{{"enabled", false}}},
              {"events", EventsJson(s.events)},
              {"latency", LatencyJson(s.stats)},
              {"stats", StatsJson(s.stats)}};
}

}  // namespace kvtier
