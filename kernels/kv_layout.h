// SPDX-License-Identifier: Apache-2.0
// Shapes and byte layouts shared by the KV kernels.
//
// An engine keeps its KV cache paged, per layer: K and V each
// [num_pages, page_tokens, kv_heads, head_dim] (vLLM / SGLang), apart or fused
// in one tensor; `PagedCache` describes both by a K and a V base address per
// layer and the byte stride between pages. A daemon block covers
// `block_tokens` = n x page_tokens tokens and is laid out layer-major so a
// reload can complete layer by layer:
//
//   lossless:  [layer][K|V][tokens][heads][dim]           (engine dtype)
//   int8/fp8:  [layer][K q][K scales][V q][V scales]      (1-byte codes)
//              K scales: float per channel (head, dim), over the block's tokens
//              V scales: float per token and head, over head_dim
//              every section starts 16-byte aligned.
#ifndef KVTIER_KERNELS_KV_LAYOUT_H_
#define KVTIER_KERNELS_KV_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvtier::kernels {

// Element type of an engine's KV cache.
enum class KvDtype : uint8_t { kF16 = 0, kBF16 = 1, kF32 = 2, kFp8E4M3 = 3, kInt8 = 4 };
// How a block's bytes encode the cache: a plain copy, or quantized on offload.
enum class BlockCodec : uint8_t { kLossless = 0, kInt8 = 1, kFp8E4M3 = 2 };

uint32_t DtypeBytes(KvDtype dtype);
absl::string_view DtypeName(KvDtype dtype);
absl::string_view CodecName(BlockCodec codec);
// "f16" | "bf16" | "f32" | "fp8_e4m3" | "int8" (also "float16", "bfloat16",
// "float32", as Hugging Face configs spell them).
absl::Status ParseDtype(absl::string_view name, KvDtype* out);
// "none" | "int8" | "fp8"
absl::Status ParseCodec(absl::string_view name, BlockCodec* out);

struct KvShape {
  uint32_t layers = 0;
  uint32_t block_tokens = 0;  // tokens in one daemon block
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  KvDtype dtype = KvDtype::kF16;
};

// Sizes and offsets of one encoded block.
struct BlockGeometry {
  uint64_t k_bytes = 0;         // K codes (or K elements) of one layer
  uint64_t k_scales_off = 0;    // offset of K scales in a layer (quantized only)
  uint64_t v_off = 0;           // offset of V in a layer
  uint64_t v_scales_off = 0;    // offset of V scales in a layer (quantized only)
  uint64_t layer_bytes = 0;     // bytes of one layer
  uint64_t block_bytes = 0;     // layers x layer_bytes
};

// InvalidArgument naming the field when a shape is empty, too large, or when
// a codec cannot apply (quantizing needs a f16/bf16/f32 cache).
absl::Status Validate(const KvShape& shape, BlockCodec codec);
BlockGeometry GeometryOf(const KvShape& shape, BlockCodec codec);

// An engine's paged KV cache. Page p of layer l's K starts at
// k_base[l] + p * page_stride (same for V); a page holds
// [page_tokens][kv_heads][head_dim] contiguous elements.
struct PagedCache {
  uint32_t page_tokens = 0;
  uint64_t num_pages = 0;
  uint64_t page_stride = 0;       // bytes
  std::vector<uint64_t> k_base;   // per layer, addresses on the kernels' device
  std::vector<uint64_t> v_base;   // per layer
};

// Checks the cache against the shape: one base per layer, block_tokens a
// multiple of page_tokens, a stride that holds a page, and (for the CPU
// reference's callers) pages of one layer that do not overlap.
absl::Status Validate(const KvShape& shape, const PagedCache& cache);
inline uint32_t PagesPerBlock(const KvShape& shape, const PagedCache& cache) {
  return shape.block_tokens / cache.page_tokens;
}
inline uint64_t PageBytes(const KvShape& shape, const PagedCache& cache) {
  return uint64_t{cache.page_tokens} * shape.kv_heads * shape.head_dim * DtypeBytes(shape.dtype);
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_KV_LAYOUT_H_
