// SPDX-License-Identifier: Apache-2.0
// The daemon runs what the simulator measures: the same workload replayed
// through a real kvtierd (kvtier-replay, one session, host memory only) and
// through kvtier-replay --simulate at the same capacity in blocks gives the
// same token hit rate, within 1%, for the default policy and the others
// (the simulator follows the daemon's order of touches, evictions and
// inserts; today they agree block for block).
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

std::string Tool(const std::string& name) {
  const char* dir = std::getenv("KVTIER_BUILD_DIR");
  return std::string(dir ? dir : ".") + "/tools/" + name;
}

std::string Run(const std::string& cmd, int* exit_code) {
  testing::CommandOutput o = testing::RunCommand(cmd);
  *exit_code = o.exit_code;
  return std::move(o.out);
}

struct Rates {
  double daemon = -1, simulated = -2;
  uint64_t daemon_hit = 0, simulated_hit = 0;
};

// `workload`: kvtier-replay's workload options (a --trace, or the chat's).
Rates Compare(const std::string& policy, uint64_t blocks, uint32_t block_tokens, const std::string& workload) {
  Rates r;
  testing::DaemonProcess d("[tiers.host]\ncapacity = " + std::to_string(blocks * 4096) + "\npolicy = \"" + policy +
                           "\"\nhigh_watermark = 1.0\nlow_watermark = 1.0\n");
  EXPECT_TRUE(d.Start().ok()) << d.Log();
  int code = -1;
  const std::string replay =
      Run(Tool("kvtier-replay") + " --socket " + d.socket_path() + " --block-bytes 4KiB --json -q " + workload, &code);
  EXPECT_EQ(code, 0) << replay << d.Log();
  if (code != 0) return r;
  nlohmann::json j = nlohmann::json::parse(replay);
  r.daemon = j["token_hit_rate"].get<double>();
  r.daemon_hit = j["blocks_hit"].get<uint64_t>();
  EXPECT_EQ(j["verify_failures"], 0);
  const std::string sim = Run(Tool("kvtier-replay") + " --simulate --json -q --policies " + policy + " --tier host=" +
                                  std::to_string(blocks * block_tokens) + " " + workload,
                              &code);
  EXPECT_EQ(code, 0) << sim;
  if (code != 0) return r;
  std::istringstream lines(sim);
  std::string first;
  std::getline(lines, first);
  nlohmann::json s = nlohmann::json::parse(first);
  r.simulated = s["token_hit_rate"].get<double>();
  r.simulated_hit = s["blocks_hit"].get<uint64_t>();
  return r;
}

class SimParityTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SimParityTest, TheBuiltInChatHitsAsSimulated) {
  // 48 conversations x 6 turns of 64-token blocks; 312 and 800 blocks of room.
  for (uint64_t blocks : {312u, 800u}) {
    SCOPED_TRACE(blocks);
    const Rates r = Compare(GetParam(), blocks, 64, "");
    ASSERT_GT(r.daemon, 0.2);
    EXPECT_NEAR(r.daemon, r.simulated, 0.01 * r.simulated)
        << "daemon " << r.daemon_hit << " blocks hit, simulator " << r.simulated_hit;
  }
}

TEST_P(SimParityTest, TheConversationTraceHitsAsSimulated) {
  const char* env = std::getenv("KVTIER_TRACE");
  const std::string trace = env ? env : KVTIER_SOURCE_DIR "/../shared/data/traces/conversation_trace.jsonl";
  if (!std::filesystem::exists(trace)) GTEST_SKIP() << "no trace at " << trace << " (set KVTIER_TRACE)";
  // Its first 2,000 requests (512-token blocks) in 1M tokens of room.
  const Rates r = Compare(GetParam(), 1953, 512, "--trace " + trace + " --requests 2000");
  ASSERT_GT(r.daemon, 0.02);
  EXPECT_NEAR(r.daemon, r.simulated, 0.01 * r.simulated)
      << "daemon " << r.daemon_hit << " blocks hit, simulator " << r.simulated_hit;
}

INSTANTIATE_TEST_SUITE_P(Policies, SimParityTest, ::testing::Values("adaptive", "lru", "s3fifo-deep", "arc", "arc-cutoff", "tinylfu", "holds"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = (c == '-') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace kvtier
