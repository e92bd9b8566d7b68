// SPDX-License-Identifier: Apache-2.0
// What the daemon knows about costs, and the decisions it takes from them:
// the model's shape (config), the prefill throughput fitted to the engines'
// report_prefill calls, and the NVMe tier's read speed measured on the
// daemon's own reads. A block on NVMe is worth loading only if reading it is
// faster than recomputing it at its position; otherwise a lookup reports it
// as "recompute" and an eviction drops it instead of writing it to NVMe.
#ifndef KVTIER_STORE_COST_TRACKER_H_
#define KVTIER_STORE_COST_TRACKER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/mutex.h"
#include "nlohmann/json.hpp"
#include "policies/cost_model.h"

namespace kvtier {

class CostTracker {
 public:
  struct Options {
    ModelProfile model = ModelProfile::Default();
    double prior_flops_per_s = 300e12;
    TierSpeed nvme_prior{3e9, 100e-6};  // until kMinReads reads are measured
    bool decide = true;                  // false: always load, always demote
    // A tier below NVMe gets no calibration reads: a fit with no read for
    // this long gives way to the prior again, so a tier measured slow once
    // (and then never read, as its copies lose every decision) is tried
    // again instead of being locked out.
    uint64_t lower_fit_stale_ns = 10'000'000'000;
  };
  static constexpr uint64_t kMinReads = 8;

  explicit CostTracker(Options opts);

  // An engine's measurement: a prefill that reused `cached_tokens` and
  // computed `computed_tokens` after them took `seconds`. InvalidArgument
  // (nothing recorded) for 0 tokens, a duration that is not in (0, 1 h], or
  // more than 16M tokens.
  absl::Status ReportPrefill(uint64_t cached_tokens, uint64_t computed_tokens, double seconds);
  // Lower tiers by chain position: 0 is NVMe (the first), each next one
  // what the cascade moves below it. Each has its own speed: a fit of its
  // own reads, or its prior until kMinReads are measured.
  static constexpr size_t kMaxTiers = 8;
  // Setup: the prior of tier `tier` (nvme_prior until set).
  void SetTierPrior(size_t tier, TierSpeed prior);
  // One read of `bytes` from tier `tier` that took the device `seconds`
  // (its share of the device's time, without the queue wait in front of
  // it: IoTiming). Out-of-range tiers are ignored.
  void RecordRead(size_t tier, uint64_t bytes, double seconds);
  void RecordNvmeRead(uint64_t bytes, double seconds) { RecordRead(0, bytes, seconds); }
  // Main thread. True when the NVMe estimate needs fresh reads: decisions
  // went against NVMe (blocks dropped or reported "recompute" by cost) since
  // the last time this said so, and no read was measured in the last
  // `quiet_ns`. Without real reads the estimate would never change again, and
  // a tier measured slow once would stay off for good; the caller then makes
  // calibration reads (NvmeTier::CalibrationRead).
  bool WantsNvmeCalibration(uint64_t now_ns, uint64_t quiet_ns = 2'000'000'000);

  TierSpeed speed(size_t tier) const;
  TierSpeed nvme_speed() const { return speed(0); }
  double prefill_flops_per_s() const;
  // The model profile describes blocks of this shape: bytes per token, times
  // the tensor-parallel ranks, is the profile's KV bytes per token, or a
  // half or a quarter of it (8- and 4-bit KV). Blocks of other shapes belong
  // to another model: the daemon does not price them (it loads and demotes).
  bool Prices(uint64_t block_bytes, uint64_t block_tokens, uint32_t tp_size) const;
  // Reading a block of `bytes` holding tokens [position, position + tokens)
  // from NVMe is slower than prefilling them. False when decide is off or
  // the block's shape is not the profile's (Prices).
  bool RecomputeBeatsNvme(uint64_t position, uint64_t tokens, uint64_t bytes, uint32_t tp_size) const {
    return RecomputeBeats(0, position, tokens, bytes, tp_size);
  }
  // The same for a copy in lower tier `tier`, priced at that tier's speed.
  bool RecomputeBeats(size_t tier, uint64_t position, uint64_t tokens, uint64_t bytes, uint32_t tp_size) const;
  bool decide() const { return decide_.load(std::memory_order_relaxed); }
  // Thread-safe (a config reload).
  void set_decide(bool on) { decide_.store(on, std::memory_order_relaxed); }
  const ModelProfile& model() const { return opts_.model; }

  // The fit and the measurements, as status and metrics report them.
  struct Report {
    std::string model;
    uint64_t kv_bytes_per_token = 0;
    bool decide = true;
    uint64_t prefill_reports = 0;
    bool prefill_fitted = false;
    double prefill_tflops = 0, prefill_overhead_s = 0, prefill_r_squared = 0;
    uint64_t nvme_reads_measured = 0;
    bool nvme_measured = false;
    double nvme_read_gbps = 0, nvme_read_latency_us = 0;
    // Every tier below the first that has been read or given a prior, by
    // chain position (1, 2, ...).
    struct Tier {
      size_t chain_position = 0;
      uint64_t reads_measured = 0;
      bool measured = false;
      double read_gbps = 0, read_latency_us = 0;
    };
    std::vector<Tier> lower;
  };
  Report report() const;
  // The report as kvtierctl shows it.
  nlohmann::json ToJson() const { return ReportJson(report()); }
  static nlohmann::json ReportJson(const Report& r);

 private:
  // Exponentially weighted sums over one tier's reads (x = bytes, y = seconds).
  struct ReadFit {
    TierSpeed prior;
    bool prior_set = false;
    uint64_t reads = 0;
    uint64_t last_read_ns = 0;
    double w = 0, wx = 0, wy = 0, wxx = 0, wxy = 0;
  };
  TierSpeed SpeedLocked(size_t tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options opts_;
  std::atomic<bool> decide_;
  mutable Mutex mu_;
  PrefillCalibration cal_ ABSL_GUARDED_BY(mu_);
  uint64_t reports_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<ReadFit, kMaxTiers> fits_ ABSL_GUARDED_BY(mu_);
  // Decisions against NVMe (RecomputeBeatsNvme said yes), and their count
  // when calibration was last asked for.
  mutable std::atomic<uint64_t> against_nvme_{0};
  uint64_t against_at_calibration_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_COST_TRACKER_H_
