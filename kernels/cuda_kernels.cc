// SPDX-License-Identifier: Apache-2.0
// CudaKvKernels: validation and launch splitting on the host; the kernels
// themselves are in cuda_kernels.cu.
#include "kernels/cuda_kernels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cuda_launch.h"

namespace kvtier::kernels {
namespace {

absl::Status LaunchStatus(int err, absl::string_view what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cuda::ErrorString(err)));
}

// The widest access every address and size allows.
uint32_t VectorBytes(const cuda::Params& p, const PagedCache& cache, const BlockIo& io) {
  uint64_t bits = p.page_bytes | p.page_stride | p.layer_bytes | p.v_off | 16;
  for (uint64_t a : cache.k_base) bits |= a;
  for (uint64_t a : cache.v_base) bits |= a;
  for (uint64_t a : io.blocks) bits |= a;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

void* StreamOf(DeviceStream stream) { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream)); }

class CudaKvKernels final : public KvKernels {
 public:
  absl::string_view name() const override { return "cuda"; }

  absl::Status Gather(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                      DeviceStream stream) override {
    return Run(shape, codec, cache, io, stream, /*gather=*/true);
  }
  absl::Status Scatter(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                       DeviceStream stream) override {
    return Run(shape, codec, cache, io, stream, /*gather=*/false);
  }

  absl::Status Checksum(absl::Span<const uint64_t> blocks, uint64_t bytes, uint64_t* out,
                        DeviceStream stream) override {
    if (out == nullptr && !blocks.empty()) return absl::InvalidArgumentError("checksum: null output");
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] == 0 && bytes > 0) {
        return absl::InvalidArgumentError(absl::StrCat("checksum: block ", i, " is null"));
      }
    }
    auto p = std::make_unique<cuda::ChecksumParams>();
    for (size_t first = 0; first < blocks.size(); first += cuda::kMaxBlocks) {
      const size_t n = std::min<size_t>(cuda::kMaxBlocks, blocks.size() - first);
      std::copy_n(blocks.begin() + first, n, p->blocks);
      p->bytes = bytes;
      p->out = reinterpret_cast<uint64_t>(out + first);
      RETURN_IF_ERROR(LaunchStatus(cuda::LaunchChecksum(*p, static_cast<uint32_t>(n), StreamOf(stream)),
                                   "checksum kernel"));
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Run(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                          DeviceStream stream, bool gather) {
    RETURN_IF_ERROR(ValidateIo(shape, codec, cache, io));
    const uint32_t ppb = PagesPerBlock(shape, cache);
    if (ppb > cuda::kMaxPages) {
      return absl::InvalidArgumentError(
          absl::StrCat("a block of ", ppb, " pages; the CUDA kernels take at most ", cuda::kMaxPages));
    }
    const BlockGeometry g = GeometryOf(shape, codec);
    auto p = std::make_unique<cuda::Params>();  // ~13 KB: not on the stack
    p->page_stride = cache.page_stride;
    p->page_bytes = PageBytes(shape, cache);
    p->token_bytes = uint64_t{shape.kv_heads} * shape.head_dim * DtypeBytes(shape.dtype);
    p->layer_bytes = g.layer_bytes;
    p->v_off = g.v_off;
    p->k_scales_off = g.k_scales_off;
    p->v_scales_off = g.v_scales_off;
    p->ppb = ppb;
    p->page_tokens = cache.page_tokens;
    p->block_tokens = shape.block_tokens;
    p->kv_heads = shape.kv_heads;
    p->head_dim = shape.head_dim;
    p->dtype = static_cast<int>(shape.dtype);
    p->codec = static_cast<int>(codec);
    p->gather = gather ? 1 : 0;
    const uint32_t vec = VectorBytes(*p, cache, io);
    const uint32_t layer_end = io.layer_count == 0 ? shape.layers : io.first_layer + io.layer_count;
    const uint32_t blocks_per_launch = std::min(cuda::kMaxBlocks, cuda::kMaxPages / ppb);
    for (uint32_t l0 = io.first_layer; l0 < layer_end; l0 += cuda::kMaxLayers) {
      p->first_layer = l0;
      p->num_layers = std::min(cuda::kMaxLayers, layer_end - l0);
      std::copy_n(cache.k_base.begin() + l0, p->num_layers, p->k_base);
      std::copy_n(cache.v_base.begin() + l0, p->num_layers, p->v_base);
      for (size_t b0 = 0; b0 < io.blocks.size(); b0 += blocks_per_launch) {
        p->num_blocks = static_cast<uint32_t>(std::min<size_t>(blocks_per_launch, io.blocks.size() - b0));
        std::copy_n(io.blocks.begin() + b0, p->num_blocks, p->blocks);
        std::copy_n(io.pages.begin() + b0 * ppb, p->num_blocks * ppb, p->pages);
        const int err = codec == BlockCodec::kLossless ? cuda::LaunchCopyPages(*p, vec, StreamOf(stream))
                                                       : cuda::LaunchQuantized(*p, StreamOf(stream));
        RETURN_IF_ERROR(LaunchStatus(err, gather ? "gather kernel" : "scatter kernel"));
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<KvKernels> MakeCudaKernels() { return std::make_unique<CudaKvKernels>(); }

}  // namespace kvtier::kernels
