// SPDX-License-Identifier: Apache-2.0
// The few CUDA runtime calls libkvtier makes for an engine's CUDA KV cache:
// is there a device, the IPC handle of an allocation, pinning the host arena
// so kernels on the engine's stream can read it in place, and opening the
// daemon's per-layer events so that stream can wait for a layer. Each fails
// with Unavailable in a build without CUDA.
#ifndef KVTIER_KERNELS_CUDA_HOST_H_
#define KVTIER_KERNELS_CUDA_HOST_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvtier::kernels {

// The NVIDIA driver's library (libcuda.so.1), which the CUDA runtime
// (linked in statically) opens with dlopen at its first call: OK once it is
// loaded, else Unavailable with dlopen's reason. Checked before any runtime
// call, so that a node without the driver gets this reason rather than the
// runtime's "driver version is insufficient". Also in builds without CUDA.
absl::Status CudaDriverPresent();
bool CudaDeviceAnswers();
// cudaIpcGetMemHandle of `base` (the start of a cudaMalloc allocation).
absl::StatusOr<std::array<uint8_t, 64>> CudaIpcHandleOf(const void* base);
// cudaHostRegister (portable, mapped).
absl::Status CudaRegisterHost(void* ptr, size_t bytes);
// cudaIpcOpenEventHandle: another process's event, as a cudaEvent_t's bits.
absl::StatusOr<uint64_t> CudaOpenEvent(const std::array<uint8_t, 64>& handle);
// cudaIpcOpenMemHandle: another process's allocation, mapped here.
absl::StatusOr<void*> CudaOpenMemory(const std::array<uint8_t, 64>& handle);
void CudaCloseMemory(const void* ptr);
// cudaStreamWaitEvent(stream, event).
absl::Status CudaStreamWaitEvent(uint64_t stream, uint64_t event);
// cudaEventDestroy.
void CudaCloseEvent(uint64_t event);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CUDA_HOST_H_
