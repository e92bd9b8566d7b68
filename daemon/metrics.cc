// SPDX-License-Identifier: Apache-2.0
#include "daemon/metrics.h"

#include <map>

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ipc/abi.h"

namespace kvtier {

namespace {

std::string Num(double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 9e15 && v > -9e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%.9g", v);
}

// Label values: escape backslash, quote and newline.
std::string Esc(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Hits below host memory by the kind of tier they were found in, kinds in
// chain order, the chain's tiers of one kind summed: `hits(lane)` of each.
template <typename F>
std::vector<std::pair<std::string, uint64_t>> HitsByKind(const StatusSnapshot& s, F hits) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const StatusSnapshot::Lower& l : s.lower) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& k) { return k.first == l.kind; });
    if (it == out.end()) it = out.insert(out.end(), {l.kind, 0});
    it->second += hits(l);
  }
  return out;
}

class Writer {
 public:
  // A family's HELP and TYPE, once; then its samples.
  void Family(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, const std::string& labels, double v) {
    out_ << name;
    if (!labels.empty()) out_ << "{" << labels << "}";
    out_ << " " << Num(v) << "\n";
  }
  void Histogram(const std::string& name, const std::string& labels, const kvtier::Histogram& histogram) {
    const kvtier::Histogram::Snapshot h = histogram.Get();
    const auto& bounds = kvtier::Histogram::kBounds;
    uint64_t cumulative = 0;
    const std::string sep = labels.empty() ? "" : labels + ",";
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cumulative += h.counts[i];
      const std::string le = i < bounds.size() ? Num(bounds[i]) : "+Inf";
      Sample(name + "_bucket", sep + "le=\"" + le + "\"", double(cumulative));
    }
    Sample(name + "_sum", labels, h.sum_s);
    Sample(name + "_count", labels, double(h.count));
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// One tier's row of the tier gauges.
struct TierRow {
  std::string name;
  uint64_t capacity_bytes, used_bytes, blocks;
  bool healthy;
};

std::vector<TierRow> TierRows(const StatusSnapshot& s) {
  std::vector<TierRow> rows;
  rows.push_back({"host", s.host.capacity_bytes, s.host.used_bytes, s.host.blocks, true});
  for (const StatusSnapshot::Lower& l : s.lower) {
    rows.push_back({l.name, l.io.capacity_bytes, l.io.used_bytes, l.blocks, l.health == TierHealth::kHealthy});
  }
  if (s.gpu) {
    const GpuCache::Usage& u = s.gpu->usage;
    rows.push_back({"gpu", u.capacity_bytes, u.used_bytes, u.blocks, s.gpu->health == TierHealth::kHealthy});
  }
  return rows;
}

double Ratio(uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); }

}  // namespace

std::string PrometheusText(const StatusSnapshot& s, bool detailed) {
  Writer w;
  const DaemonStats& st = s.stats;
  w.Family("kvtier_build_info", "gauge", "kvtierd's version (always 1).");
  w.Sample("kvtier_build_info", "version=\"" + Esc(s.version) + "\",device=\"" + Esc(s.device) + "\"", 1);
  w.Family("kvtier_uptime_seconds", "gauge", "Seconds since kvtierd started.");
  w.Sample("kvtier_uptime_seconds", "", s.uptime_s);

  // Tiers.
  const std::vector<TierRow> tiers = TierRows(s);
  const std::tuple<const char*, uint64_t TierRow::*, const char*> tier_gauges[] = {
      {"kvtier_tier_capacity_bytes", &TierRow::capacity_bytes, "Bytes each tier can hold."},
      {"kvtier_tier_used_bytes", &TierRow::used_bytes, "Bytes in use in each tier."},
      {"kvtier_tier_blocks", &TierRow::blocks, "Blocks held in each tier."}};
  for (const auto& [family, field, help] : tier_gauges) {
    w.Family(family, "gauge", help);
    for (const TierRow& t : tiers) w.Sample(family, "tier=\"" + Esc(t.name) + "\"", double(t.*field));
  }
  w.Family("kvtier_tier_healthy", "gauge", "1 when the tier is healthy.");
  for (const TierRow& t : tiers) w.Sample("kvtier_tier_healthy", "tier=\"" + Esc(t.name) + "\"", t.healthy ? 1 : 0);
  w.Family("kvtier_lower_blocks_hit_total", "counter",
           "Blocks found by asks in each lower tier, by lane (position in the chain), tier and kind.");
  for (const StatusSnapshot::Lower& l : s.lower) {
    w.Sample("kvtier_lower_blocks_hit_total",
             "lane=\"" + std::to_string(l.chain_position) + "\",tier=\"" + Esc(l.name) + "\",kind=\"" + Esc(l.kind) + "\"",
             double(l.hits));
  }
  w.Family("kvtier_lower_tier_counter", "gauge",
           "What a lower tier's kind counts beyond the common series, by lane (position in the chain), tier, kind "
           "and name (the fs tier: scans, files, bytes, evicted, vanished, stale_temps, scan_failures, misses_*).");
  for (const StatusSnapshot::Lower& l : s.lower) {
    const std::string labels = "lane=\"" + std::to_string(l.chain_position) + "\",tier=\"" + Esc(l.name) +
                               "\",kind=\"" + Esc(l.kind) + "\",name=\"";
    for (const auto& [name, v] : l.counters) w.Sample("kvtier_lower_tier_counter", labels + Esc(name) + "\"", double(v));
  }

  // Hits: per request and per reused token (a 16-token hit and a 16,000-token
  // hit count the same in the first, not in the second).
  w.Family("kvtier_lookups_total", "counter",
           "Requests' asks: leased lookups, or probes an engine flags as its request's ask (what the policies learn "
           "from).");
  w.Sample("kvtier_lookups_total", "", double(st.lookups.Get()));
  w.Family("kvtier_lookup_hits_total", "counter", "Asks that hit at least one block.");
  w.Sample("kvtier_lookup_hits_total", "", double(st.lookup_hits.Get()));
  w.Family("kvtier_blocks_hit_total", "counter",
           "Blocks found by asks, by the tier they were in: host, or a lower tier's kind (nvme, remote, "
           "fs; the chain's tiers of one kind summed).");
  {
    // Host: from the same copy of the counters as blocks_hit (the lanes'
    // hits are read apart, a moment earlier), so the series never goes back.
    const uint64_t lower = st.blocks_hit_local.Get() + st.blocks_hit_shared.Get();
    w.Sample("kvtier_blocks_hit_total", "tier=\"host\"", double(st.blocks_hit.Get() - std::min(st.blocks_hit.Get(), lower)));
    for (const auto& [kind, n] : HitsByKind(s, [](const StatusSnapshot::Lower& l) { return l.hits; })) {
      w.Sample("kvtier_blocks_hit_total", "tier=\"" + Esc(kind) + "\"", double(n));
    }
  }
  w.Family("kvtier_blocks_missed_total", "counter", "Blocks asks named and did not find.");
  w.Sample("kvtier_blocks_missed_total", "", double(st.blocks_queried.Get() - st.blocks_hit.Get()));
  w.Family("kvtier_tokens_queried_total", "counter", "Tokens covered by the blocks asks named.");
  w.Sample("kvtier_tokens_queried_total", "", double(st.tokens_queried.Get()));
  w.Family("kvtier_tokens_reused_total", "counter", "Tokens covered by the blocks asks found.");
  w.Sample("kvtier_tokens_reused_total", "", double(st.tokens_hit.Get()));
  w.Family("kvtier_hit_rate", "gauge", "Share of asks that hit (per request).");
  w.Sample("kvtier_hit_rate", "", Ratio(st.lookup_hits.Get(), st.lookups.Get()));
  w.Family("kvtier_reused_token_ratio", "gauge",
           "Share of queried tokens that were found (per token). Tokens count in full blocks only: a prompt's "
           "partial last block is never cached, so it is neither queried nor found.");
  w.Sample("kvtier_reused_token_ratio", "", Ratio(st.tokens_hit.Get(), st.tokens_queried.Get()));

  // Per tenant, where the operator opted in ([metrics] per_tenant, or a
  // token_file): one series per tenant, so as many as [[tenants]] entries.
  if (detailed) {
    const std::tuple<const char*, const char*, uint64_t TenantUsage::*> per_tenant[] = {
        {"kvtier_tenant_lookups_total", "Asks of the tenant.", &TenantUsage::lookups},
        {"kvtier_tenant_lookup_hits_total", "Asks of the tenant that hit at least one block.",
         &TenantUsage::lookup_hits},
        {"kvtier_tenant_blocks_queried_total", "Blocks the tenant's asks named.",
         &TenantUsage::blocks_queried},
        {"kvtier_tenant_tokens_queried_total", "Tokens covered by the blocks the tenant's asks named.",
         &TenantUsage::tokens_queried},
        {"kvtier_tenant_tokens_reused_total", "Tokens covered by the blocks the tenant's asks found.",
         &TenantUsage::tokens_hit},
        {"kvtier_tenant_evictions_total", "Host blocks of the tenant evicted.", &TenantUsage::evictions}};
    for (const auto& [family, help, field] : per_tenant) {
      w.Family(family, "counter", help);
      for (const StatusSnapshot::Tenant& t : s.tenants) {
        w.Sample(family, "tenant=\"" + Esc(t.usage.name) + "\"", double(t.usage.*field));
      }
    }
    w.Family("kvtier_tenant_blocks_hit_total", "counter",
             "Blocks the tenant's asks found, by the tier they were in.");
    for (const StatusSnapshot::Tenant& t : s.tenants) {
      const TenantUsage& u = t.usage;
      const std::string who = "tenant=\"" + Esc(u.name) + "\",";
      const auto by_kind = HitsByKind(s, [&u](const StatusSnapshot::Lower& l) {
        return l.chain_position < u.blocks_hit_lane.size() ? u.blocks_hit_lane[l.chain_position] : 0;
      });
      uint64_t lower = 0;
      for (const auto& [kind, n] : by_kind) lower += n;
      w.Sample("kvtier_tenant_blocks_hit_total", who + "tier=\"host\"", double(u.blocks_hit - std::min(u.blocks_hit, lower)));
      for (const auto& [kind, n] : by_kind) {
        w.Sample("kvtier_tenant_blocks_hit_total", who + "tier=\"" + Esc(kind) + "\"", double(n));
      }
    }
    const std::tuple<const char*, const char*, uint64_t TenantUsage::*> tenant_gauges[] = {
        {"kvtier_tenant_host_used_bytes", "Host arena bytes the tenant's blocks use.", &TenantUsage::used_bytes},
        {"kvtier_tenant_host_capacity_bytes", "The tenant's host arena.", &TenantUsage::capacity_bytes},
        {"kvtier_tenant_nvme_bytes", "NVMe bytes the tenant's blocks use.", &TenantUsage::nvme_bytes}};
    for (const auto& [family, help, field] : tenant_gauges) {
      w.Family(family, "gauge", help);
      for (const StatusSnapshot::Tenant& t : s.tenants) {
        w.Sample(family, "tenant=\"" + Esc(t.usage.name) + "\"", double(t.usage.*field));
      }
    }
  }

  // The trust boundary: requests and connections refused by a limit.
  w.Family("kvtier_refused_total", "counter",
           "Requests and connections refused by a per-tenant limit or a rule of the trust boundary, by reason.");
  for (size_t i = 0; i < st.refused.size(); ++i) {
    w.Sample("kvtier_refused_total", absl::StrCat("reason=\"", kRefusalNames[i], "\""), double(st.refused[i].Get()));
  }

  if (s.events) {
    w.Family("kvtier_events_total", "counter",
             "KV events for routers ([events]): events sent, and dropped because the publisher fell behind "
             "(max_pending); a router that saw a drop should replay or resynchronize.");
    w.Sample("kvtier_events_total", "result=\"sent\"", double(s.events->stats.events));
    w.Sample("kvtier_events_total", "result=\"dropped\"", double(s.events->stats.dropped));
    w.Family("kvtier_events_replays_total", "counter", "Replay requests served, and refused as malformed.");
    w.Sample("kvtier_events_replays_total", "result=\"served\"", double(s.events->stats.replays));
    w.Sample("kvtier_events_replays_total", "result=\"malformed\"", double(s.events->stats.bad_replays));
    w.Sample("kvtier_events_replays_total", "result=\"throttled\"", double(s.events->stats.replays_throttled));
    w.Family("kvtier_events_publisher_restarts_total", "counter",
             "Tenants' event publisher processes restarted after they ended (a peer exhausted their limits).");
    w.Sample("kvtier_events_publisher_restarts_total", "", double(s.events->stats.publisher_restarts));
  }

  w.Family("kvtier_log_lines_suppressed_total", "counter",
           "Log lines peers would have caused beyond limits.log_lines_per_s (dropped).");
  w.Sample("kvtier_log_lines_suppressed_total", "", double(st.log_lines_suppressed.Get()));
  w.Family("kvtier_namespaces_freed_total", "counter",
           "Namespaces freed because no session used them and no block of theirs was left.");
  w.Sample("kvtier_namespaces_freed_total", "", double(st.namespaces_freed.Get()));
  w.Family("kvtier_heap_trims_total", "counter",
           "Times kvtierd gave its heap's free pages back to the kernel after its tiers evicted an eighth of their "
           "blocks.");
  w.Sample("kvtier_heap_trims_total", "", double(st.heap_trims.Get()));
  w.Family("kvtier_heap_trim_seconds_total", "counter", "Time those trims took, in all.");
  w.Sample("kvtier_heap_trim_seconds_total", "", double(st.heap_trim_ns.Get()) / 1e9);
  w.Family("kvtier_cascades_total", "counter",
           "Blocks the cascade moved one lower tier down (moved), or tried to and left in place (failed: a read or "
           "write failed, no room below, or the block was used meanwhile).");
  w.Sample("kvtier_cascades_total", "result=\"moved\"", double(st.cascades.Get()));
  w.Sample("kvtier_cascades_total", "result=\"failed\"", double(st.cascades_failed.Get()));

  // Bytes moved, per direction. The NVMe tier is the chain's first.
  const BlockTierStats nvme = s.lower.empty() ? BlockTierStats{} : s.lower.front().io;
  w.Family("kvtier_bytes_moved_total", "counter", "Block bytes moved, by direction.");
  w.Sample("kvtier_bytes_moved_total", "direction=\"engine_to_host\"", double(st.bytes_stored.Get()));
  w.Sample("kvtier_bytes_moved_total", "direction=\"host_to_engine\"", double(st.bytes_loaded.Get()));
  w.Sample("kvtier_bytes_moved_total", "direction=\"host_to_nvme\"", double(nvme.bytes_written));
  w.Sample("kvtier_bytes_moved_total", "direction=\"nvme_to_host\"", double(nvme.bytes_read));

  // Evictions by reason.
  const uint64_t dropped = st.evictions_dropped.Get(), by_cost = st.evictions_dropped_by_cost.Get();
  w.Family("kvtier_evictions_total", "counter", "Blocks evicted, by tier and what became of them.");
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"demoted\"", double(st.demotions.Get()));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"kept_on_nvme\"", double(st.evictions_kept_on_nvme.Get()));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"dropped\"", double(dropped - std::min(dropped, by_cost)));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"dropped_by_cost\"", double(by_cost));
  w.Sample("kvtier_evictions_total", "tier=\"nvme\",reason=\"dropped\"", double(st.nvme_evictions.Get()));
  w.Family("kvtier_demotions_past_full_tier_total", "counter",
           "Host evictions written to the tier below the first lower tier because the first was full (or its staging "
           "memory refused the write) and the next had room (also in kvtier_evictions_total{reason=\"demoted\"}).");
  w.Sample("kvtier_demotions_past_full_tier_total", "", double(st.demotions_past_full_tier.Get()));
  w.Family("kvtier_demotions_failed_total", "counter",
           "Host evictions that found no room below, or whose write to the lower tier failed or was refused, "
           "waits included (the block was lost; also in kvtier_evictions_total, as demoted or dropped).");
  w.Sample("kvtier_demotions_failed_total", "", double(st.demotions_failed.Get()));
  w.Family("kvtier_demotions_waited_total", "counter",
           "Background demotions that waited for the first lower tier's device to take their write (a burst past its "
           "staging memory): background eviction went at the device's pace.");
  w.Sample("kvtier_demotions_waited_total", "", double(st.demotions_waited.Get()));
  w.Family("kvtier_cascade_dropped_not_admitted_total", "counter",
           "NVMe blocks the cascade dropped instead of moving them to the tier below, whose admission gate refused "
           "them (tiers.remote.admission_min_uses; also in kvtier_evictions_total{tier=\"nvme\"}).");
  w.Sample("kvtier_cascade_dropped_not_admitted_total", "", double(st.cascade_dropped_not_admitted.Get()));
  w.Family("kvtier_evictions_dropped_total", "counter",
           "Host evictions dropped rather than demoted, by why (they sum to kvtier_evictions_total's dropped and "
           "dropped_by_cost).");
  const std::pair<const char*, uint64_t> why[] = {{"cost", by_cost},
                                                  {"no_lower_tier", st.dropped_no_lower_tier.Get()},
                                                  {"too_large", st.dropped_too_large.Get()},
                                                  {"no_room", st.dropped_no_room.Get()},
                                                  {"tier_unwritable", st.dropped_tier_unwritable.Get()},
                                                  {"not_admitted", st.dropped_not_admitted.Get()}};
  for (const auto& [reason, n] : why) {
    w.Sample("kvtier_evictions_dropped_total", absl::StrCat("reason=\"", reason, "\""), double(n));
  }
  // Host memory per block size: one size cannot use another's segments
  // until they are empty, so a shifting mix of sizes shows here first.
  w.Family("kvtier_host_block_size_bytes", "gauge",
           "Host arena bytes per tenant and slot size: in live blocks (used), in free slots only that size can use "
           "(stranded), in free slots of empty segments any size may take back (idle).");
  w.Family("kvtier_host_stranded_bytes", "gauge",
           "Free host arena bytes per tenant that only one block size can use (summed over sizes).");
  {
    // Per tenant when detailed; else summed over tenants ("" label), so one
    // tenant's stores do not show as a series of their own.
    struct Sizes {
      uint64_t used = 0, stranded = 0, idle = 0;
    };
    std::map<std::string, std::pair<uint64_t, std::map<uint64_t, Sizes>>> by_tenant;
    for (const StatusSnapshot::Tenant& t : s.tenants) {
      auto& [stranded, classes] = by_tenant[detailed ? "tenant=\"" + Esc(t.usage.name) + "\"" : ""];
      stranded += t.usage.stranded_bytes;
      for (const SlotAllocator::ClassUsage& c : t.usage.classes) {
        const uint64_t free_bytes = c.free_bytes();
        Sizes& z = classes[c.slot_bytes];
        z.used += c.used_bytes;
        z.stranded += c.stranded_bytes;
        z.idle += free_bytes - std::min(free_bytes, c.stranded_bytes);
      }
    }
    for (const auto& [tenant, usage] : by_tenant) {
      w.Sample("kvtier_host_stranded_bytes", tenant, double(usage.first));
      for (const auto& [slot_bytes, z] : usage.second) {
        const std::string labels = (tenant.empty() ? "" : tenant + ",") + "slot_bytes=\"" + std::to_string(slot_bytes) + "\"";
        w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"used\"", double(z.used));
        w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"stranded\"", double(z.stranded));
        w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"idle\"", double(z.idle));
      }
    }
  }
  w.Family("kvtier_host_segments_reclaimed_total", "counter",
           "Host segments of one block size emptied for another under pressure, and the evictions that took.");
  w.Sample("kvtier_host_segments_reclaimed_total", "", double(st.host_segments_reclaimed.Get()));
  w.Family("kvtier_evictions_for_other_size_total", "counter",
           "Host evictions that emptied a segment of one block size for another (part of kvtier_evictions_total).");
  w.Sample("kvtier_evictions_for_other_size_total", "", double(st.evictions_for_other_size.Get()));
  w.Family("kvtier_checksum_failures_total", "counter", "NVMe blocks whose checksum failed on read (served as misses).");
  w.Sample("kvtier_checksum_failures_total", "", double(nvme.checksum_failures));
  w.Family("kvtier_stores_refused_total", "counter", "Stores refused, by reason.");
  w.Sample("kvtier_stores_refused_total", "reason=\"no_space\"", double(st.store_refused_no_space.Get()));
  w.Sample("kvtier_stores_refused_total", "reason=\"draining\"", double(st.store_refused_draining.Get()));
  w.Family("kvtier_stores_waited_for_busy_blocks_total", "counter",
           "Stores that found every host block they could evict busy with I/O for a moment, and waited (at most "
           "50 ms a store) instead of being refused.");
  w.Sample("kvtier_stores_waited_for_busy_blocks_total", "", double(st.stores_waited_for_busy_blocks.Get()));

  // Sessions and leases.
  uint64_t leases = 0, pinned = 0;
  for (const StatusSnapshot::Session& x : s.sessions) {
    leases += x.info.leases;
    pinned += x.info.pinned_blocks;
  }
  w.Family("kvtier_sessions", "gauge", "Engine sessions attached.");
  w.Sample("kvtier_sessions", "", double(s.sessions.size()));
  w.Family("kvtier_leases", "gauge", "Leases held by engines.");
  w.Sample("kvtier_leases", "", double(leases));
  w.Family("kvtier_pinned_blocks", "gauge", "Blocks pinned by leases.");
  w.Sample("kvtier_pinned_blocks", "", double(pinned));
  w.Family("kvtier_sessions_total", "counter", "Session ends and refusals, by outcome.");
  w.Sample("kvtier_sessions_total", "outcome=\"attached\"", double(st.sessions_attached.Get()));
  w.Sample("kvtier_sessions_total", "outcome=\"detached\"", double(st.sessions_detached.Get()));
  w.Sample("kvtier_sessions_total", "outcome=\"died\"", double(st.sessions_closed_dead.Get()));
  w.Sample("kvtier_sessions_total", "outcome=\"refused\"", double(st.attach_refused.Get()));
  w.Family("kvtier_protocol_errors_total", "counter", "Sessions closed for breaking the ring protocol.");
  w.Sample("kvtier_protocol_errors_total", "", double(st.protocol_errors.Get()));
  w.Family("kvtier_reloads_total", "counter", "SIGHUP config reloads, by result.");
  w.Sample("kvtier_reloads_total", "result=\"applied\"", double(st.reloads.Get()));
  w.Sample("kvtier_reloads_total", "result=\"refused\"", double(st.reloads_failed.Get()));

  // Cost model fit.
  const CostTracker::Report& cm = s.cost_model;
  w.Family("kvtier_cost_model_prefill_tflops", "gauge", "Prefill throughput the cost model uses (fitted, or its prior).");
  w.Sample("kvtier_cost_model_prefill_tflops", "", cm.prefill_tflops);
  w.Family("kvtier_cost_model_prefill_fitted", "gauge", "1 once the prefill fit rests on engines' reports.");
  w.Sample("kvtier_cost_model_prefill_fitted", "", cm.prefill_fitted ? 1 : 0);
  w.Family("kvtier_cost_model_prefill_r_squared", "gauge", "R squared of the prefill fit.");
  w.Sample("kvtier_cost_model_prefill_r_squared", "", cm.prefill_r_squared);
  w.Family("kvtier_cost_model_prefill_reports_total", "counter", "report_prefill calls the fit used.");
  w.Sample("kvtier_cost_model_prefill_reports_total", "", double(cm.prefill_reports));
  w.Family("kvtier_cost_model_nvme_read_gbps", "gauge", "NVMe read bandwidth the cost model uses.");
  w.Sample("kvtier_cost_model_nvme_read_gbps", "", cm.nvme_read_gbps);
  w.Family("kvtier_blocks_reported_recompute_total", "counter",
           "Blocks asks found but reported as cheaper to recompute.");
  w.Sample("kvtier_blocks_reported_recompute_total", "", double(st.blocks_recompute.Get()));

  // Latency.
  w.Family("kvtier_op_latency_seconds", "histogram", "Requests from the session thread taking them to completion.");
  for (size_t op = 1; op < st.op_latency.size(); ++op) {
    w.Histogram("kvtier_op_latency_seconds", absl::StrCat("op=\"", ipc::kOpcodes[op].name, "\""), st.op_latency[op]);
  }
  w.Family("kvtier_transfer_latency_seconds", "histogram", "NVMe block transfers from submission to completion.");
  w.Histogram("kvtier_transfer_latency_seconds", "direction=\"nvme_to_host\"", st.nvme_read_latency);
  w.Histogram("kvtier_transfer_latency_seconds", "direction=\"host_to_nvme\"", st.nvme_write_latency);

  // The shared tier (tiers.remote), when there is one.
  for (const StatusSnapshot::Lower& l : s.lower) {
    if (!l.remote) continue;
    const RemoteStatus& r = *l.remote;
    w.Family("kvtier_remote_misses_total", "counter",
             "Reads from the shared tier that missed, by cause (not_found: evicted there or never written; "
             "bad_value: failed its checks, deleted; unavailable, deadline, other).");
    const std::pair<const char*, uint64_t> causes[] = {{"not_found", r.misses.not_found},
                                                       {"bad_value", r.misses.bad_value},
                                                       {"unavailable", r.misses.unavailable},
                                                       {"deadline", r.misses.deadline},
                                                       {"other", r.misses.other}};
    for (const auto& [cause, n] : causes) w.Sample("kvtier_remote_misses_total", absl::StrCat("cause=\"", cause, "\""), double(n));
    w.Family("kvtier_remote_auth_failures_total", "counter",
             "Connections to the shared tier's nodes refused at AUTH: a wrong password or a revoked user "
             "(the log says which tenant's user).");
    w.Sample("kvtier_remote_auth_failures_total", "", double(r.auth_failures));
    w.Family("kvtier_remote_tenants_refused", "gauge",
             "Tenants whose ACL user the cluster refuses now (no slot map): left out of the slot and node figures.");
    w.Sample("kvtier_remote_tenants_refused", "", double(r.tenants_refused));
    w.Family("kvtier_remote_adoptions_refused_total", "counter",
             "Blocks the cluster held that a lookup did not index: the tenant had tiers.remote.records_per_tenant.");
    w.Sample("kvtier_remote_adoptions_refused_total", "", double(st.remote_adoptions_refused.Get()));
    w.Family("kvtier_remote_forged_values_total", "counter",
             "Of the bad_value misses, values whose checksum held but whose seal did not: written by someone "
             "without the tenant's key (remote_key_file), or sealed by a key no longer configured.");
    w.Sample("kvtier_remote_forged_values_total", "", double(r.misses.forged));
    w.Family("kvtier_remote_budget_evictions_total", "counter",
             "Blocks deleted from the shared tier to keep their tenant within its budget (tiers.remote.tenant_budget, "
             "[[tenants]] remote_budget): the tenant's own least recently used.");
    w.Sample("kvtier_remote_budget_evictions_total", "", double(r.budget.evictions));
    w.Family("kvtier_remote_budget_writes_total", "counter",
             "Budget ledger updates in the shared tier (refused: a block alone past its tenant's budget, not "
             "written; failed: the ledger call failed, and the write with it, e.g. the ledger library not loaded or a user without +fcall).");
    w.Sample("kvtier_remote_budget_writes_total", "result=\"counted\"", double(r.budget.updates));
    w.Sample("kvtier_remote_budget_writes_total", "result=\"refused\"", double(r.budget.refused));
    w.Sample("kvtier_remote_budget_writes_total", "result=\"failed\"", double(r.budget.failures));
    w.Family("kvtier_remote_probe_blocks_total", "counter",
             "Blocks lookups asked the shared tier about past their local hit prefix, and those it held.");
    w.Sample("kvtier_remote_probe_blocks_total", "result=\"asked\"", double(st.remote_probe_blocks.Get()));
    w.Sample("kvtier_remote_probe_blocks_total", "result=\"found\"", double(st.remote_probe_found.Get()));
    w.Family("kvtier_remote_probes_total", "counter",
             "Lookups that asked the shared tier (late: no answer within tiers.remote.probe_budget_us; busy: not "
             "asked, the tenant had 8 lookups waiting on it already; throttled: not asked, the tenant's "
             "tiers.remote.probe_blocks_per_s was spent).");
    w.Sample("kvtier_remote_probes_total", "result=\"answered\"",
             double(st.remote_probes.Get() - std::min(st.remote_probes.Get(), st.remote_probes_late.Get())));
    w.Sample("kvtier_remote_probes_total", "result=\"late\"", double(st.remote_probes_late.Get()));
    w.Sample("kvtier_remote_probes_total", "result=\"busy\"", double(st.remote_probes_busy.Get()));
    w.Sample("kvtier_remote_probes_total", "result=\"throttled\"", double(st.remote_probes_throttled.Get()));
    w.Family("kvtier_remote_publishes_total", "counter",
             "Blocks written to the shared tier on its write policy (skipped: published already or too many in "
             "flight; not_admitted: its admission gate refused them), and cascade moves into it that found the block "
             "there already, read it back intact and wrote nothing (avoided), or found a value there that did not "
             "read back intact and wrote this node's copy over it (found_unproven).");
    w.Sample("kvtier_remote_publishes_total", "result=\"written\"", double(st.remote_publishes.Get()));
    w.Sample("kvtier_remote_publishes_total", "result=\"skipped\"", double(st.remote_publishes_skipped.Get()));
    w.Sample("kvtier_remote_publishes_total", "result=\"not_admitted\"", double(st.remote_publishes_not_admitted.Get()));
    w.Sample("kvtier_remote_publishes_total", "result=\"failed\"", double(st.remote_publishes_failed.Get()));
    w.Sample("kvtier_remote_publishes_total", "result=\"avoided\"", double(st.remote_writes_avoided.Get()));
    w.Sample("kvtier_remote_publishes_total", "result=\"found_unproven\"", double(st.cascade_found_unproven.Get()));
    w.Family("kvtier_remote_slots_covered", "gauge", "Cluster slots (of 16384) the slot map covers.");
    w.Sample("kvtier_remote_slots_covered", "", double(r.slots_covered));
    w.Family("kvtier_remote_redirections_total", "counter", "MOVED, ASK, TRYAGAIN and CLUSTERDOWN answers.");
    w.Sample("kvtier_remote_redirections_total", "kind=\"moved\"", double(r.moved));
    w.Sample("kvtier_remote_redirections_total", "kind=\"ask\"", double(r.ask));
    w.Sample("kvtier_remote_redirections_total", "kind=\"tryagain\"", double(r.tryagain));
    w.Sample("kvtier_remote_redirections_total", "kind=\"clusterdown\"", double(r.clusterdown));
    if (detailed) {
      w.Family("kvtier_remote_node_up", "gauge",
               "1 while every tenant's connection to the cluster node is up; nodes that serve slots (primaries).");
      for (const RemoteStatus::Node& n : r.nodes) {
        if (n.slots == 0) continue;  // a replica, or a node out of the map: nothing is sent to it
        w.Sample("kvtier_remote_node_up", "node=\"" + Esc(n.address) + "\"", n.connected ? 1 : 0);
      }
      w.Family("kvtier_remote_node_errors_total", "counter", "Commands to the cluster node that failed.");
      for (const RemoteStatus::Node& n : r.nodes) {
        w.Sample("kvtier_remote_node_errors_total", "node=\"" + Esc(n.address) + "\"", double(n.errors));
      }
    } else {
      // Without addresses (metrics.token_file or metrics.per_tenant shows them).
      uint64_t up = 0, down = 0, errors = 0;
      for (const RemoteStatus::Node& n : r.nodes) {
        errors += n.errors;
        if (n.slots != 0) ++(n.connected ? up : down);
      }
      w.Family("kvtier_remote_nodes", "gauge", "Cluster nodes that serve slots (primaries), by whether every "
                                               "tenant's connection to them is up.");
      w.Sample("kvtier_remote_nodes", "state=\"up\"", double(up));
      w.Sample("kvtier_remote_nodes", "state=\"down\"", double(down));
      w.Family("kvtier_remote_node_errors_total", "counter", "Commands to the cluster's nodes that failed.");
      w.Sample("kvtier_remote_node_errors_total", "", double(errors));
    }
    w.Family("kvtier_remote_probe_latency_seconds", "histogram", "A lookup's wait for the shared tier's answer.");
    w.Histogram("kvtier_remote_probe_latency_seconds", "", st.remote_probe_latency);
    w.Family("kvtier_remote_read_latency_seconds", "histogram", "Promotions' reads from tiers below the first.");
    w.Histogram("kvtier_remote_read_latency_seconds", "", st.lower_read_latency);
    break;
  }
  return w.str();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address, uint16_t port,
                                                                    Snapshot snapshot, std::string bearer_token,
                                                                    bool detailed) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  m->server_->Get("/metrics", [snapshot, detailed, token = std::move(bearer_token)](const httplib::Request& req,
                                                                                   httplib::Response& res) {
    if (!token.empty()) {
      const std::string want = "Bearer " + token;
      const std::string got = req.get_header_value("Authorization");
      // Compared in time independent of where the first difference is.
      unsigned diff = got.size() != want.size();
      for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(i < got.size() ? got[i] ^ want[i] : 1);
      if (diff != 0) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer realm=\"kvtierd\"");
        res.set_content("kvtierd: metrics need the bearer token of metrics.token_file\n", "text/plain");
        return;
      }
    }
    std::optional<StatusSnapshot> s = snapshot();
    if (!s) {
      res.status = 503;
      res.set_content("kvtierd is busy (draining or stopping)\n", "text/plain");
      return;
    }
    res.set_content(PrometheusText(*s, detailed), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
  // second daemon would share the port instead of being told it is taken.
  m->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("kvtierd: metrics at /metrics\n", "text/plain");
  });
  int bound = port == 0 ? m->server_->bind_to_any_port(address) : (m->server_->bind_to_port(address, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ":", port,
                                               " (in use, or not a local address); set metrics.port or "
                                               "metrics.enabled = false"));
  }
  m->port_ = static_cast<uint16_t>(bound);
  m->thread_ = std::thread([srv = m->server_.get()] { srv->listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvtier
