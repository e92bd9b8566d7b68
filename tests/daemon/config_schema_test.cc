// SPDX-License-Identifier: Apache-2.0
// The config schema against what users read and run: the key tables of
// docs/configuration.md (every key documented once, with the schema's
// default, and "Reloadable" exactly where SIGHUP applies it), the printed
// default file, and the reload diff.
#include "daemon/config_schema.h"
#include "daemon/lower_kinds.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

struct DocRow {
  std::string default_cell;
  std::string text;
};

// "## [tiers.nvme]" tables: section -> key -> row.
std::map<std::string, std::map<std::string, DocRow>> ReadDocTables() {
  std::ifstream f(std::string(KVTIER_SOURCE_DIR) + "/docs/configuration.md");
  EXPECT_TRUE(f.good()) << "docs/configuration.md not found";
  std::map<std::string, std::map<std::string, DocRow>> out;
  std::string line, section;
  while (std::getline(f, line)) {
    if (line.rfind("## [", 0) == 0) {
      section = line.substr(3);
      section.erase(std::remove(section.begin(), section.end(), '['), section.end());
      section.erase(std::remove(section.begin(), section.end(), ']'), section.end());
      continue;
    }
    if (section.empty() || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = absl::StrSplit(line, " | ");
    if (cells.size() < 3) continue;
    std::string key(absl::StripPrefix(cells[0], "| "));
    key = std::string(absl::StripSuffix(absl::StripPrefix(key, "`"), "`"));
    std::string text = cells[2];
    for (size_t i = 3; i < cells.size(); ++i) text += " | " + cells[i];
    EXPECT_FALSE(out[section].contains(key)) << section << "." << key << " is documented twice";
    out[section][key] = DocRow{cells[1], text};
  }
  return out;
}

// A default as written in the docs or in TOML, without quoting.
std::string Plain(std::string v) {
  v = std::string(absl::StripSuffix(absl::StripPrefix(v, "`"), "`"));
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  return v;
}

bool SaysReloadable(const std::string& text) { return text.find("Reloadable") != std::string::npos; }

TEST(ConfigSchemaTest, DocsListEveryKeyOnceWithTheSchemasDefault) {
  const auto docs = ReadDocTables();
  const Config d = DefaultConfig();
  std::set<std::string> schema_keys;
  for (const ConfigKey& k : ConfigSchema()) {
    const std::string full = k.full_name();
    schema_keys.insert(full);
    auto sec = docs.find(std::string(k.section));
    ASSERT_NE(sec, docs.end()) << "docs/configuration.md has no ## [" << k.section << "] table";
    auto row = sec->second.find(std::string(k.name));
    if (row == sec->second.end()) {
      ADD_FAILURE() << full << " is not in docs/configuration.md";
      continue;
    }
    EXPECT_EQ(SaysReloadable(row->second.text), k.reloadable)
        << full << ": the docs and the schema disagree on whether SIGHUP applies it";
    if (row->second.default_cell == "see below") continue;  // run_dir, data_dir: depend on who runs it
    const std::string want = Plain(ConfigValueToml(k, d)), got = Plain(row->second.default_cell);
    if (k.type == ConfigType::kDouble) {
      EXPECT_DOUBLE_EQ(std::strtod(got.c_str(), nullptr), std::strtod(want.c_str(), nullptr)) << full;
    } else {
      EXPECT_EQ(got, want) << full << ": the docs' default is not the schema's";
    }
  }
  for (const auto& [section, rows] : docs) {
    if (section == "tenants") continue;
    for (const auto& [key, row] : rows) {
      EXPECT_TRUE(schema_keys.contains(section + "." + key))
          << section << "." << key << " is documented but kvtierd does not know it";
    }
  }
  // [[tenants]] entries.
  ASSERT_TRUE(docs.contains("tenants"));
  const auto& tenant_rows = docs.at("tenants");
  EXPECT_EQ(tenant_rows.size(), TenantSchema().size());
  for (const TenantKey& k : TenantSchema()) {
    auto row = tenant_rows.find(std::string(k.name));
    if (row == tenant_rows.end()) {
      ADD_FAILURE() << "tenants." << k.name << " is not in docs/configuration.md";
      continue;
    }
    EXPECT_EQ(SaysReloadable(row->second.text), k.reloadable) << "tenants." << k.name;
    if (k.name != "name") {
      EXPECT_EQ(Plain(row->second.default_cell), Plain(std::string(k.default_toml))) << k.name;
    }
  }
}

TEST(ConfigSchemaTest, EveryKeyIsPrintedOnceInTheDefaultFileAndParsesBack) {
  const std::string text = DefaultConfigToml();
  for (const ConfigKey& k : ConfigSchema()) {
    const std::string section = "\n[" + std::string(k.section) + "]\n";
    const size_t at = text.find(section);
    ASSERT_NE(at, std::string::npos) << k.section;
    const size_t end = text.find("\n[", at + section.size());
    const std::string body = text.substr(at, end - at);
    EXPECT_NE(body.find("\n" + std::string(k.name) + " = "), std::string::npos) << k.full_name();
  }
  absl::StatusOr<Config> c = ParseConfig(text, "default");
  ASSERT_TRUE(c.ok()) << c.status();
  for (const ConfigKey& k : ConfigSchema()) {
    if (k.name == "run_dir" || k.name == "data_dir") continue;
    EXPECT_FALSE(ConfigValuesDiffer(k, *c, DefaultConfig())) << k.full_name();
  }
}

TEST(ConfigSchemaTest, AChangedKeyIsSeenByTheDiffAndNamesItsKey) {
  const ConfigKey* spin = nullptr;
  for (const ConfigKey& k : ConfigSchema()) {
    if (k.full_name() == "ipc.spin_us") spin = &k;
  }
  ASSERT_NE(spin, nullptr);
  absl::StatusOr<Config> a = ParseConfig("", "a"), b = ParseConfig("[ipc]\nspin_us = 7\n", "b");
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0;
  for (const ConfigKey& k : ConfigSchema()) differ += ConfigValuesDiffer(k, *a, *b);
  EXPECT_EQ(differ, 1);
  EXPECT_TRUE(ConfigValuesDiffer(*spin, *a, *b));
  EXPECT_FALSE(spin->reloadable);
  EXPECT_EQ(ConfigValueToml(*spin, *b), "7");
}

TEST(ConfigSchemaTest, ASectionThatIsNotATableIsRefused) {
  for (const char* text : {"tiers = 1\n", "cost_model = 5\n", "[tiers]\nhost = 1\n", "[tiers]\nnvme = \"x\"\n"}) {
    absl::StatusOr<Config> c = ParseConfig(text, "t.toml");
    EXPECT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("must be a table"), absl::string_view::npos) << c.status();
  }
  EXPECT_TRUE(ParseConfig("[tiers.host]\ncapacity = \"2GiB\"\n", "t.toml").ok());
}

TEST(ConfigSchemaTest, SectionsAndKeysAreUnique) {
  std::set<std::string> seen;
  for (const ConfigKey& k : ConfigSchema()) EXPECT_TRUE(seen.insert(k.full_name()).second) << k.full_name();
  std::set<std::string_view> sections;
  for (const ConfigSection& s : ConfigSections()) sections.insert(s.name);
  for (const ConfigKey& k : ConfigSchema()) EXPECT_TRUE(sections.contains(k.section)) << k.full_name();
}

TEST(ConfigSchemaTest, EachLowerTierKindBringsItsSectionAndKeys) {
  std::set<std::string> kinds;
  for (const LowerTierKind& k : LowerTierKinds()) {
    EXPECT_TRUE(kinds.insert(std::string(k.kind)).second) << k.kind;
    EXPECT_EQ(FindLowerTierKind(k.kind), &k);
    // Its section, with its comment, in the file's sections.
    int sections = 0;
    for (const ConfigSection& s : ConfigSections()) {
      if (s.name != k.section) continue;
      ++sections;
      EXPECT_EQ(s.preamble, k.preamble) << k.section;
    }
    EXPECT_EQ(sections, 1) << k.section;
    // Its keys, all in its section, each once in the schema.
    ASSERT_FALSE(k.keys.empty()) << k.kind;
    for (const ConfigKey& key : k.keys) {
      EXPECT_EQ(key.section, k.section) << key.full_name();
      int found = 0;
      for (const ConfigKey& s : ConfigSchema()) found += s.full_name() == key.full_name() && s.doc == key.doc;
      EXPECT_EQ(found, 1) << key.full_name();
    }
    // And no key of its section comes from anywhere else.
    size_t in_section = 0;
    for (const ConfigKey& s : ConfigSchema()) in_section += s.section == k.section;
    EXPECT_EQ(in_section, k.keys.size()) << k.section;
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"nvme", "redis", "fs"}));
  EXPECT_EQ(FindLowerTierKind("tape"), nullptr);
}

TEST(ConfigSchemaTest, AKindsOwnChecksRunOnlyWhenTheChainHasIt) {
  // The fs kind's check (an absolute dir) is its own: a relative dir is
  // refused in a chain with the fs tier, with the key's line.
  absl::StatusOr<Config> c = ParseConfig("[[tiers.lower]]\nkind = \"fs\"\ndir = \"relative/dir\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("t.toml:3: tiers.fs.dir must be an absolute path"), std::string::npos)
      << c.status();
  // NVMe's: an entry of its kind that turns it off.
  c = ParseConfig("[[tiers.lower]]\nkind = \"nvme\"\ncapacity = 0\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("leave the entry out instead"), std::string::npos) << c.status();
  // A chain without the fs tier does not run its checks.
  EXPECT_TRUE(ParseConfig("[tiers.nvme]\ncapacity = \"64MiB\"\n", "t.toml").ok());
}

}  // namespace
}  // namespace kvtier
