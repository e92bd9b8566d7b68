// SPDX-License-Identifier: Apache-2.0
// The fs kind's config half (fs_kind_config.h): its keys and its checks.
#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "tiers/fs/fs_kind_config.h"

namespace kvtier {
namespace {

using T = ConfigType;

const ConfigKey kFsKeys[] = {
    {"tiers.fs", "dir", T::kString, Field<&Config::fs, &FsTierSettings::dir>(), 0, 0, false,
     "a directory several nodes mount (NFS, CephFS, Lustre, FUSE); empty: no fs tier. It must exist"},
    {"tiers.fs", "capacity", T::kBytes, Field<&Config::fs, &FsTierSettings::capacity_bytes>(), 0, 0, true,
     "what the directory's block files may take, every node's together; past it the scan deletes the oldest"},
    {"tiers.fs", "io_threads", T::kInt, Field<&Config::fs, &FsTierSettings::io_threads>(), 1, 256, false, "threads that read and write files"},
    {"tiers.fs", "op_timeout_ms", T::kInt, Field<&Config::fs, &FsTierSettings::op_timeout_ms>(), 1, 600000, true,
     "a read or write not started by then is a miss"},
    {"tiers.fs", "scan_interval_ms", T::kInt, Field<&Config::fs, &FsTierSettings::scan_interval_ms>(), 100, 3600000, true,
     "how often the capacity scan lists the directory (also after an eighth of capacity written)"},
    {"tiers.fs", "fsync", T::kBool, Field<&Config::fs, &FsTierSettings::fsync>(), 0, 0, true,
     "fsync each file before it is renamed into place"},
    {"tiers.fs", "low_watermark", T::kDouble, Field<&Config::fs, &FsTierSettings::low_watermark>(), 0.01, 1, true,
     "a scan past capacity deletes down to this fraction of it"},
};

void ValidateFs(const Config& c, ConfigFail fail) {
  if (c.fs.dir.empty() || c.fs.dir.front() != '/') {
    fail("tiers.fs.dir", absl::StrCat("tiers.fs.dir must be an absolute path to a directory several nodes mount (got \"",
                                      c.fs.dir.substr(0, 200), "\")"));
  }
  if (c.fs.capacity_bytes == 0) fail("tiers.fs.capacity", "tiers.fs.capacity must not be 0");
}

}  // namespace

LowerTierKind FsTierKind() {
  return {.kind = "fs",
          .section = "tiers.fs",
          .preamble = "# A directory several nodes mount: blocks as files, shared like [tiers.remote]\n"
                      "# (whose probe_*, min_block_bytes, write_policy and admission_min_uses apply to\n"
                      "# whichever shared tier the chain has). Or list the chain as [[tiers.lower]]\n"
                      "# entries: kind = \"nvme\" | \"redis\" | \"fs\" and that kind's keys.\n",
          .shared = true,
          .default_name = "fs",
          // No [[tenants]] key configures it: two directories (a fast
          // cluster file system and a larger, slower one) may each be a tier.
          .repeatable = true,
          .distinct_dir_key = "dir",
          .keys = kFsKeys,
          .configured = [](const Config& c) { return !c.fs.dir.empty(); },
          .validate = &ValidateFs,
          // Every node's files together; each is a header and the block.
          .fit = [](const Config& c, uint64_t block_bytes) {
            return LowerTierKind::Fit{
                .capacity_bytes = c.fs.capacity_bytes,
                // Not one file fits: 0, and no sum that could wrap.
                .blocks = block_bytes == 0 || block_bytes > c.fs.capacity_bytes ||
                                  c.fs.capacity_bytes - block_bytes < kFsBlockHeaderBytes
                              ? 0
                              : c.fs.capacity_bytes / (block_bytes + kFsBlockHeaderBytes)};
          }};
}

}  // namespace kvtier
