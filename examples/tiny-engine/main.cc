// tiny-engine: a multi-turn chat on the tiny transformer, with and without
// kvtier, printing time to first token for each turn. Later turns reuse the
// conversation so far from kvtier; the logits are checked to be bit-identical
// to a run that recomputes everything.
//
//   tiny-engine [--config config.json] [--socket kvtierd.sock] [--turns 4]
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "tiny_engine.h"

int main(int argc, char** argv) {
  CLI::App app{"tiny-engine: a multi-turn chat on a tiny transformer, reusing earlier turns through kvtier"};
  std::string config_path, socket;
  uint32_t turns = 4, user_tokens = 96, reply_tokens = 8, block_tokens = 16;
  uint64_t seed = 1;
  app.add_option("--config", config_path, "Hugging Face-style config.json (default: a built-in tiny model)");
  app.add_option("--socket", socket, "kvtierd's socket (default: $KVTIER_SOCKET or the run dir's)");
  app.add_option("--turns", turns, "conversation turns")->capture_default_str();
  app.add_option("--user-tokens", user_tokens, "tokens each user message adds")->capture_default_str();
  app.add_option("--reply-tokens", reply_tokens, "tokens generated per turn")->capture_default_str();
  app.add_option("--block-tokens", block_tokens, "tokens per KV-cache page and kvtier block")->capture_default_str();
  app.add_option("--seed", seed, "weights' seed")->capture_default_str();
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
  tiny::Engine probe(*m, seed, block_tokens, 1, nullptr);
  kvtier::AttachOptions o;
  o.socket_path = socket;
  o.client_name = "tiny-engine";
  o.ns.model_id = "tiny-engine/seed-" + std::to_string(seed);
  o.ns.kv_dtype = "f32";
  o.ns.kv_layout = "layer_major";
  o.ns.block_tokens = block_tokens;
  o.ns.block_bytes = probe.block_bytes();
  auto client = kvtier::Client::Attach(o);
  if (!client.ok()) {
    std::cerr << "tiny-engine: " << client.status().message() << "\n";
    return 1;
  }
  const uint32_t pages = (turns * (user_tokens + reply_tokens)) / block_tokens + 8;
  tiny::Engine with(*m, seed, block_tokens, pages, client->get());
  tiny::Engine without(*m, seed, block_tokens, pages, nullptr);
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
    for (size_t i = 0; same && i < a->logits.size(); ++i) {
      same = std::memcmp(a->logits[i].data(), b->logits[i].data(), a->logits[i].size() * sizeof(float)) == 0;
    }
    std::printf("%4u  %6zu  %6u  %13.2f ms  %10.2f ms  %6.2fx  %s\n", t + 1, conversation.size(), b->reused_tokens,
                a->ttft_s * 1e3, b->ttft_s * 1e3, a->ttft_s / b->ttft_s, same ? "bit-identical" : "DIFFER");
    if (!same) return 3;
    conversation.insert(conversation.end(), b->tokens.begin(), b->tokens.end());
  }
  return 0;
}
