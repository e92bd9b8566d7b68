// kvtierd: the kvtier daemon.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "core/checked.h"
#include "core/cli_parse.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "tiers/nvme_tier.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  kvtier::Daemon::BlockSignals();
  CLI::App app{"kvtierd: keeps LLM KV-cache blocks across GPU, host memory and NVMe.\n"
               "Runs on its embedded defaults when no config file exists."};
  app.set_version_flag("--version", KVTIER_VERSION);
  std::string config_path = "/etc/kvtier/kvtierd.toml";
  bool config_given = false;
  std::string run_dir, data_dir, log_level;
  bool print_default = false, check_only = false, defaults = false;
  app.add_option("-c,--config", config_path, "TOML config file (default /etc/kvtier/kvtierd.toml if it exists)")
      ->each([&](const std::string&) { config_given = true; });
  app.add_option("--run-dir", run_dir, "override daemon.run_dir (sockets)");
  app.add_option("--data-dir", data_dir, "override daemon.data_dir");
  app.add_option("--log-level", log_level, "override daemon.log_level");
  app.add_flag("--defaults", defaults, "ignore config files: run on the embedded defaults");
  app.add_flag("--print-default-config", print_default, "print every config key with its default and exit");
  app.add_flag("--check-config", check_only, "validate the config and exit");
  app.footer("Examples:\n  kvtierd                      # embedded defaults\n"
             "  kvtierd -c ./kvtierd.toml --check-config\n"
             "  kvtierd --run-dir /tmp/kv --log-level debug");
  KVTIER_CLI_PARSE(app, argc, argv);

  if (print_default) {
    std::cout << kvtier::DefaultConfigToml();
    return 0;
  }
  auto logger = spdlog::stderr_color_mt("kvtierd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  if (defaults && config_given) {
    std::cerr << "kvtierd: --defaults and --config exclude each other\n";
    return 2;
  }
  absl::StatusOr<kvtier::Config> config =
      defaults ? absl::StatusOr<kvtier::Config>(absl::NotFoundError("")) : kvtier::LoadConfigFile(config_path);
  const bool from_file = config.ok();
  if (!config.ok() && absl::IsNotFound(config.status()) && !config_given) {
    config = kvtier::DefaultConfig();
  }
  if (!config.ok()) {
    spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(config.status().message()));
    return 2;
  }
  if (!run_dir.empty()) config->run_dir = run_dir;
  if (!data_dir.empty()) config->data_dir = data_dir;
  if (!log_level.empty()) config->log_level = log_level;
  if (absl::Status s = kvtier::ValidateConfig(*config); !s.ok()) {
    spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(s.message()));
    return 2;
  }
  if (check_only) {
    // The NVMe tier's space too: a capacity the disk cannot hold fails the
    // start, so it fails the check. (A default capacity shrinks to fit.)
    if (config->nvme_capacity != 0 && config->nvme_capacity_explicit) {
      if (absl::Status s = kvtier::CheckNvmeSpace(config->NvmeDirs(), config->nvme_capacity,
                                                  config->nvme_segment_bytes);
          !s.ok()) {
        spdlog::critical("event=config_error detail=\"{}\"", kvtier::LogQuoted(s.message()));
        return 2;
      }
    }
    std::cout << "config OK\n";
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  spdlog::info("event=start version={} pid={} config=\"{}\"", KVTIER_VERSION, getpid(),
               kvtier::LogQuoted(from_file ? config_path : "embedded defaults"));

  absl::StatusOr<std::unique_ptr<kvtier::Daemon>> daemon = kvtier::Daemon::Create(*config);
  if (!daemon.ok()) {
    spdlog::critical("event=start_failed detail=\"{}\"", kvtier::LogQuoted(daemon.status().message()));
    return 1;
  }
  if (from_file) {
    // SIGHUP reads the same file, with the same command-line overrides.
    (*daemon)->SetConfigLoader([config_path, run_dir, data_dir, log_level]() -> absl::StatusOr<kvtier::Config> {
      absl::StatusOr<kvtier::Config> c = kvtier::LoadConfigFile(config_path);
      if (!c.ok()) return c;
      if (!run_dir.empty()) c->run_dir = run_dir;
      if (!data_dir.empty()) c->data_dir = data_dir;
      if (!log_level.empty()) c->log_level = log_level;
      return c;
    });
  }
  if (absl::Status s = (*daemon)->Run(); !s.ok()) {
    spdlog::critical("event=loop_failed detail=\"{}\"", kvtier::LogQuoted(s.message()));
    return 1;
  }
  return 0;
}
