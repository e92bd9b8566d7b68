// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/nodes_sim.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "tools/replay/sim_tier.h"

namespace kvtier::tools {

double NodesSimRow::TtftPercentile(double pct) const {
  return TtftPercentileOf(ttft_s, pct);
}

nlohmann::json NodesSimRow::ToJson() const {
  const double req = blocks_requested ? double(blocks_requested) : 1;
  return nlohmann::json{{"nodes", nodes},
                        {"routing", routing},
                        {"pooled", pooled},
                        {"remote_blocks", remote_blocks},
                        {"requests", requests},
                        {"token_hit_rate", token_hit_rate()},
                        {"token_hit_rate_host", double(blocks_hit_host) / req},
                        {"token_hit_rate_nvme", double(blocks_hit_nvme) / req},
                        {"token_hit_rate_remote", double(blocks_hit_remote) / req},
                        {"ttft_p50_s", TtftPercentile(50)},
                        {"ttft_p95_s", TtftPercentile(95)},
                        {"blocks_requested", blocks_requested},
                        {"blocks_hit", blocks_hit},
                        {"remote_hits_recomputed", remote_hits_recomputed},
                        {"remote_writes", remote_writes},
                        {"remote_evictions", remote_evictions},
                        {"bytes_read_remote", bytes_read_remote},
                        {"bytes_written_remote", bytes_written_remote},
                        {"requests_per_node", requests_per_node},
                        {"seconds", seconds}};
}

namespace {

struct Node {
  SimTier host, nvme;
  bool with_nvme = false;
  std::priority_queue<double, std::vector<double>, std::greater<double>> gpu_free;
};

// Per request, its conversation: that of the earlier request whose whole
// chain this one's chain extends most deeply (else its own). A turn is
// continued by one later turn only: a prompt many requests start with (a
// shared system prompt sent alone once) does not make them one
// conversation.
std::vector<uint32_t> Conversations(const Prepared& p) {
  std::vector<uint32_t> conv(p.ids.size());
  absl::flat_hash_map<uint32_t, uint32_t> by_last;  // a request's last block -> its conversation
  for (size_t r = 0; r < p.ids.size(); ++r) {
    conv[r] = static_cast<uint32_t>(r);
    const std::vector<uint32_t>& ids = p.ids[r];
    // The deepest block of this chain that ended an earlier request.
    for (size_t j = ids.size(); j-- > 0;) {
      auto it = by_last.find(ids[j]);
      if (it != by_last.end()) {
        conv[r] = it->second;
        by_last.erase(it);
        break;
      }
    }
    if (!ids.empty()) by_last.try_emplace(ids.back(), conv[r]);
  }
  return conv;
}

uint32_t Mix(uint32_t x) {
  uint64_t z = uint64_t{x} + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

}  // namespace

absl::StatusOr<NodesSimRow> SimulateNodes(const Workload& w, const NodesSimOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const SimOptions& so = opts.node;
  if (opts.nodes == 0) return absl::InvalidArgumentError("the simulation needs at least one node");
  if (so.gpus == 0) return absl::InvalidArgumentError("the simulation needs at least one GPU per node");
  if (so.capacity_blocks == 0) return absl::InvalidArgumentError("the simulated host tier has no capacity");
  if (std::find(std::begin(kRoutings), std::end(kRoutings), opts.routing) == std::end(kRoutings)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown routing \"", opts.routing, "\" (round-robin, affinity or prefix)"));
  }
  const bool committed = opts.write_policy == "committed";
  if (!committed && opts.write_policy != "demoted") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown write policy \"", opts.write_policy, "\" (demoted or committed)"));
  }
  const std::string host_policy = so.policies.empty() ? so.default_policy : so.policies.front();
  if (host_policy == "belady" || host_policy == "none" || host_policy == "infinite") {
    return absl::InvalidArgumentError("--nodes simulates an online host policy (not belady, none or infinite)");
  }
  if (so.nvme_blocks > 0 && IsHostOnlyPolicy(so.nvme_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the NVMe tier's policy cannot be ", so.nvme_policy, " (as in the daemon)"));
  }
  const Prepared p = Prepare(w, /*with_next_use=*/false);
  std::vector<Node> nodes(opts.nodes);
  for (Node& n : nodes) {
    RETURN_IF_ERROR(n.host.Init(host_policy, p.distinct, so.capacity_blocks, p.parent, so.max_shadow_blocks));
    n.with_nvme = so.nvme_blocks > 0;
    if (n.with_nvme) RETURN_IF_ERROR(n.nvme.Init(so.nvme_policy, p.distinct, so.nvme_blocks, p.parent));
    for (uint32_t g = 0; g < so.gpus; ++g) n.gpu_free.push(0);
  }
  const bool pooled = opts.remote_blocks > 0;
  SimTier remote;
  if (pooled) RETURN_IF_ERROR(remote.Init("lru", p.distinct, opts.remote_blocks, p.parent));
  const std::vector<uint32_t> conv = opts.routing == "affinity" ? Conversations(p) : std::vector<uint32_t>{};

  const PrefillCalibration cal(so.prefill_flops_per_s);
  const uint64_t bt = w.block_tokens;
  const uint64_t block_bytes = bt * so.model.KvBytesPerToken();
  NodesSimRow row;
  row.nodes = opts.nodes;
  row.routing = opts.routing;
  row.pooled = pooled;
  row.remote_blocks = opts.remote_blocks;
  row.requests_per_node.assign(opts.nodes, 0);
  row.ttft_s.reserve(w.requests.size());
  // Per node, the request that pins each block (its hit prefix, while it runs).
  std::vector<std::vector<uint32_t>> pinned(opts.nodes, std::vector<uint32_t>(p.distinct, UINT32_MAX));
  std::vector<uint64_t> chain;

  auto remote_put = [&](uint32_t id) {
    if (remote.Has(id)) return;
    remote.Access(id, 0);
    ++row.remote_writes;
    row.bytes_written_remote += block_bytes;
    while (remote.count > remote.capacity) {
      std::optional<uint32_t> v = remote.pol->PickVictim([](uint32_t) { return true; });
      if (!v) break;
      remote.Drop(*v);
      ++row.remote_evictions;
    }
  };
  auto local_prefix = [&](const Node& n, const std::vector<uint32_t>& ids) {
    size_t k = 0;
    while (k < ids.size() && (n.host.Has(ids[k]) || (n.with_nvme && n.nvme.Has(ids[k])))) ++k;
    return k;
  };

  for (size_t r = 0; r < w.requests.size(); ++r) {
    const Request& req = w.requests[r];
    const std::vector<uint32_t>& ids = p.ids[r];
    if (ids.size() > so.capacity_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r + 1, " has ", ids.size(),
                                                     " blocks, more than a simulated node's host tier holds (",
                                                     so.capacity_blocks, "); give it more capacity"));
    }
    // Route.
    uint32_t k = 0;
    if (opts.routing == "round-robin") {
      k = static_cast<uint32_t>(r % opts.nodes);
    } else if (opts.routing == "affinity") {
      k = Mix(conv[r]) % opts.nodes;
    } else {
      // The node where the request would start soonest and compute least:
      // its queue's wait plus the prefill of what its local tiers lack (a
      // KV-aware router's estimate; loads are left out, as they are small
      // beside prefill).
      double best = 0;
      for (uint32_t i = 0; i < opts.nodes; ++i) {
        const uint64_t got = std::min<uint64_t>(local_prefix(nodes[i], ids) * bt, req.prompt_tokens);
        const double wait = std::max(0.0, nodes[i].gpu_free.top() - double(req.arrival_ms) / 1000.0);
        const double est = wait + so.model.PrefillFlops(got, req.prompt_tokens - got) / cal.flops_per_second();
        if (i == 0 || est < best) {
          best = est;
          k = i;
        }
      }
    }
    Node& n = nodes[k];
    ++row.requests_per_node[k];
    ++row.requests;
    row.prompt_tokens += req.prompt_tokens;
    row.blocks_requested += ids.size();

    // The loaded prefix: host, NVMe, then the remote tier.
    size_t hit = 0, from_nvme = 0, from_remote = 0;
    double load_s = 0;
    for (; hit < ids.size(); ++hit) {
      const uint32_t id = ids[hit];
      if (n.host.Has(id)) {
        load_s += so.host.LoadSeconds(block_bytes);
        continue;
      }
      if (n.with_nvme && n.nvme.Has(id)) {
        if (so.cost_aware_loads &&
            DecideHit(so.model, cal, hit * bt, bt, block_bytes, so.nvme) == HitDecision::kRecompute) {
          break;
        }
        load_s += so.nvme.LoadSeconds(block_bytes) + so.host.LoadSeconds(block_bytes);
        ++from_nvme;
        continue;
      }
      if (pooled && remote.Has(id)) {
        if (so.cost_aware_loads &&
            DecideHit(so.model, cal, hit * bt, bt, block_bytes, opts.remote) == HitDecision::kRecompute) {
          ++row.remote_hits_recomputed;
          break;
        }
        // The run's reads are pipelined: one round trip for all of them.
        load_s += (from_remote == 0 ? opts.remote.latency_s : 0) +
                  double(block_bytes) / opts.remote.bytes_per_second + so.host.LoadSeconds(block_bytes);
        remote.pol->Touch(id);
        ++from_remote;
        continue;
      }
      break;
    }
    row.blocks_hit += hit;
    row.blocks_hit_nvme += from_nvme;
    row.blocks_hit_remote += from_remote;
    row.blocks_hit_host += hit - from_nvme - from_remote;
    row.bytes_read_remote += from_remote * block_bytes;

    const uint64_t reused = std::min<uint64_t>(hit * bt, req.prompt_tokens);
    const double compute_s = so.model.PrefillFlops(reused, req.prompt_tokens - reused) / cal.flops_per_second();
    const double arrival = double(req.arrival_ms) / 1000.0;
    const double start = std::max(arrival, n.gpu_free.top());
    n.gpu_free.pop();
    const double done = start + load_s + compute_s + so.prefill_overhead_s;
    n.gpu_free.push(done);
    row.ttft_s.push_back(done - arrival);

    if (n.host.Observes()) n.host.Observe(ids, bt, hit, chain);
    std::vector<uint32_t>& pin = pinned[k];
    for (size_t j = 0; j < hit; ++j) pin[ids[j]] = static_cast<uint32_t>(r);
    for (size_t j = ids.size(); j-- > 0;) {
      const uint32_t id = ids[j];
      const bool computed = j >= hit;
      n.host.Access(id, j * bt);
      if (n.with_nvme && n.nvme.Has(id)) n.nvme.Access(id, j * bt);
      if (pooled && committed && computed) remote_put(id);
    }
    while (n.host.count > n.host.capacity) {
      std::optional<uint32_t> v = n.host.pol->PickVictim([&](uint32_t h) { return pin[h] != r; });
      if (!v) break;
      n.host.Drop(*v);
      if (!n.with_nvme) {
        if (pooled) remote_put(*v);  // the last local tier is host memory
        continue;
      }
      if (n.nvme.Has(*v)) continue;
      n.nvme.Access(*v, 0);
      while (n.nvme.count > n.nvme.capacity) {
        std::optional<uint32_t> nv = n.nvme.pol->PickVictim([](uint32_t) { return true; });
        if (!nv) break;
        n.nvme.Drop(*nv);
        if (pooled) remote_put(*nv);
      }
    }
    if (n.host.count > n.host.capacity) {
      return absl::InternalError(absl::StrCat("policy ", host_policy, " found no victim at request ", r + 1));
    }
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

}  // namespace kvtier::tools
