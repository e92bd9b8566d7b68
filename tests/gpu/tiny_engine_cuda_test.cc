// SPDX-License-Identifier: Apache-2.0
// The tiny engine on a CUDA device (skipped, exit 77, where none answers):
// its kernels agree with the CPU path within rounding, and with a daemon on
// the same GPU (device = "cuda") reuse through the registered device cache
// (StoreFromCache from device pages, layer-wise LoadIntoCache with the
// engine's stream waiting on the daemon's CUDA IPC events) is bit-identical
// to recomputing on the GPU, from host memory and from the GPU tier.
#include <cmath>
#include <cstring>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/test_support.h"
#include "tiny_engine.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint32_t kBlockTokens = 16;

tiny::ModelConfig Model() {
  return *tiny::ModelConfig::FromJson(R"({"num_hidden_layers": 3, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 211})");
}

tiny::EngineOptions Cuda(std::string codec = "none") {
  tiny::EngineOptions eo;
  eo.device = tiny::EngineOptions::Device::kCuda;
  eo.codec = std::move(codec);
  return eo;
}

std::vector<uint32_t> Prompt(uint32_t n, uint32_t seed) {
  std::vector<uint32_t> p;
  for (uint32_t i = 0; i < n; ++i) p.push_back((seed * 131 + i * 17) % 211);
  return p;
}

std::unique_ptr<Client> Attach(const DaemonProcess& d, const std::string& codec = "none") {
  auto ns = tiny::NamespaceFor(Model(), kBlockTokens, "tiny/cuda-test", codec);
  EXPECT_TRUE(ns.ok());
  AttachOptions o;
  o.socket_path = d.socket_path();
  o.ns = *ns;
  auto c = Client::Attach(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

void ExpectSame(const tiny::GenerateResult& a, const tiny::GenerateResult& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)), 0)
        << "logits of generated token " << i;
  }
}

double MaxError(const tiny::GenerateResult& a, const tiny::GenerateResult& b, double* scale) {
  double worst = 0;
  *scale = 0;
  for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i) {
    for (size_t v = 0; v < a.logits[i].size(); ++v) {
      worst = std::max(worst, std::fabs(double(a.logits[i][v]) - double(b.logits[i][v])));
      *scale = std::max(*scale, std::fabs(double(a.logits[i][v])));
    }
  }
  return worst;
}

TEST(TinyEngineCudaTest, KernelsAgreeWithTheCpuWithinRounding) {
  tiny::Engine cpu(Model(), 1, kBlockTokens, 32, nullptr);
  tiny::Engine gpu(Model(), 1, kBlockTokens, 32, nullptr, Cuda());
  const auto prompt = Prompt(100, 1);
  auto a = cpu.Generate(prompt, 6);
  auto b = gpu.Generate(prompt, 6);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  double scale = 0;
  const double worst = MaxError(*a, *b, &scale);
  std::printf("[ measured ] CUDA vs CPU logits: max |d| %.3e of max |logit| %.3e\n", worst, scale);
  EXPECT_LT(worst, 1e-4 * std::max(1.0, scale));
  EXPECT_EQ(a->tokens, b->tokens);
}

TEST(TinyEngineCudaTest, ReuseThroughTheDeviceCacheIsBitIdentical) {
  DaemonProcess d("device = \"cuda\"\n[tiers.gpu]\ncapacity = \"16MiB\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 32, nullptr, Cuda());
  const auto prompt = Prompt(150, 2);  // 9 blocks reusable
  auto want = plain.Generate(prompt, 5);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto c = Attach(d);
  ASSERT_NE(c, nullptr);
  tiny::Engine e(Model(), 1, kBlockTokens, 32, c.get(), Cuda());
  auto first = e.Generate(prompt, 5);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->reused_tokens, 0u);
  EXPECT_GE(first->stored_blocks, 9u);
  ExpectSame(*want, *first);
  for (int round = 0; round < 2; ++round) {  // from host memory, then from the GPU tier
    auto again = e.Generate(prompt, 5);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->reused_tokens, 144u) << "round " << round;
    EXPECT_EQ(again->layers_waited, Model().layers);
    ExpectSame(*want, *again);
  }
  // Another engine (its own session and device cache) reuses the same blocks.
  auto c2 = Attach(d);
  tiny::Engine other(Model(), 1, kBlockTokens, 32, c2.get(), Cuda());
  auto shared = other.Generate(prompt, 5);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->reused_tokens, 144u);
  ExpectSame(*want, *shared);
}

TEST(TinyEngineCudaTest, Int8BlocksFromTheDeviceStayWithinTheBound) {
  DaemonProcess d("device = \"cuda\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  tiny::Engine plain(Model(), 1, kBlockTokens, 32, nullptr, Cuda());
  const auto prompt = Prompt(97, 3);
  auto want = plain.Generate(prompt, 4);
  ASSERT_TRUE(want.ok());
  auto c = Attach(d, "int8");
  tiny::Engine e(Model(), 1, kBlockTokens, 32, c.get(), Cuda("int8"));
  ASSERT_TRUE(e.Generate(prompt, 4).ok());
  auto reused = e.Generate(prompt, 4);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused->reused_tokens, 96u);
  double scale = 0;
  const double worst = MaxError(*want, *reused, &scale);
  std::printf("[ measured ] CUDA int8 blocks: max |dlogit| %.3e of %.3e\n", worst, scale);
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(worst, 0.005 * scale);
}

TEST(TinyEngineCudaTest, TheCopyPathIsRefusedOnCuda) {
  DaemonProcess d("device = \"cuda\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Attach(d);
  tiny::EngineOptions eo = Cuda();
  eo.path = tiny::EngineOptions::Path::kCopy;
  tiny::Engine e(Model(), 1, kBlockTokens, 32, c.get(), eo);
  auto r = e.Generate(Prompt(20, 4), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("CPU"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvtier
