// SPDX-License-Identifier: Apache-2.0
// The CUDA device backend: cudaMalloc'd memory,
// non-blocking streams, events that can cross processes, cudaHostRegister,
// CUDA IPC memory handles, and the CUDA KV kernels. Every call first makes
// the backend's device current on the calling thread.
#include <cuda_runtime_api.h>

#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/mutex.h"
#include "core/status.h"
#include "kernels/cuda_kernels.h"
#include "tiers/device_backend.h"

namespace kvtier {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(IpcMemHandle::opaque), "IPC handle does not fit");

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

cudaStream_t AsStream(DeviceStream s) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s)); }
cudaEvent_t AsEvent(DeviceEvent e) { return reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(e)); }

class CudaDevice final : public DeviceBackend {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), kernels_(kernels::MakeCudaKernels()) {}
  ~CudaDevice() override {
    if (!Use().ok()) return;
    MutexLock l(&mu_);
    for (auto& [ptr, bytes] : allocations_) cudaFree(ptr);
    for (DeviceStream s : streams_) cudaStreamDestroy(AsStream(s));
    for (DeviceEvent e : events_) cudaEventDestroy(AsEvent(e));
    for (void* p : registered_) cudaHostUnregister(p);
    for (void* p : imported_) cudaIpcCloseMemHandle(p);
  }

  absl::string_view name() const override { return "cuda"; }

  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("device allocation of 0 bytes");
    RETURN_IF_ERROR(Use());
    void* p = nullptr;
    RETURN_IF_ERROR(CudaError(cudaMalloc(&p, bytes), absl::StrCat("cudaMalloc of ", bytes, " bytes")));
    MutexLock l(&mu_);
    allocations_.emplace(p, bytes);
    return p;
  }

  absl::Status Free(void* ptr) override {
    {
      MutexLock l(&mu_);
      if (allocations_.erase(ptr) == 0) {
        return absl::InvalidArgumentError("free of a pointer the CUDA backend did not allocate");
      }
    }
    RETURN_IF_ERROR(Use());
    return CudaError(cudaFree(ptr), "cudaFree");
  }

  absl::StatusOr<DeviceStream> CreateStream() override {
    RETURN_IF_ERROR(Use());
    cudaStream_t s;
    RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    const auto id = static_cast<DeviceStream>(reinterpret_cast<uintptr_t>(s));
    MutexLock l(&mu_);
    streams_.insert(id);
    return id;
  }

  absl::Status DestroyStream(DeviceStream stream) override {
    {
      MutexLock l(&mu_);
      if (streams_.erase(stream) == 0) return UnknownStream(stream);
    }
    RETURN_IF_ERROR(Use());
    RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize"));
    return CudaError(cudaStreamDestroy(AsStream(stream)), "cudaStreamDestroy");
  }

  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, DeviceStream stream) override {
    if (bytes > 0 && (dst == nullptr || src == nullptr)) {
      return absl::InvalidArgumentError("copy with a null pointer");
    }
    if (!KnownStream(stream)) return UnknownStream(stream);
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Use());
    return CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)), "cudaMemcpyAsync");
  }

  absl::Status SynchronizeStream(DeviceStream stream) override {
    if (!KnownStream(stream)) return UnknownStream(stream);
    RETURN_IF_ERROR(Use());
    return CudaError(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
  }

  absl::StatusOr<DeviceEvent> CreateEvent(uint64_t /*group*/) override {
    RETURN_IF_ERROR(Use());
    cudaEvent_t e;
    // Interprocess needs DisableTiming; both keep events cheap to record.
    RETURN_IF_ERROR(CudaError(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess),
                              "cudaEventCreate"));
    const auto id = static_cast<DeviceEvent>(reinterpret_cast<uintptr_t>(e));
    MutexLock l(&mu_);
    events_.insert(id);
    return id;
  }

  absl::Status DestroyEvent(DeviceEvent event) override {
    {
      MutexLock l(&mu_);
      if (events_.erase(event) == 0) return UnknownEvent(event);
      imported_events_.erase(event);
    }
    RETURN_IF_ERROR(Use());
    return CudaError(cudaEventDestroy(AsEvent(event)), "cudaEventDestroy");
  }

  absl::Status RecordEvent(DeviceEvent event, DeviceStream stream) override {
    if (!KnownEvent(event)) return UnknownEvent(event);
    if (!KnownStream(stream)) return UnknownStream(stream);
    RETURN_IF_ERROR(Use());
    return CudaError(cudaEventRecord(AsEvent(event), AsStream(stream)), "cudaEventRecord");
  }

  absl::StatusOr<bool> QueryEvent(DeviceEvent event) override {
    if (!KnownEvent(event)) return UnknownEvent(event);
    RETURN_IF_ERROR(Use());
    const cudaError_t err = cudaEventQuery(AsEvent(event));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    RETURN_IF_ERROR(CudaError(err, "cudaEventQuery"));
    return true;
  }

  absl::Status WaitEvent(DeviceEvent event, std::chrono::nanoseconds timeout) override {
    // cudaEventSynchronize has no timeout: poll, spinning briefly first.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(0);
    for (;;) {
      ASSIGN_OR_RETURN(bool done, QueryEvent(event));
      if (done) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError("CUDA event did not complete in time");
      }
      if (pause.count() == 0) {
        std::this_thread::yield();
        pause = std::chrono::microseconds(1);
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(100));
      }
    }
  }

  absl::Status StreamWaitEvent(DeviceStream stream, DeviceEvent event) override {
    if (!KnownEvent(event)) return UnknownEvent(event);
    if (!KnownStream(stream)) return UnknownStream(stream);
    RETURN_IF_ERROR(Use());
    return CudaError(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0), "cudaStreamWaitEvent");
  }

  absl::StatusOr<IpcEventHandle> ExportEvent(DeviceEvent event) override {
    if (!KnownEvent(event)) return UnknownEvent(event);
    {
      MutexLock l(&mu_);
      if (imported_events_.contains(event)) return absl::InvalidArgumentError("export of an event this device imported");
    }
    RETURN_IF_ERROR(Use());
    cudaIpcEventHandle_t h;
    RETURN_IF_ERROR(CudaError(cudaIpcGetEventHandle(&h, AsEvent(event)), "cudaIpcGetEventHandle"));
    IpcEventHandle out;
    static_assert(sizeof(h) <= sizeof(out.opaque));
    std::memcpy(out.opaque.data(), &h, sizeof(h));
    return out;
  }

  absl::StatusOr<DeviceEvent> ImportEvent(const IpcEventHandle& handle) override {
    RETURN_IF_ERROR(Use());
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.opaque.data(), sizeof(h));
    cudaEvent_t e;
    RETURN_IF_ERROR(CudaError(cudaIpcOpenEventHandle(&e, h),
                              "cudaIpcOpenEventHandle (the exporting process must still hold the event)"));
    const auto id = static_cast<DeviceEvent>(reinterpret_cast<uintptr_t>(e));
    MutexLock l(&mu_);
    events_.insert(id);
    imported_events_.insert(id);
    return id;
  }

  absl::Status RegisterHost(void* ptr, uint64_t bytes) override {
    if (ptr == nullptr || bytes == 0) return absl::InvalidArgumentError("register of an empty range");
    {
      MutexLock l(&mu_);
      if (registered_.contains(ptr)) return absl::AlreadyExistsError("host memory is already registered");
    }
    RETURN_IF_ERROR(Use());
    RETURN_IF_ERROR(CudaError(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                              absl::StrCat("cudaHostRegister of ", bytes,
                                           " bytes (raise LimitMEMLOCK / ulimit -l if this is an out-of-memory error)")));
    MutexLock l(&mu_);
    registered_.insert(ptr);
    return absl::OkStatus();
  }

  absl::Status UnregisterHost(void* ptr) override {
    {
      MutexLock l(&mu_);
      if (registered_.erase(ptr) == 0) {
        return absl::InvalidArgumentError("unregister of host memory that was not registered");
      }
    }
    RETURN_IF_ERROR(Use());
    return CudaError(cudaHostUnregister(ptr), "cudaHostUnregister");
  }

  absl::StatusOr<IpcMemHandle> ExportMemory(void* device_ptr) override {
    uint64_t bytes;
    {
      MutexLock l(&mu_);
      auto it = allocations_.find(device_ptr);
      if (it == allocations_.end()) {
        return absl::InvalidArgumentError("export of a pointer that is not an allocation's start");
      }
      bytes = it->second;
    }
    RETURN_IF_ERROR(Use());
    cudaIpcMemHandle_t h;
    RETURN_IF_ERROR(CudaError(cudaIpcGetMemHandle(&h, device_ptr), "cudaIpcGetMemHandle"));
    IpcMemHandle out;
    std::memcpy(out.opaque.data(), &h, sizeof(h));
    out.bytes = bytes;
    return out;
  }

  absl::StatusOr<void*> ImportMemory(const IpcMemHandle& handle) override {
    if (handle.bytes == 0) return absl::InvalidArgumentError("CUDA IPC handle of 0 bytes");
    RETURN_IF_ERROR(Use());
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.opaque.data(), sizeof(h));
    void* p = nullptr;
    RETURN_IF_ERROR(CudaError(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                              "cudaIpcOpenMemHandle (the exporting process must still hold the memory)"));
    MutexLock l(&mu_);
    imported_.insert(p);
    return p;
  }

  absl::Status CloseImported(void* ptr) override {
    {
      MutexLock l(&mu_);
      if (imported_.erase(ptr) == 0) return absl::InvalidArgumentError("close of memory not imported");
    }
    RETURN_IF_ERROR(Use());
    return CudaError(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle");
  }

  kernels::KvKernels& kernels() override { return *kernels_; }

 private:
  absl::Status Use() const { return CudaError(cudaSetDevice(ordinal_), absl::StrCat("cudaSetDevice(", ordinal_, ")")); }
  bool KnownStream(DeviceStream s) {
    MutexLock l(&mu_);
    return streams_.contains(s);
  }
  bool KnownEvent(DeviceEvent e) {
    MutexLock l(&mu_);
    return events_.contains(e);
  }
  static absl::Status UnknownStream(DeviceStream s) {
    return absl::InvalidArgumentError(absl::StrCat("unknown stream ", s));
  }
  static absl::Status UnknownEvent(DeviceEvent e) {
    return absl::InvalidArgumentError(absl::StrCat("unknown event ", e));
  }

  const int ordinal_;
  const std::unique_ptr<kernels::KvKernels> kernels_;
  Mutex mu_;
  absl::flat_hash_map<void*, uint64_t> allocations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<DeviceStream> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<DeviceEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<DeviceEvent> imported_events_ ABSL_GUARDED_BY(mu_);  // also in events_
  absl::flat_hash_set<void*> registered_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<void*> imported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("no CUDA device: ", cudaGetErrorString(err)));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " present)"));
  }
  auto dev = std::make_unique<CudaDevice>(ordinal);
  RETURN_IF_ERROR(CudaError(cudaSetDevice(ordinal), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaError(cudaFree(nullptr), "creating the CUDA context"));
  return std::unique_ptr<DeviceBackend>(std::move(dev));
}

}  // namespace kvtier
