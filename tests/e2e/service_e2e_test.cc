// SPDX-License-Identifier: Apache-2.0
// kvtierd as systemd runs it: the notify protocol on a real datagram socket
// set as $NOTIFY_SOCKET (READY=1 with a STATUS= line once the tiers are open,
// watchdog pings from the main loop, STOPPING=1 on SIGTERM).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/notify_socket.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::NotifySocket;

TEST(ServiceE2eTest, NotifiesReadyWithStatusPingsTheWatchdogAndStopping) {
  NotifySocket notify;
  setenv("WATCHDOG_USEC", "400000", 1);  // a ping at least every 200 ms
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string ready = notify.WaitFor("READY=1", std::chrono::seconds(10));
  ASSERT_FALSE(ready.empty()) << d.Log();
  EXPECT_NE(ready.find("STATUS=0 sessions; host "), std::string::npos) << ready;
  // Ready means serving: the tiers answer.
  auto status = d.Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["tiers"][0]["tier"], "host");

  // Pings keep coming while the loop turns: at least 4 in 1.5 s.
  int pings = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < end) {
    if (notify.Next(std::chrono::milliseconds(100)).find("WATCHDOG=1") != std::string::npos) ++pings;
  }
  EXPECT_GE(pings, 4) << d.Log();

  // A session shows in the status line.
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(4096, "notify"));
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(notify.WaitFor("STATUS=1 sessions", std::chrono::seconds(5)).empty());
  c.reset();

  const int st = d.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  std::vector<std::string> seen;
  EXPECT_FALSE(notify.WaitFor("STOPPING=1", std::chrono::seconds(1), &seen).empty());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
}

// Waits until the daemon's log has `n` occurrences of `what`.
bool LogHas(const DaemonProcess& d, const std::string& what, int n = 1) {
  return testing::Eventually([&] {
    const std::string log = d.Log();
    int count = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++count;
    return count >= n;
  });
}

TEST(ServiceE2eTest, SighupReloadsWhatCanChangeAndKeepsTheConfigWhenTheFileIsBad) {
  NotifySocket notify;
  DaemonProcess d(absl::StrCat("[tiers.host]\nhigh_watermark = 0.95\nlow_watermark = 0.90\n[[tenants]]\n"
                               "name = \"default\"\nuids = [", getuid(), "]\nhost_tokens = 1000\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_FALSE(notify.WaitFor("READY=1", std::chrono::seconds(10)).empty());
  const std::string path = d.dir() + "/kvtierd.toml";
  const std::string original = ReadFile(path);
  auto status = [&] { return *d.Status(); };

  // Quotas, watermarks and the log level change in place.
  std::string next = original;
  Replace(next, "host_tokens = 1000", "host_tokens = 2000");
  Replace(next, "high_watermark = 0.95", "high_watermark = 0.80");
  Replace(next, "low_watermark = 0.90", "low_watermark = 0.70");
  Replace(next, "log_level = \"debug\"", "log_level = \"info\"");
  std::ofstream(path) << next;
  d.Kill(SIGHUP);
  ASSERT_TRUE(LogHas(d, "event=reload applied")) << d.Log();
  EXPECT_FALSE(notify.WaitFor("RELOADING=1", std::chrono::seconds(5)).empty());
  EXPECT_FALSE(notify.WaitFor("READY=1", std::chrono::seconds(5)).empty()) << "ready again after the reload";
  nlohmann::json s = status();
  EXPECT_EQ(s["tenants"][0]["quota"]["host_tokens"], 2000);
  EXPECT_DOUBLE_EQ(s["tiers"][0]["high_watermark"].get<double>(), 0.80);
  EXPECT_DOUBLE_EQ(s["tiers"][0]["low_watermark"].get<double>(), 0.70);
  EXPECT_EQ(s["stats"]["reloads"], 1);
  EXPECT_NE(d.Log().find("daemon.log_level, tiers.host.high_watermark, tiers.host.low_watermark, tenants.default.quotas"), std::string::npos)
      << d.Log();

  // A file that does not validate (low above high), then one that does not
  // parse: refused, with why, and nothing changes.
  std::string bad = next;
  Replace(bad, "low_watermark = 0.70", "low_watermark = 0.90");
  Replace(bad, "host_tokens = 2000", "host_tokens = 5");
  Replace(bad, "log_level = \"info\"", "log_level = \"loud\"");
  std::ofstream(path) << bad;
  d.Kill(SIGHUP);
  ASSERT_TRUE(LogHas(d, "event=reload_failed")) << d.Log();
  EXPECT_NE(d.Log().find("low_watermark"), std::string::npos);
  // Both errors, each with its line, and the quotes inside detail="..."
  // escaped so the line stays one logfmt record.
  EXPECT_NE(d.Log().find(": daemon.log_level = \\\"loud\\\"; use one of"), std::string::npos) << d.Log();
  EXPECT_NE(d.Log().find(path + ":"), std::string::npos) << d.Log();
  std::ofstream(path) << "[[[ not toml\n";
  d.Kill(SIGHUP);
  ASSERT_TRUE(LogHas(d, "event=reload_failed", 2)) << d.Log();
  s = status();
  EXPECT_EQ(s["stats"]["reloads_failed"], 2);
  EXPECT_EQ(s["tenants"][0]["quota"]["host_tokens"], 2000);
  EXPECT_DOUBLE_EQ(s["tiers"][0]["low_watermark"].get<double>(), 0.70);
  // A key nested 100000 deep overflowed toml++'s stack: the daemon died of
  // SIGSEGV on the reload. Refused before toml++ sees it, nothing changes.
  std::string deep = "a";
  for (int i = 0; i < 100000; ++i) deep += ".a";
  std::ofstream(path) << next << deep << " = 1\n";
  d.Kill(SIGHUP);
  ASSERT_TRUE(LogHas(d, "event=reload_failed", 3)) << d.Log().substr(0, 4000);
  EXPECT_NE(d.Log().find("nested deeper than 32 levels"), std::string::npos);
  s = status();
  EXPECT_EQ(s["stats"]["reloads_failed"], 3);
  EXPECT_EQ(s["tenants"][0]["quota"]["host_tokens"], 2000);

  // What is fixed at start is named, and keeps its running value.
  std::string fixed = next;
  Replace(fixed, "[tiers.host]\n", "[tiers.host]\ncapacity = \"2MiB\"\n");
  std::ofstream(path) << fixed;
  const uint64_t capacity = s["tiers"][0]["capacity_bytes"];
  d.Kill(SIGHUP);
  ASSERT_TRUE(LogHas(d, "needs_restart=\"tiers.host.capacity\"")) << d.Log();
  s = status();
  EXPECT_EQ(s["tiers"][0]["capacity_bytes"], capacity);
  EXPECT_EQ(s["stats"]["reloads"], 2);
  const int st = d.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// SIGTERM while an engine stores: no store the daemon acknowledged is lost.
// Acknowledged blocks still only in host memory are written to NVMe before
// the daemon exits 0, and a daemon started over the same NVMe serves them.
TEST(ServiceE2eTest, SigtermDrainsUnderLoadAndLosesNoAcknowledgedStore) {
  testing::TempDir data;
  constexpr uint64_t kBlock = 64 << 10;
  // 4 MiB of host memory (64 blocks): some blocks are demoted, most are not.
  const std::string config = "[tiers.host]\ncapacity = \"4MiB\"\n[tiers.nvme]\ndirs = [\"" + data.File("nvme") +
                             "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n";
  const NamespaceDescriptor ns = testing::TestNamespace(kBlock, "drain/e2e");
  DaemonProcess d(config, "", data.File("state"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  int acked[2];
  ASSERT_EQ(pipe(acked), 0);
  const pid_t engine = fork();
  ASSERT_GE(engine, 0);
  if (engine == 0) {
    close(acked[0]);
    auto c = testing::AttachTo(d.socket_path(), ns);
    if (!c) _exit(2);
    // Four blocks a store, up to 200 blocks; each acknowledged seed goes
    // down the pipe. A refusal (draining) or a closed session ends it.
    for (uint32_t seed = 1; seed <= 50; ++seed) {
      const Status st = testing::StoreFilled(*c, testing::SeededKeys(*c, seed, 4), false);
      if (!st.ok()) _exit(st.code() == ErrorCode::kBusy || st.code() == ErrorCode::kNotConnected ? 0 : 3);
      if (write(acked[1], &seed, sizeof(seed)) != sizeof(seed)) _exit(4);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    _exit(0);
  }
  close(acked[1]);
  std::vector<uint32_t> seeds;
  uint32_t seed;
  while (seeds.size() < 20 && read(acked[0], &seed, sizeof(seed)) == sizeof(seed)) seeds.push_back(seed);
  const auto t0 = std::chrono::steady_clock::now();
  d.Kill(SIGTERM);
  while (read(acked[0], &seed, sizeof(seed)) == sizeof(seed)) seeds.push_back(seed);
  close(acked[0]);
  int est = 0;
  waitpid(engine, &est, 0);
  EXPECT_TRUE(WIFEXITED(est) && WEXITSTATUS(est) == 0) << "engine exit " << est;
  const int st = d.WaitExit(std::chrono::seconds(10));
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0) << d.Log();
  EXPECT_LT(took, std::chrono::seconds(9)) << "drain_timeout_ms bounds it";
  EXPECT_NE(d.Log().find("event=drained written="), std::string::npos) << d.Log();
  ASSERT_GE(seeds.size(), 20u);

  DaemonProcess d2(config, "", data.File("state"));
  ASSERT_TRUE(d2.Start().ok()) << d2.Log();
  auto c = testing::AttachTo(d2.socket_path(), ns);
  ASSERT_NE(c, nullptr);
  size_t correct = 0, blocks = 0;
  for (uint32_t sd : seeds) {
    for (const BlockKey& k : testing::SeededKeys(*c, sd, 4)) {
      ++blocks;
      auto r = c->Lookup({&k, 1}, {.lease = true});
      if (!r.ok() || r->hit_blocks != 1) continue;
      auto v = c->Load(r->lease, {&k, 1});
      if (v.ok() && v->size() == 1 && testing::MatchesKey(k, {(*v)[0].data, (*v)[0].size})) ++correct;
      (void)c->Release(r->lease);
    }
  }
  EXPECT_EQ(correct, blocks) << "every acknowledged block is back, byte for byte (" << seeds.size() << " stores)";
}

// Runs a command line, feeding `input` on stdin; returns its exit code and
// what it printed (stdout and stderr).
std::pair<int, std::string> RunWithInput(const std::string& cmd, const std::string& input) {
  const std::string in = ::testing::TempDir() + "/kvtier-metrics-in-" + std::to_string(getpid());
  std::ofstream(in) << input;
  FILE* p = popen((cmd + " < " + in + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = p == nullptr ? -1 : pclose(p);
  unlink(in.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The value of a sample line "name{labels} value" (or "name value").
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(ServiceE2eTest, MetricsAreScrapedAndPassPromtool) {
  DaemonProcess d(absl::StrCat("[metrics]\nport = 0\n[[tenants]]\nname = \"team\"\nuids = [", getuid(),
                               "]\nsalt = \"s3cret-salt-value\"\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto status = d.Status();
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE((*status)["metrics"]["enabled"].get<bool>());
  const int port = (*status)["metrics"]["port"];
  // Traffic: a store of 4 blocks, a leased lookup of 6 (4 hit), a load.
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(4096, "metrics"));
  ASSERT_NE(c, nullptr);
  const auto keys = testing::SeededKeys(*c, 7, 6);
  ASSERT_TRUE(testing::StoreFilled(*c, std::span(keys).first(4)).ok());
  auto hit = c->Lookup(keys, {.lease = true});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->hit_blocks, 4u);
  ASSERT_TRUE(c->Load(hit->lease, std::span(keys).first(4)).ok());

  httplib::Client http("127.0.0.1", port);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "no answer on port " << port;
  ASSERT_EQ(res->status, 200);
  const std::string text = "\n" + res->body;
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  // Both hit figures, and the ones they come from.
  EXPECT_EQ(Sample(text, "kvtier_hit_rate"), 1.0);
  EXPECT_NEAR(Sample(text, "kvtier_reused_token_ratio"), 4.0 / 6.0, 1e-6);
  EXPECT_NE(text.find("# HELP kvtier_reused_token_ratio Share of queried tokens that were found (per token). Tokens "
                      "count in full blocks only"),
            std::string::npos)
      << "the ratio says it leaves out the partial last block";
  // Host memory per block size, summed over tenants: without a token any
  // local user scrapes, and must not see one tenant's stores.
  EXPECT_EQ(Sample(text, "kvtier_host_block_size_bytes{slot_bytes=\"4096\",state=\"used\"}"), 4 * 4096);
  EXPECT_EQ(text.find("tenant=\""), std::string::npos);
  EXPECT_EQ(Sample(text, "kvtier_host_segments_reclaimed_total"), 0);
  EXPECT_EQ(Sample(text, "kvtier_lookups_total"), 1);
  EXPECT_EQ(Sample(text, "kvtier_blocks_hit_total{tier=\"host\"}"), 4);
  EXPECT_EQ(Sample(text, "kvtier_blocks_missed_total"), 2);
  EXPECT_EQ(Sample(text, "kvtier_tier_blocks{tier=\"host\"}"), 4);
  EXPECT_EQ(Sample(text, "kvtier_bytes_moved_total{direction=\"engine_to_host\"}"), 4 * 4096);
  EXPECT_EQ(Sample(text, "kvtier_bytes_moved_total{direction=\"host_to_engine\"}"), 4 * 4096);
  EXPECT_EQ(Sample(text, "kvtier_sessions"), 1);
  EXPECT_EQ(Sample(text, "kvtier_leases"), 1);
  EXPECT_EQ(Sample(text, "kvtier_pinned_blocks"), 4);
  EXPECT_EQ(Sample(text, "kvtier_op_latency_seconds_count{op=\"lookup\"}"), 1);
  EXPECT_EQ(Sample(text, "kvtier_op_latency_seconds_bucket{op=\"lookup\",le=\"+Inf\"}"), 1);
  EXPECT_EQ(Sample(text, "kvtier_op_latency_seconds_count{op=\"store_begin\"}"), 1);
  EXPECT_EQ(Sample(text, "kvtier_checksum_failures_total"), 0);
  EXPECT_EQ(text.find("s3cret-salt-value"), std::string::npos) << "salts never reach metrics";
  // The exposition format as Prometheus itself reads it.
  if (system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool is not installed";
  const auto [rc, out] = RunWithInput("promtool check metrics", res->body);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("error"), std::string::npos) << out;
  ASSERT_TRUE(c->Release(hit->lease).ok());
}

TEST(ServiceE2eTest, MetricsOffAndPortInUseAreSaidPlainly) {
  // A port in use: the daemon serves engines anyway and says why there are
  // no metrics.
  httplib::Server blocker;
  const int taken = blocker.bind_to_any_port("127.0.0.1");
  ASSERT_GT(taken, 0);
  DaemonProcess d(absl::StrCat("[metrics]\nport = ", taken, "\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto status = d.Status();
  ASSERT_TRUE(status.ok());
  EXPECT_FALSE((*status)["metrics"]["enabled"].get<bool>());
  EXPECT_NE(d.Log().find("event=metrics_unavailable"), std::string::npos) << d.Log();
  DaemonProcess off;  // the test default: [metrics] enabled = false
  ASSERT_TRUE(off.Start().ok());
  EXPECT_FALSE((*off.Status())["metrics"]["enabled"].get<bool>());
}

TEST(ServiceE2eTest, WithoutNotifySocketNothingIsSentAndTheDaemonRuns) {
  unsetenv("NOTIFY_SOCKET");
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_TRUE(d.Status().ok());
  EXPECT_EQ(d.Log().find("sd_notify_failed"), std::string::npos);
  const int st = d.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace
}  // namespace kvtier
