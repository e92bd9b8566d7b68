// SPDX-License-Identifier: Apache-2.0
// Weights from and to safetensors files: an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range in
// the data that follows, then the data.
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tiny_engine.h"

namespace tiny {

using kvtier::ErrorCode;
using kvtier::Status;

namespace {

// A header larger than this is not a weights file we wrote or can trust.
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;

Status Bad(const std::string& path, const std::string& why) {
  return Status(ErrorCode::kInvalidArgument, path + ": " + why);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits |= sign;
  std::memcpy(&v, &bits, 4);
  return v;
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

struct Tensors {
  nlohmann::json header;
  std::string data;  // everything after the header
};

// The tensor `name` of `shape`, converted to f32.
kvtier::Result<std::vector<float>> Read(const Tensors& t, const std::string& path, const std::string& name,
                                        std::vector<uint64_t> shape) {
  if (!t.header.contains(name)) return Bad(path, "no tensor \"" + name + "\"");
  const nlohmann::json& e = t.header[name];
  if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
      !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2 || !e["data_offsets"][0].is_number_unsigned() ||
      !e["data_offsets"][1].is_number_unsigned()) {
    return Bad(path, "tensor \"" + name + "\" lacks dtype, shape or data_offsets");
  }
  std::vector<uint64_t> got;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned()) return Bad(path, "tensor \"" + name + "\" has a non-integer dimension");
    got.push_back(d.get<uint64_t>());
  }
  if (got != shape) {
    std::string want, have;
    for (uint64_t d : shape) want += (want.empty() ? "" : ",") + std::to_string(d);
    for (uint64_t d : got) have += (have.empty() ? "" : ",") + std::to_string(d);
    return Bad(path, "tensor \"" + name + "\" has shape [" + have + "], the config wants [" + want + "]");
  }
  const std::string dtype = e["dtype"].get<std::string>();
  const uint64_t elem = dtype == "F32" ? 4 : (dtype == "F16" || dtype == "BF16") ? 2 : 0;
  if (elem == 0) return Bad(path, "tensor \"" + name + "\" is " + dtype + "; F32, F16 and BF16 are read");
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  const uint64_t begin = e["data_offsets"][0].get<uint64_t>(), end = e["data_offsets"][1].get<uint64_t>();
  if (begin > end || end > t.data.size() || end - begin != n * elem) {
    return Bad(path, "tensor \"" + name + "\"'s data_offsets do not fit its shape or the file");
  }
  std::vector<float> out(n);
  const char* p = t.data.data() + begin;
  for (uint64_t i = 0; i < n; ++i) {
    if (elem == 4) {
      std::memcpy(&out[i], p + i * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      out[i] = dtype == "F16" ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  return out;
}

std::string LayerName(uint32_t l, const char* rest) { return "model.layers." + std::to_string(l) + "." + rest; }

}  // namespace

kvtier::Result<std::shared_ptr<const Weights>> Weights::FromSafetensors(const ModelConfig& m,
                                                                        const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status(ErrorCode::kNotFound, path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return FromSafetensorsBytes(m, ss.str(), path);
}

kvtier::Result<std::shared_ptr<const Weights>> Weights::FromSafetensorsBytes(const ModelConfig& m,
                                                                             std::string_view file,
                                                                             const std::string& path) {
  if (file.size() < 8) return Bad(path, "shorter than a safetensors header");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<uint8_t>(file[i]);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file.size() - 8) {
    return Bad(path, "the header length (" + std::to_string(header_bytes) + " bytes) runs past the file");
  }
  Tensors t;
  t.header = nlohmann::json::parse(file.substr(8, header_bytes), nullptr, /*allow_exceptions=*/false);
  if (t.header.is_discarded() || !t.header.is_object()) return Bad(path, "the header is not a JSON object");
  t.data = std::string(file.substr(8 + header_bytes));

  const uint64_t H = m.hidden, q = uint64_t{m.heads} * m.head_dim, kv = uint64_t{m.kv_heads} * m.head_dim,
                 I = m.intermediate, V = m.vocab;
  auto w = std::make_shared<Weights>();
  auto read = [&](const std::string& name, std::vector<uint64_t> shape, std::vector<float>* out) -> Status {
    auto v = Read(t, path, name, std::move(shape));
    if (!v.ok()) return v.status();
    *out = std::move(*v);
    return Status();
  };
  if (Status s = read("model.embed_tokens.weight", {V, H}, &w->embed); !s.ok()) return s;
  for (uint32_t l = 0; l < m.layers; ++l) {
    Layer L;
    for (auto [name, shape, out] : {std::tuple{"input_layernorm.weight", std::vector<uint64_t>{H}, &L.attn_norm},
                                    std::tuple{"self_attn.q_proj.weight", std::vector<uint64_t>{q, H}, &L.wq},
                                    std::tuple{"self_attn.k_proj.weight", std::vector<uint64_t>{kv, H}, &L.wk},
                                    std::tuple{"self_attn.v_proj.weight", std::vector<uint64_t>{kv, H}, &L.wv},
                                    std::tuple{"self_attn.o_proj.weight", std::vector<uint64_t>{H, q}, &L.wo},
                                    std::tuple{"post_attention_layernorm.weight", std::vector<uint64_t>{H}, &L.mlp_norm},
                                    std::tuple{"mlp.gate_proj.weight", std::vector<uint64_t>{I, H}, &L.wg},
                                    std::tuple{"mlp.up_proj.weight", std::vector<uint64_t>{I, H}, &L.wu},
                                    std::tuple{"mlp.down_proj.weight", std::vector<uint64_t>{H, I}, &L.wd}}) {
      if (Status s = read(LayerName(l, name), shape, out); !s.ok()) return s;
    }
    w->layers.push_back(std::move(L));
  }
  if (Status s = read("model.norm.weight", {H}, &w->final_norm); !s.ok()) return s;
  if (t.header.contains("lm_head.weight")) {
    if (Status s = read("lm_head.weight", {V, H}, &w->lm_head); !s.ok()) return s;
  } else {
    w->lm_head = w->embed;  // tied embeddings
  }
  return std::shared_ptr<const Weights>(std::move(w));
}

Status Weights::SaveSafetensors(const ModelConfig& m, const std::string& path) const {
  const uint64_t H = m.hidden, q = uint64_t{m.heads} * m.head_dim, kv = uint64_t{m.kv_heads} * m.head_dim,
                 I = m.intermediate, V = m.vocab;
  std::vector<std::tuple<std::string, std::vector<uint64_t>, const std::vector<float>*>> all;
  all.emplace_back("model.embed_tokens.weight", std::vector<uint64_t>{V, H}, &embed);
  for (uint32_t l = 0; l < layers.size(); ++l) {
    const Layer& L = layers[l];
    all.emplace_back(LayerName(l, "input_layernorm.weight"), std::vector<uint64_t>{H}, &L.attn_norm);
    all.emplace_back(LayerName(l, "self_attn.q_proj.weight"), std::vector<uint64_t>{q, H}, &L.wq);
    all.emplace_back(LayerName(l, "self_attn.k_proj.weight"), std::vector<uint64_t>{kv, H}, &L.wk);
    all.emplace_back(LayerName(l, "self_attn.v_proj.weight"), std::vector<uint64_t>{kv, H}, &L.wv);
    all.emplace_back(LayerName(l, "self_attn.o_proj.weight"), std::vector<uint64_t>{H, q}, &L.wo);
    all.emplace_back(LayerName(l, "post_attention_layernorm.weight"), std::vector<uint64_t>{H}, &L.mlp_norm);
    all.emplace_back(LayerName(l, "mlp.gate_proj.weight"), std::vector<uint64_t>{I, H}, &L.wg);
    all.emplace_back(LayerName(l, "mlp.up_proj.weight"), std::vector<uint64_t>{I, H}, &L.wu);
    all.emplace_back(LayerName(l, "mlp.down_proj.weight"), std::vector<uint64_t>{H, I}, &L.wd);
  }
  all.emplace_back("model.norm.weight", std::vector<uint64_t>{H}, &final_norm);
  all.emplace_back("lm_head.weight", std::vector<uint64_t>{V, H}, &lm_head);
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, shape, data] : all) {
    const uint64_t bytes = data->size() * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status(ErrorCode::kIo, path + ": cannot create");
  uint64_t n = h.size();
  char len[8];
  for (char& c : len) {
    c = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  f.write(len, 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& entry : all) {
    const std::vector<float>* data = std::get<2>(entry);
    f.write(reinterpret_cast<const char*>(data->data()), static_cast<std::streamsize>(data->size() * sizeof(float)));
  }
  f.flush();
  if (!f) return Status(ErrorCode::kIo, path + ": write failed");
  return Status();
}

}  // namespace tiny
