// SPDX-License-Identifier: Apache-2.0
#include "tests/kernels/kv_kernels_testlib.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/kv_math.h"

namespace kvtier::kernels::testing {
namespace {

// A case laid out in memory: the engine cache (one region) and the blocks.
struct Setup {
  KvShape shape;
  PagedCache cache;          // addresses in kernel memory
  uint64_t cache_addr = 0;   // the region holding every layer's pages
  uint64_t cache_bytes = 0;
  std::vector<uint8_t> host; // what the region holds
  std::vector<uint32_t> pages;
  std::vector<uint64_t> blocks;
  uint32_t eb = 0, ppb = 0;
  uint64_t page_bytes = 0;
  BlockGeometry g;

  uint64_t Off(uint64_t addr) const { return addr - cache_addr; }
  // Offset in the region of element (layer, kv, block b, token t, channel c).
  uint64_t CacheOff(uint32_t l, int kv, uint32_t b, uint32_t t, uint64_t c) const {
    const uint64_t base = kv == 0 ? cache.k_base[l] : cache.v_base[l];
    const uint32_t page = pages[b * ppb + t / cache.page_tokens];
    return Off(base) + page * cache.page_stride +
           ((t % cache.page_tokens) * uint64_t{shape.kv_heads} * shape.head_dim + c) * eb;
  }
};

Setup Build(Memory& m, const Case& c, BlockCodec codec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Setup s;
  s.shape = c.shape;
  s.eb = DtypeBytes(c.shape.dtype);
  s.cache.page_tokens = c.page_tokens;
  s.ppb = c.shape.block_tokens / c.page_tokens;
  s.page_bytes = uint64_t{c.page_tokens} * c.shape.kv_heads * c.shape.head_dim * s.eb;
  s.cache.num_pages = uint64_t{c.blocks} * s.ppb + c.spare_pages;
  const uint64_t pad = (rng() % 2) * 16;
  s.cache.page_stride = (c.fused ? 2 * s.page_bytes : s.page_bytes) + pad;
  const uint64_t tensor = s.cache.num_pages * s.cache.page_stride;
  const uint64_t per_layer = c.fused ? tensor : 2 * tensor;
  s.cache_bytes = per_layer * c.shape.layers;
  s.cache_addr = m.alloc(s.cache_bytes);
  for (uint32_t l = 0; l < c.shape.layers; ++l) {
    const uint64_t base = s.cache_addr + l * per_layer;
    s.cache.k_base.push_back(base);
    s.cache.v_base.push_back(c.fused ? base + s.page_bytes : base + tensor);
  }
  s.pages.resize(s.cache.num_pages);
  std::iota(s.pages.begin(), s.pages.end(), 0u);
  std::shuffle(s.pages.begin(), s.pages.end(), rng);
  s.pages.resize(uint64_t{c.blocks} * s.ppb);
  s.g = GeometryOf(c.shape, codec);
  for (uint32_t b = 0; b < c.blocks; ++b) s.blocks.push_back(m.alloc(s.g.block_bytes));
  // Contents: any bytes for a lossless copy; for quantizing, values whose
  // magnitude varies by channel in K and by token in V (as real caches do),
  // so a scale taken on the wrong axis is far off.
  s.host.assign(s.cache_bytes, 0);
  if (codec == BlockCodec::kLossless) {
    for (auto& byte : s.host) byte = static_cast<uint8_t>(rng());
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
    const uint64_t channels = uint64_t{c.shape.kv_heads} * c.shape.head_dim;
    const int dt = static_cast<int>(c.shape.dtype);
    for (uint32_t l = 0; l < c.shape.layers; ++l) {
      std::vector<float> k_mag(channels);
      for (auto& mag : k_mag) mag = std::pow(10.0f, exponent(rng));
      for (uint32_t b = 0; b < c.blocks; ++b) {
        for (uint32_t t = 0; t < c.shape.block_tokens; ++t) {
          const float v_mag = std::pow(10.0f, exponent(rng));
          for (uint64_t ch = 0; ch < channels; ++ch) {
            const float zero_or_one = (rng() % 50 == 0) ? 0.0f : 1.0f;
            math::StoreElement(s.host.data() + s.CacheOff(l, 0, b, t, ch), dt,
                               normal(rng) * k_mag[ch] * zero_or_one);
            math::StoreElement(s.host.data() + s.CacheOff(l, 1, b, t, ch), dt, normal(rng) * v_mag);
          }
        }
      }
    }
  }
  m.upload(s.cache_addr, s.host.data(), s.cache_bytes);
  m.sync();
  return s;
}

BlockIo IoOf(const Setup& s, uint32_t first_layer = 0, uint32_t layer_count = 0) {
  return BlockIo{s.pages, s.blocks, first_layer, layer_count};
}

std::vector<uint8_t> Download(Memory& m, uint64_t addr, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  m.download(out.data(), addr, bytes);
  m.sync();
  return out;
}

void ZeroCache(Memory& m, const Setup& s) {
  std::vector<uint8_t> zero(s.cache_bytes, 0);
  m.upload(s.cache_addr, zero.data(), zero.size());
  m.sync();
}

// The cache bytes the engine would hold if only `layers` of the used pages
// had been written back (everything else zero).
std::vector<uint8_t> ExpectedCache(const Setup& s, uint32_t first, uint32_t end) {
  std::vector<uint8_t> want(s.cache_bytes, 0);
  const uint64_t channels = uint64_t{s.shape.kv_heads} * s.shape.head_dim;
  for (uint32_t l = first; l < end; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t b = 0; b < s.blocks.size(); ++b) {
        for (uint32_t t = 0; t < s.shape.block_tokens; ++t) {
          const uint64_t off = s.CacheOff(l, kv, b, t, 0);
          std::memcpy(want.data() + off, s.host.data() + off, channels * s.eb);
        }
      }
    }
  }
  return want;
}

std::string FirstDiff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                      absl::string_view what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::StrCat(what, ": byte ", i, " is ", got[i], ", want ", want[i]);
    }
  }
  return "";
}

double OutputUlp(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16: return std::ldexp(1.0, -11);
    case KvDtype::kBF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// How far a decoded value may be from the original, from the scale alone.
double Bound(BlockCodec codec, double x, double scale) {
  if (codec == BlockCodec::kInt8) return 0.5 * scale * (1 + 1e-5) + std::fabs(x) * 1e-6;
  // E4M3: half a unit in the last of 3 mantissa bits, or half the subnormal step.
  return std::max(std::fabs(x) * std::ldexp(1.0, -4), scale * std::ldexp(1.0, -10)) * (1 + 1e-5);
}

}  // namespace

Memory HostMemory() {
  auto owned = std::make_shared<std::vector<void*>>();
  Memory m;
  m.alloc = [owned](uint64_t bytes) {
    void* p = std::calloc(1, bytes + 16);
    owned->push_back(p);
    return reinterpret_cast<uint64_t>(p);
  };
  m.upload = [](uint64_t dst, const void* src, uint64_t n) {
    if (n > 0) std::memcpy(reinterpret_cast<void*>(dst), src, n);
  };
  m.download = [](void* dst, uint64_t src, uint64_t n) {
    if (n > 0) std::memcpy(dst, reinterpret_cast<void*>(src), n);
  };
  m.sync = [] {};
  m.free_all = [owned] {
    for (void* p : *owned) std::free(p);
    owned->clear();
  };
  return m;
}

Memory DeviceMemory(DeviceBackend& dev, DeviceStream stream) {
  auto owned = std::make_shared<std::vector<void*>>();
  Memory m;
  m.stream = stream;
  m.alloc = [&dev, owned, stream](uint64_t bytes) {
    absl::StatusOr<void*> p = dev.Allocate(bytes + 16);
    if (!p.ok()) std::abort();
    owned->push_back(*p);
    std::vector<uint8_t> zero(bytes + 16, 0);
    if (!dev.CopyAsync(*p, zero.data(), zero.size(), stream).ok() || !dev.SynchronizeStream(stream).ok()) {
      std::abort();
    }
    return reinterpret_cast<uint64_t>(*p);
  };
  m.upload = [&dev, stream](uint64_t dst, const void* src, uint64_t n) {
    if (!dev.CopyAsync(reinterpret_cast<void*>(dst), src, n, stream).ok()) std::abort();
  };
  m.download = [&dev, stream](void* dst, uint64_t src, uint64_t n) {
    if (!dev.CopyAsync(dst, reinterpret_cast<void*>(src), n, stream).ok()) std::abort();
  };
  m.sync = [&dev, stream] {
    if (!dev.SynchronizeStream(stream).ok()) std::abort();
  };
  m.free_all = [&dev, owned] {
    for (void* p : *owned) (void)dev.Free(p);
    owned->clear();
  };
  return m;
}

std::string Case::Name() const {
  return absl::StrCat(DtypeName(shape.dtype), " L", shape.layers, " T", shape.block_tokens, "/", page_tokens,
                      " H", shape.kv_heads, " D", shape.head_dim, fused ? " fused" : " apart", " x",
                      blocks);
}

std::vector<Case> Cases(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<uint32_t> v) { return *(v.begin() + rng() % v.size()); };
  std::vector<Case> out;
  const KvDtype dtypes[] = {KvDtype::kF16, KvDtype::kBF16, KvDtype::kF32, KvDtype::kFp8E4M3,
                            KvDtype::kInt8};
  for (int i = 0; i < count; ++i) {
    Case c;
    c.shape.dtype = dtypes[i % 5];
    c.shape.layers = pick({1, 2, 3});
    c.page_tokens = pick({1, 2, 3, 5, 16});
    c.shape.block_tokens = c.page_tokens * pick({1, 2, 3});
    c.shape.kv_heads = pick({1, 2, 3, 8});
    c.shape.head_dim = pick({1, 3, 8, 64, 128});
    c.fused = rng() % 2 == 0;
    c.blocks = pick({1, 2, 5});
    c.spare_pages = pick({0, 1, 3});
    out.push_back(c);
  }
  return out;
}

std::string CheckLosslessRoundTrip(KvKernels& k, Memory& m, const Case& c, uint64_t seed) {
  Setup s = Build(m, c, BlockCodec::kLossless, seed);
  absl::Status st = k.Gather(s.shape, BlockCodec::kLossless, s.cache, IoOf(s), m.stream);
  if (!st.ok()) return absl::StrCat("gather: ", st.ToString());
  m.sync();
  const uint64_t channels = uint64_t{s.shape.kv_heads} * s.shape.head_dim;
  for (uint32_t b = 0; b < s.blocks.size(); ++b) {
    const std::vector<uint8_t> block = Download(m, s.blocks[b], s.g.block_bytes);
    for (uint32_t l = 0; l < s.shape.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (uint32_t t = 0; t < s.shape.block_tokens; ++t) {
          for (uint64_t ch = 0; ch < channels; ++ch) {
            // [layer][K|V][tokens][heads][dim]
            const uint64_t at = l * s.g.layer_bytes + kv * s.g.v_off + (t * channels + ch) * s.eb;
            if (std::memcmp(block.data() + at, s.host.data() + s.CacheOff(l, kv, b, t, ch), s.eb) != 0) {
              return absl::StrCat("gather: block ", b, " layer ", l, kv ? " V" : " K", " token ", t,
                                  " channel ", ch, " differs");
            }
          }
        }
      }
    }
  }
  ZeroCache(m, s);
  st = k.Scatter(s.shape, BlockCodec::kLossless, s.cache, IoOf(s), m.stream);
  if (!st.ok()) return absl::StrCat("scatter: ", st.ToString());
  m.sync();
  std::string diff = FirstDiff(Download(m, s.cache_addr, s.cache_bytes),
                               ExpectedCache(s, 0, s.shape.layers), "scatter");
  m.free_all();
  return diff;
}

std::string CheckLayerwiseScatter(KvKernels& k, Memory& m, const Case& c, uint64_t seed) {
  Setup s = Build(m, c, BlockCodec::kLossless, seed);
  absl::Status st = k.Gather(s.shape, BlockCodec::kLossless, s.cache, IoOf(s), m.stream);
  if (!st.ok()) return absl::StrCat("gather: ", st.ToString());
  m.sync();
  ZeroCache(m, s);
  for (uint32_t l = 0; l < s.shape.layers; ++l) {
    st = k.Scatter(s.shape, BlockCodec::kLossless, s.cache, IoOf(s, l, 1), m.stream);
    if (!st.ok()) return absl::StrCat("scatter layer ", l, ": ", st.ToString());
    m.sync();
    std::string diff = FirstDiff(Download(m, s.cache_addr, s.cache_bytes), ExpectedCache(s, 0, l + 1),
                                 absl::StrCat("after layer ", l));
    if (!diff.empty()) return diff;
  }
  m.free_all();
  return "";
}

std::string CheckQuantized(KvKernels& k, Memory& m, const Case& c, BlockCodec codec, uint64_t seed) {
  Setup s = Build(m, c, codec, seed);
  absl::Status st = k.Gather(s.shape, codec, s.cache, IoOf(s), m.stream);
  if (!st.ok()) return absl::StrCat("gather: ", st.ToString());
  m.sync();
  const int dt = static_cast<int>(s.shape.dtype), cc = static_cast<int>(codec);
  const uint32_t H = s.shape.kv_heads, D = s.shape.head_dim, T = s.shape.block_tokens;
  const uint64_t channels = uint64_t{H} * D;
  auto x_at = [&](uint32_t l, int kv, uint32_t b, uint32_t t, uint64_t ch) {
    return math::LoadElement(s.host.data() + s.CacheOff(l, kv, b, t, ch), dt);
  };
  // The decoded value each element must come back as, after the scatter.
  std::vector<uint8_t> want_cache(s.cache_bytes, 0);
  for (uint32_t b = 0; b < s.blocks.size(); ++b) {
    const std::vector<uint8_t> block = Download(m, s.blocks[b], s.g.block_bytes);
    for (uint32_t l = 0; l < s.shape.layers; ++l) {
      const uint8_t* layer = block.data() + l * s.g.layer_bytes;
      for (int kv = 0; kv < 2; ++kv) {
        const uint8_t* codes = layer + (kv == 0 ? 0 : s.g.v_off);
        const uint8_t* scales = layer + (kv == 0 ? s.g.k_scales_off : s.g.v_scales_off);
        // Scales by naive loops: K per channel over the block's tokens, V per
        // token and head over head_dim.
        std::vector<float> want_scales(kv == 0 ? channels : uint64_t{T} * H, 0.0f);
        for (uint32_t t = 0; t < T; ++t) {
          for (uint64_t ch = 0; ch < channels; ++ch) {
            float& amax = want_scales[kv == 0 ? ch : uint64_t{t} * H + ch / D];
            amax = std::max(amax, math::AbsForScale(x_at(l, kv, b, t, ch)));
          }
        }
        for (float& v : want_scales) v = math::ScaleFor(v, cc);
        for (uint32_t t = 0; t < T; ++t) {
          for (uint64_t ch = 0; ch < channels; ++ch) {
            const uint64_t scale_index = kv == 0 ? ch : uint64_t{t} * H + ch / D;
            const float want_scale = want_scales[scale_index];
            float scale;
            std::memcpy(&scale, scales + scale_index * 4, 4);
            if (scale != want_scale) {
              return absl::StrCat("block ", b, " layer ", l, kv ? " V" : " K", " scale ", scale_index,
                                  " is ", scale, ", want ", want_scale,
                                  kv ? " (per token and head)" : " (per channel)");
            }
            const float x = x_at(l, kv, b, t, ch);
            const uint8_t code = codes[uint64_t{t} * channels + ch];
            if (code != math::Quantize(x, scale, cc)) {
              return absl::StrCat("block ", b, " layer ", l, kv ? " V" : " K", " token ", t, " channel ", ch,
                                  " code ", code, " want ", math::Quantize(x, scale, cc));
            }
            const float y = math::Dequantize(code, scale, cc);
            if (std::fabs(double{y} - x) > Bound(codec, x, scale)) {
              return absl::StrCat("decoded ", y, " is too far from ", x, " (scale ", scale, ")");
            }
            uint8_t* w = want_cache.data() + s.CacheOff(l, kv, b, t, ch);
            math::StoreElement(w, dt, y);
            const double back = math::LoadElement(w, dt);
            if (std::fabs(back - x) > Bound(codec, x, scale) + OutputUlp(s.shape.dtype) * (std::fabs(x) + scale)) {
              return absl::StrCat("stored ", back, " is too far from ", x);
            }
          }
        }
      }
    }
  }
  ZeroCache(m, s);
  st = k.Scatter(s.shape, codec, s.cache, IoOf(s), m.stream);
  if (!st.ok()) return absl::StrCat("scatter: ", st.ToString());
  m.sync();
  std::string diff = FirstDiff(Download(m, s.cache_addr, s.cache_bytes), want_cache, "dequantizing scatter");
  m.free_all();
  return diff;
}

std::string CheckChecksums(KvKernels& k, Memory& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<uint64_t> lens = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025,
                                      4096, 65536 + 13, (2u << 20) + 5};
  for (uint64_t bytes : lens) {
    std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(bytes));
    std::vector<uint64_t> addrs;
    for (auto& d : data) {
      for (auto& byte : d) byte = static_cast<uint8_t>(rng());
      addrs.push_back(m.alloc(bytes + 1) + (addrs.size() == 1 ? 1 : 0));  // one unaligned
      m.upload(addrs.back(), d.data(), bytes);
    }
    const uint64_t out = m.alloc(8 * data.size());
    m.sync();
    absl::Status st = k.Checksum(addrs, bytes, reinterpret_cast<uint64_t*>(out), m.stream);
    if (!st.ok()) return absl::StrCat("checksum of ", bytes, " bytes: ", st.ToString());
    m.sync();
    std::vector<uint64_t> got(data.size());
    m.download(got.data(), out, 8 * got.size());
    m.sync();
    for (size_t i = 0; i < data.size(); ++i) {
      if (got[i] != XXH3_64bits(data[i].data(), bytes)) {
        return absl::StrCat("checksum of ", bytes, " bytes (buffer ", i, ") differs from XXH3_64bits");
      }
    }
    m.free_all();
  }
  return "";
}

}  // namespace kvtier::kernels::testing
