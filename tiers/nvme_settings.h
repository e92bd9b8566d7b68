// SPDX-License-Identifier: Apache-2.0
// What an operator sets of the NVMe tier ([tiers.nvme]), with its defaults
// stated once: NvmeTierOptions extends NvmeTierSettings (the tier's own
// keys) and kvtierd's config holds NvmeSettings (those and what the store
// does with the tier) as Config::nvme. The config does not need the tier's
// header (or liburing's) for them.
#ifndef KVTIER_TIERS_NVME_SETTINGS_H_
#define KVTIER_TIERS_NVME_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

struct NvmeTierSettings {
  std::vector<std::string> dirs;          // one slab file per directory (config: empty is <data_dir>/nvme)
  uint64_t capacity_bytes = 2ull << 30;   // across all directories (config: 0 is no NVMe tier)
  uint64_t segment_bytes = 256ull << 20;
  uint32_t queue_depth = 32;              // per I/O worker
  uint32_t io_workers = 1;                // one io_uring each
  std::string io_engine = "auto";         // "auto" | "io_uring" | "threads"
  bool allow_buffered = false;            // use buffered I/O where O_DIRECT is refused
  uint64_t staging_bytes = 64ull << 20;

  bool operator==(const NvmeTierSettings&) const = default;
};

struct NvmeSettings : NvmeTierSettings {
  // capacity_bytes was set in a file (a default may shrink to fit the disk).
  bool capacity_explicit = false;
  // Every committed block is written to NVMe at once, not on eviction.
  bool write_through = false;
  std::string policy = "lru";  // the tier's eviction policy (policies/)
  // Admission by evidence of reuse (policies/reuse_gate.h): a block goes to
  // the tier only once leased lookups asked for it this many times; 1: all.
  uint32_t admission_min_uses = 1;

  bool operator==(const NvmeSettings&) const = default;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_NVME_SETTINGS_H_
