// SPDX-License-Identifier: Apache-2.0
// The tiny engine's kernels: one thread per output element (or per token and
// head for attention), each summing in a fixed order, so results do not
// depend on which tokens share a pass. Small and plain: the point is exact
// reuse, not speed. Built with --fmad=false like the KV kernels.
#include <cuda_runtime.h>

#include <cmath>

#include "examples/tiny-engine/cuda_forward_launch.h"

namespace tiny::cuda {
namespace {

constexpr uint32_t kThreads = 128;

uint32_t Blocks(uint64_t work) { return static_cast<uint32_t>((work + kThreads - 1) / kThreads); }

int Launched() { return static_cast<int>(cudaGetLastError()); }

__global__ void EmbedK(const float* embed, const uint32_t* tokens, uint32_t n, uint32_t hidden, float* x) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<uint64_t>(n) * hidden) return;
  x[i] = embed[static_cast<uint64_t>(tokens[i / hidden]) * hidden + i % hidden];
}

__global__ void RmsNormK(const float* x, const float* g, uint32_t n, uint32_t hidden, float eps, float* out) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float* xr = x + static_cast<uint64_t>(t) * hidden;
  float ss = 0;
  for (uint32_t e = 0; e < hidden; ++e) ss += xr[e] * xr[e];
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
  for (uint32_t e = 0; e < hidden; ++e) out[static_cast<uint64_t>(t) * hidden + e] = xr[e] * inv * g[e];
}

__global__ void MatMulK(const float* w, const float* h, uint32_t n, uint32_t rows, uint32_t cols, float* out) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<uint64_t>(n) * rows) return;
  const uint64_t t = i / rows, r = i % rows;
  const float* row = w + r * cols;
  const float* x = h + t * cols;
  float acc = 0;
  for (uint32_t c = 0; c < cols; ++c) acc += row[c] * x[c];
  out[i] = acc;
}

__global__ void RopeK(float* v, uint32_t n, uint32_t heads, uint32_t hd, uint32_t pos0, float theta) {
  const uint32_t half = hd / 2;
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<uint64_t>(n) * heads * half) return;
  const uint64_t t = i / (uint64_t{heads} * half), rem = i % (uint64_t{heads} * half);
  const uint32_t head = static_cast<uint32_t>(rem / half), d = static_cast<uint32_t>(rem % half);
  float* x = v + (t * heads + head) * hd;
  const float freq = powf(theta, -2.0f * static_cast<float>(d) / static_cast<float>(hd));
  const float a = static_cast<float>(pos0 + t) * freq, c = cosf(a), s = sinf(a);
  const float x0 = x[d], x1 = x[d + half];
  x[d] = x0 * c - x1 * s;
  x[d + half] = x1 * c + x0 * s;
}

__global__ void WriteKvK(const float* k, const float* v, uint32_t n, uint32_t kv_dim, uint32_t pos0, const int* table,
                         uint32_t bt, float* k_pages, float* v_pages) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<uint64_t>(n) * kv_dim) return;
  const uint32_t pos = pos0 + static_cast<uint32_t>(i / kv_dim), e = static_cast<uint32_t>(i % kv_dim);
  const uint64_t at = (static_cast<uint64_t>(table[pos / bt]) * bt + pos % bt) * kv_dim + e;
  k_pages[at] = k[i];
  v_pages[at] = v[i];
}

__device__ const float* Slot(const float* pages, const int* table, uint32_t j, uint32_t bt, uint32_t kv_dim) {
  return pages + (static_cast<uint64_t>(table[j / bt]) * bt + j % bt) * kv_dim;
}

__global__ void AttentionK(const float* q, const float* k_pages, const float* v_pages, const int* table, uint32_t n,
                           uint32_t pos0, uint32_t heads, uint32_t kv_heads, uint32_t hd, uint32_t bt, float* out) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<uint64_t>(n) * heads) return;
  const uint32_t t = static_cast<uint32_t>(i / heads), head = static_cast<uint32_t>(i % heads);
  const uint32_t pos = pos0 + t, kvh = head / (heads / kv_heads), kv_dim = kv_heads * hd;
  const float* qh = q + i * hd;
  float* o = out + i * hd;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  // Three passes over the positions (max, sum, weighted V), recomputing the
  // scores: no per-thread buffer whose size depends on the context.
  auto score = [&](uint32_t j) {
    const float* kj = Slot(k_pages, table, j, bt, kv_dim) + kvh * hd;
    float d = 0;
    for (uint32_t e = 0; e < hd; ++e) d += qh[e] * kj[e];
    return d * scale;
  };
  float mx = -INFINITY;
  for (uint32_t j = 0; j <= pos; ++j) mx = fmaxf(mx, score(j));
  float sum = 0;
  for (uint32_t j = 0; j <= pos; ++j) sum += expf(score(j) - mx);
  for (uint32_t e = 0; e < hd; ++e) o[e] = 0;
  for (uint32_t j = 0; j <= pos; ++j) {
    const float p = expf(score(j) - mx) / sum;
    const float* vj = Slot(v_pages, table, j, bt, kv_dim) + kvh * hd;
    for (uint32_t e = 0; e < hd; ++e) o[e] += p * vj[e];
  }
}

__global__ void AddK(float* x, const float* o, uint64_t count) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < count) x[i] += o[i];
}

__global__ void SwiGluK(float* g, const float* u, uint64_t count) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < count) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

}  // namespace

int LaunchEmbed(const float* embed, const uint32_t* tokens, uint32_t n, uint32_t hidden, float* x, void* stream) {
  EmbedK<<<Blocks(uint64_t{n} * hidden), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(embed, tokens, n, hidden, x);
  return Launched();
}

int LaunchRmsNorm(const float* x, const float* g, uint32_t n, uint32_t hidden, float eps, float* out, void* stream) {
  RmsNormK<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, g, n, hidden, eps, out);
  return Launched();
}

int LaunchMatMul(const float* w, const float* h, uint32_t n, uint32_t rows, uint32_t cols, float* out, void* stream) {
  MatMulK<<<Blocks(uint64_t{n} * rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(w, h, n, rows, cols, out);
  return Launched();
}

int LaunchRope(float* v, uint32_t n, uint32_t heads, uint32_t head_dim, uint32_t pos0, float theta, void* stream) {
  RopeK<<<Blocks(uint64_t{n} * heads * (head_dim / 2)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      v, n, heads, head_dim, pos0, theta);
  return Launched();
}

int LaunchWriteKv(const float* k, const float* v, uint32_t n, uint32_t kv_dim, uint32_t pos0, const int* table,
                  uint32_t block_tokens, float* k_pages, float* v_pages, void* stream) {
  WriteKvK<<<Blocks(uint64_t{n} * kv_dim), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      k, v, n, kv_dim, pos0, table, block_tokens, k_pages, v_pages);
  return Launched();
}

int LaunchAttention(const float* q, const float* k_pages, const float* v_pages, const int* table, uint32_t n,
                    uint32_t pos0, uint32_t heads, uint32_t kv_heads, uint32_t head_dim, uint32_t block_tokens,
                    float* out, void* stream) {
  AttentionK<<<Blocks(uint64_t{n} * heads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, k_pages, v_pages, table, n, pos0, heads, kv_heads, head_dim, block_tokens, out);
  return Launched();
}

int LaunchAdd(float* x, const float* o, uint64_t count, void* stream) {
  AddK<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, o, count);
  return Launched();
}

int LaunchSwiGlu(float* g, const float* u, uint64_t count, void* stream) {
  SwiGluK<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, u, count);
  return Launched();
}

}  // namespace tiny::cuda
