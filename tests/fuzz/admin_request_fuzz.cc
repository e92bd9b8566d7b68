// SPDX-License-Identifier: Apache-2.0
// Admin request lines as kvtierd handles them: bytes from whoever may
// connect to the admin socket, split into lines and answered by a real
// Daemon (created once, never Run) through Daemon::AnswerAdminLine, the
// code OnAdminConn runs for each line. Every answer must be one line that
// kvtierctl's decoder (ipc::DecodeAdminResponse) reads as an answer: a JSON
// object with a boolean "ok", and a string "error" when ok is false.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "ipc/admin_client.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

std::string& Dir() {
  static std::string dir;
  return dir;
}

kvtier::Daemon& TheDaemon() {
  static kvtier::Daemon* d = [] {
    spdlog::set_level(spdlog::level::off);
    char tmpl[] = "/tmp/kvtier-admin-fuzz-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    Dir() = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(Dir(), ec);
    });
    // Small, no NVMe, no metrics port, the simulated device: nothing
    // outside the temporary folder is touched.
    const std::string toml = absl::StrCat("[daemon]\nrun_dir = \"", Dir(), "/run\"\ndata_dir = \"", Dir(),
                                          "/data\"\ndevice = \"sim\"\nlog_level = \"off\"\n"
                                          "[metrics]\nenabled = false\n[tiers.host]\ncapacity = \"4MiB\"\n"
                                          "[tiers.nvme]\ncapacity = 0\n"
                                          "[[tenants]]\nname = \"default\"\nuids = [0]\n"
                                          "[[tenants]]\nname = \"other\"\nuids = [1]\n");
    absl::StatusOr<kvtier::Config> c = kvtier::ParseConfig(toml, "admin_request_fuzz");
    if (!c.ok()) {
      std::fprintf(stderr, "admin_request_fuzz: config: %s\n", std::string(c.status().message()).c_str());
      std::abort();
    }
    absl::StatusOr<std::unique_ptr<kvtier::Daemon>> daemon = kvtier::Daemon::Create(*c);
    if (!daemon.ok()) {
      std::fprintf(stderr, "admin_request_fuzz: daemon: %s\n", std::string(daemon.status().message()).c_str());
      std::abort();
    }
    return daemon->release();
  }();
  return *d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvtier::Daemon& d = TheDaemon();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // As OnAdminConn: each complete line is a request; a last line without
  // its newline is answered too (as if the newline came later).
  while (!in.empty()) {
    const size_t nl = in.find('\n');
    const std::string_view line = in.substr(0, nl);
    in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
    const std::string answer = d.AnswerAdminLine(line);
    // One answer, one line: a newline inside would desynchronise every
    // answer after it.
    if (answer.find('\n') != std::string::npos) __builtin_trap();
    absl::StatusOr<nlohmann::json> decoded = kvtier::ipc::DecodeAdminResponse(answer);
    // The daemon's answers are never ones kvtierctl calls unreadable.
    if (!decoded.ok() && !absl::IsFailedPrecondition(decoded.status())) __builtin_trap();
    if (!decoded.ok() && decoded.status().message().empty()) __builtin_trap();
    // A line that is not a JSON object is refused.
    const nlohmann::json req = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if ((req.is_discarded() || !req.is_object()) && decoded.ok()) __builtin_trap();
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds = {
      R"({"cmd":"status"})",
      R"({"cmd":"ping"})",
      R"({"cmd":"config"})",
      R"({"cmd":"flush","timeout_ms":5})",
      R"({"cmd":"evict","tenant":"default"})",
      R"({"cmd":"evict","tenant":"nobody"})",
      R"({"cmd":"evict"})",
      R"({"cmd":"blocks"})",
      R"({"cmd":"blocks","tenant":"other","limit":3})",
      R"({"cmd":"blocks","key":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"})",
      R"({"cmd":"blocks","key":"xyz","limit":-9223372036854775808})",
      R"({"cmd":"blocks","limit":"ten"})",
      R"({"cmd":"blocks","tenant":7})",
      R"({"cmd":"\u0000\ud83d\ude00 nope"})",
      R"({"cmd":5})",
      "[1,2,{\"cmd\":\"ping\"}]",
      "{\"cmd\":\"ping\"}\n{\"cmd\":\"status\"}\nnot json\n\n{\"cmd\":\"drain\"}\n",
  };
  // Nesting far past any bound: the daemon parses requests without one.
  std::string deep(200000, '[');
  deep += std::string(200000, ']');
  seeds.push_back(R"({"cmd":"ping","x":)" + deep + "}");
  seeds.push_back(R"({"cmd":)" + deep + "}");
  seeds.push_back(deep);
  return seeds;
}

long FuzzDefaultIterations() { return 400; }  // each input runs a real daemon command; libFuzzer does the volume
