// SPDX-License-Identifier: Apache-2.0
// The KV kernels: gather engine pages into layer-major
// blocks (quantizing on the way when a codec asks), scatter blocks back into
// pages, and checksum blocks the way the NVMe tier does. Two implementations
// share this interface and its exact results: the CPU reference (used by the
// host-simulated device) and CUDA.
#ifndef KVTIER_KERNELS_KV_KERNELS_H_
#define KVTIER_KERNELS_KV_KERNELS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/device_types.h"
#include "kernels/kv_layout.h"

namespace kvtier::kernels {

// Which blocks and pages one call moves.
struct BlockIo {
  // PagesPerBlock() page ids per block, block after block.
  absl::Span<const uint32_t> pages;
  // Address of each encoded block (GeometryOf().block_bytes each).
  absl::Span<const uint64_t> blocks;
  // Layers [first_layer, first_layer + layer_count); 0 = through the last.
  // A reload scatters layer by layer so the engine can start on layer 0.
  uint32_t first_layer = 0;
  uint32_t layer_count = 0;
};

// InvalidArgument, naming what is wrong, for a shape, cache or I/O list that
// no kernel may run on: page ids out of range, a count mismatch, a null block,
// a layer range past the last layer.
absl::Status ValidateIo(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                        const BlockIo& io);

class KvKernels {
 public:
  KvKernels() = default;
  virtual ~KvKernels() = default;
  KvKernels(const KvKernels&) = delete;
  KvKernels& operator=(const KvKernels&) = delete;

  // Thread-safe. "reference" or "cuda".
  virtual absl::string_view name() const = 0;
  // Thread-safe. Engine pages -> encoded blocks on `stream`: a copy for the
  // lossless codec; INT8 / FP8 with per-channel K and per-token V scales else.
  virtual absl::Status Gather(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                              const BlockIo& io, DeviceStream stream) = 0;
  // Thread-safe. Encoded blocks -> engine pages on `stream` (the inverse).
  virtual absl::Status Scatter(const KvShape& shape, BlockCodec codec, const PagedCache& cache,
                               const BlockIo& io, DeviceStream stream) = 0;
  // Thread-safe. out[i] = XXH3-64 of the `bytes` bytes at blocks[i], the NVMe
  // tier's payload checksum. `out` must be writable by the stream's device.
  virtual absl::Status Checksum(absl::Span<const uint64_t> blocks, uint64_t bytes, uint64_t* out,
                                DeviceStream stream) = 0;
};

// The CPU reference: runs at once on the calling thread; `stream` is ignored.
std::unique_ptr<KvKernels> MakeReferenceKernels();

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_KV_KERNELS_H_
