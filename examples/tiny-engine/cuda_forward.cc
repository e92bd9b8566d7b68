// SPDX-License-Identifier: Apache-2.0
// The host side of the tiny engine's CUDA forward pass: weights and KV pages
// in device memory, kernels queued on one stream (cuda_forward_kernels.cu).
#include "cuda_forward.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "cuda_forward_launch.h"
#include "tiny_engine.h"

namespace tiny {
namespace {

using kvtier::ErrorCode;
using kvtier::Status;

Status CudaError(int err, const char* what) {
  return Status(ErrorCode::kIo, std::string("tiny-engine CUDA: ") + what + ": " +
                                    cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Device memory freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  int Allocate(size_t bytes) {
    const cudaError_t e = cudaMalloc(&p_, bytes == 0 ? 1 : bytes);
    bytes_ = bytes;
    return static_cast<int>(e);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class CudaForwardImpl final : public CudaForward {
 public:
  CudaForwardImpl(const ModelConfig& m, uint32_t block_tokens, uint32_t pages)
      : m_(m), block_tokens_(block_tokens), pages_(pages) {}

  ~CudaForwardImpl() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  Status Init(const Weights& w) {
    int devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
      return Status(ErrorCode::kNotFound, std::string("tiny-engine CUDA: no device answers (") +
                                              (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    }
    if (int e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != 0) return CudaError(e, "stream");
    auto upload = [](DeviceBuffer* d, const std::vector<float>& v) -> Status {
      if (int e = d->Allocate(v.size() * sizeof(float)); e != 0) return CudaError(e, "cudaMalloc of weights");
      if (int e = cudaMemcpy(d->as<void>(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice); e != 0) {
        return CudaError(e, "weights upload");
      }
      return Status();
    };
    for (auto [dst, src] : {std::pair{&embed_, &w.embed}, std::pair{&final_norm_, &w.final_norm},
                            std::pair{&lm_head_, &w.lm_head}}) {
      if (Status s = upload(dst, *src); !s.ok()) return s;
    }
    layers_.resize(m_.layers);
    for (uint32_t l = 0; l < m_.layers; ++l) {
      const Weights::Layer& L = w.layers[l];
      DeviceLayer& D = layers_[l];
      for (auto [dst, src] : {std::pair{&D.attn_norm, &L.attn_norm}, std::pair{&D.wq, &L.wq}, std::pair{&D.wk, &L.wk},
                              std::pair{&D.wv, &L.wv}, std::pair{&D.wo, &L.wo}, std::pair{&D.mlp_norm, &L.mlp_norm},
                              std::pair{&D.wg, &L.wg}, std::pair{&D.wu, &L.wu}, std::pair{&D.wd, &L.wd}}) {
        if (Status s = upload(dst, *src); !s.ok()) return s;
      }
    }
    if (int e = kv_.Allocate(PageFloats() * 2 * m_.layers * pages_ * sizeof(float)); e != 0) {
      return CudaError(e, "cudaMalloc of the KV pages");
    }
    if (int e = cudaMemset(kv_.as<void>(), 0, kv_.bytes()); e != 0) return CudaError(e, "cudaMemset");
    return Status();
  }

  kvtier::Result<std::vector<float>> Forward(const std::vector<uint32_t>& tokens, uint32_t first,
                                             const std::vector<int>& block_table,
                                             const std::function<bool(uint32_t)>& before_layer) override {
    const uint32_t n = static_cast<uint32_t>(tokens.size() - first), H = m_.hidden, hd = m_.head_dim;
    const uint32_t q_dim = m_.heads * hd, kv_dim = m_.kv_heads * hd, I = m_.intermediate, bt = block_tokens_;
    void* s = stream_;
    DeviceBuffer tok, table, x, h, q, k, v, attn, o, g, u, logits;
    for (auto [buf, bytes] : {std::pair{&tok, size_t{n} * 4}, std::pair{&table, block_table.size() * sizeof(int)},
                              std::pair{&x, size_t{n} * H * 4}, std::pair{&h, size_t{n} * H * 4},
                              std::pair{&q, size_t{n} * q_dim * 4}, std::pair{&k, size_t{n} * kv_dim * 4},
                              std::pair{&v, size_t{n} * kv_dim * 4}, std::pair{&attn, size_t{n} * q_dim * 4},
                              std::pair{&o, size_t{n} * H * 4}, std::pair{&g, size_t{n} * I * 4},
                              std::pair{&u, size_t{n} * I * 4}, std::pair{&logits, size_t{m_.vocab} * 4}}) {
      if (int e = buf->Allocate(bytes); e != 0) return CudaError(e, "cudaMalloc of activations");
    }
    int e = cudaMemcpyAsync(tok.as<void>(), tokens.data() + first, size_t{n} * 4, cudaMemcpyHostToDevice, stream_);
    if (e == 0) {
      e = cudaMemcpyAsync(table.as<void>(), block_table.data(), block_table.size() * sizeof(int),
                          cudaMemcpyHostToDevice, stream_);
    }
    if (e == 0) e = cuda::LaunchEmbed(embed_.as<float>(), tok.as<uint32_t>(), n, H, x.as<float>(), s);
    const int* tbl = table.as<int>();
    for (uint32_t l = 0; l < m_.layers && e == 0; ++l) {
      if (before_layer && !before_layer(l)) {
        cudaStreamSynchronize(stream_);  // nothing queued may outlive the buffers
        return std::vector<float>{};
      }
      const DeviceLayer& L = layers_[l];
      float* k_pages = kv_.as<float>() + (size_t{l} * 2) * pages_ * PageFloats();
      float* v_pages = k_pages + size_t{pages_} * PageFloats();
      const int steps[] = {
          cuda::LaunchRmsNorm(x.as<float>(), L.attn_norm.as<float>(), n, H, m_.rms_eps, h.as<float>(), s),
          cuda::LaunchMatMul(L.wq.as<float>(), h.as<float>(), n, q_dim, H, q.as<float>(), s),
          cuda::LaunchMatMul(L.wk.as<float>(), h.as<float>(), n, kv_dim, H, k.as<float>(), s),
          cuda::LaunchMatMul(L.wv.as<float>(), h.as<float>(), n, kv_dim, H, v.as<float>(), s),
          cuda::LaunchRope(q.as<float>(), n, m_.heads, hd, first, m_.rope_theta, s),
          cuda::LaunchRope(k.as<float>(), n, m_.kv_heads, hd, first, m_.rope_theta, s),
          cuda::LaunchWriteKv(k.as<float>(), v.as<float>(), n, kv_dim, first, tbl, bt, k_pages, v_pages, s),
          cuda::LaunchAttention(q.as<float>(), k_pages, v_pages, tbl, n, first, m_.heads, m_.kv_heads, hd, bt,
                                attn.as<float>(), s),
          cuda::LaunchMatMul(L.wo.as<float>(), attn.as<float>(), n, H, q_dim, o.as<float>(), s),
          cuda::LaunchAdd(x.as<float>(), o.as<float>(), uint64_t{n} * H, s),
          cuda::LaunchRmsNorm(x.as<float>(), L.mlp_norm.as<float>(), n, H, m_.rms_eps, h.as<float>(), s),
          cuda::LaunchMatMul(L.wg.as<float>(), h.as<float>(), n, I, H, g.as<float>(), s),
          cuda::LaunchMatMul(L.wu.as<float>(), h.as<float>(), n, I, H, u.as<float>(), s),
          cuda::LaunchSwiGlu(g.as<float>(), u.as<float>(), uint64_t{n} * I, s),
          cuda::LaunchMatMul(L.wd.as<float>(), g.as<float>(), n, H, I, o.as<float>(), s),
          cuda::LaunchAdd(x.as<float>(), o.as<float>(), uint64_t{n} * H, s),
      };
      for (int step : steps) e = e != 0 ? e : step;
    }
    const float* last = x.as<float>() + size_t{n - 1} * H;
    if (e == 0) e = cuda::LaunchRmsNorm(last, final_norm_.as<float>(), 1, H, m_.rms_eps, h.as<float>(), s);
    if (e == 0) e = cuda::LaunchMatMul(lm_head_.as<float>(), h.as<float>(), 1, m_.vocab, H, logits.as<float>(), s);
    std::vector<float> out(m_.vocab);
    if (e == 0) {
      e = cudaMemcpyAsync(out.data(), logits.as<void>(), out.size() * 4, cudaMemcpyDeviceToHost, stream_);
    }
    const int synced = cudaStreamSynchronize(stream_);
    if (e != 0) return CudaError(e, "forward pass");
    if (synced != 0) return CudaError(synced, "forward pass");
    return out;
  }

  kvtier::KvCacheLayout Layout(const std::string& codec) const override {
    return CacheLayout(m_, block_tokens_, pages_, kv_.as<float>(), {kv_.as<void>(), kv_.bytes(), -1}, codec);
  }

  uint64_t stream() const override { return reinterpret_cast<uint64_t>(stream_); }

 private:
  struct DeviceLayer {
    DeviceBuffer attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd;
  };
  size_t PageFloats() const { return size_t{block_tokens_} * m_.kv_heads * m_.head_dim; }

  ModelConfig m_;
  uint32_t block_tokens_, pages_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer embed_, final_norm_, lm_head_, kv_;
  std::vector<DeviceLayer> layers_;
};

}  // namespace

kvtier::Result<std::unique_ptr<CudaForward>> CudaForward::Create(const ModelConfig& m, const Weights& w,
                                                                uint32_t block_tokens, uint32_t pages) {
  auto f = std::make_unique<CudaForwardImpl>(m, block_tokens, pages);
  if (Status s = f->Init(w); !s.ok()) return s;
  return std::unique_ptr<CudaForward>(std::move(f));
}

}  // namespace tiny
