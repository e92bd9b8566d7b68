// SPDX-License-Identifier: Apache-2.0
// The status snapshot and its two writers: the status JSON and the
// Prometheus text read the same typed fields, so the same fact has the same
// value in both, and a snapshot does not move with the live counters.
#include "daemon/status_snapshot.h"

#include <gtest/gtest.h>

#include <string>

#include "daemon/metrics.h"

namespace kvtier {
namespace {

double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// A snapshot with a value of its own in every field the writers read.
StatusSnapshot Distinct() {
  StatusSnapshot s;
  s.version = "9.9.9";
  s.device = "host-simulated";
  s.uptime_s = 12.5;
  s.host = {.policy = "adaptive", .capacity_bytes = 1000, .used_bytes = 600, .blocks = 7, .pinned_blocks = 2,
            .evictions = 3, .stranded_bytes = 40, .high_watermark = 0.9, .low_watermark = 0.8};
  StatusSnapshot::Lower nvme{.name = "nvme", .kind = "nvme", .chain_position = 0, .policy = "lru", .durable = true,
                              .blocks = 11, .hits = 25};
  nvme.io = {.capacity_bytes = 5000, .used_bytes = 2500, .used_slots = 12, .bytes_read = 333, .bytes_written = 444,
             .checksum_failures = 5};
  nvme.nvme = NvmeStats{.io_engine = "io_uring", .journal_records = 17};
  s.lower.push_back(nvme);
  StatusSnapshot::Lower below{.name = "memory", .kind = "remote", .shared = true, .chain_position = 1,
                              .durable = false, .blocks = 13, .hits = 7, .health = TierHealth::kDegraded};
  below.io = {.capacity_bytes = 8000, .used_bytes = 100};
  s.lower.push_back(below);
  StatusSnapshot::Tenant t;
  t.usage.name = "team\"a";
  t.usage.stranded_bytes = 40;
  t.usage.classes.push_back({.slot_bytes = 4096, .segments = 1, .carved_bytes = 65536, .used_bytes = 8192,
                             .stranded_bytes = 4096});
  t.sessions = 1;
  s.tenants.push_back(t);
  StatusSnapshot::Session x;
  x.id = 42;
  x.info.tenant = "team\"a";
  x.info.leases = 6;
  x.info.pinned_blocks = 19;
  s.sessions.push_back(x);
  s.cost_model.prefill_tflops = 123.5;
  s.cost_model.nvme_read_gbps = 2.25;
  s.cost_model.prefill_reports = 31;
  DaemonStats& st = s.stats;
  st.lookups.Add(100);
  st.lookup_hits.Add(40);
  st.blocks_queried.Add(90);
  st.blocks_hit.Add(60);
  st.blocks_hit_local.Add(25);
  st.blocks_hit_shared.Add(7);
  st.tokens_queried.Add(1000);
  st.tokens_hit.Add(250);
  st.bytes_stored.Add(4096 * 3);
  st.bytes_loaded.Add(4096 * 5);
  st.demotions.Add(8);
  st.evictions_kept_on_nvme.Add(9);
  st.evictions_dropped.Add(10);
  st.evictions_dropped_by_cost.Add(4);
  st.nvme_evictions.Add(21);
  st.cascades.Add(14);
  st.cascades_failed.Add(15);
  st.Refused(Refusal::kSlowPeer);
  st.Refused(Refusal::kSlowPeer);
  st.op_latency[static_cast<size_t>(ipc::Opcode::kLookup)].Record(3'000);
  st.nvme_read_latency.Record(200'000);
  return s;
}

// Hits below host memory are shown by the kind of tier they came from: two
// tiers of one kind are summed, and a shared directory's hits are not the
// cluster's ("remote") or NVMe's.
TEST(StatusSnapshotTest, HitsAreCountedByTheKindOfTierTheyCameFrom) {
  StatusSnapshot s = Distinct();
  s.lower.clear();
  s.lower.push_back({.name = "fs", .kind = "fs", .shared = true, .chain_position = 0, .hits = 4});
  s.lower.push_back({.name = "remote", .kind = "remote", .shared = true, .chain_position = 1, .hits = 9});
  s.lower.push_back({.name = "fs", .kind = "fs", .shared = true, .chain_position = 2, .hits = 6});
  s.stats.blocks_hit_local = Counter();
  s.stats.blocks_hit_shared = Counter();
  s.stats.blocks_hit_shared.Add(19);
  TenantUsage& u = s.tenants[0].usage;
  u.blocks_hit = 30;
  u.blocks_hit_lane = {1, 2, 3};
  const std::string p = PrometheusText(s, true);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"fs\"}"), 10);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"remote\"}"), 9);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"nvme\"}"), -1) << "no series for a kind the chain lacks";
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"host\"}"), 60 - 19);
  EXPECT_EQ(Sample(p, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"fs\"}"), 4);
  EXPECT_EQ(Sample(p, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"remote\"}"), 2);
  EXPECT_EQ(Sample(p, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"host\"}"), 24);
  EXPECT_EQ(StatusJson(s)["stats"]["blocks_hit_shared"], 19);
  // The cluster's own row loads only its own hits, not the directories'.
  s.lower[1].remote = RemoteStatus{};
  bool seen = false;
  const nlohmann::json j = StatusJson(s);
  for (const nlohmann::json& t : j["tiers"]) {
    if (t.value("kind", "") != "remote") continue;
    seen = true;
    EXPECT_EQ(t["remote"]["hits_loaded"], 9) << t.dump();
  }
  EXPECT_TRUE(seen);
}

TEST(StatusSnapshotTest, TheJsonAndThePrometheusTextSayTheSame) {
  const StatusSnapshot s = Distinct();
  const nlohmann::json j = StatusJson(s);
  const std::string p = PrometheusText(s);
  const nlohmann::json& st = j["stats"];
  // Counters.
  EXPECT_EQ(st["lookups"], 100);
  EXPECT_EQ(Sample(p, "kvtier_lookups_total"), 100);
  EXPECT_EQ(Sample(p, "kvtier_lookup_hits_total"), st["lookup_hits"].get<double>());
  EXPECT_EQ(st["blocks_hit_host"], 28);
  EXPECT_EQ(st["blocks_hit_local"], 25);
  EXPECT_EQ(st["blocks_hit_shared"], 7);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"host\"}"), 28);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"nvme\"}"), 25);
  EXPECT_EQ(Sample(p, "kvtier_blocks_hit_total{tier=\"remote\"}"), 7);
  EXPECT_EQ(st["blocks_missed"], 30);
  EXPECT_EQ(Sample(p, "kvtier_blocks_missed_total"), 30);
  EXPECT_DOUBLE_EQ(st["hit_rate"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(Sample(p, "kvtier_hit_rate"), 0.4);
  EXPECT_DOUBLE_EQ(Sample(p, "kvtier_reused_token_ratio"), st["reused_token_ratio"].get<double>());
  EXPECT_EQ(st["refused"]["slow_peer"], 2);
  EXPECT_EQ(Sample(p, "kvtier_refused_total{reason=\"slow_peer\"}"), 2);
  EXPECT_EQ(Sample(p, "kvtier_refused_total{reason=\"duplicate_keys\"}"), 0);
  EXPECT_EQ(Sample(p, "kvtier_cascades_total{result=\"moved\"}"), 14);
  EXPECT_EQ(Sample(p, "kvtier_cascades_total{result=\"failed\"}"), 15);
  // Tiers, in chain order, the first with its NVMe-only fields.
  const nlohmann::json& tiers = j["tiers"];
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(tiers[0]["tier"], "host");
  EXPECT_EQ(tiers[0]["demotions"], 8);
  EXPECT_EQ(Sample(p, "kvtier_evictions_total{tier=\"host\",reason=\"demoted\"}"), 8);
  EXPECT_EQ(Sample(p, "kvtier_evictions_total{tier=\"host\",reason=\"dropped\"}"), 6);
  EXPECT_EQ(Sample(p, "kvtier_evictions_total{tier=\"host\",reason=\"dropped_by_cost\"}"), 4);
  EXPECT_EQ(tiers[1]["evictions"], 21);
  EXPECT_EQ(Sample(p, "kvtier_evictions_total{tier=\"nvme\",reason=\"dropped\"}"), 21);
  EXPECT_EQ(tiers[1]["journal"]["records"], 17);
  EXPECT_EQ(tiers[1]["io_engine"], "io_uring");
  EXPECT_EQ(tiers[1]["bytes_written"], 444);
  EXPECT_EQ(Sample(p, "kvtier_bytes_moved_total{direction=\"host_to_nvme\"}"), 444);
  EXPECT_EQ(Sample(p, "kvtier_bytes_moved_total{direction=\"nvme_to_host\"}"), 333);
  EXPECT_EQ(Sample(p, "kvtier_checksum_failures_total"), tiers[1]["checksum_failures"].get<double>());
  EXPECT_EQ(tiers[2]["chain_position"], 1);
  EXPECT_FALSE(tiers[2].contains("journal")) << "only the first tier carries the NVMe fields";
  EXPECT_FALSE(tiers[2].contains("hits_loaded"));
  for (const nlohmann::json& t : tiers) {
    const std::string label = "{tier=\"" + t["tier"].get<std::string>() + "\"}";
    EXPECT_EQ(Sample(p, "kvtier_tier_capacity_bytes" + label), t["capacity_bytes"].get<double>()) << label;
    EXPECT_EQ(Sample(p, "kvtier_tier_used_bytes" + label), t["used_bytes"].get<double>()) << label;
    EXPECT_EQ(Sample(p, "kvtier_tier_blocks" + label), t["blocks"].get<double>()) << label;
    EXPECT_EQ(Sample(p, "kvtier_tier_healthy" + label), t["health"] == "healthy" ? 1 : 0) << label;
  }
  EXPECT_EQ(Sample(p, "kvtier_tier_healthy{tier=\"memory\"}"), 0);
  // Tenants and sessions; label values are escaped.
  EXPECT_EQ(j["tenants"][0]["name"], "team\"a");
  StatusSnapshot with_hits = Distinct();
  TenantUsage& u = with_hits.tenants[0].usage;
  u.lookups = 11;
  u.lookup_hits = 7;
  u.blocks_hit = 20;
  u.blocks_hit_lane[0] = 5;
  u.blocks_hit_lane[1] = 3;
  u.tokens_queried = 640;
  u.tokens_hit = 320;
  const std::string detailed = PrometheusText(with_hits, true);
  // Per tenant: its lookups, and its hits by the tier they came from.
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_lookups_total{tenant=\"team\\\"a\"}"), 11);
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_lookup_hits_total{tenant=\"team\\\"a\"}"), 7);
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"host\"}"), 12);
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"nvme\"}"), 5);
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_blocks_hit_total{tenant=\"team\\\"a\",tier=\"remote\"}"), 3);
  EXPECT_EQ(Sample(detailed, "kvtier_tenant_tokens_reused_total{tenant=\"team\\\"a\"}"), 320);
  EXPECT_EQ(p.find("kvtier_tenant_"), std::string::npos) << "per-tenant series only where the operator opted in";
  EXPECT_EQ(Sample(detailed, "kvtier_host_block_size_bytes{tenant=\"team\\\"a\",slot_bytes=\"4096\",state=\"used\"}"), 8192);
  EXPECT_EQ(Sample(detailed, "kvtier_host_block_size_bytes{tenant=\"team\\\"a\",slot_bytes=\"4096\",state=\"idle\"}"),
            65536 - 8192 - 4096);
  // Without detail (no token, no metrics.per_tenant): summed, no tenant named.
  EXPECT_EQ(p.find("tenant=\""), std::string::npos) << p;
  EXPECT_EQ(Sample(p, "kvtier_host_block_size_bytes{slot_bytes=\"4096\",state=\"used\"}"), 8192);
  EXPECT_EQ(j["sessions"][0]["id"], 42);
  EXPECT_EQ(Sample(p, "kvtier_leases"), 6);
  EXPECT_EQ(Sample(p, "kvtier_pinned_blocks"), 19);
  // The cost model and latency.
  EXPECT_EQ(j["cost_model"]["prefill_tflops"], 123.5);
  EXPECT_EQ(Sample(p, "kvtier_cost_model_prefill_tflops"), 123.5);
  EXPECT_EQ(Sample(p, "kvtier_cost_model_nvme_read_gbps"), 2.25);
  EXPECT_EQ(Sample(p, "kvtier_cost_model_prefill_reports_total"), 31);
  EXPECT_EQ(j["latency"]["ops"]["lookup"]["count"], 1);
  EXPECT_EQ(Sample(p, "kvtier_op_latency_seconds_count{op=\"lookup\"}"), 1);
  EXPECT_EQ(Sample(p, "kvtier_op_latency_seconds_bucket{op=\"lookup\",le=\"2.5e-06\"}"), 0);
  EXPECT_EQ(Sample(p, "kvtier_op_latency_seconds_bucket{op=\"lookup\",le=\"5e-06\"}"), 1);
  EXPECT_EQ(j["latency"]["nvme_read"]["count"], 1);
  EXPECT_EQ(Sample(p, "kvtier_transfer_latency_seconds_count{direction=\"nvme_to_host\"}"), 1);
  EXPECT_DOUBLE_EQ(Sample(p, "kvtier_transfer_latency_seconds_sum{direction=\"nvme_to_host\"}"), 200e-6);
  EXPECT_FALSE(j["metrics"]["enabled"].get<bool>());
}

TEST(StatusSnapshotTest, ASnapshotKeepsItsValuesWhileTheCountersMove) {
  DaemonStats live;
  live.lookups.Add(3);
  live.nvme_read_latency.Record(1'000);
  StatusSnapshot s;
  s.stats = live;
  live.lookups.Add(5);
  live.nvme_read_latency.Record(1'000);
  EXPECT_EQ(s.stats.lookups.Get(), 3u);
  EXPECT_EQ(s.stats.nvme_read_latency.Get().count, 1u);
  EXPECT_EQ(StatusJson(s)["stats"]["lookups"], 3);
  EXPECT_EQ(live.lookups.Get(), 8u);
}

TEST(StatusSnapshotTest, WithoutALowerTierNothingIsInvented) {
  StatusSnapshot s;
  s.version = "1";
  const nlohmann::json j = StatusJson(s);
  ASSERT_EQ(j["tiers"].size(), 1u);
  const std::string p = PrometheusText(s);
  EXPECT_EQ(Sample(p, "kvtier_bytes_moved_total{direction=\"host_to_nvme\"}"), 0);
  EXPECT_EQ(Sample(p, "kvtier_tier_capacity_bytes{tier=\"nvme\"}"), -1) << "no tier row without the tier";
  EXPECT_EQ(Sample(p, "kvtier_sessions"), 0);
}

}  // namespace
}  // namespace kvtier
