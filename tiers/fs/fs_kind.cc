// SPDX-License-Identifier: Apache-2.0
// The fs kind's daemon half (fs_kind.h): the tier as [tiers.fs] configures
// it, and the hook that applies its reloadable keys.
#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/fmt_absl.h"
#include "core/units.h"
#include "daemon/config.h"
#include "spdlog/spdlog.h"
#include "tiers/fs/fs_kind.h"
#include "tiers/fs/fs_tier.h"

namespace kvtier {

absl::StatusOr<OpenedLowerTier> OpenFsTier(const Config& c, std::string_view name) {
  FsTierOptions o;
  static_cast<FsTierSettings&>(o) = c.fs;
  o.name = std::string(name);
  for (const TenantConfig& t : c.tenants) o.tenants.push_back({t.name, TenantHash(t.name)});
  o.on_failure = [dir = c.fs.dir, name = o.name](const std::string& why) {
    spdlog::error("event=fs_tier_failed tier={} dir=\"{}\" detail=\"{}\" hint=\"the fs tier is degraded: its reads are misses "
                  "and blocks stay in the tiers above until it works; check that the directory is mounted, has "
                  "room and is writable by kvtierd's user\"",
                  name, LogQuoted(dir), LogQuoted(why));
  };
  absl::StatusOr<std::unique_ptr<FsTier>> tier = FsTier::Create(o);
  if (!tier.ok()) {
    return absl::Status(tier.status().code(),
                        absl::StrCat("opening the fs tier \"", o.name, "\": ", tier.status().message()));
  }
  spdlog::info("event=fs_tier state=on tier={} dir=\"{}\" capacity=\"{}\" tenants={} io_threads={} fsync={} detail=\"a "
               "directory several nodes mount; every file checked on read, misses there cost a recompute, never a "
               "wrong block\"",
               o.name, LogQuoted(c.fs.dir), FormatBytes(c.fs.capacity_bytes), o.tenants.size(), o.io_threads, o.fsync);
  OpenedLowerTier out;
  out.reload = [fs = tier->get()](const Config& next) {
    // The reloadable settings only: a new dir or io_threads in the same file
    // waits for a restart on its own (the reload names it).
    FsTierSettings s = fs->settings();
    s.capacity_bytes = next.fs.capacity_bytes;
    s.low_watermark = next.fs.low_watermark;
    s.op_timeout_ms = next.fs.op_timeout_ms;
    s.scan_interval_ms = next.fs.scan_interval_ms;
    s.fsync = next.fs.fsync;
    return fs->Retune(s);
  };
  out.tier = *std::move(tier);
  return out;
}

}  // namespace kvtier
