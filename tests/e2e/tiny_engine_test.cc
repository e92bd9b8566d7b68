// The tiny engine on a live kvtierd: greedy generation that reuses blocks
// from kvtier (host memory, NVMe, another session) gives logits bit-identical
// to recomputing everything; another namespace never hits.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "ipc/admin_client.h"
#include "kvtier/client.h"
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

std::unique_ptr<Client> Attach(const DaemonProcess& d, const std::string& revision = "r1") {
  tiny::Engine probe(Model(), 1, kBlockTokens, 1, nullptr);
  AttachOptions o;
  o.socket_path = d.socket_path();
  o.ns.model_id = "tiny/test";
  o.ns.model_revision = revision;
  o.ns.kv_dtype = "f32";
  o.ns.kv_layout = "layer_major";
  o.ns.block_tokens = kBlockTokens;
  o.ns.block_bytes = probe.block_bytes();
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
  EXPECT_EQ(first->stored_blocks, 5u);  // 44 tokens: 5 full blocks of 8
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
  auto r1 = Attach(d, "r1");
  auto r2 = Attach(d, "r2");  // another model revision
  tiny::Engine a(Model(), 1, kBlockTokens, 64, r1.get());
  tiny::Engine b(Model(), 1, kBlockTokens, 64, r2.get());
  const auto prompt = Prompt(40, 3);
  ASSERT_TRUE(a.Generate(prompt, 2).ok());
  auto other = b.Generate(prompt, 2);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->reused_tokens, 0u);
  EXPECT_EQ(a.Generate(prompt, 2)->reused_tokens, 32u);
}

TEST(TinyEngineTest, BadConfigsNameTheField) {
  auto m = tiny::ModelConfig::FromJson(R"({"num_hidden_layers": 2, "hidden_size": 64})");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads"), std::string::npos) << m.status().message();
  EXPECT_FALSE(tiny::ModelConfig::FromJson("not json").ok());
}

}  // namespace
}  // namespace kvtier
