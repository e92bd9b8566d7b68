// SPDX-License-Identifier: Apache-2.0
// Checks every KvKernels implementation must pass, against naive loops over
// explicit indices. kv_kernels_test runs them on the CPU reference and on the
// host-simulated device; cuda_kernels_test on a GPU, with device memory.
#ifndef KVTIER_TESTS_KERNELS_KV_KERNELS_TESTLIB_H_
#define KVTIER_TESTS_KERNELS_KV_KERNELS_TESTLIB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kv_kernels.h"
#include "tiers/device_backend.h"

namespace kvtier::kernels::testing {

// Where the kernels' memory lives: host memory for the reference, device
// memory (with copies in and out) for CUDA.
struct Memory {
  std::function<uint64_t(uint64_t bytes)> alloc;              // zeroed
  std::function<void(uint64_t dst, const void* src, uint64_t bytes)> upload;
  std::function<void(void* dst, uint64_t src, uint64_t bytes)> download;
  std::function<void()> sync;                                 // wait for the stream
  std::function<void()> free_all;
  DeviceStream stream = 0;
};

struct Case {
  KvShape shape;
  uint32_t page_tokens = 1;
  bool fused = false;        // K and V pages of a layer interleaved in one tensor
  uint32_t blocks = 1;
  uint32_t spare_pages = 3;  // pages no block uses (must stay untouched)
  std::string Name() const;
};

// Host memory: what the CPU reference reads and writes.
Memory HostMemory();
// Memory of a device backend, moved with its copies on `stream`.
Memory DeviceMemory(DeviceBackend& dev, DeviceStream stream);

// A spread of shapes: every dtype, odd block sizes, head counts and dims,
// fused and separate K/V, one and several pages per block.
std::vector<Case> Cases(uint64_t seed, int count);

// Each returns "" on success, else what differed first.
std::string CheckLosslessRoundTrip(KvKernels& k, Memory& m, const Case& c, uint64_t seed);
std::string CheckQuantized(KvKernels& k, Memory& m, const Case& c, BlockCodec codec, uint64_t seed);
std::string CheckLayerwiseScatter(KvKernels& k, Memory& m, const Case& c, uint64_t seed);
std::string CheckChecksums(KvKernels& k, Memory& m, uint64_t seed);

}  // namespace kvtier::kernels::testing

#endif  // KVTIER_TESTS_KERNELS_KV_KERNELS_TESTLIB_H_
