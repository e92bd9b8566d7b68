// SPDX-License-Identifier: Apache-2.0
// tiny-engine-bench: time to first token of the tiny engine on a 4096-token
// prompt whose first 3584 tokens kvtier holds, against the same
// prompt with no cache, per tier the prefix comes from:
//  - host:  pinned host memory of a daemon with host + NVMe tiers;
//  - nvme:  the same daemon after `evict` pushed the blocks to NVMe;
//  - gpu:   the GPU tier of a daemon on the simulated device;
//  - on a CUDA device (where one answers, unless --device sim): the engine
//    running on the GPU, its cache in device memory, from host memory and
//    from the GPU tier, against the same engine on the GPU with no cache.
// The engine registers its cache and loads layer by layer. Each repetition
// asks a new question after the cached prefix (the 512 tokens after it
// differ), and its own blocks are invalidated after it, so no run reuses
// more than the prefix. Medians.
//
//   tiny-engine-bench engine [--json] [--quick] [--pairs N] [--device sim] [--kvtierd PATH]
//
// It shares kvtier-bench's command line and table (tools/bench) but is its
// own binary, not installed: kvtier-bench does not link the example engine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ipc/admin_client.h"
#include "tiny_engine.h"
#include "tiers/device_backend.h"
#include "tools/bench/bench.h"
#include "tools/bench/driver.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kBlockTokens = 16;

tiny::ModelConfig BenchModel() {
  // 2 layers, 4 heads of 32 over 2 KV heads: a 4k prefill takes seconds in f32
  // on one CPU core, mostly attention, as in a real model at long context.
  return *tiny::ModelConfig::FromJson(R"({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 512})");
}

std::vector<uint32_t> Tokens(uint32_t n, uint32_t seed, uint32_t vocab) {
  std::vector<uint32_t> t;
  uint64_t x = seed * 2654435761u + 1;
  for (uint32_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<uint32_t>(x >> 33) % vocab);
  }
  return t;
}

struct Run {
  double ttft = 0, wait = 0;
  uint32_t reused = 0;
};

// The daemon's host tier has nothing queued for NVMe and nothing in flight.
bool WaitNvmeIdle(const tools::DaemonProcess& d) {
  for (int i = 0; i < 1000; ++i) {
    auto s = d.Status();
    if (s.ok()) {
      for (const auto& t : (*s)["tiers"]) {
        if (t["tier"] == "nvme" && t["in_flight"] == 0 && t["queued"] == 0) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::unique_ptr<Client> AttachEngine(const tools::DaemonProcess& d) {
  auto ns = tiny::NamespaceFor(BenchModel(), kBlockTokens, "kvtier-bench/tiny");
  if (!ns.ok()) return nullptr;
  AttachOptions o;
  o.socket_path = d.socket_path();
  o.client_name = "kvtier-bench-engine";
  o.ns = *ns;
  auto c = Client::Attach(o);
  if (!c.ok()) {
    std::fprintf(stderr, "tiny-engine-bench: attach: %s\n", c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*c);
}


std::vector<Metric> RunEngineSuite(const Context& ctx) {
  const tiny::ModelConfig m = BenchModel();
  const uint32_t prompt_tokens = ctx.quick ? 512 : 4096, cached_tokens = prompt_tokens / 8 * 7;
  const int reps = ctx.pairs > 0 ? ctx.pairs : (ctx.quick ? 1 : 3);
  const uint32_t pages = prompt_tokens / kBlockTokens + 8;
  const auto weights = tiny::Weights::Seeded(m, 1);
  const std::vector<uint32_t> prefix = Tokens(cached_tokens, 1, m.vocab);
  auto prompt = [&](int rep) {
    std::vector<uint32_t> p = prefix;
    for (uint32_t t : Tokens(prompt_tokens - cached_tokens, 100 + rep, m.vocab)) p.push_back(t);
    return p;
  };
  std::fprintf(stderr, "tiny-engine-bench: %u-token prompts, the first %u cached; %d repetition(s) per tier\n",
               prompt_tokens, cached_tokens, reps);

  bool exact = true;
  struct Baseline {
    double ttft = 0;
    std::vector<std::vector<float>> logits;  // per repetition
  };
  // No cache: the whole prompt computed.
  auto baseline = [&](const char* label, const tiny::EngineOptions& eo) -> std::optional<Baseline> {
    Baseline b;
    std::vector<double> ttft;
    tiny::Engine e(m, weights, kBlockTokens, pages, nullptr, eo);
    for (int r = 0; r < reps; ++r) {
      auto g = e.Generate(prompt(r), 1);
      if (!g.ok()) {
        std::fprintf(stderr, "tiny-engine-bench: %s: %s\n", label, g.status().ToString().c_str());
        return std::nullopt;
      }
      ttft.push_back(g->ttft_s);
      b.logits.push_back(g->logits[0]);
      std::fprintf(stderr, "  %-14s  rep %d: TTFT %.1f ms\n", label, r + 1, g->ttft_s * 1e3);
    }
    b.ttft = Median(ttft);
    return b;
  };
  // One tier's runs: `before` readies the tier ahead of each repetition.
  auto measure = [&](const char* tier, Client* c, const std::function<bool()>& before, const tiny::EngineOptions& eo,
                     const Baseline& base) -> std::optional<Run> {
    std::vector<double> ttft, wait, reused;
    tiny::Engine e(m, weights, kBlockTokens, pages, c, eo);
    for (int r = 0; r < reps; ++r) {
      if (before && !before()) return std::nullopt;
      auto g = e.Generate(prompt(r), 1);
      if (!g.ok()) {
        std::fprintf(stderr, "tiny-engine-bench: %s: %s\n", tier, g.status().ToString().c_str());
        return std::nullopt;
      }
      // The question's own blocks go, so the next tier reuses only the prefix.
      const auto keys = c->ComputeKeys(prompt(r));
      if (!c->Invalidate(std::span(keys).subspan(cached_tokens / kBlockTokens)).ok()) return std::nullopt;
      exact &= g->logits[0] == base.logits[r];
      ttft.push_back(g->ttft_s);
      wait.push_back(g->load_wait_s);
      reused.push_back(g->reused_tokens);
      std::fprintf(stderr, "  %-14s  rep %d: TTFT %.1f ms (%u tokens reused, %.1f ms waiting for layers)\n", tier,
                   r + 1, g->ttft_s * 1e3, g->reused_tokens, g->load_wait_s * 1e3);
    }
    return Run{Median(ttft), Median(wait), static_cast<uint32_t>(Median(reused))};
  };
  // Stores the cached prefix through an engine of its own (its prompt is the
  // prefix and one more token, so every prefix block is full and stored).
  auto populate = [&](Client* c, const tiny::EngineOptions& eo) {
    tiny::Engine e(m, weights, kBlockTokens, pages, c, eo);
    std::vector<uint32_t> p = prefix;
    p.push_back(0);
    auto g = e.Generate(p, 1);
    return g.ok() && g->stored_blocks == cached_tokens / kBlockTokens;
  };
  // Loads the prefix once through a registered cache: the daemon promotes
  // what it took from host memory to its GPU tier.
  auto warm = [&](Client* c, const tiny::EngineOptions& eo) {
    tiny::Engine e(m, weights, kBlockTokens, pages, c, eo);
    std::vector<uint32_t> p = prefix;
    p.push_back(1);
    auto g = e.Generate(p, 1);
    return g.ok() && g->reused_tokens == cached_tokens;
  };
  // A GPU-tier figure must have come from the GPU tier.
  auto gpu_hits = [](const tools::DaemonProcess& d) {
    auto s = d.Status();
    if (s.ok()) {
      for (const auto& t : (*s)["tiers"]) {
        if (t["tier"] == "gpu") return t["hits"].get<int64_t>();
      }
    }
    return int64_t{-1};
  };
  const int64_t want_gpu_hits = int64_t{reps} * (cached_tokens / kBlockTokens);

  std::vector<Metric> out;
  auto add = [&](const char* tier, const Run& run, const char* baseline_name, double base_ttft) {
    char note[128];
    std::snprintf(note, sizeof(note), "%u of %u tokens reused; %.2f ms waiting for layers", run.reused,
                  prompt_tokens, run.wait * 1e3);
    out.push_back(Metric{"engine", absl::StrCat("ttft_", tier), run.ttft * 1e3, baseline_name, base_ttft * 1e3, "ms",
                         LowerIsBetter(run.ttft, base_ttft), std::nullopt, note});
  };
  auto start = [&](tools::DaemonProcess& d) {
    if (absl::Status s = d.Start(); !s.ok()) {
      std::fprintf(stderr, "tiny-engine-bench: cannot start kvtierd: %s\n", std::string(s.message()).c_str());
      return false;
    }
    return true;
  };
  const tiny::EngineOptions cpu;
  tiny::EngineOptions copy;  // through the host tier only
  copy.path = tiny::EngineOptions::Path::kCopy;
  const std::optional<Baseline> base = baseline("recompute", cpu);
  if (!base) return {};
  {
    tools::TempDir data;
    const std::string config = absl::StrCat("[tiers.host]\ncapacity = \"64MiB\"\n[tiers.nvme]\ndirs = [\"",
                                            data.File("nvme"), "\"]\ncapacity = \"256MiB\"\n");
    tools::DaemonProcess d(config, ctx.kvtierd);
    if (!start(d)) return {};
    auto c = AttachEngine(d);
    if (c == nullptr || !populate(c.get(), copy)) return {};
    // NVMe first: every repetition starts with the tenant's blocks pushed out.
    auto to_nvme = [&] {
      auto ev = ipc::AdminCall(d.admin_socket_path(), {{"cmd", "evict"}, {"tenant", "default"}});
      return ev.ok() && WaitNvmeIdle(d);
    };
    auto nvme = measure("nvme", c.get(), to_nvme, cpu, *base);
    if (!nvme) return {};
    // What the NVMe loads brought back stays in host memory.
    auto host = measure("host", c.get(), {}, cpu, *base);
    if (!host) return {};
    add("host", *host, "no_cache", base->ttft);
    add("nvme", *nvme, "no_cache", base->ttft);
  }
  {
    tools::DaemonProcess d("device = \"sim\"\n[tiers.host]\ncapacity = \"64MiB\"\n[tiers.gpu]\ncapacity = \"64MiB\"\n",
                           ctx.kvtierd);
    if (!start(d)) return {};
    auto c = AttachEngine(d);
    if (c == nullptr || !populate(c.get(), copy) || !warm(c.get(), cpu)) return {};
    const int64_t hits = gpu_hits(d);
    auto gpu = measure("gpu(sim)", c.get(), {}, cpu, *base);
    if (!gpu) return {};
    if (gpu_hits(d) - hits < want_gpu_hits) {
      std::fprintf(stderr, "tiny-engine-bench: the GPU tier served %lld of %lld blocks\n",
                   static_cast<long long>(gpu_hits(d) - hits), static_cast<long long>(want_gpu_hits));
      return {};
    }
    add("gpu_sim", *gpu, "no_cache", base->ttft);
  }
  // The engine on a CUDA device, where one answers: from host memory and from
  // the GPU tier, against the CUDA engine with no cache.
  std::string why;
  if (ctx.device != "cuda" || ProbeCudaDevices(&why) == 0) {
    std::fprintf(stderr, "tiny-engine-bench: CUDA engine figures skipped (%s)\n",
                 ctx.device != "cuda" ? "--device sim" : why.c_str());
  } else {
    tiny::EngineOptions gpu_engine;
    gpu_engine.device = tiny::EngineOptions::Device::kCuda;
    const std::optional<Baseline> cuda_base = baseline("cuda recompute", gpu_engine);
    if (!cuda_base) return {};
    for (bool gpu_tier : {false, true}) {
      tools::DaemonProcess d(gpu_tier ? "device = \"cuda\"\n[tiers.host]\ncapacity = \"64MiB\"\n[tiers.gpu]\n"
                                        "capacity = \"64MiB\"\n"
                                      : "device = \"cuda\"\n[tiers.host]\ncapacity = \"64MiB\"\n",
                             ctx.kvtierd);
      if (!start(d)) return {};
      auto c = AttachEngine(d);
      if (c == nullptr || !populate(c.get(), gpu_engine) || (gpu_tier && !warm(c.get(), gpu_engine))) return {};
      const int64_t hits = gpu_hits(d);
      auto run = measure(gpu_tier ? "cuda gpu tier" : "cuda host", c.get(), {}, gpu_engine, *cuda_base);
      if (!run) return {};
      if (gpu_tier && gpu_hits(d) - hits < want_gpu_hits) {
        std::fprintf(stderr, "tiny-engine-bench: the GPU tier served %lld of %lld blocks\n",
                     static_cast<long long>(gpu_hits(d) - hits), static_cast<long long>(want_gpu_hits));
        return {};
      }
      add(gpu_tier ? "cuda_gpu_tier" : "cuda_host", *run, "cuda_no_cache", cuda_base->ttft);
    }
  }
  if (!exact) {
    std::fprintf(stderr, "tiny-engine-bench: a run with reuse gave other logits than recomputing\n");
    return {};
  }
  for (Metric& mt : out) mt.note += "; logits bit-identical to no cache";
  return out;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  return kvtier::bench::BenchMain(
      argc, argv, "tiny-engine-bench",
      {{"engine",
        "time to first token of the tiny engine, 4096-token prompt with 3584 cached, per tier\n"
        "                (host, NVMe, GPU tier on the simulated device; CUDA rows where a device\n"
        "                answers) vs no cache (--pairs N: repetitions)",
        kvtier::bench::RunEngineSuite}});
}
