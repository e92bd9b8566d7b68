// SPDX-License-Identifier: Apache-2.0
// The tiny engine's safetensors reader: a weights file is input from
// whoever made it. Whatever it accepts has every tensor at its shape.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "tests/fuzz/fuzz_target.h"
#include "tiny_engine.h"

namespace {

const tiny::ModelConfig& Model() {
  static const tiny::ModelConfig m = *tiny::ModelConfig::FromJson(
      R"({"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
          "intermediate_size": 8, "vocab_size": 4})");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tiny::ModelConfig& m = Model();
  auto w = tiny::Weights::FromSafetensorsBytes(m, std::string_view(reinterpret_cast<const char*>(data), size),
                                               "fuzz.safetensors");
  if (!w.ok()) {
    if (w.status().message().empty()) __builtin_trap();  // refusals say why
    return 0;
  }
  const tiny::Weights& x = **w;
  const size_t H = m.hidden, q = size_t{m.heads} * m.head_dim, kv = size_t{m.kv_heads} * m.head_dim;
  if (x.embed.size() != m.vocab * H || x.lm_head.size() != m.vocab * H || x.final_norm.size() != H ||
      x.layers.size() != m.layers) {
    __builtin_trap();
  }
  for (const auto& L : x.layers) {
    if (L.wq.size() != q * H || L.wk.size() != kv * H || L.wv.size() != kv * H || L.wo.size() != H * q ||
        L.attn_norm.size() != H || L.mlp_norm.size() != H || L.wg.size() != m.intermediate * H ||
        L.wu.size() != m.intermediate * H || L.wd.size() != H * m.intermediate) {
      __builtin_trap();
    }
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  // A well-formed file: the seeded weights as the engine writes them.
  char path[] = "/tmp/kvtier-safetensors-seed-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {""};
  close(fd);
  std::string bytes;
  if (tiny::Weights::Seeded(Model(), 1)->SaveSafetensors(Model(), path).ok()) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  std::remove(path);
  return {bytes, bytes.substr(0, 8 + 64)};
}

long FuzzDefaultIterations() { return 20000; }
