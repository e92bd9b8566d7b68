// SPDX-License-Identifier: Apache-2.0
// The daemon's cost model: engine reports calibrate the prefill throughput,
// its own NVMe reads measure the tier, and the two decide load or recompute.
#include "store/cost_tracker.h"

#include <chrono>
#include <random>
#include <thread>

#include "core/units.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

// Llama-3.1-8B shape: 128 KiB of KV per token.
constexpr uint64_t kKvPerToken = 128 << 10;

TEST(CostTrackerTest, RefusesReportsThatAreNotMeasurements) {
  CostTracker c({});
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(0, 0, 0.1)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(0, 100, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(0, 100, -1)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(0, 100, 7200)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(0, 1ull << 30, 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.ReportPrefill(1ull << 30, 10, 1)));
  EXPECT_EQ(c.ToJson()["prefill_reports"], 0);
  EXPECT_DOUBLE_EQ(c.prefill_flops_per_s(), 300e12) << "the prior stays";
}

TEST(CostTrackerTest, EngineReportsCalibrateThePrefillThroughput) {
  CostTracker c({});
  const ModelProfile m = ModelProfile::Default();
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint64_t> tokens(256, 8192), cached(0, 16384);
  std::normal_distribution<double> noise(1.0, 0.02);
  for (int i = 0; i < 200; ++i) {
    const uint64_t p = cached(rng), n = tokens(rng);
    // A GPU at 150 TFLOP/s with 5 ms of fixed cost per prefill.
    const double seconds = (m.PrefillFlops(p, n) / 150e12 + 0.005) * noise(rng);
    ASSERT_TRUE(c.ReportPrefill(p, n, seconds).ok());
  }
  const auto j = c.ToJson();
  EXPECT_EQ(j["prefill_reports"], 200);
  EXPECT_TRUE(j["prefill_fitted"].get<bool>());
  EXPECT_NEAR(j["prefill_tflops"].get<double>(), 150, 7.5);
  EXPECT_NEAR(j["prefill_overhead_s"].get<double>(), 0.005, 0.002);
  EXPECT_GT(j["prefill_r_squared"].get<double>(), 0.95);
}

TEST(CostTrackerTest, NvmeSpeedIsThePriorUntilMeasuredThenFitted) {
  CostTracker c({.nvme_prior = TierSpeed{3e9, 100e-6}});
  for (int i = 0; i < 7; ++i) c.RecordNvmeRead(1 << 20, 0.01);
  EXPECT_DOUBLE_EQ(c.nvme_speed().bytes_per_second, 3e9) << "7 reads are not enough to trust";
  // Reads of two sizes at 2 GB/s + 50 us (enough of them for the early,
  // slower reads to have decayed away).
  for (int i = 0; i < 1000; ++i) {
    const uint64_t bytes = (i % 2 ? 256u : 2048u) << 10;
    c.RecordNvmeRead(bytes, 50e-6 + double(bytes) / 2e9);
  }
  EXPECT_NEAR(c.nvme_speed().bytes_per_second, 2e9, 0.05e9);
  EXPECT_NEAR(c.nvme_speed().latency_s, 50e-6, 5e-6);
  EXPECT_TRUE(c.ToJson()["nvme_measured"].get<bool>());
}

TEST(CostTrackerTest, ReadsOfOneSizeChargeTheTimeToBandwidth) {
  CostTracker c({.nvme_prior = TierSpeed{3e9, 100e-6}});
  for (int i = 0; i < 100; ++i) c.RecordNvmeRead(1 << 20, 1.1e-3);  // 1 MiB in 1.1 ms
  const TierSpeed s = c.nvme_speed();
  EXPECT_NEAR(s.LoadSeconds(1 << 20), 1.1e-3, 1e-5) << "the model reproduces what was measured";
}

TEST(CostTrackerTest, OnlyBlocksOfTheProfilesShapeArePriced) {
  CostTracker c({});
  EXPECT_TRUE(c.Prices(512 * kKvPerToken, 512, 1));
  EXPECT_TRUE(c.Prices(512 * kKvPerToken / 2, 512, 1)) << "8-bit KV";
  EXPECT_TRUE(c.Prices(512 * kKvPerToken / 4, 512, 4)) << "one of 4 tensor-parallel ranks";
  EXPECT_FALSE(c.Prices(64 << 10, 16, 1)) << "4 KiB per token is another model";
  EXPECT_FALSE(c.Prices(512 * kKvPerToken, 0, 1));
}

TEST(CostTrackerTest, ASlowTierLosesToRecomputeAndDepthMakesLoadingWorthIt) {
  const uint64_t block = 512 * kKvPerToken;  // 64 MiB
  // Recomputing 512 tokens at position 0 takes ~24 ms at 300 TFLOP/s.
  CostTracker fast({.nvme_prior = TierSpeed{10e9, 100e-6}});
  EXPECT_FALSE(fast.RecomputeBeatsNvme(0, 512, block, 1)) << "6.7 ms to read";
  CostTracker slow({.nvme_prior = TierSpeed{0.5e9, 2e-3}});
  EXPECT_TRUE(slow.RecomputeBeatsNvme(0, 512, block, 1)) << "136 ms to read";
  // The attention term grows with position: deep enough, loading wins, and
  // stays won.
  uint64_t first_load = 0;
  for (uint64_t pos = 0; pos <= 2'000'000; pos += 512) {
    if (!slow.RecomputeBeatsNvme(pos, 512, block, 1)) {
      first_load = pos;
      break;
    }
  }
  ASSERT_GT(first_load, 0u);
  for (uint64_t pos = first_load; pos <= first_load + 100 * 512; pos += 512) {
    EXPECT_FALSE(slow.RecomputeBeatsNvme(pos, 512, block, 1)) << pos;
  }
  CostTracker off({.nvme_prior = TierSpeed{0.5e9, 2e-3}, .decide = false});
  EXPECT_FALSE(off.RecomputeBeatsNvme(0, 512, block, 1)) << "decisions off: always load";
  EXPECT_FALSE(slow.RecomputeBeatsNvme(0, 16, 64 << 10, 1)) << "blocks of another model are not priced";
}

TEST(CostTrackerTest, MeasuredReadsReplaceTheOptimisticPrior) {
  const uint64_t block = 512 * kKvPerToken;
  CostTracker c({.nvme_prior = TierSpeed{10e9, 100e-6}});
  EXPECT_FALSE(c.RecomputeBeatsNvme(0, 512, block, 1));
  for (int i = 0; i < 50; ++i) c.RecordNvmeRead(block, 0.2);  // the device is far slower than believed
  EXPECT_TRUE(c.RecomputeBeatsNvme(0, 512, block, 1));
}

// Each tier of the chain has its own speed: reads of a slow tier below NVMe
// make copies there lose to recomputation while NVMe copies still load, and
// NVMe's calibration does not count decisions against another tier.
TEST(CostTrackerTest, EachLowerTierIsPricedAtItsOwnMeasuredSpeed) {
  const uint64_t block = 512 * kKvPerToken;  // ~24 ms to recompute at position 0
  CostTracker c({.nvme_prior = TierSpeed{10e9, 100e-6}});
  EXPECT_TRUE(c.ToJson()["lower_tiers"].is_null()) << "no tier below NVMe seen yet";
  for (int i = 0; i < 50; ++i) c.RecordRead(0, block, 0.0067);  // NVMe measured at its prior's 10 GB/s
  for (int i = 0; i < 50; ++i) c.RecordRead(1, block, 0.5);  // tier 1: 0.13 GB/s
  EXPECT_NEAR(c.nvme_speed().bytes_per_second, 10e9, 0.3e9) << "NVMe keeps its own speed";
  EXPECT_NEAR(c.speed(1).LoadSeconds(block), 0.5, 1e-3);
  EXPECT_FALSE(c.RecomputeBeats(0, 0, 512, block, 1)) << "6.7 ms from NVMe";
  EXPECT_TRUE(c.RecomputeBeats(1, 0, 512, block, 1)) << "500 ms from tier 1";
  EXPECT_FALSE(c.WantsNvmeCalibration(MonotonicNanos() + 3'000'000'000ull))
      << "a decision against tier 1 asks no NVMe calibration (NVMe is measured and quiet)";
  // An unmeasured tier is priced at its prior.
  c.SetTierPrior(2, TierSpeed{0.1e9, 10e-3});
  EXPECT_TRUE(c.RecomputeBeats(2, 0, 512, block, 1));
  const nlohmann::json j = c.ToJson();
  ASSERT_EQ(j["lower_tiers"].size(), 2u);
  EXPECT_EQ(j["lower_tiers"][0]["chain_position"], 1);
  EXPECT_TRUE(j["lower_tiers"][0]["measured"].get<bool>());
  EXPECT_EQ(j["lower_tiers"][0]["reads_measured"], 50);
  EXPECT_NEAR(j["lower_tiers"][0]["read_gbps"].get<double>(), block / 0.5 / 1e9, 0.01);
  EXPECT_EQ(j["lower_tiers"][1]["chain_position"], 2);
  EXPECT_FALSE(j["lower_tiers"][1]["measured"].get<bool>());
  EXPECT_DOUBLE_EQ(j["lower_tiers"][1]["read_gbps"].get<double>(), 0.1);
  c.RecordRead(CostTracker::kMaxTiers, block, 1.0);  // out of range: ignored, not a crash
  EXPECT_EQ(c.ToJson()["lower_tiers"].size(), 2u);
}

// A tier below NVMe gets no calibration reads: measured slow once, its
// copies would lose every decision, never be read again, and stay priced
// slow for good. A fit with no read for lower_fit_stale_ns gives way to the
// prior, so the tier is tried again.
TEST(CostTrackerTest, ALowerTierMeasuredSlowIsTriedAgainOnceItsFitIsStale) {
  const uint64_t block = 512 * kKvPerToken;
  // Stale after a second: far longer than a loaded machine takes between
  // two lines of this test, so "just measured" is never already stale.
  CostTracker c({.nvme_prior = TierSpeed{10e9, 100e-6}, .lower_fit_stale_ns = 1'000'000'000});
  for (int i = 0; i < 50; ++i) {
    c.RecordRead(1, block, 0.5);
    c.RecordRead(0, block, 0.5);
  }
  EXPECT_TRUE(c.RecomputeBeats(1, 0, 512, block, 1)) << "just measured slow";
  EXPECT_TRUE(c.RecomputeBeats(0, 0, 512, block, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE(c.RecomputeBeats(1, 0, 512, block, 1)) << "stale: priced at its prior again";
  // NVMe's fit never goes stale: calibration reads keep it fresh instead.
  EXPECT_TRUE(c.RecomputeBeats(0, 0, 512, block, 1));
  c.RecordRead(1, block, 0.5);
  EXPECT_TRUE(c.RecomputeBeats(1, 0, 512, block, 1)) << "a fresh read brings the fit back";
}

// The lock-out: measured slow once, the tier loses every decision, nothing
// is read from it any more, and with only reads to learn from the estimate
// would never change. The tracker asks for calibration reads when decisions
// went against NVMe and no read came for a while; a device that recovered is
// trusted again after ~10 rounds of 32 reads (one round per quiet 2 s in the
// daemon: about 20 s).
TEST(CostTrackerTest, ATierJudgedSlowAsksForCalibrationAndIsTrustedAgainWhenItRecovers) {
  const uint64_t block = 512 * kKvPerToken;  // 64 MiB: ~24 ms to recompute at position 0
  CostTracker c({.nvme_prior = TierSpeed{10e9, 100e-6}});
  for (int i = 0; i < 50; ++i) c.RecordNvmeRead(block, 1.0);  // 0.067 GB/s
  const uint64_t now = MonotonicNanos();
  const uint64_t later = now + 3'000'000'000ull;
  EXPECT_FALSE(c.WantsNvmeCalibration(later)) << "no decision went against NVMe yet";
  ASSERT_TRUE(c.RecomputeBeatsNvme(0, 512, block, 1));
  EXPECT_FALSE(c.WantsNvmeCalibration(now)) << "a read was measured just now";
  EXPECT_TRUE(c.WantsNvmeCalibration(later));
  EXPECT_FALSE(c.WantsNvmeCalibration(later)) << "once per spell of decisions against it";
  CostTracker off({.nvme_prior = TierSpeed{10e9, 100e-6}, .decide = false});
  for (int i = 0; i < 50; ++i) off.RecordNvmeRead(block, 1.0);
  (void)off.RecomputeBeatsNvme(0, 512, block, 1);
  EXPECT_FALSE(off.WantsNvmeCalibration(later)) << "decisions off: nothing to calibrate";
  // The device recovered (10 GB/s): calibration rounds of 32 reads.
  int rounds = 0;
  while (c.RecomputeBeatsNvme(0, 512, block, 1) && rounds < 100) {
    for (int i = 0; i < 32; ++i) c.RecordNvmeRead(block, 0.0067);
    ++rounds;
  }
  EXPECT_LE(rounds, 12) << "rounds until NVMe is trusted again";
  EXPECT_GE(rounds, 2) << "one fast read does not undo fifty slow ones";
}

}  // namespace
}  // namespace kvtier
