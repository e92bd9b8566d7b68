// SPDX-License-Identifier: Apache-2.0
// The CPU reference of the KV kernels. It is what the host-simulated device
// runs, and what the CUDA kernels are tested against: element arithmetic comes
// from kv_math.h, which both compile.
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/kv_kernels.h"
#include "kernels/kv_math.h"

namespace kvtier::kernels {
namespace {

uint8_t* Ptr(uint64_t address) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(address)); }

uint32_t LayerEnd(const KvShape& shape, const BlockIo& io) {
  return io.layer_count == 0 ? shape.layers : io.first_layer + io.layer_count;
}

// Where token t of a block lives in the engine's cache, for one layer's K or V.
struct PageWalk {
  const PagedCache& cache;
  const uint32_t* pages;  // this block's page ids
  uint64_t token_bytes;   // kv_heads * head_dim * element bytes
  uint8_t* Token(uint64_t base, uint32_t t) const {
    return Ptr(base) + pages[t / cache.page_tokens] * cache.page_stride +
           (t % cache.page_tokens) * token_bytes;
  }
};

class ReferenceKernels final : public KvKernels {
 public:
  absl::string_view name() const override { return "reference"; }

  absl::Status Gather(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                      const BlockIo& io, DeviceStream) override {
    RETURN_IF_ERROR(ValidateIo(shape, codec, cache, io));
    Run(shape, codec, cache, io, /*gather=*/true);
    return absl::OkStatus();
  }

  absl::Status Scatter(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                       const BlockIo& io, DeviceStream) override {
    RETURN_IF_ERROR(ValidateIo(shape, codec, cache, io));
    Run(shape, codec, cache, io, /*gather=*/false);
    return absl::OkStatus();
  }

  absl::Status Checksum(absl::Span<const uint64_t> blocks, uint64_t bytes, uint64_t* out,
                        DeviceStream) override {
    if (out == nullptr && !blocks.empty()) return absl::InvalidArgumentError("checksum: null output");
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] == 0 && bytes > 0) {
        return absl::InvalidArgumentError(absl::StrCat("checksum: block ", i, " is null"));
      }
      out[i] = XXH3_64bits(Ptr(blocks[i]), bytes);
    }
    return absl::OkStatus();
  }

 private:
  static void Run(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                  bool gather) {
    const BlockGeometry g = GeometryOf(shape, codec);
    const uint32_t ppb = PagesPerBlock(shape, cache);
    const uint64_t page_bytes = PageBytes(shape, cache);
    for (size_t b = 0; b < io.blocks.size(); ++b) {
      const uint32_t* pages = io.pages.data() + b * ppb;
      for (uint32_t l = io.first_layer; l < LayerEnd(shape, io); ++l) {
        uint8_t* layer = Ptr(io.blocks[b]) + l * g.layer_bytes;
        if (codec == BlockCodec::kLossless) {
          for (int kv = 0; kv < 2; ++kv) {
            const uint64_t base = kv == 0 ? cache.k_base[l] : cache.v_base[l];
            uint8_t* section = layer + (kv == 0 ? 0 : g.v_off);
            for (uint32_t j = 0; j < ppb; ++j) {
              uint8_t* page = Ptr(base) + pages[j] * cache.page_stride;
              if (gather) {
                std::memcpy(section + j * page_bytes, page, page_bytes);
              } else {
                std::memcpy(page, section + j * page_bytes, page_bytes);
              }
            }
          }
        } else {
          const PageWalk walk{cache, pages,
                              uint64_t{shape.kv_heads} * shape.head_dim * DtypeBytes(shape.dtype)};
          QuantizedLayer(shape, codec, walk, cache.k_base[l], cache.v_base[l], layer, g, gather);
        }
      }
    }
  }

  static void QuantizedLayer(const KvShape& shape, BlockCodec codec, const PageWalk& walk,
                             uint64_t k_base, uint64_t v_base, uint8_t* layer,
                             const BlockGeometry& g, bool gather) {
    const int dt = static_cast<int>(shape.dtype);
    const int cc = static_cast<int>(codec);
    const uint32_t eb = DtypeBytes(shape.dtype);
    const uint32_t channels = shape.kv_heads * shape.head_dim;
    const uint32_t tokens = shape.block_tokens;
    uint8_t* k_codes = layer;
    uint8_t* v_codes = layer + g.v_off;
    auto* k_scales = reinterpret_cast<float*>(layer + g.k_scales_off);
    auto* v_scales = reinterpret_cast<float*>(layer + g.v_scales_off);
    // K: one scale per channel, over the block's tokens.
    for (uint32_t c = 0; c < channels; ++c) {
      float scale;
      if (gather) {
        float amax = 0.0f;
        for (uint32_t t = 0; t < tokens; ++t) {
          amax = std::max(amax, math::AbsForScale(math::LoadElement(walk.Token(k_base, t) + c * eb, dt)));
        }
        scale = math::ScaleFor(amax, cc);
        k_scales[c] = scale;
      } else {
        scale = k_scales[c];
      }
      for (uint32_t t = 0; t < tokens; ++t) {
        uint8_t* e = walk.Token(k_base, t) + c * eb;
        uint8_t& code = k_codes[uint64_t{t} * channels + c];
        if (gather) {
          code = math::Quantize(math::LoadElement(e, dt), scale, cc);
        } else {
          math::StoreElement(e, dt, math::Dequantize(code, scale, cc));
        }
      }
    }
    // V: one scale per token and head, over head_dim.
    for (uint32_t t = 0; t < tokens; ++t) {
      uint8_t* token = walk.Token(v_base, t);
      for (uint32_t h = 0; h < shape.kv_heads; ++h) {
        const uint64_t row = uint64_t{h} * shape.head_dim;
        float scale;
        if (gather) {
          float amax = 0.0f;
          for (uint32_t d = 0; d < shape.head_dim; ++d) {
            amax = std::max(amax, math::AbsForScale(math::LoadElement(token + (row + d) * eb, dt)));
          }
          scale = math::ScaleFor(amax, cc);
          v_scales[uint64_t{t} * shape.kv_heads + h] = scale;
        } else {
          scale = v_scales[uint64_t{t} * shape.kv_heads + h];
        }
        for (uint32_t d = 0; d < shape.head_dim; ++d) {
          uint8_t* e = token + (row + d) * eb;
          uint8_t& code = v_codes[uint64_t{t} * channels + row + d];
          if (gather) {
            code = math::Quantize(math::LoadElement(e, dt), scale, cc);
          } else {
            math::StoreElement(e, dt, math::Dequantize(code, scale, cc));
          }
        }
      }
    }
  }
};

}  // namespace

absl::Status ValidateIo(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                        const BlockIo& io) {
  RETURN_IF_ERROR(Validate(shape, codec));
  RETURN_IF_ERROR(Validate(shape, cache));
  const uint64_t ppb = PagesPerBlock(shape, cache);
  if (io.pages.size() != io.blocks.size() * ppb) {
    return absl::InvalidArgumentError(absl::StrCat(io.pages.size(), " page ids for ", io.blocks.size(),
                                                   " blocks of ", ppb, " pages"));
  }
  for (size_t i = 0; i < io.pages.size(); ++i) {
    if (io.pages[i] >= cache.num_pages) {
      return absl::InvalidArgumentError(absl::StrCat("page id ", io.pages[i], " (entry ", i,
                                                     ") is past the cache's ", cache.num_pages,
                                                     " pages"));
    }
  }
  for (size_t b = 0; b < io.blocks.size(); ++b) {
    if (io.blocks[b] == 0) return absl::InvalidArgumentError(absl::StrCat("block ", b, " is null"));
  }
  if (io.first_layer >= shape.layers ||
      uint64_t{io.first_layer} + io.layer_count > shape.layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", io.first_layer, ", +", io.layer_count,
                                                   ") are not within the shape's ", shape.layers));
  }
  return absl::OkStatus();
}

std::unique_ptr<KvKernels> MakeReferenceKernels() { return std::make_unique<ReferenceKernels>(); }

}  // namespace kvtier::kernels
