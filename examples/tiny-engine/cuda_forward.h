// SPDX-License-Identifier: Apache-2.0
// The tiny engine's forward pass on a CUDA device: the same model and the
// same paged KV cache layout as the CPU path, with weights and pages in
// device memory. Each kernel does a token's arithmetic in a fixed order, so
// a prefix whose K/V were loaded gives the same bits as one computed here.
// Built without the CUDA toolkit, or where no device answers, Create says so.
#ifndef KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_H_
#define KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/client.h"

namespace tiny {

struct ModelConfig;
struct Weights;

class CudaForward {
 public:
  // Uploads the weights and allocates `pages` KV pages of `block_tokens`
  // tokens per layer ([layer][K|V][page][token][kv_heads * head_dim] f32).
  static kvtier::Result<std::unique_ptr<CudaForward>> Create(const ModelConfig& m, const Weights& w,
                                                            uint32_t block_tokens, uint32_t pages);
  virtual ~CudaForward() = default;
  // Runs every layer over tokens [first, tokens.size()) and returns the last
  // one's logits. `before_layer(l)` is called before layer l's kernels are
  // queued (it may make the stream wait for loaded K/V); when it returns
  // false nothing more is queued and the result is empty. Errors are CUDA's.
  virtual kvtier::Result<std::vector<float>> Forward(const std::vector<uint32_t>& tokens, uint32_t first,
                                                     const std::vector<int>& block_table,
                                                     const std::function<bool(uint32_t)>& before_layer) = 0;
  // The device cache as RegisterKvCache wants it (a CUDA region).
  virtual kvtier::KvCacheLayout Layout(const std::string& codec) const = 0;
  // The cudaStream_t the forward pass runs on.
  virtual uint64_t stream() const = 0;
};

}  // namespace tiny

#endif  // KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_H_
