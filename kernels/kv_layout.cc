// SPDX-License-Identifier: Apache-2.0
#include "kernels/kv_layout.h"

#include "absl/strings/str_cat.h"
#include "core/checked.h"

namespace kvtier::kernels {
namespace {

constexpr uint64_t Align16(uint64_t v) { return (v + 15) & ~uint64_t{15}; }
// A block must stay well inside what one transfer and one NVMe slot can hold.
constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 32;

}  // namespace

uint32_t DtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16:
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kF32:
      return 4;
    case KvDtype::kFp8E4M3:
    case KvDtype::kInt8:
      return 1;
  }
  return 0;
}

absl::string_view DtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16: return "f16";
    case KvDtype::kBF16: return "bf16";
    case KvDtype::kF32: return "f32";
    case KvDtype::kFp8E4M3: return "fp8_e4m3";
    case KvDtype::kInt8: return "int8";
  }
  return "?";
}

absl::string_view CodecName(BlockCodec codec) {
  switch (codec) {
    case BlockCodec::kLossless: return "none";
    case BlockCodec::kInt8: return "int8";
    case BlockCodec::kFp8E4M3: return "fp8";
  }
  return "?";
}

absl::Status ParseDtype(absl::string_view name, KvDtype* out) {
  if (name == "f16" || name == "float16" || name == "half") {
    *out = KvDtype::kF16;
  } else if (name == "bf16" || name == "bfloat16") {
    *out = KvDtype::kBF16;
  } else if (name == "f32" || name == "float32" || name == "float") {
    *out = KvDtype::kF32;
  } else if (name == "fp8_e4m3" || name == "fp8" || name == "float8_e4m3fn") {
    *out = KvDtype::kFp8E4M3;
  } else if (name == "int8") {
    *out = KvDtype::kInt8;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV dtype \"", name, "\" is not one of f16, bf16, f32, fp8_e4m3, int8"));
  }
  return absl::OkStatus();
}

absl::Status ParseCodec(absl::string_view name, BlockCodec* out) {
  if (name == "none" || name == "lossless") {
    *out = BlockCodec::kLossless;
  } else if (name == "int8") {
    *out = BlockCodec::kInt8;
  } else if (name == "fp8" || name == "fp8_e4m3") {
    *out = BlockCodec::kFp8E4M3;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("block codec \"", name, "\" is not one of none, int8, fp8"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const KvShape& shape, BlockCodec codec) {
  if (shape.layers == 0) return absl::InvalidArgumentError("KV shape: layers is 0");
  if (shape.block_tokens == 0) return absl::InvalidArgumentError("KV shape: block_tokens is 0");
  if (shape.kv_heads == 0) return absl::InvalidArgumentError("KV shape: kv_heads is 0");
  if (shape.head_dim == 0) return absl::InvalidArgumentError("KV shape: head_dim is 0");
  if (DtypeBytes(shape.dtype) == 0) return absl::InvalidArgumentError("KV shape: unknown dtype");
  if (codec != BlockCodec::kLossless && shape.dtype != KvDtype::kF16 &&
      shape.dtype != KvDtype::kBF16 && shape.dtype != KvDtype::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV shape: the ", CodecName(codec), " codec quantizes f16, bf16 or f32 caches, not ",
        DtypeName(shape.dtype), "; use codec none"));
  }
  // Three 32-bit factors can pass 2^64: every product is checked.
  const std::optional<uint64_t> bytes = CheckedProduct(
      {shape.block_tokens, shape.kv_heads, shape.head_dim, DtypeBytes(shape.dtype), 2, shape.layers});
  if (!bytes || *bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError("KV shape: one block would exceed 4 GiB");
  }
  return absl::OkStatus();
}

BlockGeometry GeometryOf(const KvShape& shape, BlockCodec codec) {
  BlockGeometry g;
  const uint64_t channels = uint64_t{shape.kv_heads} * shape.head_dim;
  const uint64_t elems = uint64_t{shape.block_tokens} * channels;
  if (codec == BlockCodec::kLossless) {
    g.k_bytes = elems * DtypeBytes(shape.dtype);
    g.v_off = g.k_bytes;
    g.layer_bytes = 2 * g.k_bytes;
  } else {
    g.k_bytes = elems;
    g.k_scales_off = Align16(g.k_bytes);
    g.v_off = Align16(g.k_scales_off + channels * sizeof(float));
    g.v_scales_off = Align16(g.v_off + elems);
    g.layer_bytes = Align16(g.v_scales_off +
                            uint64_t{shape.block_tokens} * shape.kv_heads * sizeof(float));
  }
  g.block_bytes = g.layer_bytes * shape.layers;
  return g;
}

absl::Status Validate(const KvShape& shape, const PagedCache& cache) {
  if (cache.page_tokens == 0) return absl::InvalidArgumentError("paged cache: page_tokens is 0");
  if (shape.block_tokens % cache.page_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged cache: a block of ", shape.block_tokens, " tokens is not a whole number of ",
        cache.page_tokens, "-token pages"));
  }
  if (cache.k_base.size() != shape.layers || cache.v_base.size() != shape.layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged cache: ", cache.k_base.size(), " K and ", cache.v_base.size(),
        " V layer bases for a ", shape.layers, "-layer shape"));
  }
  if (cache.page_stride < PageBytes(shape, cache)) {
    return absl::InvalidArgumentError(absl::StrCat("paged cache: page stride ", cache.page_stride,
                                                   " is smaller than a page (",
                                                   PageBytes(shape, cache), " bytes)"));
  }
  if (cache.num_pages == 0) return absl::InvalidArgumentError("paged cache: num_pages is 0");
  // Every page address base + p * stride must be computable: the layer's
  // extent may not wrap 64 bits.
  if (!StridedExtent(cache.num_pages, cache.page_stride, PageBytes(shape, cache))) {
    return absl::InvalidArgumentError(absl::StrCat("paged cache: ", cache.num_pages, " pages of stride ",
                                                   cache.page_stride, " overflow 64 bits"));
  }
  for (uint32_t l = 0; l < shape.layers; ++l) {
    if (cache.k_base[l] == 0 || cache.v_base[l] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("paged cache: layer ", l, " has a null base"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::kernels
