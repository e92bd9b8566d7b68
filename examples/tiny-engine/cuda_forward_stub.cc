// SPDX-License-Identifier: Apache-2.0
// Built without the CUDA toolkit: the CUDA forward pass says so.
#include "cuda_forward.h"

namespace tiny {

kvtier::Result<std::unique_ptr<CudaForward>> CudaForward::Create(const ModelConfig&, const Weights&, uint32_t,
                                                                uint32_t) {
  return kvtier::Status(kvtier::ErrorCode::kNotFound,
                        "tiny-engine was built without the CUDA toolkit; use the CPU (--device cpu)");
}

}  // namespace tiny
