// SPDX-License-Identifier: Apache-2.0
// Without the CUDA toolkit there are no CUDA kernels.
#include "kernels/cuda_kernels.h"

namespace kvtier::kernels {

std::unique_ptr<KvKernels> MakeCudaKernels() { return nullptr; }

}  // namespace kvtier::kernels
