// SPDX-License-Identifier: Apache-2.0
// The boundary between host C++ and nvcc: plain parameter blocks and launch
// functions, so cuda_kernels.cu includes no Abseil and cuda_kernels.cc no
// CUDA headers. Work descriptors travel as kernel parameters
// (__grid_constant__, ~13 KB); bigger calls are split into several launches.
#ifndef KVTIER_KERNELS_CUDA_LAUNCH_H_
#define KVTIER_KERNELS_CUDA_LAUNCH_H_

#include <cstdint>

namespace kvtier::kernels::cuda {

constexpr uint32_t kMaxLayers = 128;  // per launch
constexpr uint32_t kMaxPages = 2048;  // per launch
constexpr uint32_t kMaxBlocks = 256;  // per launch

struct Params {
  uint64_t k_base[kMaxLayers];
  uint64_t v_base[kMaxLayers];
  uint64_t blocks[kMaxBlocks];
  uint32_t pages[kMaxPages];
  uint64_t page_stride, page_bytes, token_bytes, layer_bytes, v_off, k_scales_off, v_scales_off;
  uint32_t first_layer, num_layers, num_blocks, ppb, page_tokens, block_tokens, kv_heads, head_dim;
  int dtype, codec, gather;
};
static_assert(sizeof(Params) < 32000, "kernel parameters are limited to 32 KB");

struct ChecksumParams {
  uint64_t blocks[kMaxBlocks];
  uint64_t bytes;
  uint64_t out;  // address of uint64_t[number of blocks]
};

// Each returns the cudaError_t of the launch (0 = success). `stream` is a
// cudaStream_t.
int LaunchCopyPages(const Params& p, uint32_t vector_bytes, void* stream);
int LaunchQuantized(const Params& p, void* stream);
int LaunchChecksum(const ChecksumParams& p, uint32_t buffers, void* stream);
const char* ErrorString(int error);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_LAUNCH_H_
