// SPDX-License-Identifier: Apache-2.0
#include "policies/cost_model.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

constexpr const char* kLlama8B = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "torch_dtype": "bfloat16", "vocab_size": 128256})";

TEST(CostModelTest, ReadsAHuggingFaceConfig) {
  auto m = ModelProfile::FromHfConfig(kLlama8B, "llama");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->layers, 32u);
  EXPECT_EQ(m->kv_heads, 8u);
  EXPECT_EQ(m->head_dim, 128u) << "hidden / heads when head_dim is absent";
  EXPECT_EQ(m->dtype_bytes, 2u);
  // K and V, 32 layers, 8 KV heads of 128, bf16: the well-known 128 KiB per token.
  EXPECT_EQ(m->KvBytesPerToken(), 131072u);
  // Per token: twice the non-embedding parameters (6,979,321,856).
  EXPECT_DOUBLE_EQ(m->LinearFlops(1), 2.0 * 6979321856.0);
  EXPECT_EQ(ModelProfile::Default().KvBytesPerToken(), 131072u) << "the default is this shape";

  auto mha = ModelProfile::FromHfConfig(
      R"({"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
          "num_hidden_layers": 22, "head_dim": 64, "torch_dtype": "float32"})", "mha");
  ASSERT_TRUE(mha.ok()) << mha.status();
  EXPECT_EQ(mha->kv_heads, 16u) << "no num_key_value_heads: one per head";
  EXPECT_EQ(mha->head_dim, 64u);
  EXPECT_EQ(mha->dtype_bytes, 4u);
}

TEST(CostModelTest, BadConfigsNameTheField) {
  auto missing = ModelProfile::FromHfConfig(R"({"hidden_size": 4096})", "x.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_hidden_layers"), std::string::npos) << missing.status();
  auto negative = ModelProfile::FromHfConfig(
      R"({"hidden_size": 4096, "intermediate_size": 1, "num_attention_heads": -2, "num_hidden_layers": 2})", "x");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("num_attention_heads"), std::string::npos);
  EXPECT_FALSE(ModelProfile::FromHfConfig("not json", "x").ok());
  EXPECT_FALSE(ModelProfile::FromHfConfig(
                   R"({"hidden_size": 64, "intermediate_size": 1, "num_attention_heads": 4, "num_hidden_layers": 2,
                       "torch_dtype": "float128"})", "x")
                   .ok());
  EXPECT_FALSE(ModelProfile::FromHfConfigFile("/nonexistent/config.json").ok());
}

// A config.json is untrusted input (kvtierctl capacity, kvtier-replay,
// [cost_model] model_config): every hostile one is an error naming the field
// and what is wrong, on one line; never a crash, a wrapped size or a value
// read as some other type.
TEST(CostModelTest, HostileConfigsAreErrorsNamingTheField) {
  const std::string base = R"("num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128)";
  struct Case {
    std::string json;
    std::string field;  // the message must name it
  };
  const std::vector<Case> cases = {
      {"{" + base + R"(, "num_attention_heads": 0})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 4, "num_key_value_heads": 0})", "num_key_value_heads"},
      {"{" + base + R"(, "num_attention_heads": -4})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": "4"})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": [4]})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": {"n": 4}})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": true})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": null})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 4.5})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 1e300})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 18446744073709551615})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 9223372036854775808})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 4, "head_dim": "NaN"})", "head_dim"},
      {"{" + base + R"(, "num_attention_heads": 4, "head_dim": -1})", "head_dim"},
      {"{" + base + R"(, "num_attention_heads": 4, "torch_dtype": 16})", "torch_dtype"},
      {"{" + base + R"(, "num_attention_heads": 4, "torch_dtype": ["bfloat16"]})", "torch_dtype"},
      {"{" + base + R"(, "num_attention_heads": 4, "dtype": {"x": 1}})", "dtype"},
      {"{" + base + R"(, "num_attention_heads": 4, "torch_dtype": "\u001b[2Jevil"})", "torch_dtype"},
      // Each dimension in range, their product past 64 bits (2 x 2^24 x
      // 2^24 x 2^24 x 4 = 2^75, which wrapped to 0).
      {R"({"num_hidden_layers": 16777216, "hidden_size": 16777216, "intermediate_size": 1,
          "num_attention_heads": 16777216, "num_key_value_heads": 16777216, "head_dim": 16777216,
          "torch_dtype": "float32"})",
       "64 bits"},
      {R"([1, 2, 3])", "not a JSON object"},
      {R"("config")", "not a JSON object"},
      {R"(NaN)", "not valid JSON"},
      {R"({"num_hidden_layers": 2,)", "not valid JSON"},
      {std::string("\x7f\x45\x4c\x46\x02\x01\x01\x00\xff\xfe", 10), "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto m = ModelProfile::FromHfConfig(c.json, "config.json");
    ASSERT_FALSE(m.ok()) << c.json;
    const std::string msg(m.status().message());
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.json << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << "no control characters: " << msg;
  }
  // A text_config nested a million levels deep: copying it (or dump()ing
  // it) recursed once per level and overflowed the stack.
  const std::string deep = R"({"text_config": {"x": )" + std::string(1000000, '[') + std::string(1000000, ']') + "}}";
  auto m = ModelProfile::FromHfConfig(deep, "config.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("nested deeper than"), std::string::npos) << m.status();
}

TEST(CostModelTest, RecomputeCostGrowsWithPosition) {
  const ModelProfile m = ModelProfile::Default();
  double prev = 0;
  for (uint64_t p = 0; p <= 128 * 1024; p += 4096) {
    const double f = m.PrefillFlops(p, 512);
    EXPECT_GT(f, prev) << "position " << p;
    prev = f;
  }
  // The attention term alone, against a hand sum of (t + 1) over the block.
  double pairs = 0;
  for (uint64_t t = 1000; t < 1016; ++t) pairs += double(t + 1);
  EXPECT_DOUBLE_EQ(m.AttentionFlops(1000, 16), 4.0 * 32 * 128 * pairs * 32);
}

TEST(CostModelTest, CalibrationConvergesOnSyntheticMeasurements) {
  PrefillCalibration cal(100e12);
  EXPECT_DOUBLE_EQ(cal.flops_per_second(), 100e12) << "the prior until there is a fit";
  const ModelProfile m = ModelProfile::Default();
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint64_t> pos(0, 60000), len(64, 8192);
  std::normal_distribution<double> noise(1.0, 0.02);
  for (int i = 0; i < 400; ++i) {
    const double f = m.PrefillFlops(pos(rng), len(rng));
    cal.Add(f, (f / 250e12 + 0.002) * noise(rng));
  }
  EXPECT_NEAR(cal.flops_per_second() / 250e12, 1.0, 0.03);
  EXPECT_NEAR(cal.overhead_s(), 0.002, 0.0015);
  EXPECT_GT(cal.r_squared(), 0.95);
  EXPECT_EQ(cal.samples(), 400u);
  // Garbage is ignored, not fitted.
  cal.Add(-1, 1);
  cal.Add(1e12, std::nan(""));
  EXPECT_EQ(cal.samples(), 400u);
}

TEST(CostModelTest, ASlowTierIsNeverChosenOverRecomputation) {
  const ModelProfile m = ModelProfile::Default();
  PrefillCalibration cal;
  const uint64_t bytes = 512 * m.KvBytesPerToken();  // 64 MiB
  // A block at the start of a prompt costs ~24 ms to recompute at 300 TFLOP/s.
  const TierSpeed slow_disk{500e6, 100e-6};  // 0.13 s for 64 MiB
  const TierSpeed host{20e9, 5e-6};          // 3.4 ms
  EXPECT_EQ(DecideHit(m, cal, 0, 512, bytes, slow_disk), HitDecision::kRecompute);
  EXPECT_EQ(DecideHit(m, cal, 0, 512, bytes, host), HitDecision::kLoad);
  // Deep in a long prompt the attention term makes the same disk worth it.
  EXPECT_EQ(DecideHit(m, cal, 1 << 20, 512, bytes, slow_disk), HitDecision::kLoad);
  // Whatever the numbers: load only when loading is faster.
  std::mt19937 rng(9);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t p = rng() % 200000, n = 16 + rng() % 1024;
    const TierSpeed t{double(1 + rng() % 40000) * 1e6, double(rng() % 5000) * 1e-6};
    const uint64_t b = n * m.KvBytesPerToken();
    const double load = t.LoadSeconds(b), recompute = m.PrefillFlops(p, n) / cal.flops_per_second();
    ASSERT_EQ(DecideHit(m, cal, p, n, b, t), load < recompute ? HitDecision::kLoad : HitDecision::kRecompute);
  }
}

}  // namespace
}  // namespace kvtier
