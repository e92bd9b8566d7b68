// SPDX-License-Identifier: Apache-2.0
// Launchers of the tiny engine's CUDA kernels (cuda_forward_kernels.cu).
// Plain types only, so the .cu file needs nothing else of the project. Each
// returns a cudaError_t (0: queued on `stream`). Row-major f32 throughout;
// `n` counts the tokens of this pass, at positions pos0, pos0 + 1, ...
#ifndef KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_LAUNCH_H_
#define KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_LAUNCH_H_

#include <cstdint>

namespace tiny::cuda {

// x[t][:] = embed[tokens[t]][:]
int LaunchEmbed(const float* embed, const uint32_t* tokens, uint32_t n, uint32_t hidden, float* x, void* stream);
// out[t] = x[t] / rms(x[t]) * g
int LaunchRmsNorm(const float* x, const float* g, uint32_t n, uint32_t hidden, float eps, float* out, void* stream);
// out[t][r] = sum_c w[r][c] * h[t][c], summed in order of c
int LaunchMatMul(const float* w, const float* h, uint32_t n, uint32_t rows, uint32_t cols, float* out, void* stream);
// Rotary positions on v[t][head][head_dim] (halves rotated, as Llama).
int LaunchRope(float* v, uint32_t n, uint32_t heads, uint32_t head_dim, uint32_t pos0, float theta, void* stream);
// K and V of each token into its page slot: pages [page][block_tokens][kv_dim].
int LaunchWriteKv(const float* k, const float* v, uint32_t n, uint32_t kv_dim, uint32_t pos0, const int* table,
                  uint32_t block_tokens, float* k_pages, float* v_pages, void* stream);
// Causal attention of each token over positions 0..its own, from the pages.
int LaunchAttention(const float* q, const float* k_pages, const float* v_pages, const int* table, uint32_t n,
                    uint32_t pos0, uint32_t heads, uint32_t kv_heads, uint32_t head_dim, uint32_t block_tokens,
                    float* out, void* stream);
// x += o
int LaunchAdd(float* x, const float* o, uint64_t count, void* stream);
// g = silu(g) * u
int LaunchSwiGlu(float* g, const float* u, uint64_t count, void* stream);

}  // namespace tiny::cuda

#endif  // KVTIER_EXAMPLES_TINY_ENGINE_CUDA_FORWARD_LAUNCH_H_
