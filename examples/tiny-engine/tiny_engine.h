// A tiny decoder-only transformer on libkvtier: RMSNorm, rotary positions,
// grouped-query attention, SwiGLU MLP, greedy decoding, on the CPU in f32,
// with a paged KV cache (pages of block_tokens tokens, a block table per
// sequence, allocate / fork / free). Before prefill it looks up the prompt's
// blocks in kvtier and loads the hit prefix into its pages; after prefill it
// stores the blocks kvtier did not have, and it reports its prefill cost.
//
// A kvtier block is the layer-major form of one page of every layer:
// [layer][K|V][block_tokens][kv_heads][head_dim] f32. Reuse is exact: the
// K/V a layer reads are the same bytes whether computed or loaded, and every
// token's arithmetic is done in the same order either way.
#ifndef KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_
#define KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/client.h"

namespace tiny {

struct ModelConfig {
  uint32_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float rope_theta = 10000.0f, rms_eps = 1e-6f;
  // From a Hugging Face-style config.json; errors name the missing field.
  static kvtier::Result<ModelConfig> FromJson(const std::string& text);
};

struct Weights;  // seeded

// Pages of the KV cache, shared by the sequences that hold them.
class PagedKvCache {
 public:
  PagedKvCache(const ModelConfig& m, uint32_t block_tokens, uint32_t pages);
  // A free page, or -1 when none is left.
  int Allocate();
  void Retain(int page) { ++refs_[page]; }
  void Release(int page);
  uint32_t free_pages() const { return static_cast<uint32_t>(free_.size()); }
  // K or V of token slot `t` of `page` in `layer`: kv_heads * head_dim floats.
  float* At(uint32_t layer, int kv, int page, uint32_t t);
  // kvtier block <-> one page of every layer.
  void ToBlock(int page, std::byte* block) const;
  void FromBlock(int page, const std::byte* block);
  uint64_t block_bytes() const { return uint64_t{layers_} * 2 * block_tokens_ * token_floats_ * sizeof(float); }
  uint32_t block_tokens() const { return block_tokens_; }

 private:
  uint32_t layers_, block_tokens_, token_floats_, pages_;
  std::vector<float> data_;  // [layer][K|V][page][token][kv_heads * head_dim]
  std::vector<uint32_t> refs_;
  std::vector<int> free_;
};

// A sequence: its tokens and the pages holding their K/V.
struct Sequence {
  std::vector<uint32_t> tokens;
  std::vector<int> block_table;
  uint32_t computed = 0;  // tokens whose K/V are in the pages
};

struct GenerateResult {
  std::vector<uint32_t> tokens;             // generated
  std::vector<std::vector<float>> logits;   // per generated token: the logits it was picked from
  uint32_t reused_tokens = 0;               // prompt tokens loaded from kvtier
  uint32_t stored_blocks = 0;
  double ttft_s = 0;                        // prompt in, first token out
};

class Engine {
 public:
  // `client` may be null: no kvtier (recompute everything).
  Engine(const ModelConfig& m, uint64_t seed, uint32_t block_tokens, uint32_t pages, kvtier::Client* client);
  ~Engine();
  uint64_t block_bytes() const { return cache_.block_bytes(); }
  // Greedy generation of `new_tokens` after `prompt`. Errors are kvtier's
  // (a failed load is a miss: the engine recomputes).
  kvtier::Result<GenerateResult> Generate(const std::vector<uint32_t>& prompt, uint32_t new_tokens);
  // Sequences are freed after Generate; a fork shares pages.
  Sequence Fork(const Sequence& s);
  void Free(Sequence& s);

 private:
  // Runs layers over tokens [s.computed, s.tokens.size()); logits of the last.
  std::vector<float> Forward(Sequence& s);
  bool EnsurePages(Sequence& s, size_t tokens);

  ModelConfig m_;
  std::unique_ptr<Weights> w_;
  PagedKvCache cache_;
  kvtier::Client* client_;
};

}  // namespace tiny

#endif  // KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_
