// SPDX-License-Identifier: Apache-2.0
// Names for device streams and events, shared by the device backends
// (tiers/) and the KV kernels (kernels/). A CUDA stream or event travels as
// its handle's bits; the host-simulated backend numbers its own.
#ifndef KVTIER_CORE_DEVICE_TYPES_H_
#define KVTIER_CORE_DEVICE_TYPES_H_

#include <cstdint>

namespace kvtier {

using DeviceStream = uint64_t;
using DeviceEvent = uint64_t;

}  // namespace kvtier

#endif  // KVTIER_CORE_DEVICE_TYPES_H_
