// SPDX-License-Identifier: Apache-2.0
#include "kernels/cuda_host.h"

#include <dlfcn.h>

#include <cstring>

#include "absl/strings/str_cat.h"

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::kernels {

absl::Status CudaDriverPresent() {
  // Loaded once and kept (the runtime holds it too); the answer does not
  // change while the process runs.
  static const absl::Status present = [] {
    if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr) return absl::OkStatus();
    const char* err = dlerror();
    return absl::UnavailableError(absl::StrCat("the NVIDIA driver library libcuda.so.1 cannot be loaded (",
                                               err != nullptr ? err : "not found",
                                               "): install the NVIDIA driver for CUDA"));
  }();
  return present;
}

#ifdef KVTIER_HAVE_CUDA
bool CudaDeviceAnswers() {
  if (!CudaDriverPresent().ok()) return false;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

absl::StatusOr<std::array<uint8_t, 64>> CudaIpcHandleOf(const void* base) {
  static_assert(sizeof(cudaIpcMemHandle_t) <= 64);
  if (absl::Status s = CudaDriverPresent(); !s.ok()) return s;
  cudaIpcMemHandle_t h;
  const cudaError_t err = cudaIpcGetMemHandle(&h, const_cast<void*>(base));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(err),
                                                   " (a region's base must be what cudaMalloc returned)"));
  }
  std::array<uint8_t, 64> out{};
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

absl::Status CudaRegisterHost(void* ptr, size_t bytes) {
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess && err != cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaHostRegister of the host arena: ", cudaGetErrorString(err),
                                            " (raise ulimit -l / LimitMEMLOCK)"));
  }
  cudaGetLastError();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaOpenEvent(const std::array<uint8_t, 64>& handle) {
  static_assert(sizeof(cudaIpcEventHandle_t) <= 64);
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t e;
  const cudaError_t err = cudaIpcOpenEventHandle(&e, h);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaIpcOpenEventHandle of a layer event: ", cudaGetErrorString(err)));
  }
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(e));
}

absl::StatusOr<void*> CudaOpenMemory(const std::array<uint8_t, 64>& handle) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaIpcOpenMemHandle of the GPU-tier arena: ", cudaGetErrorString(err)));
  }
  return p;
}

void CudaCloseMemory(const void* ptr) {
  cudaIpcCloseMemHandle(const_cast<void*>(ptr));
  cudaGetLastError();
}

absl::Status CudaStreamWaitEvent(uint64_t stream, uint64_t event) {
  const cudaError_t err = cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)),
                                              reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(event)), 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaStreamWaitEvent: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

void CudaCloseEvent(uint64_t event) {
  cudaEventDestroy(reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(event)));
  cudaGetLastError();
}
#else
bool CudaDeviceAnswers() { return false; }
absl::StatusOr<std::array<uint8_t, 64>> CudaIpcHandleOf(const void*) {
  return absl::UnavailableError("this libkvtier was built without CUDA");
}
absl::Status CudaRegisterHost(void*, size_t) { return absl::UnavailableError("this libkvtier was built without CUDA"); }
absl::StatusOr<uint64_t> CudaOpenEvent(const std::array<uint8_t, 64>&) {
  return absl::UnavailableError("this libkvtier was built without CUDA");
}
absl::Status CudaStreamWaitEvent(uint64_t, uint64_t) {
  return absl::UnavailableError("this libkvtier was built without CUDA");
}
void CudaCloseEvent(uint64_t) {}
absl::StatusOr<void*> CudaOpenMemory(const std::array<uint8_t, 64>&) {
  return absl::UnavailableError("this libkvtier was built without CUDA");
}
void CudaCloseMemory(const void*) {}
#endif

}  // namespace kvtier::kernels
