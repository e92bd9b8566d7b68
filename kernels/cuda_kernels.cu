// SPDX-License-Identifier: Apache-2.0
// The KV kernels on CUDA. Element arithmetic comes from kv_math.h, shared
// with the CPU reference, so results are bit-identical to it (tests compare
// them on a GPU: cuda_kernels_test). Nothing is allocated or copied before a
// kernel runs: descriptors are kernel parameters (cuda_launch.h).
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda_launch.h"
#include "kernels/kv_math.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t* At(uint64_t address) {
  return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(address));
}

// Lossless: one thread block per page segment (block, layer, K|V, page).
template <typename V>
__global__ void __launch_bounds__(kThreads) CopyPages(const __grid_constant__ Params p) {
  uint64_t seg = blockIdx.x;
  const uint32_t j = seg % p.ppb;
  seg /= p.ppb;
  const int kv = seg % 2;
  seg /= 2;
  const uint32_t li = seg % p.num_layers;
  const uint32_t b = static_cast<uint32_t>(seg / p.num_layers);
  uint8_t* section = At(p.blocks[b]) + (p.first_layer + li) * p.layer_bytes + kv * p.v_off + j * p.page_bytes;
  uint8_t* page = At(kv ? p.v_base[li] : p.k_base[li]) + p.pages[b * p.ppb + j] * p.page_stride;
  V* dst = reinterpret_cast<V*>(p.gather ? section : page);
  const V* src = reinterpret_cast<const V*>(p.gather ? page : section);
  const uint64_t n = p.page_bytes / sizeof(V);
#pragma unroll 4
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
}

__device__ __forceinline__ uint8_t* Token(const Params& p, const uint32_t* pages, uint64_t base, uint32_t t) {
  return At(base) + pages[t / p.page_tokens] * p.page_stride + (t % p.page_tokens) * p.token_bytes;
}
__device__ __forceinline__ float LoadScale(const uint8_t* at) {
  float f;
  memcpy(&f, at, 4);
  return f;
}
__device__ __forceinline__ void StoreScale(uint8_t* at, float f) { memcpy(at, &f, 4); }

// Quantized: one thread block per (block, layer). K: a thread per channel
// walks the tokens (coalesced across channels); V: a thread per (token, head)
// walks head_dim.
__global__ void __launch_bounds__(kThreads) QuantizedLayers(const __grid_constant__ Params p) {
  const uint32_t li = blockIdx.x % p.num_layers;
  const uint32_t b = blockIdx.x / p.num_layers;
  uint8_t* layer = At(p.blocks[b]) + (p.first_layer + li) * p.layer_bytes;
  const uint32_t* pages = p.pages + b * p.ppb;
  const uint32_t eb = p.dtype == 2 ? 4 : 2;
  const uint32_t channels = p.kv_heads * p.head_dim;
  for (uint32_t c = threadIdx.x; c < channels; c += kThreads) {
    float scale;
    if (p.gather) {
      float amax = 0.0f;
      for (uint32_t t = 0; t < p.block_tokens; ++t) {
        amax = fmaxf(amax, math::AbsForScale(math::LoadElement(Token(p, pages, p.k_base[li], t) + c * eb, p.dtype)));
      }
      scale = math::ScaleFor(amax, p.codec);
      StoreScale(layer + p.k_scales_off + 4ull * c, scale);
    } else {
      scale = LoadScale(layer + p.k_scales_off + 4ull * c);
    }
    for (uint32_t t = 0; t < p.block_tokens; ++t) {
      uint8_t* e = Token(p, pages, p.k_base[li], t) + c * eb;
      uint8_t* code = layer + uint64_t{t} * channels + c;
      if (p.gather) {
        *code = math::Quantize(math::LoadElement(e, p.dtype), scale, p.codec);
      } else {
        math::StoreElement(e, p.dtype, math::Dequantize(*code, scale, p.codec));
      }
    }
  }
  const uint32_t rows = p.block_tokens * p.kv_heads;
  for (uint32_t r = threadIdx.x; r < rows; r += kThreads) {
    const uint32_t t = r / p.kv_heads, h = r % p.kv_heads;
    uint8_t* row = Token(p, pages, p.v_base[li], t) + uint64_t{h} * p.head_dim * eb;
    uint8_t* codes = layer + p.v_off + uint64_t{t} * channels + uint64_t{h} * p.head_dim;
    float scale;
    if (p.gather) {
      float amax = 0.0f;
      for (uint32_t d = 0; d < p.head_dim; ++d) {
        amax = fmaxf(amax, math::AbsForScale(math::LoadElement(row + d * eb, p.dtype)));
      }
      scale = math::ScaleFor(amax, p.codec);
      StoreScale(layer + p.v_scales_off + 4ull * r, scale);
    } else {
      scale = LoadScale(layer + p.v_scales_off + 4ull * r);
    }
    for (uint32_t d = 0; d < p.head_dim; ++d) {
      if (p.gather) {
        codes[d] = math::Quantize(math::LoadElement(row + d * eb, p.dtype), scale, p.codec);
      } else {
        math::StoreElement(row + d * eb, p.dtype, math::Dequantize(codes[d], scale, p.codec));
      }
    }
  }
}

// XXH3-64 of one buffer per thread block: 32 x 1 KiB XXH3 blocks are summed
// in parallel (a thread per block and lane), then 8 threads scramble them in
// order (xxh3:: in kv_math.h explains the split).
constexpr uint32_t kSumBlocks = kThreads / 8;
__global__ void __launch_bounds__(kThreads) Xxh3Buffers(const __grid_constant__ ChecksumParams p) {
  const uint8_t* in = At(p.blocks[blockIdx.x]);
  uint64_t* out = reinterpret_cast<uint64_t*>(At(p.out)) + blockIdx.x;
  const uint64_t len = p.bytes;
  if (len <= 240) {
    if (threadIdx.x == 0) *out = math::xxh3::HashShort(in, len);
    return;
  }
  __shared__ uint64_t sums[kSumBlocks][8];
  __shared__ uint64_t acc[8];
  const int lane = threadIdx.x % 8;
  const uint32_t mine = threadIdx.x / 8;
  if (threadIdx.x < 8) acc[lane] = math::xxh3::InitAcc(lane);
  const uint64_t full = math::xxh3::FullBlocks(len);
  for (uint64_t first = 0; first < full; first += kSumBlocks) {
    const uint64_t blk = first + mine;
    if (blk < full) sums[mine][lane] = math::xxh3::BlockLane(in + blk * math::xxh3::kBlockBytes, lane);
    __syncthreads();
    if (threadIdx.x < 8) {
      uint64_t a = acc[lane];
      const uint64_t n = min(uint64_t{kSumBlocks}, full - first);
      for (uint64_t i = 0; i < n; ++i) a = math::xxh3::Scramble(a + sums[i][lane], lane);
      acc[lane] = a;
    }
    __syncthreads();
  }
  if (threadIdx.x < 8) acc[lane] = math::xxh3::TailLane(in, len, acc[lane], lane);
  __syncthreads();
  if (threadIdx.x == 0) *out = math::xxh3::Merge(acc, len);
}

}  // namespace

int LaunchCopyPages(const Params& p, uint32_t vector_bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = p.num_blocks * p.num_layers * 2 * p.ppb;
  switch (vector_bytes) {
    case 16: CopyPages<uint4><<<grid, kThreads, 0, s>>>(p); break;
    case 8: CopyPages<uint2><<<grid, kThreads, 0, s>>>(p); break;
    case 4: CopyPages<uint32_t><<<grid, kThreads, 0, s>>>(p); break;
    case 2: CopyPages<uint16_t><<<grid, kThreads, 0, s>>>(p); break;
    default: CopyPages<uint8_t><<<grid, kThreads, 0, s>>>(p); break;
  }
  return static_cast<int>(cudaGetLastError());
}

int LaunchQuantized(const Params& p, void* stream) {
  QuantizedLayers<<<p.num_blocks * p.num_layers, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int LaunchChecksum(const ChecksumParams& p, uint32_t buffers, void* stream) {
  Xxh3Buffers<<<buffers, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

const char* ErrorString(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace kvtier::kernels::cuda
