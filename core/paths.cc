// SPDX-License-Identifier: Apache-2.0
#include "core/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

std::string DefaultRunDir() {
  if (auto v = Env("KVTIER_RUN_DIR"); !v.empty()) return v;
  if (auto v = Env("RUNTIME_DIRECTORY"); !v.empty()) return v;
  if (geteuid() == 0) return "/run/kvtier";
  if (auto v = Env("XDG_RUNTIME_DIR"); !v.empty()) return absl::StrCat(v, "/kvtier");
  return absl::StrCat("/tmp/kvtier-", geteuid());
}

std::string DefaultDataDir() {
  if (auto v = Env("STATE_DIRECTORY"); !v.empty()) return v;
  if (geteuid() == 0) return "/var/lib/kvtier";
  if (auto v = Env("XDG_STATE_HOME"); !v.empty()) return absl::StrCat(v, "/kvtier");
  if (auto v = Env("HOME"); !v.empty()) return absl::StrCat(v, "/.local/state/kvtier");
  return absl::StrCat("/tmp/kvtier-", geteuid(), "-data");
}

std::string FindSocket(const std::string& name, const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    const std::string path = absl::StrCat(d, "/", name);
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return path;
  }
  return dirs.empty() ? name : absl::StrCat(dirs.front(), "/", name);
}

std::string DefaultDataSocketPath() {
  if (auto v = Env("KVTIER_SOCKET"); !v.empty()) return v;
  return FindSocket(kDataSocketName, {DefaultRunDir(), kServiceRunDir});
}

std::string DefaultAdminSocketPath() {
  if (auto v = Env("KVTIER_ADMIN_SOCKET"); !v.empty()) return v;
  return FindSocket(kAdminSocketName, {DefaultRunDir(), kServiceRunDir});
}

}  // namespace kvtier
