// SPDX-License-Identifier: Apache-2.0
// kvtierd's config keys, each stated once: its section and name, the Config
// member it lands in, its type and bounds, whether SIGHUP may change it, and
// a one-line doc. Parsing, `--print-default-config`, `kvtierctl config`
// (the admin "config" answer), the reload diff and a test against the key
// tables of docs/configuration.md all read this table. Defaults are the
// members' initialisers in Config (config.h): one default per knob.
// [[tenants]] entries have their own short table (TenantSchema).
#ifndef KVTIER_DAEMON_CONFIG_SCHEMA_H_
#define KVTIER_DAEMON_CONFIG_SCHEMA_H_

#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "daemon/config.h"

namespace kvtier {

enum class ConfigType : uint8_t {
  kString,
  kBool,
  kInt,         // an integer in [lo, hi]
  kDouble,      // a number in [lo, hi]
  kBytes,       // an integer or a size such as "64MiB"
  kStringList,  // a list of non-empty strings
  kIntList,     // a list of non-negative integers (uids, gids)
  kHash,        // a block-key hash name (core/block_key.h)
};

// Where a key's value lives in Config: a member of Config itself, or a
// member of a component's options struct that Config holds (Config::fs).
template <typename V>
struct ConfigRef {
  V& (*at)(Config&);
};
using ConfigField = std::variant<ConfigRef<std::string>, ConfigRef<bool>, ConfigRef<uint32_t>, ConfigRef<uint64_t>,
                                 ConfigRef<double>, ConfigRef<std::vector<std::string>>, ConfigRef<HashAlgorithm>>;

// Field<&Config::spin_us>(), Field<&Config::fs, &FsTierSettings::dir>().
template <auto Member>
constexpr ConfigField Field() {
  using V = std::remove_reference_t<decltype(std::declval<Config&>().*Member)>;
  return ConfigRef<V>{[](Config& c) -> V& { return c.*Member; }};
}
template <auto Component, auto Member>
constexpr ConfigField Field() {
  using V = std::remove_reference_t<decltype((std::declval<Config&>().*Component).*Member)>;
  return ConfigRef<V>{[](Config& c) -> V& { return (c.*Component).*Member; }};
}

struct ConfigKey {
  std::string_view section;  // "daemon", "tiers.nvme"
  std::string_view name;
  ConfigType type;
  ConfigField field;
  double lo = 0, hi = 0;     // kInt and kDouble
  bool reloadable = false;   // SIGHUP applies it (Daemon::Reload); else it needs a restart
  std::string_view doc;      // one line; the comment in --print-default-config

  std::string full_name() const { return std::string(section) + "." + std::string(name); }
};

// A [section] in file order, with the comment lines printed above its keys.
struct ConfigSection {
  std::string_view name;
  std::string_view preamble;  // "" or whole comment lines, each ending in \n
};

// Every key of every section, in file order.
std::span<const ConfigKey> ConfigSchema();
std::span<const ConfigSection> ConfigSections();

// Calls f with the value `k` names in `c` (a const reference of its type).
template <typename F>
decltype(auto) VisitConfigValue(const ConfigKey& k, const Config& c, F&& f) {
  // at() only locates the value; nothing is written through it here.
  return std::visit([&](auto ref) -> decltype(auto) { return f(std::as_const(ref.at(const_cast<Config&>(c)))); },
                    k.field);
}

// The value as TOML: strings quoted, sizes as "64MiB" where exact, numbers
// with a decimal point.
std::string ConfigValueToml(const ConfigKey& k, const Config& c);
bool ConfigValuesDiffer(const ConfigKey& k, const Config& a, const Config& b);
// Sets k's value in *to to its value in from (a reload applying the key).
void CopyConfigValue(const ConfigKey& k, const Config& from, Config* to);

// The keys of a [[tenants]] entry. Quotas (host_tokens, nvme_bytes,
// nvme_tokens) are reloadable; the rest need a restart.
using TenantField = std::variant<std::string TenantConfig::*, std::vector<uint32_t> TenantConfig::*,
                                 uint64_t TenantConfig::*, std::vector<std::string> TenantConfig::*>;
struct TenantKey {
  std::string_view name;
  ConfigType type;  // kString, kIntList, kStringList, kBytes or kInt
  TenantField field;
  std::string_view default_toml;  // as --print-default-config writes it ("" for name: the default tenant's)
  bool reloadable;                // SIGHUP applies it
  std::string_view doc;
};
std::span<const TenantKey> TenantSchema();

}  // namespace kvtier

#endif  // KVTIER_DAEMON_CONFIG_SCHEMA_H_
