// SPDX-License-Identifier: Apache-2.0
// The Hugging Face config.json reader (ModelProfile::FromHfConfig): a model
// file is whatever its publisher wrote; kvtierd (cost_model.model_config)
// and kvtierctl capacity read it. Whatever it accepts:
//  - has every dimension from 1 to 2^24, heads a multiple of kv_heads, a
//    known dtype whose size is dtype_bytes;
//  - has KvBytesPerToken() that fits in 64 bits and finite FLOP estimates;
//  - reads the same in kv_only mode given the dtype (the capacity planner's
//    view), and head_dim defaults to hidden / heads.
// Refusals name the file.
#include <cmath>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "policies/cost_model.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

constexpr uint32_t kMaxDim = 1u << 24;

void Check(const kvtier::ModelProfile& m) {
  for (uint32_t d : {m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim}) {
    if (d < 1 || d > kMaxDim) __builtin_trap();
  }
  if (m.heads % m.kv_heads != 0) __builtin_trap();
  if (m.dtype_bytes == 0 || m.dtype_bytes != kvtier::ModelProfile::DtypeBytes(m.dtype)) __builtin_trap();
  unsigned __int128 kv = 2;
  for (uint32_t d : {m.layers, m.kv_heads, m.head_dim, m.dtype_bytes}) kv *= d;
  if (kv > UINT64_MAX || kv != m.KvBytesPerToken()) __builtin_trap();
  const double f = m.PrefillFlops(uint64_t{1} << 20, 512);
  if (!std::isfinite(f) || f < 0) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvtier::ModelProfile> full = kvtier::ModelProfile::FromHfConfig(text, "fuzz.json");
  absl::StatusOr<kvtier::ModelProfile> kv = kvtier::ModelProfile::FromHfConfig(text, "fuzz.json", /*kv_only=*/true);
  absl::StatusOr<kvtier::ModelProfile> fp8 =
      kvtier::ModelProfile::FromHfConfig(text, "fuzz.json", /*kv_only=*/true, "float8_e4m3fn");
  for (const auto* p : {&full, &kv, &fp8}) {
    if (p->ok()) {
      Check(**p);
    } else if (!absl::IsInvalidArgument(p->status()) || !absl::StartsWith(p->status().message(), "fuzz.json: ")) {
      __builtin_trap();
    }
  }
  if (full.ok()) {
    if (full->intermediate < 1 || full->intermediate > kMaxDim) __builtin_trap();
    // What the full read accepts, a KV-only read with a 1-byte dtype does
    // too, with the same shape.
    if (!fp8.ok() || fp8->layers != full->layers || fp8->kv_heads != full->kv_heads ||
        fp8->head_dim != full->head_dim || fp8->dtype_bytes != 1) {
      __builtin_trap();
    }
  }
  if (kv.ok()) {
    // kv_only needs a dtype from the file; it is the full read's, shape the same.
    if (kv->intermediate != 0 || !fp8.ok() || fp8->head_dim != kv->head_dim || fp8->heads != kv->heads) {
      __builtin_trap();
    }
    if (full.ok() && (full->dtype != kv->dtype || full->layers != kv->layers)) __builtin_trap();
  }
  // head_dim, when the file has none at the level read, is hidden / heads.
  if (fp8.ok()) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    const nlohmann::json* level = &j;
    if (j.is_object() && !j.contains("num_hidden_layers") && j.contains("text_config")) level = &j["text_config"];
    if (level->is_object() && (!level->contains("head_dim") || (*level)["head_dim"].is_null()) &&
        uint64_t{fp8->head_dim} * fp8->heads != fp8->hidden) {
      __builtin_trap();
    }
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds = {
      // Llama-3.1-8B
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
          "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "vocab_size": 128256})",
      // Qwen3-style explicit head_dim, newer "dtype" key
      R"({"hidden_size": 2048, "head_dim": 128, "intermediate_size": 6144, "num_attention_heads": 32,
          "num_hidden_layers": 28, "num_key_value_heads": 8, "dtype": "float16"})",
      // multimodal: the language model under text_config
      R"({"model_type": "llava", "text_config": {"hidden_size": 4096, "intermediate_size": 11008,
          "num_attention_heads": 32, "num_hidden_layers": 32, "torch_dtype": "float32"}})",
      // nulls fall back to defaults
      R"({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
          "num_key_value_heads": null, "head_dim": null, "torch_dtype": null, "dtype": "int8"})",
      // at the bounds: every dimension 2^24 (KV bytes per token past 64 bits)
      R"({"hidden_size": 16777216, "intermediate_size": 16777216, "num_attention_heads": 16777216,
          "num_hidden_layers": 16777216, "num_key_value_heads": 16777216, "head_dim": 16777216,
          "torch_dtype": "float32"})",
      R"({"hidden_size": 16777217, "intermediate_size": 1, "num_attention_heads": 1, "num_hidden_layers": 1})",
      R"({"hidden_size": 18446744073709551615, "intermediate_size": -1, "num_attention_heads": 1.5,
          "num_hidden_layers": 1e30})",
      R"({"hidden_size": 10, "intermediate_size": 1, "num_attention_heads": 3, "num_hidden_layers": 1})",
      R"({"hidden_size": 12, "intermediate_size": 1, "num_attention_heads": 6, "num_key_value_heads": 4,
          "num_hidden_layers": 1, "torch_dtype": "float8_e4m3fn"})",
      R"({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
          "torch_dtype": "\u001b[31mred"})",
      R"({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
          "torch_dtype": 16})",
      R"({"text_config": 5, "hidden_size": 8})",
      "[1, 2, 3]",
      "",
  };
  std::string deep(100000, '[');
  seeds.push_back(R"({"hidden_size": 8, "x": )" + deep + std::string(100000, ']') + "}");
  return seeds;
}

long FuzzDefaultIterations() { return 1000; }  // the deterministic driver is a smoke test; libFuzzer does the volume
