#include "core/paths.h"

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

std::string DefaultDataSocketPath() {
  if (auto v = Env("KVTIER_SOCKET"); !v.empty()) return v;
  return absl::StrCat(DefaultRunDir(), "/", kDataSocketName);
}

std::string DefaultAdminSocketPath() {
  if (auto v = Env("KVTIER_ADMIN_SOCKET"); !v.empty()) return v;
  return absl::StrCat(DefaultRunDir(), "/", kAdminSocketName);
}

}  // namespace kvtier
