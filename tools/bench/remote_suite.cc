// SPDX-License-Identifier: Apache-2.0
// remote: the remote tier against a plain pipelined hiredis loop on the
// same Redis Cluster node, the same keys, sizes and depth, in the same run.
//
//   - put/get of 256 KiB and 2 MiB blocks, 8 in flight: RemoteTier::Write
//     and Read (header, checksum, the AES-GCM seal under a throwaway key,
//     ACL user, the cluster client's routing and node thread) against
//     SET/GET pipelined 8 deep on one hiredis context;
//   - put with the tenant's budget on (the ledger script before each SET);
//   - a 64-block probe (RemoteTier::Exists) against one pipelined round trip
//     of 64 EXISTS to one node.
// Every key is chosen to hash to one primary, so both sides talk to the
// same node. The cluster is the one scripts/redis-cluster started in
// --cluster DIR with a tenant "bench" (its ACL user and password file).
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <latch>
#include <semaphore>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/units.h"
#include "tiers/remote_tier.h"
#include "tools/bench/bench.h"

namespace kvtier::bench {
namespace {

constexpr int kDepth = 8;
constexpr int kKeys = 32;

std::string ReadLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Setup {
  RemoteTierOptions opts;
  std::string host;  // the primary every key hashes to
  int port = 0;
  std::vector<bool> owned;  // the slots it holds
};

// The seeds and the bench tenant's credentials from DIR, and the first
// primary in CLUSTER SLOTS with the slots it holds.
std::optional<Setup> Load(const std::string& dir) {
  Setup s;
  std::ifstream env(dir + "/cluster.env");
  std::string line;
  while (std::getline(env, line)) {
    if (line.rfind("SEEDS=", 0) == 0) s.opts.seeds = absl::StrSplit(line.substr(6), ',');
  }
  const std::string pass = ReadLine(dir + "/tenants/bench.pass");
  if (s.opts.seeds.empty() || pass.empty()) {
    std::fprintf(stderr, "kvtier-bench remote: %s has no cluster.env or tenants/bench.pass; start one with "
                         "scripts/redis-cluster start %s --tenant bench\n", dir.c_str(), dir.c_str());
    return std::nullopt;
  }
  // A throwaway sealing key: the bench measures the tier as it runs, seals included.
  std::string hex;
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  for (int i = 0; i < 32; ++i) absl::StrAppend(&hex, absl::Hex(static_cast<uint8_t>(urandom.get()), absl::kZeroPad2));
  absl::StatusOr<SealKey> key = ParseSealKey(hex);
  if (!key.ok()) return std::nullopt;
  s.opts.tenants.push_back({"bench", "kvtier-bench", pass, {*key}});
  s.opts.op_timeout_ms = 5000;
  s.opts.io_timeout_ms = 5000;
  auto cluster = RedisCluster::Create({.seeds = s.opts.seeds, .user = "kvtier-bench", .password = pass});
  if (!cluster.ok() || !(*cluster)->WaitForMap(5000)) {
    std::fprintf(stderr, "kvtier-bench remote: the cluster in %s does not answer\n", dir.c_str());
    return std::nullopt;
  }
  absl::StatusOr<RedisReply> slots = (*cluster)->Call(RedisCommand::Keyless({"CLUSTER", "SLOTS"}), 5000);
  absl::StatusOr<std::vector<SlotRange>> ranges =
      slots.ok() ? ParseClusterSlots(slots->get(), "127.0.0.1") : absl::StatusOr<std::vector<SlotRange>>(slots.status());
  if (!ranges.ok() || ranges->empty()) return std::nullopt;
  s.host = ranges->front().host;
  s.port = ranges->front().port;
  s.owned.assign(RedisCluster::kSlots, false);
  for (const SlotRange& r : *ranges) {
    if (r.host == s.host && r.port == s.port) {
      for (uint32_t slot = r.first; slot <= r.last; ++slot) s.owned[slot] = true;
    }
  }
  return s;
}

struct Node {
  redisContext* c = nullptr;
  ~Node() {
    if (c) redisFree(c);
  }
};

bool Auth(redisContext* c, const std::string& user, const std::string& pass) {
  redisReply* r = static_cast<redisReply*>(redisCommand(c, "AUTH %s %s", user.c_str(), pass.c_str()));
  const bool ok = r != nullptr && r->type != REDIS_REPLY_ERROR;
  if (r) freeReplyObject(r);
  return ok;
}

}  // namespace

std::vector<Metric> RunRemoteSuite(const Context& ctx) {
  std::optional<Setup> setup = Load(ctx.cluster);
  if (!setup) return {};
  auto tier_or = RemoteTier::Create(setup->opts);
  if (!tier_or.ok()) return {};
  RemoteTier& tier = **tier_or;
  // The same tenant with a budget (no evictions: the keys repeat): each
  // write first runs the ledger script on the ledger's node.
  RemoteTierOptions budget_opts = setup->opts;
  budget_opts.tenants[0].budget_bytes = uint64_t{1} << 40;
  auto budget_or = RemoteTier::Create(budget_opts);
  if (!budget_or.ok()) return {};
  RemoteTier& budget_tier = **budget_or;
  Node base;
  base.c = redisConnect(setup->host.c_str(), setup->port);
  if (base.c == nullptr || base.c->err || !Auth(base.c, "kvtier-bench", setup->opts.tenants[0].password)) {
    std::fprintf(stderr, "kvtier-bench remote: cannot connect to %s:%d as kvtier-bench\n", setup->host.c_str(),
                 setup->port);
    return {};
  }
  const std::vector<bool>& owned = setup->owned;  // keys are picked whose slot that node holds
  const int pairs = ctx.pairs > 0 ? ctx.pairs : (ctx.quick ? 1 : 5);
  std::vector<Metric> out;
  for (uint64_t bytes : {uint64_t{256} << 10, uint64_t{2} << 20}) {
    const std::string size = bytes == (256u << 10) ? "256KiB" : "2MiB";
    const int ops = ctx.quick ? 16 : (bytes == (256u << 10) ? 512 : 96);
    std::vector<BlockMeta> metas;
    std::vector<std::string> keys;
    std::vector<SlotHandle> slots, budget_slots;
    for (uint64_t i = 0; metas.size() < kKeys; ++i) {
      BlockMeta m;
      m.ns.bytes.fill(0x42);
      std::memcpy(m.key.bytes.data(), &i, sizeof(i));
      m.key.bytes[8] = static_cast<uint8_t>(bytes >> 16);
      m.payload_bytes = bytes;
      m.tenant_hash = TenantHash("bench");
      const std::string key = tier.KeyFor("bench", m);
      if (!owned[RedisCluster::KeySlot(key)]) continue;
      metas.push_back(m);
      keys.push_back(key);
      slots.push_back(*tier.Reserve(BlockMeta{.payload_bytes = bytes}));
      budget_slots.push_back(*budget_tier.Reserve(BlockMeta{.payload_bytes = bytes}));
    }
    std::vector<std::byte> payload(bytes);
    for (uint64_t i = 0; i < bytes; ++i) payload[i] = std::byte(i * 131 + 7);
    // Baseline values: as large as ours (header included), so the bytes moved agree.
    const std::string value(sizeof(RemoteValueHeader) + bytes, 'v');
    std::vector<std::byte> dst(bytes * kDepth);

    // kDepth of the tier's writes (or reads) in flight at once.
    auto ours = [&](bool put, bool budgeted = false) {
      RemoteTier& t = budgeted ? budget_tier : tier;
      const std::vector<SlotHandle>& ts = budgeted ? budget_slots : slots;
      std::counting_semaphore<kDepth> room(kDepth);
      std::atomic<int> failed{0};
      std::latch done(ops);
      auto finished = [&](absl::Status s) {
        if (!s.ok()) ++failed;
        room.release();
        done.count_down();
      };
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < ops; ++i) {
        room.acquire();
        if (put) {
          t.Put(ts[i % kKeys], metas[i % kKeys], payload, IoPriority::kDemote, finished);
        } else {
          std::span<std::byte> d(dst.data() + (i % kDepth) * bytes, bytes);
          t.Get(ts[i % kKeys], metas[i % kKeys], d, IoPriority::kLoad, finished);
        }
      }
      done.wait();
      return failed == 0 ? double(ops) * bytes / Seconds(t0) / 1e9 : 0.0;
    };
    // A steady pipeline of kDepth commands on one context.
    auto base_loop = [&](bool put) {
      int outstanding = 0, failed = 0;
      auto reap = [&] {
        void* r = nullptr;
        if (redisGetReply(base.c, &r) != REDIS_OK || r == nullptr) {
          ++failed;
          return;
        }
        auto* rep = static_cast<redisReply*>(r);
        if (rep->type == REDIS_REPLY_ERROR || (!put && rep->type != REDIS_REPLY_STRING)) ++failed;
        if (!put && rep->type == REDIS_REPLY_STRING) std::memcpy(dst.data(), rep->str, std::min<size_t>(rep->len, bytes));
        freeReplyObject(rep);
        --outstanding;
      };
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < ops; ++i) {
        const std::string& k = keys[i % kKeys];
        if (put) {
          const char* argv[] = {"SET", k.c_str(), value.data()};
          const size_t len[] = {3, k.size(), value.size()};
          redisAppendCommandArgv(base.c, 3, argv, len);
        } else {
          const char* argv[] = {"GET", k.c_str()};
          const size_t len[] = {3, k.size()};
          redisAppendCommandArgv(base.c, 2, argv, len);
        }
        if (++outstanding == kDepth) reap();
      }
      while (outstanding > 0 && failed == 0) reap();
      return failed == 0 ? double(ops) * bytes / Seconds(t0) / 1e9 : 0.0;
    };
    // Warm both paths (connections, the keys' values) once.
    (void)ours(true);
    (void)ours(true, true);
    (void)base_loop(true);
    std::vector<double> put_ratio, get_ratio, put_ours, put_base, get_ours, get_base, budget_ours, budget_ratio;
    for (int p = 0; p < pairs; ++p) {
      const double bp = base_loop(true), op = ours(true), bup = ours(true, true);
      (void)ours(true);  // our values back under the keys the reads check
      const double bg = base_loop(false);
      const double og = ours(false);
      if (bp == 0 || op == 0 || bg == 0 || og == 0 || bup == 0) {
        std::fprintf(stderr, "kvtier-bench remote: a %s run failed\n", size.c_str());
        return {};
      }
      put_ours.push_back(op);
      put_base.push_back(bp);
      get_ours.push_back(og);
      get_base.push_back(bg);
      put_ratio.push_back(op / bp);
      get_ratio.push_back(og / bg);
      budget_ours.push_back(bup);
      budget_ratio.push_back(bup / bp);
      if (!ctx.json) {
        std::printf("remote %s pair %d: put %.2f GB/s (with a budget %.2f; hiredis %.2f), get %.2f GB/s (hiredis %.2f)\n",
                    size.c_str(), p + 1, op, bup, bp, og, bg);
      }
    }
    const std::string note = absl::StrCat(ops, " blocks of ", size, ", ", kDepth, " in flight, on one primary; median of ",
                                          pairs, " pairs");
    out.push_back(Metric{"remote", "put_GBps_" + size, Median(put_ours), "hiredis_pipelined_set", Median(put_base),
                         "GB/s", Median(put_ratio), 0.9, note});
    out.push_back(Metric{"remote", "put_budget_GBps_" + size, Median(budget_ours), "hiredis_pipelined_set",
                         Median(put_base), "GB/s", Median(budget_ratio), 0.8,
                         note + "; each write runs the tenant's ledger script first"});
    out.push_back(Metric{"remote", "get_GBps_" + size, Median(get_ours), "hiredis_pipelined_get", Median(get_base),
                         "GB/s", Median(get_ratio), 0.9, note});
    for (SlotHandle s : slots) (void)tier.Remove(s, BlockMeta{});
    for (SlotHandle s : budget_slots) (void)budget_tier.Remove(s, BlockMeta{});
  }
  // A 64-block probe against one pipelined round trip of 64 EXISTS.
  std::vector<BlockMeta> chain;
  std::vector<std::string> chain_keys;
  for (uint64_t i = 0; i < 64; ++i) {
    BlockMeta m;
    m.ns.bytes.fill(0x43);
    std::memcpy(m.key.bytes.data(), &i, sizeof(i));
    m.payload_bytes = 4096;
    m.tenant_hash = TenantHash("bench");
    chain.push_back(m);
    chain_keys.push_back(tier.KeyFor("bench", m));
  }
  const int probes = ctx.quick ? 20 : 400;
  std::vector<double> ours_us, base_us;
  for (int i = 0; i < probes; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::latch done(1);
    tier.Exists(chain, [&](std::vector<bool>) { done.count_down(); }, 0);
    done.wait();
    ours_us.push_back(Seconds(t0) * 1e6);
    t0 = std::chrono::steady_clock::now();
    for (const std::string& k : chain_keys) {
      const char* argv[] = {"EXISTS", k.c_str()};
      const size_t len[] = {6, k.size()};
      redisAppendCommandArgv(base.c, 2, argv, len);
    }
    for (size_t k = 0; k < chain_keys.size(); ++k) {
      void* r = nullptr;
      if (redisGetReply(base.c, &r) == REDIS_OK && r != nullptr) freeReplyObject(r);
    }
    base_us.push_back(Seconds(t0) * 1e6);
  }
  out.push_back(Metric{"remote", "probe_64_blocks_p50", Median(ours_us), "one_node_pipelined_exists",
                       Median(base_us), "us", LowerIsBetter(Median(ours_us), Median(base_us)), std::nullopt,
                       "64 EXISTS: ours over every node that holds one (3 here), the baseline to one node "
                       "(MOVED replies for keys it does not own count as answers)"});
  return out;
}

}  // namespace kvtier::bench
