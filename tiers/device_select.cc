// SPDX-License-Identifier: Apache-2.0
// Choosing the device backend at start, and probing for CUDA devices.
#include "absl/strings/str_cat.h"
#include "kernels/cuda_host.h"
#include "tiers/device_backend.h"

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier {

int ProbeCudaDevices(std::string* why) {
#ifdef KVTIER_HAVE_CUDA
  // Without the driver the runtime would answer "driver version is
  // insufficient"; say what is missing instead.
  if (absl::Status driver = kernels::CudaDriverPresent(); !driver.ok()) {
    *why = std::string(driver.message());
    return 0;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver this is "CUDA driver version is insufficient"; any
    // error here means "no device".
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    return 0;
  }
  if (count == 0) *why = "no CUDA device present";
  return count;
#else
  *why = "this kvtierd was built without the CUDA toolkit";
  return 0;
#endif
}

#ifndef KVTIER_HAVE_CUDA
absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaDevice(int) {
  return absl::UnavailableError("this build has no CUDA device backend (no CUDA toolkit at build time)");
}
#endif

absl::StatusOr<DeviceChoice> OpenDeviceBackend(absl::string_view device, const SimDeviceOptions& sim) {
  if (device == "sim") {
    return DeviceChoice{MakeSimDevice(sim), "device=sim: host-simulated device backend"};
  }
  if (device != "auto" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device = \"", device, "\" is not one of \"auto\", \"cuda\", \"sim\""));
  }
  std::string why;
  const int count = ProbeCudaDevices(&why);
  if (count > 0) {
    absl::StatusOr<std::unique_ptr<DeviceBackend>> cuda = MakeCudaDevice(0);
    if (cuda.ok()) {
      return DeviceChoice{std::move(*cuda), absl::StrCat("device=", device, ": ", count,
                                                         " CUDA device(s) answer; using CUDA device 0")};
    }
    if (device == "cuda") return cuda.status();
    return DeviceChoice{MakeSimDevice(sim),
                        absl::StrCat("device=auto: ", count, " CUDA device(s) answer but device 0 could not be "
                                     "opened (", cuda.status().message(), "); using the host-simulated device")};
  }
  if (device == "cuda") {
    return absl::FailedPreconditionError(absl::StrCat(
        "device = \"cuda\" but no CUDA device answers (", why,
        "); install the NVIDIA driver, or set device = \"auto\" or \"sim\""));
  }
  return DeviceChoice{MakeSimDevice(sim),
                      absl::StrCat("device=auto: no CUDA device (", why,
                                   "); using the host-simulated device")};
}

}  // namespace kvtier
