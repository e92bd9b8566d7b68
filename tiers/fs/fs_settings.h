// SPDX-License-Identifier: Apache-2.0
// What an operator sets of the fs tier, with its defaults stated once:
// kvtierd's config holds this struct as its [tiers.fs] section (Config::fs)
// and FsTierOptions extends it, so neither copies a default. The config
// does not need the tier's header for it.
#ifndef KVTIER_TIERS_FS_FS_SETTINGS_H_
#define KVTIER_TIERS_FS_FS_SETTINGS_H_

#include <cstdint>
#include <string>

namespace kvtier {

// The header before each block's payload in its file (FsBlockHeader,
// fs_tier.h, asserts it), for what a capacity holds.
inline constexpr uint64_t kFsBlockHeaderBytes = 104;

struct FsTierSettings {
  // Must exist: a mount point that vanished must not become a local folder.
  std::string dir;
  // What the directory's block files may take, every node's together; a
  // scan past it deletes the least recently used down to low_watermark.
  uint64_t capacity_bytes = 64ull << 30;
  double low_watermark = 0.9;
  uint32_t io_threads = 4;
  // An op's deadline when its caller gives none.
  uint64_t op_timeout_ms = 1000;
  // How often the capacity scan runs (0: no background scans, only ScanNow).
  uint64_t scan_interval_ms = 5000;
  // fsync each file before its rename (off: a crash may leave empty files;
  // they fail their check).
  bool fsync = true;

  bool operator==(const FsTierSettings&) const = default;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_FS_FS_SETTINGS_H_
