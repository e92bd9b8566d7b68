// SPDX-License-Identifier: Apache-2.0
// What a block is worth: the time to recompute it (prefill of its tokens at
// its position) against the time to load it back from a tier.
//
// Prefill cost of tokens [p, p+n) of a decoder-only transformer, per layer:
//   linear:    n * 2 * (hidden * (q + 2 kv) + q * hidden + 3 * hidden * inter)
//              (Q, K, V and O projections, SwiGLU MLP; q = heads * head_dim,
//              kv = kv_heads * head_dim)
//   attention: 4 * q * sum_{t=p}^{p+n-1} (t + 1)   (QK^T and AV, causal)
// Seconds = flops / throughput + overhead, where throughput and overhead are
// fitted by least squares to what engines report (report_prefill): the
// attention term makes a block deep in a long prompt dearer to recompute.
#ifndef KVTIER_POLICIES_COST_MODEL_H_
#define KVTIER_POLICIES_COST_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

struct ModelProfile {
  std::string name;
  uint32_t layers = 0;
  uint32_t hidden = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t intermediate = 0;
  uint32_t dtype_bytes = 2;
  std::string dtype = "bfloat16";

  // Llama-3.1-8B (32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim
  // 128, intermediate 14336, bf16): the profile used when none is given.
  static ModelProfile Default();
  // From a Hugging Face config.json's text: num_hidden_layers, hidden_size,
  // num_attention_heads, num_key_value_heads (default: heads), head_dim
  // (default: hidden / heads), intermediate_size, torch_dtype (or dtype;
  // default bfloat16). Errors name the missing or bad field. `kv_only`: what
  // the KV cache's size needs (no intermediate_size; the dtype must be given).
  // `dtype_override`, when set, replaces the config's dtype.
  // The text is untrusted: every field is range-checked (each dimension at
  // most 2^24) and KvBytesPerToken() of a profile returned here fits in 64
  // bits; a bad file is an error naming the field, never a crash.
  static absl::StatusOr<ModelProfile> FromHfConfig(const std::string& json_text, const std::string& name,
                                                   bool kv_only = false, const std::string& dtype_override = "");
  // The file's text, refused above 16 MiB.
  static absl::StatusOr<ModelProfile> FromHfConfigFile(const std::string& path, bool kv_only = false,
                                                       const std::string& dtype_override = "");
  // Bytes of one element of a torch / HF dtype name; 0 when unknown.
  static uint32_t DtypeBytes(const std::string& dtype);

  // K and V of one token across all layers.
  uint64_t KvBytesPerToken() const;
  // Prefill FLOPs of tokens [position, position + tokens).
  double LinearFlops(uint64_t tokens) const;
  double AttentionFlops(uint64_t position, uint64_t tokens) const;
  double PrefillFlops(uint64_t position, uint64_t tokens) const {
    return LinearFlops(tokens) + AttentionFlops(position, tokens);
  }
};

// seconds = flops / flops_per_second + overhead_s, fitted online.
class PrefillCalibration {
 public:
  // The prior: used until two distinct measurements exist. 300 TFLOP/s is a
  // bf16 prefill at ~30% of an H100/H200's dense peak.
  explicit PrefillCalibration(double prior_flops_per_second = 300e12) : prior_(prior_flops_per_second) {}

  // One engine report: prefill of `flops` took `seconds`.
  void Add(double flops, double seconds);
  double Seconds(double flops) const;
  double flops_per_second() const;
  double overhead_s() const;
  uint64_t samples() const { return n_; }
  // Coefficient of determination of the fit (1: perfect), 0 without one.
  double r_squared() const;

 private:
  bool Fitted() const;
  double prior_;
  uint64_t n_ = 0;
  // Sums for least squares of seconds = a * flops + b (flops in TFLOP).
  double sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0, syy_ = 0;
};

// A tier's measured speed for reading a block back.
struct TierSpeed {
  double bytes_per_second = 0;
  double latency_s = 0;
  double LoadSeconds(uint64_t bytes) const {
    return latency_s + (bytes_per_second > 0 ? static_cast<double>(bytes) / bytes_per_second : 1e30);
  }
};

enum class HitDecision { kLoad, kRecompute };

// At lookup, per hit block: load it only if that is faster than computing it.
HitDecision DecideHit(const ModelProfile& m, const PrefillCalibration& cal, uint64_t position, uint64_t tokens,
                      uint64_t bytes, const TierSpeed& tier);

}  // namespace kvtier

#endif  // KVTIER_POLICIES_COST_MODEL_H_
