// SPDX-License-Identifier: Apache-2.0
#include "store/cost_tracker.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {
namespace {

// Weight of the past per new NVMe read: about the last hundred reads count.
constexpr double kReadDecay = 0.99;
constexpr uint64_t kMaxReportTokens = 1ull << 24;

}  // namespace

CostTracker::CostTracker(Options opts) : opts_(std::move(opts)), decide_(opts_.decide), cal_(opts_.prior_flops_per_s) {
  for (ReadFit& f : fits_) f.prior = opts_.nvme_prior;
}

void CostTracker::SetTierPrior(size_t tier, TierSpeed prior) {
  if (tier >= kMaxTiers) return;
  MutexLock l(&mu_);
  fits_[tier].prior = prior;
  fits_[tier].prior_set = true;
}

absl::Status CostTracker::ReportPrefill(uint64_t cached_tokens, uint64_t computed_tokens, double seconds) {
  if (computed_tokens == 0) return absl::InvalidArgumentError("report_prefill: 0 tokens computed");
  if (computed_tokens > kMaxReportTokens || cached_tokens > kMaxReportTokens) {
    return absl::InvalidArgumentError(absl::StrCat("report_prefill: more than ", kMaxReportTokens,
                                                   " tokens in one prefill is not a real measurement"));
  }
  if (!(seconds > 0) || seconds > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("report_prefill: a duration of ", seconds, " s is not in (0, 3600]"));
  }
  const double flops = opts_.model.PrefillFlops(cached_tokens, computed_tokens);
  MutexLock l(&mu_);
  cal_.Add(flops, seconds);
  ++reports_;
  return absl::OkStatus();
}

void CostTracker::RecordRead(size_t tier, uint64_t bytes, double seconds) {
  if (tier >= kMaxTiers || bytes == 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double x = double(bytes), y = seconds;
  MutexLock l(&mu_);
  ReadFit& f = fits_[tier];
  ++f.reads;
  f.last_read_ns = MonotonicNanos();
  f.w = f.w * kReadDecay + 1;
  f.wx = f.wx * kReadDecay + x;
  f.wy = f.wy * kReadDecay + y;
  f.wxx = f.wxx * kReadDecay + x * x;
  f.wxy = f.wxy * kReadDecay + x * y;
}

TierSpeed CostTracker::SpeedLocked(size_t tier) const {
  const ReadFit& f = fits_[std::min(tier, kMaxTiers - 1)];
  if (f.reads < kMinReads) return f.prior;
  if (tier > 0 && MonotonicNanos() - f.last_read_ns > opts_.lower_fit_stale_ns) return f.prior;
  const double mx = f.wx / f.w, my = f.wy / f.w;
  const double var = f.wxx / f.w - mx * mx;
  if (var > 1e-6 * mx * mx) {
    // Reads of several sizes: seconds = latency + bytes / bandwidth.
    const double slope = (f.wxy / f.w - mx * my) / var;
    const double latency = my - slope * mx;
    if (slope > 0 && latency >= 0) return TierSpeed{1.0 / slope, latency};
  }
  // One size (or a fit that makes no sense): keep the prior's latency, at
  // most half of a read, and charge the rest to bandwidth.
  const double latency = std::min(f.prior.latency_s, 0.5 * my);
  return TierSpeed{mx / (my - latency), latency};
}

TierSpeed CostTracker::speed(size_t tier) const {
  MutexLock l(&mu_);
  return SpeedLocked(tier);
}

double CostTracker::prefill_flops_per_s() const {
  MutexLock l(&mu_);
  return cal_.flops_per_second();
}

bool CostTracker::Prices(uint64_t block_bytes, uint64_t block_tokens, uint32_t tp_size) const {
  if (block_tokens == 0 || tp_size == 0) return false;
  const double full = double(block_bytes) / double(block_tokens) * double(tp_size);
  const double kv = double(opts_.model.KvBytesPerToken());
  for (double share : {1.0, 0.5, 0.25}) {
    if (std::abs(full - kv * share) <= 0.01 * kv * share) return true;
  }
  return false;
}

bool CostTracker::RecomputeBeats(size_t tier, uint64_t position, uint64_t tokens, uint64_t bytes,
                                 uint32_t tp_size) const {
  if (!decide() || !Prices(bytes, tokens, tp_size)) return false;
  MutexLock l(&mu_);
  const bool against = DecideHit(opts_.model, cal_, position, tokens, bytes, SpeedLocked(tier)) == HitDecision::kRecompute;
  // Calibration reads are the NVMe tier's (Migrator::CalibrateFirstTier).
  if (against && tier == 0) against_nvme_.fetch_add(1, std::memory_order_relaxed);
  return against;
}

bool CostTracker::WantsNvmeCalibration(uint64_t now_ns, uint64_t quiet_ns) {
  const uint64_t against = against_nvme_.load(std::memory_order_relaxed);
  if (!decide() || against == against_at_calibration_) return false;
  {
    MutexLock l(&mu_);
    if (fits_[0].reads < kMinReads || now_ns - fits_[0].last_read_ns < quiet_ns) return false;
  }
  against_at_calibration_ = against;
  return true;
}

CostTracker::Report CostTracker::report() const {
  MutexLock l(&mu_);
  const TierSpeed nvme = SpeedLocked(0);
  std::vector<Report::Tier> lower;
  for (size_t i = 1; i < kMaxTiers; ++i) {
    const ReadFit& f = fits_[i];
    if (f.reads == 0 && !f.prior_set) continue;
    const TierSpeed sp = SpeedLocked(i);
    lower.push_back({.chain_position = i,
                     .reads_measured = f.reads,
                     .measured = f.reads >= kMinReads,
                     .read_gbps = sp.bytes_per_second / 1e9,
                     .read_latency_us = sp.latency_s * 1e6});
  }
  return Report{.model = opts_.model.name,
                .kv_bytes_per_token = opts_.model.KvBytesPerToken(),
                .decide = decide(),
                .prefill_reports = reports_,
                .prefill_fitted = cal_.samples() >= 2 && cal_.r_squared() > 0,
                .prefill_tflops = cal_.flops_per_second() / 1e12,
                .prefill_overhead_s = cal_.overhead_s(),
                .prefill_r_squared = cal_.r_squared(),
                .nvme_reads_measured = fits_[0].reads,
                .nvme_measured = fits_[0].reads >= kMinReads,
                .nvme_read_gbps = nvme.bytes_per_second / 1e9,
                .nvme_read_latency_us = nvme.latency_s * 1e6,
                .lower = std::move(lower)};
}

nlohmann::json CostTracker::ReportJson(const Report& r) {
  nlohmann::json j{{"model", r.model},
                   {"kv_bytes_per_token", r.kv_bytes_per_token},
                   {"decide", r.decide},
                   {"prefill_reports", r.prefill_reports},
                   {"prefill_fitted", r.prefill_fitted},
                   {"prefill_tflops", r.prefill_tflops},
                   {"prefill_overhead_s", r.prefill_overhead_s},
                   {"prefill_r_squared", r.prefill_r_squared},
                   {"nvme_reads_measured", r.nvme_reads_measured},
                   {"nvme_measured", r.nvme_measured},
                   {"nvme_read_gbps", r.nvme_read_gbps},
                   {"nvme_read_latency_us", r.nvme_read_latency_us}};
  if (!r.lower.empty()) {
    nlohmann::json tiers = nlohmann::json::array();
    for (const Report::Tier& t : r.lower) {
      tiers.push_back({{"chain_position", t.chain_position},
                       {"reads_measured", t.reads_measured},
                       {"measured", t.measured},
                       {"read_gbps", t.read_gbps},
                       {"read_latency_us", t.read_latency_us}});
    }
    j["lower_tiers"] = std::move(tiers);
  }
  return j;
}

}  // namespace kvtier
