// SPDX-License-Identifier: Apache-2.0
#include "daemon/config.h"
#include "daemon/config_text.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/block_key.h"
#include "core/paths.h"
#include "policies/eviction_policy.h"
#include "core/fmt_absl.h"
#include "core/status.h"
#include "core/units.h"
#include "daemon/config_schema.h"
#include "daemon/lower_kinds.h"
#include "fmt/format.h"

#include <toml++/toml.h>

namespace kvtier {
namespace {

using config_text::Cat;

std::string Where(std::string_view origin, const toml::source_region& src) {
  if (src.begin.line == 0) return std::string(origin);
  return Cat(origin, ":", src.begin.line);
}

// Reads one table, refusing keys it does not know.
class TableReader {
 public:
  TableReader(const toml::table& t, std::string prefix, std::string_view origin,
              std::map<std::string, std::string>* sources = nullptr)
      : t_(t), prefix_(std::move(prefix)), origin_(origin), sources_(sources) {}

  absl::Status String(std::string_view key, std::string* out) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      auto v = n.value<std::string>();
      if (!v) return TypeError(key, n, "a string");
      *out = *v;
      return absl::OkStatus();
    });
  }
  absl::Status Bool(std::string_view key, bool* out) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      auto v = n.value<bool>();
      if (!v) return TypeError(key, n, "true or false");
      *out = *v;
      return absl::OkStatus();
    });
  }
  template <typename T>
  absl::Status Int(std::string_view key, T* out, int64_t lo, int64_t hi) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      auto v = n.value<int64_t>();
      if (!v || !n.is_integer()) return TypeError(key, n, "an integer");
      if (*v < lo || *v > hi) {
        return absl::InvalidArgumentError(Cat(Where(origin_, n.source()), ": ", Full(key),
                                                       " = ", *v, " is outside ", lo, "..", hi));
      }
      *out = static_cast<T>(*v);
      return absl::OkStatus();
    });
  }
  // A number (integers accepted) in [lo, hi].
  absl::Status Double(std::string_view key, double* out, double lo, double hi) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      auto v = n.value<double>();
      if (!v || !(n.is_floating_point() || n.is_integer())) return TypeError(key, n, "a number");
      if (!(*v >= lo && *v <= hi)) {
        return absl::InvalidArgumentError(
            Cat(Where(origin_, n.source()), ": ", Full(key), " = ", *v, " is outside ", lo, "..", hi));
      }
      *out = *v;
      return absl::OkStatus();
    });
  }
  // A byte size: an integer, or a string such as "64MiB".
  absl::Status Bytes(std::string_view key, uint64_t* out) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      if (auto i = n.value<int64_t>(); i && n.is_integer()) {
        if (*i < 0) return TypeError(key, n, "a non-negative size");
        *out = static_cast<uint64_t>(*i);
        return absl::OkStatus();
      }
      auto s = n.value<std::string>();
      if (!s) return TypeError(key, n, "a size such as 4096 or \"64MiB\"");
      auto parsed = ParseBytes(*s);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            Cat(Where(origin_, n.source()), ": ", Full(key), ": ", parsed.status().message()));
      }
      *out = *parsed;
      return absl::OkStatus();
    });
  }
  absl::Status StringList(std::string_view key, std::vector<std::string>* out) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      const toml::array* a = n.as_array();
      if (a == nullptr) return TypeError(key, n, "a list of strings");
      out->clear();
      for (const toml::node& e : *a) {
        auto v = e.value<std::string>();
        if (!v || v->empty()) return TypeError(key, e, "a list of non-empty strings");
        out->push_back(*v);
      }
      return absl::OkStatus();
    });
  }
  template <typename T>
  absl::Status IntList(std::string_view key, std::vector<T>* out) {
    return Get(key, [&](const toml::node& n) -> absl::Status {
      const toml::array* a = n.as_array();
      if (a == nullptr) return TypeError(key, n, "a list of integers");
      out->clear();
      for (const toml::node& e : *a) {
        auto v = e.value<int64_t>();
        if (!v || !e.is_integer() || *v < 0 || *v > 0x7fffffff) {
          return TypeError(key, e, "a list of non-negative integers");
        }
        out->push_back(static_cast<T>(*v));
      }
      return absl::OkStatus();
    });
  }
  const toml::table* SubTable(std::string_view key) {
    seen_.insert(std::string(key));
    const toml::node* n = t_.get(key);
    return n ? n->as_table() : nullptr;
  }
  const toml::array* Array(std::string_view key) {
    seen_.insert(std::string(key));
    const toml::node* n = t_.get(key);
    return n ? n->as_array() : nullptr;
  }
  // Fails on every key that no getter asked about.
  absl::Status RejectUnknown() {
    std::vector<std::string> unknown;
    for (const auto& [k, v] : t_) {
      if (!seen_.contains(std::string(k.str()))) {
        unknown.push_back(Cat(Where(origin_, v.source()), ": unknown key ", Full(k.str()),
                              " (see docs/configuration.md or `kvtierd --print-default-config` for the keys)"));
      }
    }
    if (unknown.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(unknown, "; "));
  }
  std::string Full(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : Cat(prefix_, ".", key);
  }

 private:
  template <typename F>
  absl::Status Get(std::string_view key, F f) {
    seen_.insert(std::string(key));
    const toml::node* n = t_.get(key);
    if (n == nullptr) return absl::OkStatus();
    if (sources_ != nullptr) (*sources_)[Full(key)] = Where(origin_, n->source());
    return f(*n);
  }
  absl::Status TypeError(std::string_view key, const toml::node& n, std::string_view want) {
    return absl::InvalidArgumentError(
        Cat(Where(origin_, n.source()), ": ", Full(key), " must be ", want));
  }

  const toml::table& t_;
  std::string prefix_;
  std::string_view origin_;
  std::map<std::string, std::string>* sources_;
  absl::flat_hash_set<std::string> seen_;
};

// Collects errors instead of returning at the first.
#define KVTIER_KEEP_ERROR(errors, expr)                                            \
  do {                                                                             \
    if (absl::Status kvtier_keep_s = (expr); !kvtier_keep_s.ok()) {                \
      (errors).push_back(std::string(kvtier_keep_s.message()));                    \
    }                                                                              \
  } while (0)

// `key` of `parent`, when present, must be a table ([full_name]).
absl::Status CheckTableType(const toml::table& parent, std::string_view key, std::string_view origin,
                            std::string_view full_name = {}) {
  const toml::node* n = parent.get(key);
  if (n != nullptr && !n->is_table()) {
    return absl::InvalidArgumentError(
        Cat(Where(origin, n->source()), ": [", full_name.empty() ? key : full_name, "] must be a table"));
  }
  return absl::OkStatus();
}

// One key of the schema, read from its section's table into c.
absl::Status ReadKey(TableReader& r, const ConfigKey& k, std::string_view origin, Config* c) {
  switch (k.type) {
    case ConfigType::kString:
      return r.String(k.name, &std::get<ConfigRef<std::string>>(k.field).at(*c));
    case ConfigType::kBool:
      return r.Bool(k.name, &std::get<ConfigRef<bool>>(k.field).at(*c));
    case ConfigType::kInt:
      if (auto* m = std::get_if<ConfigRef<uint32_t>>(&k.field)) {
        return r.Int(k.name, &m->at(*c), static_cast<int64_t>(k.lo), static_cast<int64_t>(k.hi));
      }
      return r.Int(k.name, &std::get<ConfigRef<uint64_t>>(k.field).at(*c), static_cast<int64_t>(k.lo),
                   static_cast<int64_t>(k.hi));
    case ConfigType::kDouble:
      return r.Double(k.name, &std::get<ConfigRef<double>>(k.field).at(*c), k.lo, k.hi);
    case ConfigType::kBytes:
      return r.Bytes(k.name, &std::get<ConfigRef<uint64_t>>(k.field).at(*c));
    case ConfigType::kStringList:
      return r.StringList(k.name, &std::get<ConfigRef<std::vector<std::string>>>(k.field).at(*c));
    case ConfigType::kIntList:
      return absl::InternalError(Cat(k.full_name(), ": no list of integers outside [[tenants]]"));
    case ConfigType::kHash: {
      HashAlgorithm& out = std::get<ConfigRef<HashAlgorithm>>(k.field).at(*c);
      std::string name(HashAlgorithmName(out));
      RETURN_IF_ERROR(r.String(k.name, &name));
      absl::StatusOr<HashAlgorithm> algo = ParseHashAlgorithm(name);
      if (!algo.ok()) {
        const std::string full = k.full_name();
        return absl::InvalidArgumentError(Cat(c->key_source.contains(full) ? c->key_source[full] : std::string(origin),
                                              ": ", full, ": ", algo.status().message()));
      }
      out = *algo;
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown config key type");
}

void ReadTenants(const toml::array& arr, std::string_view origin, Config* c, std::vector<std::string>* errors) {
  c->tenants.clear();
  for (const toml::node& n : arr) {
    const toml::table* t = n.as_table();
    if (t == nullptr) {
      errors->push_back(Cat(Where(origin, n.source()), ": [[tenants]] entries must be tables"));
      continue;
    }
    TenantConfig tc;
    const std::string prefix = Cat("tenants[", c->tenants.size(), "]");
    c->key_source[prefix] = Where(origin, n.source());
    TableReader r(*t, prefix, origin, &c->key_source);
    for (const TenantKey& k : TenantSchema()) {
      switch (k.type) {
        case ConfigType::kString:
          KVTIER_KEEP_ERROR(*errors, r.String(k.name, &(tc.*std::get<std::string TenantConfig::*>(k.field))));
          break;
        case ConfigType::kIntList:
          KVTIER_KEEP_ERROR(*errors, r.IntList(k.name, &(tc.*std::get<std::vector<uint32_t> TenantConfig::*>(k.field))));
          break;
        case ConfigType::kStringList:
          KVTIER_KEEP_ERROR(*errors,
                            r.StringList(k.name, &(tc.*std::get<std::vector<std::string> TenantConfig::*>(k.field))));
          break;
        case ConfigType::kBytes:
          KVTIER_KEEP_ERROR(*errors, r.Bytes(k.name, &(tc.*std::get<uint64_t TenantConfig::*>(k.field))));
          break;
        default:  // kInt: token counts
          KVTIER_KEEP_ERROR(*errors, r.Int(k.name, &(tc.*std::get<uint64_t TenantConfig::*>(k.field)), 0,
                                           int64_t{1} << 50));
          break;
      }
    }
    KVTIER_KEEP_ERROR(*errors, r.RejectUnknown());
    c->tenants.push_back(std::move(tc));
  }
}

// [[tiers.lower]]: each entry names its kind and holds that kind's keys,
// read with the same schema rows as its section ([tiers.nvme] for "nvme"),
// so each key has one default and one set of bounds. Messages name the
// key as its section's (tiers.nvme.capacity), at the entry's file:line.
// The first entry of each kind fills its section in *c; a later one (a kind
// that may repeat) keeps its section apart, as the entry's `own` options
// (Config::OptionsOf).
void ReadLowerChain(const toml::array& arr, const toml::table* tiers, std::string_view origin, Config* c,
                    std::vector<std::string>* errors) {
  for (const LowerTierKind& k : LowerTierKinds()) {
    const std::string_view inner = k.section.substr(k.section.find('.') + 1);
    if (tiers != nullptr && tiers->get(inner) != nullptr) {
      errors->push_back(Cat(Where(origin, tiers->get(inner)->source()), ": [", k.section,
                            "] and [[tiers.lower]] in one file: list every lower tier as a [[tiers.lower]] entry "
                            "(kind = \"", k.kind, "\" takes [", k.section, "]'s keys)"));
    }
  }
  c->lower_chain.clear();
  // Each entry may hold a copy of the config: bounded before any is made.
  if (arr.size() > kMaxLowerChain) {
    errors->push_back(Cat(Where(origin, arr.source()), ": [[tiers.lower]] has ", arr.size(),
                          " entries; a chain holds at most ", kMaxLowerChain, " tiers below host memory"));
    return;
  }
  absl::flat_hash_set<std::string> shared_keys_set;  // shared-tier keys some entry set
  absl::flat_hash_map<std::string, size_t> of_kind;   // entries so far, by kind
  size_t index = 0;
  for (const toml::node& n : arr) {
    const size_t i = index++;
    const toml::table* t = n.as_table();
    const std::string where = Where(origin, n.source());
    if (t == nullptr) {
      errors->push_back(Cat(where, ": [[tiers.lower]] entries must be tables"));
      continue;
    }
    std::string kind;
    TableReader kr(*t, Cat("tiers.lower[", i, "]"), origin, &c->key_source);
    KVTIER_KEEP_ERROR(*errors, kr.String("kind", &kind));
    const LowerTierKind* k = FindLowerTierKind(kind);
    if (k == nullptr) {
      std::vector<std::string> names;
      for (const LowerTierKind& known : LowerTierKinds()) names.emplace_back(known.kind);
      errors->push_back(Cat(where, ": tiers.lower[", i, "].kind must be one of ", absl::StrJoin(names, ", "),
                            kind.empty() ? " (it is missing)" : Cat(", not \"", kind.substr(0, 40), "\"")));
      continue;
    }
    const size_t nth = ++of_kind[kind];
    if (nth > 1 && !k->repeatable) {
      errors->push_back(Cat(where, ": a second [[tiers.lower]] of kind \"", kind, "\": the chain holds one tier of "
                            "this kind, which [[tenants]] keys configure; list several directories or nodes in "
                            "the one entry instead"));
      continue;
    }
    Config::LowerEntry e{.kind = kind, .name = nth == 1 ? std::string(k->default_name)
                                                        : Cat(k->default_name, "-", nth)};
    KVTIER_KEEP_ERROR(*errors, kr.String("name", &e.name));
    const bool named = t->contains("name");
    // Names label the tier rows of status and metrics, beside host and gpu
    // and the kinds' default names.
    const bool reserved = e.name == "host" || e.name == "gpu" ||
                          std::any_of(LowerTierKinds().begin(), LowerTierKinds().end(), [&](const LowerTierKind& o) {
                            return o.default_name == e.name && o.kind != kind;
                          });
    if (!TenantNameIsSafe(e.name)) {
      errors->push_back(Cat(where, ": tiers.lower[", i, "].name must be 1 to 64 of A-Z a-z 0-9 _ . - (it names the "
                            "tier in metrics and logs)"));
    } else if (reserved) {
      errors->push_back(Cat(where, ": tiers.lower[", i, "].name \"", e.name, "\" is reserved: it names host memory, "
                            "the GPU tier or another kind's tier in status and metrics"));
    } else if (std::any_of(c->lower_chain.begin(), c->lower_chain.end(),
                           [&](const Config::LowerEntry& o) { return o.name == e.name; })) {
      errors->push_back(Cat(where, ": tiers.lower[", i, "]", named ? ".name" : "'s default name", " \"", e.name,
                            "\" is taken by an earlier entry: each tier of the chain needs a name of its own",
                            named ? "" : "; give this entry a name"));
    }
    // The entry's keys land in a config of their own first: a later entry
    // of a kind must not overwrite the first's section.
    auto read = std::make_shared<Config>();
    TableReader r(*t, std::string(k->section), origin, &read->key_source);
    std::string again;  // kr read (and checked) them; r only marks them known
    (void)r.String("kind", &again);
    (void)r.String("name", &again);
    for (const ConfigKey& key : ConfigSchema()) {
      const bool shared_key = k->shared && key.section == "tiers.remote" && IsSharedTierKey(key.name);
      if (key.section != k->section && !shared_key) continue;
      // One setting for every shared tier: given in two entries, which one
      // holds would depend on their order.
      if (shared_key && t->contains(key.name) && !shared_keys_set.insert(std::string(key.name)).second) {
        errors->push_back(Cat(where, ": tiers.lower[", i, "].", key.name,
                              " is set in two shared entries: the shared-tier keys govern every shared tier, set "
                              "each in one entry"));
        continue;
      }
      KVTIER_KEEP_ERROR(*errors, ReadKey(r, key, origin, read.get()));
      // Shared-tier keys are the whole chain's, and the first entry of a
      // kind fills its section.
      if (shared_key ? t->contains(key.name) : nth == 1) {
        CopyConfigValue(key, *read, c);
        if (auto src = read->key_source.find(key.full_name()); src != read->key_source.end()) {
          c->key_source[src->first] = src->second;
        }
      }
    }
    KVTIER_KEEP_ERROR(*errors, r.RejectUnknown());
    if (nth > 1) e.own = std::move(read);
    c->lower_chain.push_back(std::move(e));
  }
  if (arr.empty()) errors->push_back(Cat(origin, ": [[tiers.lower]] is empty: leave it out for the default chain"));
}

// toml++ recurses once per level of a dotted key ("a.a.a...": 100000
// levels overflowed the stack, in kvtierd at start or on SIGHUP), and its
// own bound (256 nested arrays or inline tables) does not count the dotted
// keys within them. So before the text reaches toml++: at most
// kMaxConfigBytes, and no key nested deeper than kMaxConfigDepth, counting
// the open arrays and inline tables around it and the parts of its dotted
// name (a [table.header] counts its parts too). A lexical scan: strings
// (all four kinds) and comments are skipped, so dots and brackets in them
// do not count; what is not TOML is left for toml++ to reject.
constexpr size_t kMaxConfigBytes = 1u << 20;
constexpr size_t kMaxConfigDepth = 32;

// Skips the string that opens at text[i] (any of TOML's four kinds),
// counting the newlines inside it into *line; returns the index of its last
// byte. A newline that ended an unterminated string is left for the caller
// to count (toml++ rejects the string).
size_t SkipString(std::string_view text, size_t i, size_t* line) {
  const char c = text[i];
  const bool multi = text.substr(i, 3) == std::string(3, c);
  const std::string_view close = text.substr(i, multi ? 3 : 1);
  size_t j = i + close.size();
  while (j < text.size() && text.substr(j, close.size()) != close) {
    if (text[j] == '\n') {
      if (!multi) break;  // unterminated: toml++ says so
      ++*line;
    }
    // A basic string's escape: the next byte is not its end.
    if (c == '"' && text[j] == '\\' && j + 1 < text.size()) {
      if (text[j + 1] == '\n') ++*line;
      ++j;
    }
    ++j;
  }
  return j < text.size() && text[j] == '\n' ? j - 1 : std::min(text.size(), j + close.size()) - 1;
}

absl::Status CheckConfigShape(std::string_view text, std::string_view origin) {
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        Cat(origin, ": ", text.size(), " bytes; a config may hold at most ", kMaxConfigBytes >> 20, " MiB"));
  }
  size_t line = 1;
  std::vector<char> open;    // '[' (an array value) or '{' (an inline table)
  bool in_key = true;        // reading a key: before its '='
  bool line_start = true;    // nothing but blanks yet on a statement's line
  bool header = false;       // inside [a.b] or [[a.b]]
  size_t parts = 1;          // parts of the key being read
  auto too_deep = [&] {
    return absl::InvalidArgumentError(Cat(origin, ":", line, ": keys, arrays and inline tables nested deeper than ",
                                          kMaxConfigDepth, " levels"));
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      if (open.empty()) {  // a statement ends with its line unless an array is open
        in_key = true;
        header = false;
        parts = 1;
        line_start = true;
      }
      continue;
    }
    if (c == '#') {  // a comment, to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      i = SkipString(text, i, &line);
      line_start = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (line_start && open.empty() && c == '[') {
      header = true;
      line_start = false;
      if (i + 1 < text.size() && text[i + 1] == '[') ++i;
      continue;
    }
    line_start = false;
    if (in_key || header) {
      if (c == '.') {
        if (open.size() + ++parts > kMaxConfigDepth) return too_deep();
      } else if (c == ']' && header) {
        header = false;
        in_key = false;
      } else if (c == '=' && !header) {
        in_key = false;
      }
      continue;
    }
    if (c == '[' || c == '{') {
      open.push_back(c);
      if (open.size() > kMaxConfigDepth) return too_deep();
      if (c == '{') {
        in_key = true;
        parts = 1;
      }
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back() == '{') {
      in_key = true;
      parts = 1;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<Config::LowerEntry> Config::LowerChain() const {
  if (!lower_chain.empty()) return lower_chain;
  std::vector<LowerEntry> chain;
  for (const LowerTierKind& k : LowerTierKinds()) {
    if (k.configured(*this)) chain.push_back({.kind = std::string(k.kind), .name = std::string(k.default_name)});
  }
  return chain;
}

Config Config::OptionsOf(const LowerEntry& e) const {
  Config out = *this;
  out.lower_chain.clear();
  const LowerTierKind* k = FindLowerTierKind(e.kind);
  if (!e.own || k == nullptr) return out;
  const std::string prefix = Cat(k->section, ".");
  std::erase_if(out.key_source, [&](const auto& kv) { return kv.first.starts_with(prefix); });
  for (const ConfigKey& key : k->keys) {
    CopyConfigValue(key, *e.own, &out);
    if (auto src = e.own->key_source.find(key.full_name()); src != e.own->key_source.end()) {
      out.key_source.insert(*src);
    }
  }
  return out;
}

bool Config::ChainHolds(std::string_view kind) const {
  const std::vector<LowerEntry> chain = LowerChain();
  return std::any_of(chain.begin(), chain.end(), [&](const LowerEntry& e) { return e.kind == kind; });
}

SharedWrites Config::RemoteWritePolicy() const {
  return SharedWritesNamed(remote.write_policy).value_or(SharedWrites::kDemoted);
}

std::vector<std::string> Config::NvmeDirs() const {
  if (!nvme.dirs.empty()) return nvme.dirs;
  return {data_dir + "/nvme"};
}

uint32_t Config::SessionsPerTenant() const {
  if (limit_sessions_per_tenant != 0) return limit_sessions_per_tenant;
  return std::max<uint32_t>(1, max_sessions / std::max<uint32_t>(1, static_cast<uint32_t>(tenants.size())));
}

std::string Config::DataSocketPath() const { return Cat(run_dir, "/", kDataSocketName); }
std::string Config::AdminSocketPath() const { return Cat(run_dir, "/", kAdminSocketName); }

Config DefaultConfig() {
  Config c;
  c.run_dir = DefaultRunDir();
  c.data_dir = DefaultDataDir();
  c.tenants.push_back(TenantConfig{.name = "default", .uids = {geteuid()}});
  return c;
}

absl::StatusOr<Config> ParseConfig(std::string_view toml_text, std::string_view origin) {
  RETURN_IF_ERROR(CheckConfigShape(toml_text, origin));
  // Debian's toml++ is built with exceptions; they stop here.
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        Cat(Where(origin, e.source()), ": not valid TOML: ", e.description()));
  }
  Config c = DefaultConfig();
  std::vector<std::string> errors;
  TableReader top(root, "", origin, &c.key_source);
  // Sections are [name] or [parent.name]; a parent table holds only sections.
  std::map<std::string, std::unique_ptr<TableReader>, std::less<>> parents;
  for (const ConfigSection& sec : ConfigSections()) {
    const size_t dot = sec.name.find('.');
    const std::string_view outer = sec.name.substr(0, dot);
    if (dot == std::string_view::npos || !parents.contains(outer)) {
      KVTIER_KEEP_ERROR(errors, CheckTableType(root, outer, origin));
    }
    const toml::table* t = nullptr;
    if (dot == std::string_view::npos) {
      t = top.SubTable(sec.name);
    } else {
      auto p = parents.find(outer);
      if (p == parents.end()) {
        const toml::table* pt = top.SubTable(outer);
        p = parents.emplace(std::string(outer), pt ? std::make_unique<TableReader>(*pt, std::string(outer), origin,
                                                                                   &c.key_source)
                                                   : nullptr)
                .first;
      }
      if (p->second) {
        const std::string_view inner = sec.name.substr(dot + 1);
        if (const toml::table* pt = root.get(outer) ? root.get(outer)->as_table() : nullptr) {
          KVTIER_KEEP_ERROR(errors, CheckTableType(*pt, inner, origin, sec.name));
        }
        t = p->second->SubTable(inner);
      }
    }
    if (t == nullptr) continue;
    TableReader r(*t, std::string(sec.name), origin, &c.key_source);
    for (const ConfigKey& k : ConfigSchema()) {
      if (k.section == sec.name) KVTIER_KEEP_ERROR(errors, ReadKey(r, k, origin, &c));
    }
    KVTIER_KEEP_ERROR(errors, r.RejectUnknown());
  }
  if (auto p = parents.find("tiers"); p != parents.end() && p->second) {
    const toml::table* tiers = root.get("tiers")->as_table();
    if (const toml::array* a = p->second->Array("lower")) {
      ReadLowerChain(*a, tiers, origin, &c, &errors);
    } else if (tiers->get("lower") != nullptr) {
      errors.push_back(Cat(Where(origin, tiers->get("lower")->source()),
                           ": tiers.lower must be written as [[tiers.lower]] tables"));
    }
  }
  for (auto& [name, reader] : parents) {
    if (reader) KVTIER_KEEP_ERROR(errors, reader->RejectUnknown());
  }
  // A default capacity may shrink to the free space; one set in a file may not.
  c.nvme.capacity_explicit = c.key_source.contains("tiers.nvme.capacity");
  if (const toml::array* a = top.Array("tenants")) {
    ReadTenants(*a, origin, &c, &errors);
  } else if (root.get("tenants") != nullptr) {
    errors.push_back(Cat(origin, ": tenants must be written as [[tenants]] tables"));
  }
  KVTIER_KEEP_ERROR(errors, top.RejectUnknown());
  KVTIER_KEEP_ERROR(errors, ValidateConfig(c));
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
  return c;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (access(path.c_str(), F_OK) != 0) {
      return absl::NotFoundError(Cat("config file ", path, " does not exist"));
    }
    return absl::PermissionDeniedError(Cat("cannot read config file ", path));
  }
  // One byte past the bound is enough for ParseConfig to refuse the file:
  // a huge one (or /dev/zero) is not read into memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseConfig(text, path);
}

std::string DefaultConfigToml() {
  const Config d = DefaultConfig();
  std::string out = "# kvtierd configuration. Every key is optional; these are the defaults.\n";
  auto line = [&out](std::string_view key, std::string_view value, std::string_view doc) {
    std::string l = Cat(key, " = ", value);
    if (!doc.empty()) {
      l.resize(std::max<size_t>(l.size() + 1, 28), ' ');
      l += Cat("# ", doc);
    }
    out += l + "\n";
  };
  for (const ConfigSection& sec : ConfigSections()) {
    out += Cat("\n[", sec.name, "]\n", sec.preamble);
    for (const ConfigKey& k : ConfigSchema()) {
      if (k.section == sec.name) line(k.name, ConfigValueToml(k, d), k.doc);
    }
  }
  out +=
      "\n# Tenants: peers are matched by uid, then by primary gid. Without any\n"
      "# [[tenants]] the daemon admits its own user as tenant \"default\".\n"
      "[[tenants]]\n";
  for (const TenantKey& k : TenantSchema()) {
    if (k.name == "name") {
      line(k.name, Cat("\"", d.tenants[0].name, "\""), k.doc);
    } else if (k.name == "uids") {
      line(k.name, Cat("[", absl::StrJoin(d.tenants[0].uids, ", "), "]"), k.doc);
    } else {
      line(k.name, k.default_toml, k.doc);
    }
  }
  return out;
}

}  // namespace kvtier
