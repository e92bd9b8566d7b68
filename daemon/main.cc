// SPDX-License-Identifier: Apache-2.0
// kvtierd: the kvtier daemon.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "tiers/remote_tier.h"
#include "core/checked.h"
#include "core/cli_parse.h"
#include "core/status.h"
#include "daemon/assembly.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "events/kv_events.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/config_schema.h"
#include "tools/common/man_page.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "tiers/nvme_tier.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace {

// The command line: the config file and what overrides it.
struct Flags {
  std::string config_path = "/etc/kvtier/kvtierd.toml";
  bool config_given = false;
  std::string run_dir, data_dir, log_level;
  bool print_default = false, check_only = false, defaults = false, print_ledger = false;

  // The overrides, on a config from the file or the defaults (and on every
  // SIGHUP's reread).
  void Apply(kvtier::Config& c) const {
    if (!run_dir.empty()) c.run_dir = run_dir;
    if (!data_dir.empty()) c.data_dir = data_dir;
    if (!log_level.empty()) c.log_level = log_level;
  }
};

// The file's config, or the embedded defaults when no file was named and the
// default one is absent (or --defaults); the overrides applied and checked.
absl::StatusOr<kvtier::Config> ResolveConfig(const Flags& f, bool* from_file) {
  absl::StatusOr<kvtier::Config> config =
      f.defaults ? absl::StatusOr<kvtier::Config>(absl::NotFoundError("")) : kvtier::LoadConfigFile(f.config_path);
  *from_file = config.ok();
  if (!config.ok() && absl::IsNotFound(config.status()) && !f.config_given) config = kvtier::DefaultConfig();
  if (!config.ok()) return config;
  f.Apply(*config);
  RETURN_IF_ERROR(kvtier::ValidateConfig(*config));
  return config;
}

// --check-config: the NVMe tier's space too: a capacity the disk cannot hold
// fails the start, so it fails the check. (A default capacity shrinks to fit.)
int CheckOnly(const kvtier::Config& config) {
  if (config.nvme.capacity_bytes != 0 && config.nvme.capacity_explicit) {
    if (absl::Status s = kvtier::CheckNvmeSpace(config.NvmeDirs(), config.nvme.capacity_bytes, config.nvme.segment_bytes);
        !s.ok()) {
      spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(s.message()));
      return 2;
    }
  }
  // The remote tier's secret files, by the rules the start applies.
  if (!config.remote.seeds.empty()) {
    if (absl::StatusOr<std::vector<kvtier::RemoteTenant>> t = kvtier::RemoteTenantsFrom(config); !t.ok()) {
      spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(t.status().message()));
      return 2;
    }
  }
  std::cout << "config OK\n";
  return 0;
}

// kvtierd.toml(5), from the config schema: every key of every section with
// its type, default, whether SIGHUP applies it, and its line of doc.
std::string ConfigManPage() {
  using kvtier::ConfigType;
  auto type_name = [](ConfigType t) -> std::string {
    switch (t) {
      case ConfigType::kString: return "string";
      case ConfigType::kBool: return "boolean";
      case ConfigType::kInt: return "integer";
      case ConfigType::kDouble: return "number";
      case ConfigType::kBytes: return "size (bytes, or e.g. \"64MiB\")";
      case ConfigType::kStringList: return "list of strings";
      case ConfigType::kIntList: return "list of integers";
      case ConfigType::kHash: return "hash name";
    }
    return "value";
  };
  const kvtier::Config d = kvtier::DefaultConfig();
  kvtier::tools::ManPage p;
  p.name = "kvtierd.toml";
  p.section = 5;
  p.summary = "configuration file of kvtierd";
  p.synopsis = "/etc/kvtier/kvtierd.toml";
  p.description =
      "kvtierd reads one TOML file (kvtierd --config PATH, default /etc/kvtier/kvtierd.toml when it exists; "
      "without one it runs on the embedded defaults). Every key is optional; an unknown key or section, a value "
      "of the wrong type or out of range stops the daemon at start with the key named. kvtierd --check-config "
      "validates a file; kvtierd --print-default-config prints every key with its default. SIGHUP re-reads the "
      "file and applies the keys marked reloadable; the others need a restart.";
  p.commands_title = "Keys";
  for (const kvtier::ConfigSection& sec : kvtier::ConfigSections()) {
    kvtier::tools::ManCommand c;
    c.name = "[" + std::string(sec.name) + "]";
    std::string pre;
    for (absl::string_view line : absl::StrSplit(absl::string_view(sec.preamble.data(), sec.preamble.size()), '\n')) {
      if (absl::ConsumePrefix(&line, "# ") || absl::ConsumePrefix(&line, "#")) pre += std::string(line) + " ";
    }
    c.doc = pre.empty() ? std::string("Keys of [") + std::string(sec.name) + "]." : pre;
    for (const kvtier::ConfigKey& k : kvtier::ConfigSchema()) {
      if (k.section != sec.name) continue;
      c.options.push_back({std::string(k.name), "",
                           std::string(k.doc) + " (" + type_name(k.type) + ", default " +
                               kvtier::ConfigValueToml(k, d) + (k.reloadable ? "; reloadable" : "") + ")"});
    }
    p.commands.push_back(std::move(c));
  }
  kvtier::tools::ManCommand tenants;
  tenants.name = "[[tenants]]";
  tenants.doc = "One entry per tenant; peers are matched by uid, then by primary gid. Without any [[tenants]] the "
                "daemon admits its own user as tenant \"default\".";
  for (const kvtier::TenantKey& k : kvtier::TenantSchema()) {
    tenants.options.push_back({std::string(k.name), "",
                               std::string(k.doc) + " (" + type_name(k.type) +
                                   (k.default_toml.empty() ? "" : ", default " + std::string(k.default_toml)) +
                                   (k.reloadable ? "; reloadable" : "") + ")"});
  }
  p.commands.push_back(std::move(tenants));
  p.sections.push_back({"Example", "  [tiers.host]\n  capacity = \"64GiB\"\n  [tiers.nvme]\n  dirs = [\"/var/lib/kvtier/nvme\"]\n"
                                   "  capacity = \"2TiB\"\n  [[tenants]]\n  name = \"engine-a\"\n  uids = [1001]"});
  p.sections.push_back({"See also", "kvtierd(8), kvtierctl(1)"});
  return kvtier::tools::RenderMan(p);
}

}  // namespace

int main(int argc, char** argv) {
  // A tenant's KV-event publisher (events/kv_events.h), started by kvtierd
  // itself with its end of a socket pair as the descriptor named.
  if (argc >= 3 && std::string_view(argv[1]) == "--events-publisher") {
    int fd = -1;
    if (!absl::SimpleAtoi(argv[2], &fd) || fd < 3) return 2;
    return kvtier::RunEventsPublisher(fd);
  }
  kvtier::Daemon::BlockSignals();
  // A fixed mmap threshold. glibc raises its threshold each time it frees a
  // mapped block (up to 32 MiB), so the index's and the policies' arrays,
  // reallocated as a tier fills and its ghosts come and go, then come from
  // the heap and leave holes there that stay resident. kvtier-bench lookup,
  // after a churn of 2M blocks through a 1.2M-block tier: 206-223 B per
  // indexed block with glibc's default, 179-183 B with this (158.5 and
  // 157.3 before the churn). 1 MiB rather than glibc's initial 128 KiB:
  // a request's key arrays stay below it (a 4096-block chain's keys are
  // 128 KiB), so they do not cost a mapping each. An operator's setting
  // (GLIBC_TUNABLES or MALLOC_MMAP_THRESHOLD_) wins.
#ifdef __GLIBC__
  if (const char* t = std::getenv("GLIBC_TUNABLES");
      (t == nullptr || std::strstr(t, "mmap_threshold") == nullptr) && std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
  }
#endif
  CLI::App app{"kvtierd: keeps LLM KV-cache blocks across GPU, host memory and NVMe.\n"
               "Runs on its embedded defaults when no config file exists."};
  app.set_version_flag("--version", KVTIER_VERSION);
  Flags f;
  app.add_option("-c,--config", f.config_path, "TOML config file (default /etc/kvtier/kvtierd.toml if it exists)")
      ->each([&](const std::string&) { f.config_given = true; });
  app.add_option("--run-dir", f.run_dir, "override daemon.run_dir (sockets)");
  app.add_option("--data-dir", f.data_dir, "override daemon.data_dir");
  app.add_option("--log-level", f.log_level, "override daemon.log_level");
  app.add_flag("--defaults", f.defaults, "ignore config files: run on the embedded defaults");
  app.add_flag("--print-default-config", f.print_default, "print every config key with its default and exit");
  app.add_flag("--check-config", f.check_only, "validate the config and exit");
  app.add_flag("--print-ledger-function", f.print_ledger,
               "print the Redis Functions library that keeps tenants' remote budgets (load it on every primary: "
               "docs/remote-tier.md) and exit");
  app.footer("Examples:\n  kvtierd                      # embedded defaults\n"
             "  kvtierd -c ./kvtierd.toml --check-config\n"
             "  kvtierd --run-dir /tmp/kv --log-level debug");
  if (argc == 2 && std::string_view(argv[1]) == "--config-man") {
    std::cout << ConfigManPage();
    return 0;
  }
  if (kvtier::tools::PrintDocsIfAsked(
          argc, argv, app, "kvtierd", 8, "keeps LLM KV-cache blocks across GPU memory, host memory and NVMe",
          {{"Signals", "SIGHUP: re-read the config file and apply its reloadable keys (kvtierd.toml(5)).\n"
                       "SIGTERM, SIGINT: stop accepting engines, finish what is in flight, write the NVMe "
                       "journal, and exit 0."},
           {"Files", "/etc/kvtier/kvtierd.toml: the config (kvtierd.toml(5)).\n"
                     "/run/kvtier/kvtierd.sock, /run/kvtier/kvtierd-admin.sock: the engines' and the "
                     "administrators' sockets under the systemd unit."},
           {"Exit status", "0: stopped cleanly, or --check-config found the config valid. 1: a failure at start "
                           "(the log line says which and what to do). 2: a usage or config error."},
           {"See also", "kvtierd.toml(5), kvtierctl(1), kvtier-replay(1), kvtier-bench(1)"}})) {
    return 0;
  }
  KVTIER_CLI_PARSE(app, argc, argv);

  if (f.print_default) {
    std::cout << kvtier::DefaultConfigToml();
    return 0;
  }
  if (f.print_ledger) {
    std::cout << kvtier::LedgerLibrary();
    return 0;
  }
  auto logger = spdlog::stderr_color_mt("kvtierd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  if (f.defaults && f.config_given) {
    std::cerr << "kvtierd: --defaults and --config exclude each other\n";
    return 2;
  }
  bool from_file = false;
  absl::StatusOr<kvtier::Config> config = ResolveConfig(f, &from_file);
  if (!config.ok()) {
    spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(config.status().message()));
    return 2;
  }
  if (f.check_only) return CheckOnly(*config);
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  spdlog::info("event=start version={} pid={} config=\"{}\"", KVTIER_VERSION, getpid(),
               kvtier::LogQuoted(from_file ? f.config_path : "embedded defaults"));

  absl::StatusOr<std::unique_ptr<kvtier::Daemon>> daemon = kvtier::Daemon::Create(*config);
  if (!daemon.ok()) {
    spdlog::critical("event=start_failed detail=\"{}\"", kvtier::LogQuoted(daemon.status().message()));
    return 1;
  }
  if (from_file) {
    // SIGHUP reads the same file, with the same command-line overrides.
    (*daemon)->SetConfigLoader([f]() -> absl::StatusOr<kvtier::Config> {
      absl::StatusOr<kvtier::Config> c = kvtier::LoadConfigFile(f.config_path);
      if (c.ok()) f.Apply(*c);
      return c;
    });
  }
  if (absl::Status s = (*daemon)->Run(); !s.ok()) {
    spdlog::critical("event=loop_failed detail=\"{}\"", kvtier::LogQuoted(s.message()));
    return 1;
  }
  return 0;
}
