// SPDX-License-Identifier: Apache-2.0
// tiny-engine: a multi-turn chat on the tiny transformer, with and without
// kvtier, printing time to first token for each turn. Later turns reuse the
// conversation so far from kvtier; the logits are checked to be bit-identical
// to a run that recomputes everything.
//
//   tiny-engine [--config config.json] [--weights model.safetensors] [--socket kvtierd.sock]
//               [--turns 4] [--codec none|int8|fp8] [--copy] [--device cpu|cuda]
//               [--save-weights out.safetensors]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "tiny_engine.h"

int main(int argc, char** argv) {
  CLI::App app{"tiny-engine: a multi-turn chat on a tiny transformer, reusing earlier turns through kvtier"};
  std::string config_path, socket, weights_path, save_path, codec = "none";
  bool copy = false;
  uint32_t turns = 4, user_tokens = 96, reply_tokens = 8, block_tokens = 16;
  uint64_t seed = 1;
  app.add_option("--config", config_path, "Hugging Face-style config.json (default: a built-in tiny model)");
  app.add_option("--socket", socket, "kvtierd's socket (default: $KVTIER_SOCKET or the run dir's)");
  app.add_option("--turns", turns, "conversation turns")->capture_default_str();
  app.add_option("--user-tokens", user_tokens, "tokens each user message adds")->capture_default_str();
  app.add_option("--reply-tokens", reply_tokens, "tokens generated per turn")->capture_default_str();
  app.add_option("--block-tokens", block_tokens, "tokens per KV-cache page and kvtier block")->capture_default_str();
  app.add_option("--seed", seed, "weights' seed (when no --weights)")->capture_default_str();
  app.add_option("--weights", weights_path, "weights from a safetensors file (Hugging Face Llama names)");
  app.add_option("--save-weights", save_path, "write the weights as safetensors and exit");
  app.add_option("--codec", codec, "blocks kept in kvtier: none (exact), int8 or fp8 (quantized, within a bound)")
      ->check(CLI::IsMember({"none", "int8", "fp8"}))
      ->capture_default_str();
  std::string device = "cpu";
  app.add_option("--device", device, "where prefill and decode run: cpu, or cuda (the daemon then needs "
                                     "device = \"cuda\")")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--copy", copy, "copy blocks through Load/Store instead of registering the KV cache (no layer-wise "
                               "load; lossless only)");
  CLI11_PARSE(app, argc, argv);

  std::string text = R"({"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 8,
                         "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 256})";
  if (!config_path.empty()) {
    std::ifstream f(config_path);
    if (!f) {
      std::cerr << "tiny-engine: cannot read " << config_path << "\n";
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  auto m = tiny::ModelConfig::FromJson(text);
  if (!m.ok()) {
    std::cerr << "tiny-engine: " << m.status().message() << "\n";
    return 2;
  }
  if (copy && codec != "none") {
    std::cerr << "tiny-engine: --codec needs the registered cache (drop --copy)\n";
    return 2;
  }
  std::shared_ptr<const tiny::Weights> weights = tiny::Weights::Seeded(*m, seed);
  std::string model_id = "tiny-engine/seed-" + std::to_string(seed);
  if (!weights_path.empty()) {
    auto w = tiny::Weights::FromSafetensors(*m, weights_path);
    if (!w.ok()) {
      std::cerr << "tiny-engine: " << w.status().message() << "\n";
      return 2;
    }
    weights = *w;
    // The file's name stands for the model; give another name for other weights.
    model_id = "tiny-engine/" + weights_path.substr(weights_path.find_last_of('/') + 1);
  }
  if (!save_path.empty()) {
    if (auto st = weights->SaveSafetensors(*m, save_path); !st.ok()) {
      std::cerr << "tiny-engine: " << st.message() << "\n";
      return 1;
    }
    std::cout << "wrote " << save_path << "\n";
    return 0;
  }
  auto ns = tiny::NamespaceFor(*m, block_tokens, model_id, codec);
  if (!ns.ok()) {
    std::cerr << "tiny-engine: " << ns.status().message() << "\n";
    return 2;
  }
  kvtier::AttachOptions o;
  o.socket_path = socket;
  o.client_name = "tiny-engine";
  o.ns = *ns;
  auto client = kvtier::Client::Attach(o);
  if (!client.ok()) {
    std::cerr << "tiny-engine: " << client.status().message() << "\n";
    return 1;
  }
  const uint32_t pages = (turns * (user_tokens + reply_tokens)) / block_tokens + 8;
  tiny::EngineOptions eo;
  eo.path = copy ? tiny::EngineOptions::Path::kCopy : tiny::EngineOptions::Path::kRegistered;
  eo.codec = codec;
  eo.device = device == "cuda" ? tiny::EngineOptions::Device::kCuda : tiny::EngineOptions::Device::kCpu;
  tiny::Engine with(*m, weights, block_tokens, pages, client->get(), eo);
  tiny::EngineOptions plain;
  plain.device = eo.device;
  tiny::Engine without(*m, weights, block_tokens, pages, nullptr, plain);
  const bool exact = codec == "none";
  std::vector<uint32_t> conversation;
  uint32_t next_token = 7;
  std::cout << "turn  prompt  reused  TTFT (recompute)  TTFT (kvtier)  speedup  logits\n";
  for (uint32_t t = 0; t < turns; ++t) {
    for (uint32_t i = 0; i < user_tokens; ++i) conversation.push_back((next_token = next_token * 31 + 11) % m->vocab);
    auto a = without.Generate(conversation, reply_tokens);
    auto b = with.Generate(conversation, reply_tokens);
    if (!a.ok() || !b.ok()) {
      std::cerr << "tiny-engine: " << (a.ok() ? b.status() : a.status()).message() << "\n";
      return 1;
    }
    bool same = a->tokens == b->tokens;
    double worst = 0;  // largest |logit difference|
    for (size_t i = 0; i < std::min(a->logits.size(), b->logits.size()); ++i) {
      if (std::memcmp(a->logits[i].data(), b->logits[i].data(), a->logits[i].size() * sizeof(float)) != 0) same = false;
      for (size_t v = 0; v < a->logits[i].size(); ++v) {
        worst = std::max(worst, static_cast<double>(std::fabs(a->logits[i][v] - b->logits[i][v])));
      }
    }
    char verdict[64];
    std::snprintf(verdict, sizeof(verdict), "%s", same ? "bit-identical" : "DIFFER");
    if (!exact) std::snprintf(verdict, sizeof(verdict), "max |dlogit| %.2e", worst);
    std::printf("%4u  %6zu  %6u  %13.2f ms  %10.2f ms  %6.2fx  %s\n", t + 1, conversation.size(), b->reused_tokens,
                a->ttft_s * 1e3, b->ttft_s * 1e3, a->ttft_s / b->ttft_s, verdict);
    if (!b->kvtier_error.empty()) std::cerr << "tiny-engine: kvtier: " << b->kvtier_error << " (computed without it)\n";
    if (exact && !same) return 3;
    conversation.insert(conversation.end(), b->tokens.begin(), b->tokens.end());
  }
  return 0;
}
