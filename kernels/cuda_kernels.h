// SPDX-License-Identifier: Apache-2.0
// The CUDA implementation of KvKernels (built when the toolkit is found).
// Addresses are device addresses (or host memory the device can reach:
// registered or mapped); streams are cudaStream_t bits. Kernels run on the
// calling thread's current device.
#ifndef KVTIER_KERNELS_CUDA_KERNELS_H_
#define KVTIER_KERNELS_CUDA_KERNELS_H_

#include <memory>

#include "kernels/kv_kernels.h"

namespace kvtier::kernels {

// nullptr in a build without CUDA.
std::unique_ptr<KvKernels> MakeCudaKernels();

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CUDA_KERNELS_H_
