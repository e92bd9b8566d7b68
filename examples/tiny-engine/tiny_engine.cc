// SPDX-License-Identifier: Apache-2.0
#include "tiny_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nlohmann/json.hpp"

namespace tiny {

using kvtier::ErrorCode;
using kvtier::Status;

kvtier::Result<ModelConfig> ModelConfig::FromJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status(ErrorCode::kInvalidArgument, "config.json: not a JSON object");
  ModelConfig m;
  auto field = [&](const char* key, uint32_t* out, bool required) -> Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? Status(ErrorCode::kInvalidArgument, std::string("config.json has no \"") + key + "\"")
                      : Status();
    }
    if (!j[key].is_number_unsigned() || j[key].get<uint64_t>() == 0 || j[key].get<uint64_t>() > (1u << 20)) {
      return Status(ErrorCode::kInvalidArgument, std::string("config.json: \"") + key + "\" must be a positive integer");
    }
    *out = j[key].get<uint32_t>();
    return Status();
  };
  for (auto [key, out] : {std::pair{"num_hidden_layers", &m.layers}, std::pair{"hidden_size", &m.hidden},
                          std::pair{"num_attention_heads", &m.heads}, std::pair{"intermediate_size", &m.intermediate},
                          std::pair{"vocab_size", &m.vocab}}) {
    if (Status s = field(key, out, true); !s.ok()) return s;
  }
  m.kv_heads = m.heads;
  if (Status s = field("num_key_value_heads", &m.kv_heads, false); !s.ok()) return s;
  m.head_dim = m.hidden / m.heads;
  if (Status s = field("head_dim", &m.head_dim, false); !s.ok()) return s;
  if (m.heads % m.kv_heads != 0) {
    return Status(ErrorCode::kInvalidArgument, "config.json: num_attention_heads is not a multiple of num_key_value_heads");
  }
  if (m.head_dim % 2 != 0) return Status(ErrorCode::kInvalidArgument, "config.json: head_dim must be even (rotary)");
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) m.rope_theta = j["rope_theta"].get<float>();
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) m.rms_eps = j["rms_norm_eps"].get<float>();
  return m;
}

std::shared_ptr<const Weights> Weights::Seeded(const ModelConfig& m, uint64_t seed) {
  auto w = std::make_shared<Weights>();
  std::mt19937_64 rng(seed);
  auto fill = [&](size_t n, uint32_t fan_in) {
    std::uniform_real_distribution<float> d(-1.0f / std::sqrt(float(fan_in)), 1.0f / std::sqrt(float(fan_in)));
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  auto norm = [&](size_t n) {
    std::uniform_real_distribution<float> d(0.9f, 1.1f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  const size_t q = size_t{m.heads} * m.head_dim, kv = size_t{m.kv_heads} * m.head_dim;
  w->embed = fill(size_t{m.vocab} * m.hidden, 1);
  for (uint32_t l = 0; l < m.layers; ++l) {
    Layer L;
    L.attn_norm = norm(m.hidden);
    L.wq = fill(q * m.hidden, m.hidden);
    L.wk = fill(kv * m.hidden, m.hidden);
    L.wv = fill(kv * m.hidden, m.hidden);
    L.wo = fill(m.hidden * q, static_cast<uint32_t>(q));
    L.mlp_norm = norm(m.hidden);
    L.wg = fill(size_t{m.intermediate} * m.hidden, m.hidden);
    L.wu = fill(size_t{m.intermediate} * m.hidden, m.hidden);
    L.wd = fill(size_t{m.hidden} * m.intermediate, m.intermediate);
    w->layers.push_back(std::move(L));
  }
  w->final_norm = norm(m.hidden);
  w->lm_head = fill(size_t{m.vocab} * m.hidden, m.hidden);
  return w;
}

kvtier::KvCacheLayout CacheLayout(const ModelConfig& m, uint32_t block_tokens, uint32_t pages, const float* base,
                                  kvtier::KvMemoryRegion region, const std::string& codec) {
  kvtier::KvCacheLayout l;
  l.layers = m.layers;
  l.page_tokens = block_tokens;
  l.kv_heads = m.kv_heads;
  l.head_dim = m.head_dim;
  l.dtype = "f32";
  l.codec = codec;
  l.num_pages = pages;
  const size_t page_floats = size_t{block_tokens} * m.kv_heads * m.head_dim;
  for (uint32_t layer = 0; base != nullptr && layer < m.layers; ++layer) {
    l.k_layers.push_back(base + (size_t{layer} * 2 + 0) * pages * page_floats);
    l.v_layers.push_back(base + (size_t{layer} * 2 + 1) * pages * page_floats);
  }
  l.regions.push_back(region);
  return l;
}

kvtier::Result<kvtier::NamespaceDescriptor> NamespaceFor(const ModelConfig& m, uint32_t block_tokens,
                                                         const std::string& model_id, const std::string& codec) {
  auto bytes = kvtier::KvBlockBytes(CacheLayout(m, block_tokens, 0, nullptr, {}, codec), block_tokens);
  if (!bytes.ok()) return bytes.status();
  kvtier::NamespaceDescriptor ns;
  ns.model_id = model_id;
  // What kvtier keeps: int8 and fp8 blocks have the same size, so the dtype
  // is what keeps an engine from reading the other codec's blocks.
  ns.kv_dtype = codec == "none" ? "f32" : (codec == "fp8" ? "fp8_e4m3" : codec);
  ns.kv_layout = "layer_major";
  ns.block_tokens = block_tokens;
  ns.block_bytes = *bytes;
  return ns;
}

namespace {

// out[r] = sum_c w[r * cols + c] * x[c], in order.
void MatVec(const std::vector<float>& w, const float* x, uint32_t rows, uint32_t cols, float* out) {
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = w.data() + size_t{r} * cols;
    float acc = 0;
    for (uint32_t c = 0; c < cols; ++c) acc += row[c] * x[c];
    out[r] = acc;
  }
}

void RmsNorm(const float* x, const std::vector<float>& g, uint32_t n, float eps, float* out) {
  float ss = 0;
  for (uint32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (uint32_t i = 0; i < n; ++i) out[i] = x[i] * inv * g[i];
}

void Rope(float* v, uint32_t heads, uint32_t hd, uint32_t pos, float theta) {
  const uint32_t half = hd / 2;
  for (uint32_t h = 0; h < heads; ++h) {
    float* x = v + size_t{h} * hd;
    for (uint32_t d = 0; d < half; ++d) {
      const float freq = std::pow(theta, -2.0f * float(d) / float(hd));
      const float a = float(pos) * freq, c = std::cos(a), s = std::sin(a);
      const float x0 = x[d], x1 = x[d + half];
      x[d] = x0 * c - x1 * s;
      x[d + half] = x1 * c + x0 * s;
    }
  }
}

}  // namespace

PagedKvCache::PagedKvCache(const ModelConfig& m, uint32_t block_tokens, uint32_t pages, bool storage)
    : layers_(m.layers), block_tokens_(block_tokens), token_floats_(m.kv_heads * m.head_dim), pages_(pages),
      bytes_(storage ? size_t{m.layers} * 2 * pages * block_tokens * token_floats_ * sizeof(float) : 0),
      refs_(pages, 0) {
  for (int pg = static_cast<int>(pages) - 1; pg >= 0; --pg) free_.push_back(pg);
  if (!storage) return;
  // A memfd (zero-filled), sealed against shrinking: the daemon maps it when
  // the cache is registered. Without a memfd (an old kernel) the daemon
  // cannot, and registration is refused.
  fd_ = memfd_create("tiny-engine-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void* p = MAP_FAILED;
  if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(bytes_)) == 0 && fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
    p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  }
  if (p == MAP_FAILED) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
  }
  data_ = static_cast<float*>(p);
}

PagedKvCache::~PagedKvCache() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
}

kvtier::KvCacheLayout PagedKvCache::Layout(const ModelConfig& m, const std::string& codec) const {
  return CacheLayout(m, block_tokens_, pages_, data_, {data_, bytes_, fd_}, codec);
}

int PagedKvCache::Allocate() {
  if (free_.empty()) return -1;
  const int p = free_.back();
  free_.pop_back();
  refs_[p] = 1;
  return p;
}

void PagedKvCache::Release(int page) {
  if (--refs_[page] == 0) free_.push_back(page);
}

float* PagedKvCache::At(uint32_t layer, int kv, int page, uint32_t t) {
  return data_ + (((size_t{layer} * 2 + kv) * pages_ + page) * block_tokens_ + t) * token_floats_;
}

void PagedKvCache::ToBlock(int page, std::byte* block) const {
  const size_t bytes = size_t{block_tokens_} * token_floats_ * sizeof(float);
  for (uint32_t l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = data_ + ((size_t{l} * 2 + kv) * pages_ + page) * block_tokens_ * token_floats_;
      std::memcpy(block + (size_t{l} * 2 + kv) * bytes, src, bytes);
    }
  }
}

void PagedKvCache::FromBlock(int page, const std::byte* block) {
  const size_t bytes = size_t{block_tokens_} * token_floats_ * sizeof(float);
  for (uint32_t l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      float* dst = data_ + ((size_t{l} * 2 + kv) * pages_ + page) * block_tokens_ * token_floats_;
      std::memcpy(dst, block + (size_t{l} * 2 + kv) * bytes, bytes);
    }
  }
}

Engine::Engine(const ModelConfig& m, uint64_t seed, uint32_t block_tokens, uint32_t pages, kvtier::Client* client,
               EngineOptions options)
    : Engine(m, Weights::Seeded(m, seed), block_tokens, pages, client, std::move(options)) {}

Engine::Engine(const ModelConfig& m, std::shared_ptr<const Weights> weights, uint32_t block_tokens, uint32_t pages,
               kvtier::Client* client, EngineOptions options)
    : m_(m),
      w_(std::move(weights)),
      cache_(m, block_tokens, pages, options.device == EngineOptions::Device::kCpu),
      client_(client),
      options_(std::move(options)) {}

Engine::~Engine() {
  if (registration_ != 0 && client_ != nullptr && client_->connected()) {
    (void)client_->UnregisterKvCache(registration_);
  }
}

bool Engine::EnsurePages(Sequence& s, size_t tokens) {
  const size_t need = (tokens + cache_.block_tokens() - 1) / cache_.block_tokens();
  while (s.block_table.size() < need) {
    const int p = cache_.Allocate();
    if (p < 0) return false;
    s.block_table.push_back(p);
  }
  return true;
}

Sequence Engine::Fork(const Sequence& s) {
  for (int p : s.block_table) cache_.Retain(p);
  return s;
}

void Engine::Free(Sequence& s) {
  for (int p : s.block_table) cache_.Release(p);
  s.block_table.clear();
  s.computed = 0;
}

kvtier::Result<std::vector<float>> Engine::Forward(Sequence& s, const std::function<bool(uint32_t)>& before_layer) {
  if (cuda_ == nullptr) return ForwardCpu(s, before_layer);
  auto logits = cuda_->Forward(s.tokens, s.computed, s.block_table, before_layer);
  if (logits.ok() && !logits->empty()) s.computed = static_cast<uint32_t>(s.tokens.size());
  return logits;
}

std::vector<float> Engine::ForwardCpu(Sequence& s, const std::function<bool(uint32_t)>& before_layer) {
  const uint32_t H = m_.hidden, hd = m_.head_dim, q_dim = m_.heads * hd, kv_dim = m_.kv_heads * hd;
  const uint32_t bt = cache_.block_tokens(), group = m_.heads / m_.kv_heads;
  const size_t first = s.computed, n = s.tokens.size();
  std::vector<std::vector<float>> x(n - first, std::vector<float>(H));
  for (size_t i = first; i < n; ++i) {
    std::memcpy(x[i - first].data(), w_->embed.data() + size_t{s.tokens[i]} * H, H * sizeof(float));
  }
  std::vector<float> h(H), q(q_dim), k(kv_dim), v(kv_dim), attn(q_dim), o(H), g(m_.intermediate),
      u(m_.intermediate), scores;
  for (uint32_t l = 0; l < m_.layers; ++l) {
    if (before_layer && !before_layer(l)) return {};
    const Weights::Layer& L = w_->layers[l];
    for (size_t i = first; i < n; ++i) {
      float* xi = x[i - first].data();
      const uint32_t pos = static_cast<uint32_t>(i);
      RmsNorm(xi, L.attn_norm, H, m_.rms_eps, h.data());
      MatVec(L.wq, h.data(), q_dim, H, q.data());
      MatVec(L.wk, h.data(), kv_dim, H, k.data());
      MatVec(L.wv, h.data(), kv_dim, H, v.data());
      Rope(q.data(), m_.heads, hd, pos, m_.rope_theta);
      Rope(k.data(), m_.kv_heads, hd, pos, m_.rope_theta);
      const int page = s.block_table[pos / bt];
      std::memcpy(cache_.At(l, 0, page, pos % bt), k.data(), kv_dim * sizeof(float));
      std::memcpy(cache_.At(l, 1, page, pos % bt), v.data(), kv_dim * sizeof(float));
      // Attention over positions 0..pos, from the pages (loaded or computed alike).
      scores.resize(pos + 1);
      const float scale = 1.0f / std::sqrt(float(hd));
      for (uint32_t head = 0; head < m_.heads; ++head) {
        const uint32_t kvh = head / group;
        const float* qh = q.data() + size_t{head} * hd;
        float mx = -INFINITY;
        for (uint32_t j = 0; j <= pos; ++j) {
          const float* kj = cache_.At(l, 0, s.block_table[j / bt], j % bt) + size_t{kvh} * hd;
          float d = 0;
          for (uint32_t e = 0; e < hd; ++e) d += qh[e] * kj[e];
          scores[j] = d * scale;
          mx = std::max(mx, scores[j]);
        }
        float sum = 0;
        for (uint32_t j = 0; j <= pos; ++j) {
          scores[j] = std::exp(scores[j] - mx);
          sum += scores[j];
        }
        float* out = attn.data() + size_t{head} * hd;
        std::fill(out, out + hd, 0.0f);
        for (uint32_t j = 0; j <= pos; ++j) {
          const float* vj = cache_.At(l, 1, s.block_table[j / bt], j % bt) + size_t{kvh} * hd;
          const float p = scores[j] / sum;
          for (uint32_t e = 0; e < hd; ++e) out[e] += p * vj[e];
        }
      }
      MatVec(L.wo, attn.data(), H, q_dim, o.data());
      for (uint32_t e = 0; e < H; ++e) xi[e] += o[e];
      // SwiGLU MLP.
      RmsNorm(xi, L.mlp_norm, H, m_.rms_eps, h.data());
      MatVec(L.wg, h.data(), m_.intermediate, H, g.data());
      MatVec(L.wu, h.data(), m_.intermediate, H, u.data());
      for (uint32_t e = 0; e < m_.intermediate; ++e) g[e] = g[e] / (1.0f + std::exp(-g[e])) * u[e];
      MatVec(L.wd, g.data(), H, m_.intermediate, o.data());
      for (uint32_t e = 0; e < H; ++e) xi[e] += o[e];
    }
  }
  s.computed = static_cast<uint32_t>(n);
  RmsNorm(x.back().data(), w_->final_norm, H, m_.rms_eps, h.data());
  std::vector<float> logits(m_.vocab);
  MatVec(w_->lm_head, h.data(), m_.vocab, H, logits.data());
  return logits;
}

kvtier::Result<std::vector<float>> Engine::Prefill(Sequence& s, const std::vector<kvtier::BlockKey>& keys,
                                                   GenerateResult* r) {
  using Clock = std::chrono::steady_clock;
  const uint32_t bt = cache_.block_tokens();
  const size_t prompt = s.tokens.size();
  auto recompute_all = [&]() -> kvtier::Result<std::vector<float>> {
    s.computed = 0;
    r->reused_tokens = 0;
    if (!EnsurePages(s, prompt)) return Status(ErrorCode::kNoSpace, "tiny-engine: out of KV-cache pages");
    return Forward(s);
  };
  if (client_ == nullptr || keys.empty()) return recompute_all();
  // At least the last prompt token is computed: its logits pick the first token.
  const size_t reusable = std::min((prompt - 1) / bt, keys.size());
  if (reusable == 0) return recompute_all();
  auto hit = client_->Lookup(std::span(keys).first(reusable), {.lease = true});
  if (!hit.ok()) {
    // kvtier is a cache: without it the engine computes everything.
    r->kvtier_error = hit.status().message();
    return recompute_all();
  }
  if (hit->hit_blocks == 0) return recompute_all();
  const auto hit_keys = std::span(keys).first(hit->hit_blocks);
  if (!EnsurePages(s, prompt)) {
    (void)client_->Release(hit->lease);
    return Status(ErrorCode::kNoSpace, "tiny-engine: out of KV-cache pages");
  }
  if (options_.path == EngineOptions::Path::kCopy) {
    auto views = client_->Load(hit->lease, hit_keys);
    uint32_t loaded = 0;
    if (views.ok()) {
      for (size_t b = 0; b < views->size(); ++b) cache_.FromBlock(s.block_table[b], (*views)[b].data);
      loaded = static_cast<uint32_t>(views->size());  // a failed load is a shorter prefix: recomputed
    }
    (void)client_->Release(hit->lease);
    s.computed = loaded * bt;
    r->reused_tokens = s.computed;
    return Forward(s);
  }
  // Registered: the daemon scatters the prefix into our pages layer by layer,
  // and layer l of the new tokens runs once layer l of the prefix is in.
  std::vector<uint32_t> pages(s.block_table.begin(), s.block_table.begin() + hit->hit_blocks);
  auto load = client_->LoadIntoCacheAsync(registration_, hit->lease, hit_keys, pages);
  if (!load.ok()) {
    (void)client_->Release(hit->lease);
    return recompute_all();  // a failed load is a miss
  }
  auto waited = [&](uint32_t layers) -> kvtier::Result<uint32_t> {
    const auto t = Clock::now();
    // On CUDA the stream waits for the layer on the device; the host only
    // waits for the load to be queued.
    auto blocks = cuda_ != nullptr ? client_->StreamWaitLayers(*load, layers, cuda_->stream())
                                   : client_->WaitLayers(*load, layers);
    r->load_wait_s += std::chrono::duration<double>(Clock::now() - t).count();
    r->layers_waited = layers;
    return blocks;
  };
  // Layer 0 tells how many blocks the load covers (a block that failed to
  // come back, and those after it, are recomputed).
  auto blocks = waited(1);
  uint32_t loaded = blocks.ok() ? *blocks : 0;
  s.computed = loaded * bt;
  r->reused_tokens = s.computed;
  bool broken = !blocks.ok();
  kvtier::Result<std::vector<float>> logits = std::vector<float>{};
  if (!broken) {
    logits = Forward(s, [&](uint32_t l) {
      if (l == 0) {
        r->layers_in_at_first_compute = client_->LayersReady(*load);
        return true;
      }
      auto b = waited(l + 1);
      broken = !b.ok() || *b != loaded;
      return !broken;
    });
  }
  auto finished = client_->FinishLoad(*load);
  (void)client_->Release(hit->lease);
  if (!logits.ok()) return logits.status();  // the engine's own failure, not the load's
  if (broken || !finished.ok()) return recompute_all();  // whatever landed is not trusted
  return logits;
}

void Engine::StoreNew(const Sequence& s, const std::vector<kvtier::BlockKey>& keys, uint32_t loaded,
                      GenerateResult* r) {
  // Full blocks of computed tokens after `loaded`.
  const size_t full = std::min(keys.size(), size_t{s.computed} / cache_.block_tokens());
  if (full <= loaded) return;
  const auto new_keys = std::span(keys).subspan(loaded, full - loaded);
  if (options_.path == EngineOptions::Path::kRegistered) {
    std::vector<uint32_t> pages(s.block_table.begin() + loaded, s.block_table.begin() + full);
    auto n = client_->StoreFromCache(registration_, new_keys, pages);
    if (n.ok()) r->stored_blocks += *n;
    if (!n.ok()) r->kvtier_error = n.status().message();
    return;
  }
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<const std::byte>> spans;
  for (size_t b = loaded; b < full; ++b) {
    bufs.emplace_back(cache_.block_bytes());
    cache_.ToBlock(s.block_table[b], bufs.back().data());
  }
  for (const auto& b : bufs) spans.emplace_back(b.data(), b.size());
  auto n = client_->Store(new_keys, spans);
  if (n.ok()) r->stored_blocks += *n;
  if (!n.ok()) r->kvtier_error = n.status().message();
}

kvtier::Result<GenerateResult> Engine::Generate(const std::vector<uint32_t>& prompt, uint32_t new_tokens) {
  if (prompt.empty()) return Status(ErrorCode::kInvalidArgument, "an empty prompt");
  if (new_tokens == 0) return Status(ErrorCode::kInvalidArgument, "generate at least one token");
  for (uint32_t t : prompt) {
    if (t >= m_.vocab) return Status(ErrorCode::kInvalidArgument, "a token id past the vocabulary");
  }
  if (options_.device == EngineOptions::Device::kCuda && cuda_ == nullptr) {
    if (client_ != nullptr && options_.path == EngineOptions::Path::kCopy) {
      return Status(ErrorCode::kInvalidArgument, "tiny-engine: the copy path runs on the CPU; register the cache");
    }
    auto f = CudaForward::Create(m_, *w_, cache_.block_tokens(), cache_.pages());
    if (!f.ok()) return f.status();
    cuda_ = std::move(*f);
  }
  if (client_ != nullptr && options_.path == EngineOptions::Path::kRegistered && registration_ == 0) {
    auto reg = client_->RegisterKvCache(cuda_ != nullptr ? cuda_->Layout(options_.codec)
                                                         : cache_.Layout(m_, options_.codec));
    if (!reg.ok()) return reg.status();
    registration_ = *reg;
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  GenerateResult r;
  Sequence s;
  s.tokens = prompt;
  std::vector<kvtier::BlockKey> keys;
  if (client_ != nullptr) keys = client_->ComputeKeys(prompt);
  auto first = Prefill(s, keys, &r);
  if (!first.ok()) {
    Free(s);
    return first.status();
  }
  std::vector<float> logits = std::move(*first);
  const auto prefill_end = Clock::now();
  for (uint32_t i = 0; i < new_tokens; ++i) {
    const uint32_t next = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (i == 0) {
      r.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
      // The first token is out; offloading the new blocks does not delay it
      // (an engine with a GPU would do this on a side stream).
      if (client_ != nullptr) {
        StoreNew(s, keys, r.reused_tokens / cache_.block_tokens(), &r);
        (void)client_->ReportPrefill(r.reused_tokens, prompt.size() - r.reused_tokens, prefill_end - t0);
      }
    }
    r.tokens.push_back(next);
    r.logits.push_back(std::move(logits));
    if (i + 1 == new_tokens) break;
    s.tokens.push_back(next);
    if (!EnsurePages(s, s.tokens.size())) {
      Free(s);
      return Status(ErrorCode::kNoSpace, "tiny-engine: out of KV-cache pages");
    }
    auto more = Forward(s);
    if (!more.ok()) {
      Free(s);
      return more.status();
    }
    logits = std::move(*more);
  }
  const uint32_t bt = cache_.block_tokens(), prompt_blocks = static_cast<uint32_t>(prompt.size() / bt);
  if (client_ != nullptr && s.computed / bt > prompt_blocks) {
    // The sequence ends and its pages go (the engine's eviction): blocks its
    // reply filled are offloaded too, so the next turn reuses them. Their
    // keys continue the prompt's chain; the prompt is not hashed again.
    const auto tail = std::span(s.tokens).subspan(size_t{prompt_blocks} * bt, s.computed - size_t{prompt_blocks} * bt);
    std::vector<kvtier::BlockKey> more =
        client_->ComputeKeys(tail, prompt_blocks > 0 ? &keys[prompt_blocks - 1] : nullptr);
    keys.resize(prompt_blocks);
    keys.insert(keys.end(), more.begin(), more.end());
    StoreNew(s, keys, prompt_blocks, &r);
  }
  Free(s);
  return r;
}

}  // namespace tiny
