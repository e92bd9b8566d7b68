#include "policies/cost_model.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvtier {
namespace {

absl::StatusOr<uint32_t> Field(const nlohmann::json& j, const char* key, const std::string& name) {
  auto it = j.find(key);
  if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(name, ": config.json has no \"", key, "\""));
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"", key, "\" must be a positive integer"));
  }
  return static_cast<uint32_t>(it->get<int64_t>());
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
                                                        bool kv_only) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  // Multimodal configs nest the language model's under text_config.
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("num_hidden_layers")) {
    j = j["text_config"];
  }
  ModelProfile m;
  m.name = name;
  auto layers = Field(j, "num_hidden_layers", name);
  if (!layers.ok()) return layers.status();
  auto hidden = Field(j, "hidden_size", name);
  if (!hidden.ok()) return hidden.status();
  auto heads = Field(j, "num_attention_heads", name);
  if (!heads.ok()) return heads.status();
  m.layers = *layers;
  m.hidden = *hidden;
  m.heads = *heads;
  if (!kv_only) {
    auto inter = Field(j, "intermediate_size", name);
    if (!inter.ok()) return inter.status();
    m.intermediate = *inter;
  }
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    auto kv = Field(j, "num_key_value_heads", name);
    if (!kv.ok()) return kv.status();
    m.kv_heads = *kv;
  } else {
    m.kv_heads = m.heads;
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    auto hd = Field(j, "head_dim", name);
    if (!hd.ok()) return hd.status();
    m.head_dim = *hd;
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
  const char* key = j.contains("torch_dtype") && j["torch_dtype"].is_string() ? "torch_dtype" : "dtype";
  if (!j.contains(key) || !j[key].is_string()) {
    if (kv_only) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": config.json has no \"torch_dtype\" (or \"dtype\"); "
                                                     "give the KV cache's dtype with --dtype"));
    }
    m.dtype = "bfloat16";
  } else {
    m.dtype = j[key].get<std::string>();
  }
  m.dtype_bytes = DtypeBytes(m.dtype);
  if (m.dtype_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": unknown ", key, " \"", m.dtype, "\""));
  }
  return m;
}

absl::StatusOr<ModelProfile> ModelProfile::FromHfConfigFile(const std::string& path, bool kv_only) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the model config ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return FromHfConfig(ss.str(), path, kv_only);
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
