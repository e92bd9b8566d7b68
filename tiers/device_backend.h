// SPDX-License-Identifier: Apache-2.0
// The device backend: what tiers/ needs from a GPU —
// memory, ordered asynchronous copies on streams, events, host-memory
// registration and IPC handles. Two implementations: CUDA (the real one) and
// the host-simulated one every test runs on.
#ifndef KVTIER_TIERS_DEVICE_BACKEND_H_
#define KVTIER_TIERS_DEVICE_BACKEND_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device_types.h"
#include "core/unique_fd.h"
#include "kernels/kv_kernels.h"

namespace kvtier {

// A handle another process can open to reach device memory. CUDA fills
// `opaque` (cudaIpcMemHandle_t); the simulated backend passes a memfd.
struct IpcMemHandle {
  std::array<uint8_t, 64> opaque{};
  UniqueFd fd;
  uint64_t bytes = 0;
};

// A handle another process can open to wait on an event. CUDA fills
// `opaque` (cudaIpcEventHandle_t); the simulated backend passes the memfd
// page that holds the event's state and its offset there.
struct IpcEventHandle {
  std::array<uint8_t, 64> opaque{};
  UniqueFd fd;
  uint64_t offset = 0;
};

class DeviceBackend {
 public:
  DeviceBackend() = default;
  virtual ~DeviceBackend() = default;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  // Thread-safe. "cuda" or "sim".
  virtual absl::string_view name() const = 0;
  // Thread-safe. Device memory of `bytes`.
  virtual absl::StatusOr<void*> Allocate(uint64_t bytes) = 0;
  // Thread-safe. InvalidArgument for a pointer Allocate did not return.
  virtual absl::Status Free(void* ptr) = 0;
  // Thread-safe. A stream runs its work in submission order.
  virtual absl::StatusOr<DeviceStream> CreateStream() = 0;
  // Thread-safe. Waits for the stream's work, then destroys it.
  virtual absl::Status DestroyStream(DeviceStream stream) = 0;
  // Thread-safe. Enqueues a copy of `bytes` from src to dst on `stream`; host
  // or device memory on either side.
  virtual absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, DeviceStream stream) = 0;
  // Thread-safe. Blocks until the stream's enqueued work is done.
  virtual absl::Status SynchronizeStream(DeviceStream stream) = 0;
  // Thread-safe. Events of one `group` (e.g. one engine registration) may
  // share what is exported of them; events of different groups never do
  // (the simulated device's event pages; CUDA events are each their own).
  virtual absl::StatusOr<DeviceEvent> CreateEvent(uint64_t group = 0) = 0;
  virtual absl::Status DestroyEvent(DeviceEvent event) = 0;
  // Thread-safe. The event completes when the stream's work enqueued so far does.
  virtual absl::Status RecordEvent(DeviceEvent event, DeviceStream stream) = 0;
  // Thread-safe. True when complete (an event never recorded is complete).
  virtual absl::StatusOr<bool> QueryEvent(DeviceEvent event) = 0;
  // Thread-safe. DeadlineExceeded when not complete within timeout.
  virtual absl::Status WaitEvent(DeviceEvent event, std::chrono::nanoseconds timeout) = 0;
  // Thread-safe. Work enqueued on `stream` after this call waits until the
  // event's latest record (as of this call) completes; it may come from
  // another stream, or from another process (ImportEvent).
  virtual absl::Status StreamWaitEvent(DeviceStream stream, DeviceEvent event) = 0;
  // Thread-safe. A handle to an event for another process.
  virtual absl::StatusOr<IpcEventHandle> ExportEvent(DeviceEvent event) = 0;
  // Thread-safe. Opens an exported event; it records, waits and is queried
  // like one of ours, and DestroyEvent closes it.
  virtual absl::StatusOr<DeviceEvent> ImportEvent(const IpcEventHandle& handle) = 0;
  // Thread-safe. Pins host memory for fast copies (cudaHostRegister).
  virtual absl::Status RegisterHost(void* ptr, uint64_t bytes) = 0;
  virtual absl::Status UnregisterHost(void* ptr) = 0;
  // Thread-safe. A handle to an allocation for another process.
  virtual absl::StatusOr<IpcMemHandle> ExportMemory(void* device_ptr) = 0;
  // Thread-safe. Opens a handle from another process; close with CloseImported.
  virtual absl::StatusOr<void*> ImportMemory(const IpcMemHandle& handle) = 0;
  virtual absl::Status CloseImported(void* ptr) = 0;
  // Thread-safe. The KV kernels (gather / scatter / quantize / checksum),
  // run in order with the copies of the stream they are given.
  virtual kernels::KvKernels& kernels() = 0;
};

struct SimDeviceOptions {
  // Copy bandwidth cap in bytes/s imitating a PCIe link; 0 = memcpy speed.
  uint64_t bandwidth_bytes_per_s = 0;
};
std::unique_ptr<DeviceBackend> MakeSimDevice(const SimDeviceOptions& opts = {});

// The CUDA backend on device `ordinal`: Unavailable when this build has no
// CUDA or the device does not answer.
absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaDevice(int ordinal);

// Number of CUDA devices that answer; 0 (with the reason in *why) when the
// build has no CUDA, there is no driver, or any CUDA call fails.
int ProbeCudaDevices(std::string* why);

struct DeviceChoice {
  std::unique_ptr<DeviceBackend> backend;
  std::string reason;  // one line for the log: what was chosen and why
};
// device = "auto" | "cuda" | "sim".
absl::StatusOr<DeviceChoice> OpenDeviceBackend(absl::string_view device, const SimDeviceOptions& sim);

}  // namespace kvtier

#endif  // KVTIER_TIERS_DEVICE_BACKEND_H_
