// SPDX-License-Identifier: Apache-2.0
#include "policies/cost_model.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/bounded_json.h"
#include "core/checked.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace kvtier {
namespace {

// The largest value any one dimension may have: far above any real model's
// (Llama-3.1-405B: hidden 16384, intermediate 53248), and small enough that
// the FLOP estimates stay finite.
constexpr int64_t kMaxDimension = int64_t{1} << 24;
// A config.json is a few KiB; anything this large is not one.
constexpr size_t kMaxConfigBytes = 16u << 20;

// What a JSON value is, for a message: the number itself, or its type.
std::string Describe(const nlohmann::json& v) {
  if (v.is_number()) return v.dump();
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_boolean()) return "a boolean";
  return "null";
}

absl::StatusOr<uint32_t> Field(const nlohmann::json& j, const char* key, const std::string& name) {
  auto it = j.find(key);
  if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(name, ": config.json has no \"", key, "\""));
  // nlohmann reads every non-negative integer as unsigned; a negative one,
  // a fraction or 1e30 (a float) is not. Never convert before testing:
  // get<int64_t>() of 2^64-1 is -1.
  const bool in_range =
      it->is_number_unsigned() && it->get<uint64_t>() >= 1 && it->get<uint64_t>() <= uint64_t{kMaxDimension};
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"", key, "\" must be a positive integer of at most ",
                                                   kMaxDimension, ", not ", Describe(*it)));
  }
  return static_cast<uint32_t>(it->get<int64_t>());
}

// A dtype name as a message may show it: a peer's text could hold a
// terminal's control sequences or run for megabytes.
std::string Quoted(const std::string& s) {
  if (s.size() > 64 || !IsPrintableUtf8(s)) return "(a name that is not a short printable string)";
  return absl::StrCat("\"", s, "\"");
}

}  // namespace

ModelProfile ModelProfile::Default() {
  return ModelProfile{"default (Llama-3.1-8B shape)", 32, 4096, 32, 8, 128, 14336, 2, "bfloat16"};
}

uint32_t ModelProfile::DtypeBytes(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "half" || dtype == "fp16" || dtype == "bf16") return 2;
  if (dtype == "float32" || dtype == "float" || dtype == "fp32") return 4;
  if (dtype == "float8_e4m3fn" || dtype == "float8_e5m2" || dtype == "fp8" || dtype == "int8") return 1;
  return 0;
}

absl::StatusOr<ModelProfile> ModelProfile::FromHfConfig(const std::string& json_text, const std::string& name,
                                                        bool kv_only, const std::string& dtype_override) {
  // Bounded nesting: a config.json is read by people's tools too, and one
  // nested a million deep would overflow the stack of whatever copies it.
  absl::StatusOr<nlohmann::json> parsed = ParseBoundedJson(json_text);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", parsed.status().message()));
  if (!parsed->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object but ", Describe(*parsed)));
  }
  // Multimodal configs nest the language model's under text_config.
  const nlohmann::json* jp = &*parsed;
  if (auto tc = parsed->find("text_config");
      tc != parsed->end() && tc->is_object() && !parsed->contains("num_hidden_layers")) {
    jp = &*tc;
  }
  const nlohmann::json& j = *jp;
  ModelProfile m;
  m.name = name;
  ASSIGN_OR_RETURN(m.layers, Field(j, "num_hidden_layers", name));
  ASSIGN_OR_RETURN(m.hidden, Field(j, "hidden_size", name));
  ASSIGN_OR_RETURN(m.heads, Field(j, "num_attention_heads", name));
  if (!kv_only) {
    ASSIGN_OR_RETURN(m.intermediate, Field(j, "intermediate_size", name));
  }
  if (auto kv = j.find("num_key_value_heads"); kv != j.end() && !kv->is_null()) {
    ASSIGN_OR_RETURN(m.kv_heads, Field(j, "num_key_value_heads", name));
  } else {
    m.kv_heads = m.heads;
  }
  if (auto hd = j.find("head_dim"); hd != j.end() && !hd->is_null()) {
    ASSIGN_OR_RETURN(m.head_dim, Field(j, "head_dim", name));
  } else {
    if (m.hidden % m.heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no head_dim, and hidden_size is not a multiple of "
                                                     "num_attention_heads"));
    }
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_attention_heads is not a multiple of num_key_value_heads"));
  }
  // Newer configs name it "dtype", older ones "torch_dtype".
  const char* key = j.contains("torch_dtype") && !j.at("torch_dtype").is_null() ? "torch_dtype" : "dtype";
  const auto dt = j.find(key);
  if (!dtype_override.empty()) {
    m.dtype = dtype_override;
    key = "--dtype";
  } else if (dt == j.end() || dt->is_null()) {
    if (kv_only) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": config.json has no \"torch_dtype\" (or \"dtype\"); "
                                                     "give the KV cache's dtype with --dtype"));
    }
    m.dtype = "bfloat16";
  } else if (!dt->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"", key, "\" must be a string such as \"bfloat16\", not ", Describe(*dt)));
  } else {
    m.dtype = dt->get<std::string>();
  }
  m.dtype_bytes = DtypeBytes(m.dtype);
  if (m.dtype_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": unknown ", key, " ", Quoted(m.dtype)));
  }
  // Every dimension is at most 2^24, but their product is not: 2 x 2^24
  // layers x 2^24 KV heads x 2^24 head_dim wraps 64 bits, to 0 for some
  // shapes, and a planner dividing by it took SIGFPE.
  if (!CheckedProduct({2, m.layers, m.kv_heads, m.head_dim, m.dtype_bytes})) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": the KV bytes per token (2 x num_hidden_layers x num_key_value_heads x head_dim x ", m.dtype_bytes,
        " bytes) do not fit in 64 bits"));
  }
  return m;
}

absl::StatusOr<ModelProfile> ModelProfile::FromHfConfigFile(const std::string& path, bool kv_only,
                                                            const std::string& dtype_override) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the model config ", path));
  // Read at most one byte past the bound: /dev/zero or a huge file is
  // refused without being held in memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", kMaxConfigBytes >> 20, " MiB, which no config.json is"));
  }
  return FromHfConfig(text, path, kv_only, dtype_override);
}

uint64_t ModelProfile::KvBytesPerToken() const {
  return uint64_t{2} * layers * kv_heads * head_dim * dtype_bytes;
}

double ModelProfile::LinearFlops(uint64_t tokens) const {
  const double q = double(heads) * head_dim, kv = double(kv_heads) * head_dim, h = hidden;
  const double per_token_layer = 2.0 * (h * (q + 2 * kv) + q * h + 3.0 * h * intermediate);
  return per_token_layer * double(layers) * double(tokens);
}

double ModelProfile::AttentionFlops(uint64_t position, uint64_t tokens) const {
  // sum_{t=p}^{p+n-1} (t+1) = n*p + n(n+1)/2
  const double n = double(tokens), p = double(position);
  const double pairs = n * p + n * (n + 1) / 2;
  return 4.0 * double(heads) * head_dim * pairs * double(layers);
}

void PrefillCalibration::Add(double flops, double seconds) {
  if (!(flops > 0) || !(seconds > 0) || !std::isfinite(flops) || !std::isfinite(seconds)) return;
  const double x = flops / 1e12;
  ++n_;
  sx_ += x;
  sy_ += seconds;
  sxx_ += x * x;
  sxy_ += x * seconds;
  syy_ += seconds * seconds;
}

bool PrefillCalibration::Fitted() const {
  if (n_ < 2) return false;
  const double var = sxx_ - sx_ * sx_ / double(n_);
  if (!(var > 1e-12 * sxx_)) return false;
  // A fit with a non-positive slope says more work takes less time: noise.
  const double a = (sxy_ - sx_ * sy_ / double(n_)) / var;
  return a > 0;
}

double PrefillCalibration::flops_per_second() const {
  if (!Fitted()) return prior_;
  const double var = sxx_ - sx_ * sx_ / double(n_);
  const double a = (sxy_ - sx_ * sy_ / double(n_)) / var;  // seconds per TFLOP
  return 1e12 / a;
}

double PrefillCalibration::overhead_s() const {
  if (!Fitted()) return 0;
  const double a = 1e12 / flops_per_second();
  return std::max(0.0, (sy_ - a * sx_) / double(n_));
}

double PrefillCalibration::Seconds(double flops) const { return flops / flops_per_second() + overhead_s(); }

double PrefillCalibration::r_squared() const {
  if (!Fitted()) return 0;
  const double var_x = sxx_ - sx_ * sx_ / double(n_);
  const double var_y = syy_ - sy_ * sy_ / double(n_);
  const double cov = sxy_ - sx_ * sy_ / double(n_);
  return var_y > 0 ? (cov * cov) / (var_x * var_y) : 1.0;
}

HitDecision DecideHit(const ModelProfile& m, const PrefillCalibration& cal, uint64_t position, uint64_t tokens,
                      uint64_t bytes, const TierSpeed& tier) {
  // Recomputing a block alone does not pay the fixed overhead of a prefill
  // call: that is paid anyway by the request.
  const double recompute = m.PrefillFlops(position, tokens) / cal.flops_per_second();
  return tier.LoadSeconds(bytes) < recompute ? HitDecision::kLoad : HitDecision::kRecompute;
}

}  // namespace kvtier
