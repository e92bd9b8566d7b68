// SPDX-License-Identifier: Apache-2.0
// A tiny decoder-only transformer on libkvtier: RMSNorm, rotary positions,
// grouped-query attention, SwiGLU MLP, greedy decoding, on the CPU in f32,
// with a paged KV cache (pages of block_tokens tokens, a block table per
// sequence, allocate / fork / free). Weights come from a seed or from a
// Hugging Face-style safetensors file. Before prefill it looks up the
// prompt's blocks in kvtier and loads the hit prefix into its pages; after
// prefill it stores the blocks kvtier did not have, and it reports its
// prefill cost.
//
// Two ways to move blocks (EngineOptions::path):
//  - kRegistered (default): the cache lives in a sealed memfd registered with
//    the daemon (RegisterKvCache). Loads land layer by layer
//    (LoadIntoCacheAsync): layer 0 of the new tokens is computed as soon as
//    layer 0 of the prefix is in, while later layers still arrive. Stores
//    are gathered by the daemon (StoreFromCache), optionally quantized to
//    INT8 or FP8 (EngineOptions::codec).
//  - kCopy: the engine copies Load's views into its pages and stores from
//    buffers of its own.
//
// A kvtier block is the layer-major form of one page of every layer:
// [layer][K|V][block_tokens][kv_heads][head_dim] f32. Reuse is exact: the
// K/V a layer reads are the same bytes whether computed or loaded, and every
// token's arithmetic is done in the same order either way.
#ifndef KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_
#define KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_forward.h"
#include "kvtier/client.h"

namespace tiny {

struct ModelConfig {
  uint32_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float rope_theta = 10000.0f, rms_eps = 1e-6f;
  // From a Hugging Face-style config.json; errors name the missing field.
  static kvtier::Result<ModelConfig> FromJson(const std::string& text);
};

// The model's weights, f32, in Hugging Face Llama naming.
struct Weights {
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd;
  };
  std::vector<float> embed, final_norm, lm_head;
  std::vector<Layer> layers;

  // Uniform in +-1/sqrt(fan_in), norms near 1.
  static std::shared_ptr<const Weights> Seeded(const ModelConfig& m, uint64_t seed);
  // A safetensors file holding model.embed_tokens.weight,
  // model.layers.N.{input_layernorm,self_attn.{q,k,v,o}_proj,
  // post_attention_layernorm,mlp.{gate,up,down}_proj}.weight, model.norm.weight
  // and lm_head.weight (absent: tied to the embeddings), in F32, F16 or BF16.
  // Errors name the tensor and what is wrong with it.
  static kvtier::Result<std::shared_ptr<const Weights>> FromSafetensors(const ModelConfig& m, const std::string& path);
  // The same from the file's bytes (`path` names it in errors).
  static kvtier::Result<std::shared_ptr<const Weights>> FromSafetensorsBytes(const ModelConfig& m,
                                                                             std::string_view file,
                                                                             const std::string& path);
  // Writes the weights as F32 safetensors (the names above).
  kvtier::Status SaveSafetensors(const ModelConfig& m, const std::string& path) const;
};

// The KV cache layout of both devices, as RegisterKvCache wants it: per
// layer K then V, each [pages][block_tokens][kv_heads][head_dim] f32 from
// `base`, all in `region`.
kvtier::KvCacheLayout CacheLayout(const ModelConfig& m, uint32_t block_tokens, uint32_t pages, const float* base,
                                  kvtier::KvMemoryRegion region, const std::string& codec);

// Pages of the KV cache, shared by the sequences that hold them. The pages
// live in a memfd sealed against shrinking, so the daemon can map them.
class PagedKvCache {
 public:
  // `storage` false: page bookkeeping only (the pages live elsewhere, e.g.
  // on a CUDA device).
  PagedKvCache(const ModelConfig& m, uint32_t block_tokens, uint32_t pages, bool storage = true);
  ~PagedKvCache();
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;
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
  uint32_t pages() const { return pages_; }
  // The cache as RegisterKvCache wants it: per layer K then V, each
  // [pages][block_tokens][kv_heads][head_dim] f32.
  kvtier::KvCacheLayout Layout(const ModelConfig& m, const std::string& codec) const;

 private:
  uint32_t layers_, block_tokens_, token_floats_, pages_;
  int fd_ = -1;
  size_t bytes_ = 0;
  float* data_ = nullptr;  // [layer][K|V][page][token][kv_heads * head_dim]
  std::vector<uint32_t> refs_;
  std::vector<int> free_;
};

// A sequence: its tokens and the pages holding their K/V.
struct Sequence {
  std::vector<uint32_t> tokens;
  std::vector<int> block_table;
  uint32_t computed = 0;  // tokens whose K/V are in the pages
};

struct EngineOptions {
  enum class Path { kRegistered, kCopy };
  Path path = Path::kRegistered;
  // Where prefill and decode run. kCuda keeps weights and KV pages in device
  // memory (registered as a CUDA region: the daemon needs device = "cuda")
  // and makes its stream wait for each loaded layer on the device
  // (StreamWaitLayers); the copy path is CPU only.
  enum class Device { kCpu, kCuda };
  Device device = Device::kCpu;
  // kRegistered only: "none" (lossless), "int8" or "fp8" blocks in kvtier.
  std::string codec = "none";
};

// The namespace an engine of this model attaches with: the KV dtype kvtier
// keeps (f32, or the codec's) and the block size the layout needs.
kvtier::Result<kvtier::NamespaceDescriptor> NamespaceFor(const ModelConfig& m, uint32_t block_tokens,
                                                         const std::string& model_id,
                                                         const std::string& codec = "none");

struct GenerateResult {
  std::vector<uint32_t> tokens;             // generated
  std::vector<std::vector<float>> logits;   // per generated token: the logits it was picked from
  uint32_t reused_tokens = 0;               // prompt tokens loaded from kvtier
  uint32_t stored_blocks = 0;               // written: the prompt's after prefill, the reply's at the end
  double ttft_s = 0;                        // prompt in, first token out
  double load_wait_s = 0;                   // of which waiting for loaded layers
  uint32_t layers_waited = 0;               // layers the prefill waited for (registered path)
  uint32_t layers_in_at_first_compute = 0;  // of the loaded prefix, when layer 0 of the new tokens started
  std::string kvtier_error;                 // the last kvtier call that failed (the engine went on without it)
};

class Engine {
 public:
  // `client` may be null: no kvtier (recompute everything).
  Engine(const ModelConfig& m, uint64_t seed, uint32_t block_tokens, uint32_t pages, kvtier::Client* client,
         EngineOptions options = {});
  Engine(const ModelConfig& m, std::shared_ptr<const Weights> weights, uint32_t block_tokens, uint32_t pages,
         kvtier::Client* client, EngineOptions options = {});
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
  // `before_layer(l)` runs before layer l (waiting for its loaded K/V); when
  // it fails, Forward stops and returns nothing.
  kvtier::Result<std::vector<float>> Forward(Sequence& s, const std::function<bool(uint32_t)>& before_layer = {});
  std::vector<float> ForwardCpu(Sequence& s, const std::function<bool(uint32_t)>& before_layer);
  bool EnsurePages(Sequence& s, size_t tokens);
  // Loads the hit prefix of `keys` into s's pages and runs the prefill.
  kvtier::Result<std::vector<float>> Prefill(Sequence& s, const std::vector<kvtier::BlockKey>& keys,
                                            GenerateResult* r);
  void StoreNew(const Sequence& s, const std::vector<kvtier::BlockKey>& keys, uint32_t loaded, GenerateResult* r);

  ModelConfig m_;
  std::shared_ptr<const Weights> w_;
  PagedKvCache cache_;
  kvtier::Client* client_;
  EngineOptions options_;
  uint64_t registration_ = 0;  // kRegistered, once registered
  std::unique_ptr<CudaForward> cuda_;  // kCuda, once created
};

}  // namespace tiny

#endif  // KVTIER_EXAMPLES_TINY_ENGINE_TINY_ENGINE_H_
