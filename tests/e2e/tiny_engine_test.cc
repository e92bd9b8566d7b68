// SPDX-License-Identifier: Apache-2.0
// The tiny engine on a live kvtierd: greedy generation that reuses blocks
// from kvtier (host memory, NVMe, the simulated GPU tier, another session or
// process) gives logits bit-identical to recomputing everything, whether the
// engine copies blocks or registers its cache and loads layer by layer;
// INT8/FP8 blocks stay within a measured bound; another namespace or tenant
// never hits; weights load from safetensors.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "gtest/gtest.h"
#include "ipc/admin_client.h"
#include "kvtier/client.h"
#include "nlohmann/json.hpp"
#include "tests/support/test_support.h"
#include "tiny_engine.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint32_t kBlockTokens = 8;

tiny::ModelConfig Model() {
  return *tiny::ModelConfig::FromJson(R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 97})");
}

struct NsOptions {
  std::string revision = "r1", adapter, salt, codec = "none";
};

std::unique_ptr<Client> Attach(const DaemonProcess& d, const NsOptions& n = {}) {
  auto ns = tiny::NamespaceFor(Model(), kBlockTokens, "tiny/test", n.codec);
  EXPECT_TRUE(ns.ok()) << ns.status().ToString();
  if (!ns.ok()) return nullptr;
  AttachOptions o;
  o.socket_path = d.socket_path();
  o.ns = *ns;
  o.ns.model_revision = n.revision;
  o.ns.adapter_id = n.adapter;
  o.ns.cache_salt = n.salt;
  auto c = Client::Attach(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<uint32_t> Prompt(uint32_t n, uint32_t seed) {
  std::vector<uint32_t> p;
  for (uint32_t i = 0; i < n; ++i) p.push_back((seed * 131 + i * 17) % 97);
  return p;
}

// A daemon config with a 64 MiB NVMe tier under `data`.
std::string WithNvme(const testing::TempDir& data) {
  return "[tiers.nvme]\ndirs = [\"" + data.File("nvme") +
         "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n";
}

// Same tokens and bit-identical logits.
void ExpectSame(const tiny::GenerateResult& a, const tiny::GenerateResult& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)), 0)
        << "logits of generated token " << i;
  }
}

TEST(TinyEngineTest, ReuseFromHostMemoryIsBitIdentical) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Attach(d);
  ASSERT_NE(c, nullptr);
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  tiny::Engine cached(Model(), 1, kBlockTokens, 64, c.get());
  const auto prompt = Prompt(44, 1);
  auto want = plain.Generate(prompt, 6);
  ASSERT_TRUE(want.ok());
  auto first = cached.Generate(prompt, 6);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->reused_tokens, 0u);
  // 44 prompt tokens: 5 full blocks after prefill; 5 of the 6 generated
  // tokens are computed (49 tokens), filling a 6th block stored at the end.
  EXPECT_EQ(first->stored_blocks, 6u);
  ExpectSame(*want, *first);
  auto second = cached.Generate(prompt, 6);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->reused_tokens, 40u) << "5 blocks: the last prompt token is always computed";
  ExpectSame(*want, *second);
  // A longer prompt reuses the shared prefix, computes the rest, and still matches.
  auto longer = Prompt(44, 1);
  for (uint32_t t : Prompt(30, 9)) longer.push_back(t);
  auto want_longer = plain.Generate(longer, 4);
  auto got_longer = cached.Generate(longer, 4);
  ASSERT_TRUE(want_longer.ok() && got_longer.ok());
  EXPECT_EQ(got_longer->reused_tokens, 40u);
  ExpectSame(*want_longer, *got_longer);
  // The next turn of a chat: the prompt, the reply, a new message. The block
  // the reply completed is reused too.
  auto next_turn = prompt;
  next_turn.insert(next_turn.end(), first->tokens.begin(), first->tokens.end());
  for (uint32_t t : Prompt(12, 10)) next_turn.push_back(t);
  auto want_next = plain.Generate(next_turn, 3);
  auto got_next = cached.Generate(next_turn, 3);
  ASSERT_TRUE(want_next.ok() && got_next.ok());
  EXPECT_EQ(got_next->reused_tokens, 48u) << "6 blocks: the prompt's 5 and the one the reply filled";
  ExpectSame(*want_next, *got_next);
}

TEST(TinyEngineTest, ReuseAcrossSessionsAndFromNvmeIsBitIdentical) {
  testing::TempDir data;
  DaemonProcess d(WithNvme(data));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  const auto prompt = Prompt(57, 2);
  auto want = plain.Generate(prompt, 5);
  ASSERT_TRUE(want.ok());
  {
    auto writer = Attach(d);
    tiny::Engine e(Model(), 1, kBlockTokens, 64, writer.get());
    ASSERT_EQ(e.Generate(prompt, 5)->stored_blocks, 7u);
  }
  // Push every host block to NVMe, then reuse from another session.
  auto ev = ipc::AdminCall(d.admin_socket_path(), {{"cmd", "evict"}, {"tenant", "default"}});
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ((*ev)["evicted"], 7);
  auto reader = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, reader.get());
  auto keys = reader->ComputeKeys(prompt);
  auto probe = reader->Lookup(keys);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->tiers[0], TierKind::kNvme);
  auto got = e.Generate(prompt, 5);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->reused_tokens, 56u);
  ExpectSame(*want, *got);
}

// A block corrupted on disk is never served: the load stops before it, the
// engine recomputes from there, and the output is still exact.
TEST(TinyEngineTest, ACorruptedBlockFallsBackToRecomputeWithIdenticalOutput) {
  testing::TempDir data;
  DaemonProcess d(WithNvme(data));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  const auto prompt = Prompt(57, 4);
  auto want = plain.Generate(prompt, 5);
  ASSERT_TRUE(want.ok());
  auto c = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  ASSERT_EQ(e.Generate(prompt, 5)->stored_blocks, 7u);
  ASSERT_TRUE(ipc::AdminCall(d.admin_socket_path(), {{"cmd", "evict"}, {"tenant", "default"}}).ok());
  // The demotions' writes land before the byte is flipped.
  ASSERT_TRUE(testing::Eventually([&] {
    auto s = d.Status();
    return s.ok() && (*s)["tiers"][1]["blocks"] == 7 && (*s)["tiers"][1]["in_flight"] == 0 &&
           (*s)["tiers"][1]["queued"] == 0;
  }));
  // Flip a byte in the payload of the slab's first slot (reads are O_DIRECT).
  ASSERT_TRUE(testing::FlipByteOnDisk(data.File("nvme") + "/kvtier-slab.kvt", 4096 + 1234));
  auto got = e.Generate(prompt, 5);
  ASSERT_TRUE(got.ok());
  EXPECT_LT(got->reused_tokens, 56u) << "the corrupted block and what follows it are recomputed";
  ExpectSame(*want, *got);
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["tiers"][1]["checksum_failures"], 1);
}

// Two engine processes share a system prompt through the daemon, and an
// engine started after the first was killed with -9 reuses what it stored.
TEST(TinyEngineTest, EngineProcessesShareASystemPromptAcrossKillNine) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto system = Prompt(48, 5);  // 6 blocks
  auto with_user = [&](uint32_t seed) {
    auto p = system;
    for (uint32_t t : Prompt(20, seed)) p.push_back(t);
    return p;
  };
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t first = fork();
  ASSERT_GE(first, 0);
  if (first == 0) {
    auto c = Attach(d);
    tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
    auto r = e.Generate(with_user(1), 3);
    const char ok = r.ok() && r->stored_blocks == 8 ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    pause();  // killed here
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  EXPECT_EQ(ok, 'y');
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  // A new engine process-equivalent (own session) after the kill.
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  auto c = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  const auto prompt = with_user(2);
  auto want = plain.Generate(prompt, 3);
  auto got = e.Generate(prompt, 3);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->reused_tokens, 48u) << "the shared system prompt, stored by the killed engine";
  ExpectSame(*want, *got);
  EXPECT_TRUE(testing::Eventually([&] {
    auto s = d.Status();
    return s.ok() && (*s)["stats"]["sessions_closed_dead"] == 1;
  })) << "the daemon saw the first engine die";
}

TEST(TinyEngineTest, AnotherNamespaceNeverHits) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto r1 = Attach(d);
  tiny::Engine a(Model(), 1, kBlockTokens, 64, r1.get());
  const auto prompt = Prompt(40, 3);
  ASSERT_TRUE(a.Generate(prompt, 2).ok());
  // Another model revision, another adapter, another salt, another codec.
  for (const NsOptions& other : {NsOptions{.revision = "r2"}, NsOptions{.adapter = "lora-7"},
                                 NsOptions{.salt = "tenant-salt"}, NsOptions{.codec = "int8"}}) {
    auto c = Attach(d, other);
    ASSERT_NE(c, nullptr);
    tiny::EngineOptions eo;
    eo.codec = other.codec;
    tiny::Engine b(Model(), 1, kBlockTokens, 64, c.get(), eo);
    auto got = b.Generate(prompt, 2);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->reused_tokens, 0u) << "revision " << other.revision << " adapter " << other.adapter << " codec "
                                      << other.codec;
  }
  EXPECT_EQ(a.Generate(prompt, 2)->reused_tokens, 32u);
}

tiny::EngineOptions CopyPath() {
  tiny::EngineOptions eo;
  eo.path = tiny::EngineOptions::Path::kCopy;
  return eo;
}

// The engine that copies blocks (Load views, Store buffers) and the one that
// registers its cache read each other's blocks: one layout, exact either way.
TEST(TinyEngineTest, CopyAndRegisteredPathsShareBlocksExactly) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Attach(d);
  ASSERT_NE(c, nullptr);
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  tiny::Engine copy(Model(), 1, kBlockTokens, 64, c.get(), CopyPath());
  tiny::Engine reg(Model(), 1, kBlockTokens, 64, c.get());
  const auto a = Prompt(44, 11), b = Prompt(52, 12);
  auto want_a = plain.Generate(a, 4), want_b = plain.Generate(b, 4);
  ASSERT_TRUE(want_a.ok() && want_b.ok());
  ASSERT_EQ(copy.Generate(a, 4)->stored_blocks, 5u);
  ASSERT_EQ(reg.Generate(b, 4)->stored_blocks, 6u);
  auto reg_a = reg.Generate(a, 4);    // stored by the copy path, loaded layer by layer
  auto copy_b = copy.Generate(b, 4);  // stored by the daemon's gather, copied from views
  ASSERT_TRUE(reg_a.ok() && copy_b.ok());
  EXPECT_EQ(reg_a->reused_tokens, 40u);
  EXPECT_EQ(copy_b->reused_tokens, 48u);
  ExpectSame(*want_a, *reg_a);
  ExpectSame(*want_b, *copy_b);
  EXPECT_EQ(reg_a->layers_waited, Model().layers) << "the registered engine waits for each layer before using it";
  EXPECT_EQ(copy_b->layers_waited, 0u);
}

// Layer-by-layer loads from every tier of a daemon on the simulated device:
// host memory, then the GPU tier the first load promoted the blocks to.
TEST(TinyEngineTest, LayerWiseLoadsFromHostAndGpuTierAreBitIdentical) {
  DaemonProcess d("device = \"sim\"\n[tiers.gpu]\ncapacity = \"64KiB\"\n");  // 16 blocks of 4 KiB
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto gpu = [&](const char* key) {
    auto s = d.Status();
    if (!s.ok()) return -1;
    for (const auto& t : (*s)["tiers"]) {
      if (t["tier"] == "gpu") return t[key].get<int>();
    }
    return -1;
  };
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  const auto prompt = Prompt(60, 21);  // 7 blocks
  auto want = plain.Generate(prompt, 5);
  ASSERT_TRUE(want.ok());
  {
    // The writer copies through the host tier: nothing on the GPU tier yet.
    auto w = Attach(d);
    tiny::Engine writer(Model(), 1, kBlockTokens, 64, w.get(), CopyPath());
    ASSERT_EQ(writer.Generate(prompt, 5)->stored_blocks, 8u);  // 60 + 4 computed reply tokens
  }
  EXPECT_EQ(gpu("blocks"), 0);
  auto c = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  auto from_host = e.Generate(prompt, 5);
  ASSERT_TRUE(from_host.ok()) << from_host.status().ToString();
  EXPECT_EQ(from_host->reused_tokens, 56u);
  ExpectSame(*want, *from_host);
  EXPECT_EQ(gpu("hits"), 0);
  ASSERT_TRUE(testing::Eventually([&] { return gpu("blocks") == 7; })) << "the load promoted its blocks";
  auto from_gpu = e.Generate(prompt, 5);
  ASSERT_TRUE(from_gpu.ok());
  EXPECT_EQ(from_gpu->reused_tokens, 56u);
  ExpectSame(*want, *from_gpu);
  EXPECT_EQ(gpu("hits"), 7) << "the second load came from the GPU tier";
}

// On a device whose copies take time (the simulated device paced to 64 KiB/s:
// 7 blocks' layer, 14 KiB, takes ~220 ms), the engine computes layer 0 of the
// new tokens while layer 1 of the prefix is still on its way, and the output
// is still exact.
TEST(TinyEngineTest, LayerZeroIsComputedWhileLaterLayersArrive) {
  DaemonProcess d("device = \"sim\"\n[sim]\nbandwidth = \"64KiB\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  const auto prompt = Prompt(60, 22);
  auto want = plain.Generate(prompt, 3);
  ASSERT_TRUE(want.ok());
  {
    auto w = Attach(d);
    tiny::Engine writer(Model(), 1, kBlockTokens, 64, w.get(), CopyPath());
    ASSERT_EQ(writer.Generate(prompt, 1)->stored_blocks, 7u);
  }
  auto c = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  auto got = e.Generate(prompt, 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->reused_tokens, 56u);
  EXPECT_EQ(got->layers_in_at_first_compute, 1u) << "layer 0 ran with only layer 0 of the prefix in";
  // Each layer takes ~220 ms to land: waiting ~0.44 s in all means the engine
  // waited for layer 1 after computing layer 0, not only for layer 0.
  EXPECT_GT(got->load_wait_s, 0.3) << "then the engine waited for layer 1";
  ExpectSame(*want, *got);
}

// Largest |a - b| over every generated token's logits, and the largest |a|.
std::pair<double, double> LogitError(const tiny::GenerateResult& a, const tiny::GenerateResult& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i) {
    for (size_t v = 0; v < a.logits[i].size(); ++v) {
      worst = std::max(worst, std::fabs(double(a.logits[i][v]) - double(b.logits[i][v])));
      scale = std::max(scale, std::fabs(double(a.logits[i][v])));
    }
  }
  return {worst, scale};
}

// INT8 and FP8 blocks (quantized by the daemon's gather, restored by its
// scatter) are not exact; the error they put into the logits is measured
// against the stated bound: INT8 within 0.5% of the largest logit, FP8 (3
// mantissa bits) within 2% (measured here: 0.04% and 0.23%). Greedy tokens
// are compared only for INT8.
TEST(TinyEngineTest, QuantizedBlocksStayWithinTheStatedBound) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  const auto prompt = Prompt(73, 31);  // 9 blocks reused, 1 token computed after them
  auto want = plain.Generate(prompt, 6);
  ASSERT_TRUE(want.ok());
  for (auto [codec, bound] : {std::pair{"int8", 0.005}, std::pair{"fp8", 0.02}}) {
    auto c = Attach(d, {.codec = codec});
    ASSERT_NE(c, nullptr);
    tiny::EngineOptions eo;
    eo.codec = codec;
    tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get(), eo);
    auto first = e.Generate(prompt, 6);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ExpectSame(*want, *first);  // computed, not reused: exact
    auto reused = e.Generate(prompt, 6);
    ASSERT_TRUE(reused.ok());
    EXPECT_EQ(reused->reused_tokens, 72u) << codec;
    auto [worst, scale] = LogitError(*want, *reused);
    std::printf("[ measured ] %s blocks: max |dlogit| %.3e, max |logit| %.3e, ratio %.4f (bound %.2f)\n", codec,
                worst, scale, worst / scale, bound);
    EXPECT_GT(worst, 0.0) << codec << " blocks are lossy: an exact match means they were not quantized";
    EXPECT_LT(worst, bound * scale) << codec;
    if (std::string(codec) == "int8") {
      EXPECT_EQ(reused->tokens, want->tokens);
    }
  }
}

// An engine killed with -9 in the middle of its loads leaves the daemon
// consistent: its session, leases and registration go, and the next engine
// reuses the same blocks exactly. The simulated device is paced so that each
// load (14 blocks of 4 KiB) takes ~220 ms: the kills land inside one.
TEST(TinyEngineTest, AnEngineKilledMidLoadLeavesTheDaemonConsistent) {
  DaemonProcess d("device = \"sim\"\n[sim]\nbandwidth = \"256KiB\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto prompt = Prompt(120, 41);  // 14 blocks reused per load
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  auto want = plain.Generate(prompt, 3);
  ASSERT_TRUE(want.ok());
  {
    auto c = Attach(d);
    tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
    ASSERT_EQ(e.Generate(prompt, 3)->stored_blocks, 15u);
  }
  for (int round = 0; round < 3; ++round) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto c = Attach(d);
      tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
      const char go = 'g';
      (void)!write(ready[1], &go, 1);
      for (;;) (void)e.Generate(prompt, 1);  // loads, layer by layer, until killed
    }
    char go = 0;
    ASSERT_EQ(read(ready[0], &go, 1), 1);
    usleep(40000 + round * 30000);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    close(ready[0]);
    close(ready[1]);
  }
  ASSERT_TRUE(testing::Eventually([&] {
    auto s = d.Status();
    return s.ok() && (*s)["stats"]["sessions_closed_dead"] == 3 && (*s)["sessions"].empty();
  }, std::chrono::seconds(20))) << "the daemon saw every killed engine go";
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["tiers"][0]["pinned_blocks"], 0) << "no lease outlives its engine";
  auto c = Attach(d);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  auto got = e.Generate(prompt, 3);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->reused_tokens, 112u);
  ExpectSame(*want, *got);
}

// kvtier is a cache: when the daemon goes away the engine goes on computing
// everything, with the same output, and says what failed.
TEST(TinyEngineTest, TheEngineGoesOnWhenTheDaemonDies) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Attach(d);
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  tiny::Engine e(Model(), 1, kBlockTokens, 64, c.get());
  const auto prompt = Prompt(40, 71);
  auto want = plain.Generate(prompt, 3);
  ASSERT_EQ(e.Generate(prompt, 3)->stored_blocks, 5u);
  d.Kill(SIGKILL);
  ASSERT_NE(d.WaitExit(std::chrono::seconds(5)), -1);
  auto got = e.Generate(prompt, 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->reused_tokens, 0u);
  EXPECT_EQ(got->stored_blocks, 0u);
  EXPECT_FALSE(got->kvtier_error.empty());
  ExpectSame(*want, *got);
}

// Two tenants run the same engine on the same prompt: neither sees the
// other's blocks.
TEST(TinyEngineTest, TenantsNeverShareBlocks) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run an engine under another uid";
  DaemonProcess d(
      "[[tenants]]\nname = \"alpha\"\nuids = [0]\n"
      "[[tenants]]\nname = \"beta\"\nuids = [65534]\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto prompt = Prompt(40, 51);
  tiny::Engine plain(Model(), 1, kBlockTokens, 64, nullptr);
  auto want = plain.Generate(prompt, 3);
  auto alpha = Attach(d);
  ASSERT_NE(alpha, nullptr);
  ASSERT_EQ(alpha->tenant(), "alpha");
  tiny::Engine a(Model(), 1, kBlockTokens, 64, alpha.get());
  ASSERT_EQ(a.Generate(prompt, 3)->stored_blocks, 5u);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(10);
    auto beta = Attach(d);
    if (!beta || beta->tenant() != "beta") _exit(11);
    tiny::Engine b(Model(), 1, kBlockTokens, 64, beta.get());
    auto first = b.Generate(prompt, 3);
    if (!first.ok() || first->reused_tokens != 0) _exit(12);  // alpha's blocks are not beta's
    if (first->tokens != want->tokens) _exit(13);
    auto again = b.Generate(prompt, 3);
    _exit(again.ok() && again->reused_tokens == 32 ? 0 : 14);  // its own are
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  auto again = a.Generate(prompt, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->reused_tokens, 32u);
  ExpectSame(*want, *again);
}

// Weights written as safetensors and read back give the same model; F16
// weights load too; a bad file is refused with the tensor and the reason.
TEST(TinyEngineTest, SafetensorsWeightsLoadAndBadFilesAreRefused) {
  testing::TempDir dir;
  const tiny::ModelConfig m = Model();
  auto seeded = tiny::Weights::Seeded(m, 3);
  ASSERT_TRUE(seeded->SaveSafetensors(m, dir.File("w.safetensors")).ok());
  auto loaded = tiny::Weights::FromSafetensors(m, dir.File("w.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  tiny::Engine a(m, 3, kBlockTokens, 16, nullptr);
  tiny::Engine b(m, *loaded, kBlockTokens, 16, nullptr);
  const auto prompt = Prompt(20, 61);
  ExpectSame(*a.Generate(prompt, 4), *b.Generate(prompt, 4));

  std::ifstream in(dir.File("w.safetensors"), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t hlen = 0;
  std::memcpy(&hlen, file.data(), 8);
  const std::string header = file.substr(8, hlen), data = file.substr(8 + hlen);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.File(name), std::ios::binary | std::ios::trunc) << bytes;
    return dir.File(name);
  };
  auto with_header = [&](std::string h, const std::string& body) {
    std::string out(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    return out + h + body;
  };
  auto refused = [&](const std::string& path, const std::string& why) {
    auto w = tiny::Weights::FromSafetensors(m, path);
    EXPECT_FALSE(w.ok()) << path;
    if (!w.ok()) {
      EXPECT_NE(w.status().message().find(why), std::string::npos) << w.status().message();
    }
  };
  refused(dir.File("missing.safetensors"), "cannot open");
  refused(write("short", "abc"), "shorter than");
  refused(write("truncated", file.substr(0, file.size() - 100)), "data_offsets");
  std::string huge(8, '\xff');
  refused(write("huge", huge + header), "header length");
  refused(write("notjson", with_header("{not json", data)), "not a JSON object");
  std::string renamed = header;
  renamed.replace(renamed.find("model.norm.weight"), 17, "model.norx.weight");
  refused(write("renamed", with_header(renamed, data)), "model.norm.weight");
  // Another config: the first tensor's shape no longer fits.
  tiny::ModelConfig wider = m;
  wider.hidden = 128;
  auto w = tiny::Weights::FromSafetensors(wider, dir.File("w.safetensors"));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.embed_tokens.weight\" has shape [97,64]"), std::string::npos)
      << w.status().message();

  // F16: every tensor halved in size; the model is then close, not equal.
  auto j = nlohmann::json::parse(header);
  std::string body;
  for (auto& [name, e] : j.items()) {
    if (name == "__metadata__") continue;
    const uint64_t b0 = e["data_offsets"][0], b1 = e["data_offsets"][1];
    e["dtype"] = "F16";
    e["data_offsets"] = {body.size(), body.size() + (b1 - b0) / 2};
    for (uint64_t o = b0; o < b1; o += 4) {
      float f;
      std::memcpy(&f, data.data() + o, 4);
      const _Float16 h = static_cast<_Float16>(f);
      body.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  auto half = tiny::Weights::FromSafetensors(m, write("half", with_header(j.dump(), body)));
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  tiny::Engine c(m, *half, kBlockTokens, 16, nullptr);
  auto [worst, scale] = LogitError(*a.Generate(prompt, 1), *c.Generate(prompt, 1));
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(worst, 0.01 * scale) << "F16 weights are within rounding of the F32 ones";
}

TEST(TinyEngineTest, BadConfigsNameTheField) {
  auto m = tiny::ModelConfig::FromJson(R"({"num_hidden_layers": 2, "hidden_size": 64})");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads"), std::string::npos) << m.status().message();
  EXPECT_FALSE(tiny::ModelConfig::FromJson("not json").ok());
}

}  // namespace
}  // namespace kvtier
