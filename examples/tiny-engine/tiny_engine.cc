#include "tiny_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

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

struct Weights {
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd;
  };
  std::vector<float> embed, final_norm, lm_head;
  std::vector<Layer> layers;

  Weights(const ModelConfig& m, uint64_t seed) {
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
    embed = fill(size_t{m.vocab} * m.hidden, 1);
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
      layers.push_back(std::move(L));
    }
    final_norm = norm(m.hidden);
    lm_head = fill(size_t{m.vocab} * m.hidden, m.hidden);
  }
};

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

PagedKvCache::PagedKvCache(const ModelConfig& m, uint32_t block_tokens, uint32_t pages)
    : layers_(m.layers), block_tokens_(block_tokens), token_floats_(m.kv_heads * m.head_dim), pages_(pages),
      data_(size_t{m.layers} * 2 * pages * block_tokens * token_floats_, 0.0f), refs_(pages, 0) {
  for (int p = static_cast<int>(pages) - 1; p >= 0; --p) free_.push_back(p);
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
  return data_.data() + (((size_t{layer} * 2 + kv) * pages_ + page) * block_tokens_ + t) * token_floats_;
}

void PagedKvCache::ToBlock(int page, std::byte* block) const {
  const size_t bytes = size_t{block_tokens_} * token_floats_ * sizeof(float);
  for (uint32_t l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = data_.data() + ((size_t{l} * 2 + kv) * pages_ + page) * block_tokens_ * token_floats_;
      std::memcpy(block + (size_t{l} * 2 + kv) * bytes, src, bytes);
    }
  }
}

void PagedKvCache::FromBlock(int page, const std::byte* block) {
  const size_t bytes = size_t{block_tokens_} * token_floats_ * sizeof(float);
  for (uint32_t l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      float* dst = data_.data() + ((size_t{l} * 2 + kv) * pages_ + page) * block_tokens_ * token_floats_;
      std::memcpy(dst, block + (size_t{l} * 2 + kv) * bytes, bytes);
    }
  }
}

Engine::Engine(const ModelConfig& m, uint64_t seed, uint32_t block_tokens, uint32_t pages, kvtier::Client* client)
    : m_(m), w_(std::make_unique<Weights>(m, seed)), cache_(m, block_tokens, pages), client_(client) {}

Engine::~Engine() = default;

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

std::vector<float> Engine::Forward(Sequence& s) {
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

kvtier::Result<GenerateResult> Engine::Generate(const std::vector<uint32_t>& prompt, uint32_t new_tokens) {
  if (prompt.empty()) return Status(ErrorCode::kInvalidArgument, "an empty prompt");
  for (uint32_t t : prompt) {
    if (t >= m_.vocab) return Status(ErrorCode::kInvalidArgument, "a token id past the vocabulary");
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  GenerateResult r;
  Sequence s;
  s.tokens = prompt;
  const uint32_t bt = cache_.block_tokens();
  std::vector<kvtier::BlockKey> keys;
  uint32_t loaded = 0;
  if (client_ != nullptr) {
    keys = client_->ComputeKeys(prompt);
    // At least the last prompt token is computed: its logits pick the first token.
    const size_t reusable = (prompt.size() - 1) / bt;
    auto hit = client_->Lookup(std::span(keys).first(std::min(reusable, keys.size())), {.lease = true});
    if (!hit.ok()) return hit.status();
    if (hit->hit_blocks > 0) {
      auto views = client_->Load(hit->lease, std::span(keys).first(hit->hit_blocks));
      if (views.ok() && EnsurePages(s, size_t{views->size()} * bt)) {
        for (size_t b = 0; b < views->size(); ++b) cache_.FromBlock(s.block_table[b], (*views)[b].data);
        loaded = static_cast<uint32_t>(views->size());  // a failed load is a shorter prefix: recomputed
      }
      (void)client_->Release(hit->lease);
    }
  }
  s.computed = loaded * bt;
  r.reused_tokens = s.computed;
  if (!EnsurePages(s, prompt.size())) {
    Free(s);
    return Status(ErrorCode::kNoSpace, "tiny-engine: out of KV-cache pages");
  }
  std::vector<float> logits = Forward(s);
  const auto prefill_end = Clock::now();
  if (client_ != nullptr) {
    // Store what kvtier did not supply: full prompt blocks after the loaded prefix.
    const size_t full = prompt.size() / bt;
    std::vector<std::vector<std::byte>> bufs;
    std::vector<std::span<const std::byte>> spans;
    for (size_t b = loaded; b < full; ++b) {
      bufs.emplace_back(cache_.block_bytes());
      cache_.ToBlock(s.block_table[b], bufs.back().data());
    }
    for (const auto& b : bufs) spans.emplace_back(b.data(), b.size());
    if (!spans.empty()) {
      auto n = client_->Store(std::span(keys).subspan(loaded, spans.size()), spans);
      if (n.ok()) r.stored_blocks = *n;
    }
    (void)client_->ReportPrefill(r.reused_tokens, prompt.size() - r.reused_tokens, prefill_end - t0);
  }
  for (uint32_t i = 0; i < new_tokens; ++i) {
    const uint32_t next = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (i == 0) r.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
    r.tokens.push_back(next);
    r.logits.push_back(std::move(logits));
    if (i + 1 == new_tokens) break;
    s.tokens.push_back(next);
    if (!EnsurePages(s, s.tokens.size())) {
      Free(s);
      return Status(ErrorCode::kNoSpace, "tiny-engine: out of KV-cache pages");
    }
    logits = Forward(s);
  }
  Free(s);
  return r;
}

}  // namespace tiny
