// SPDX-License-Identifier: Apache-2.0
// ipc: round trip of a 1-key lookup through the shared-memory rings, against
// a Unix-domain-socket request/response carrying the same bytes (a 64-byte
// request record plus a 32-byte key; a 32-byte completion plus a 16-byte
// result) to a server process, in the same run.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "core/units.h"
#include "ipc/unix_socket.h"
#include "kvtier/client.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"
#include "tools/common/latency.h"

namespace kvtier::bench {
namespace {

constexpr size_t kRequestBytes = 64 + 32;
constexpr size_t kResponseBytes = 32 + 16;

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = write(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A request/response server in its own process, as a socket-based daemon is.
pid_t StartEchoServer(const std::string& path) {
  auto listener = ipc::ListenUnix(path, SOCK_STREAM, 0600);
  if (!listener.ok()) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    const int c = accept(listener->get(), nullptr, nullptr);
    char req[kRequestBytes], resp[kResponseBytes] = {};
    while (ReadFull(c, req, sizeof(req))) {
      std::memcpy(resp, req, 8);  // echo the op id, as a completion would
      if (!WriteFull(c, resp, sizeof(resp))) break;
    }
    _exit(0);
  }
  return pid;
}

}  // namespace

std::vector<Metric> RunIpcSuite(const Context& ctx) {
  std::optional<SuiteDaemon> sd = StartSuiteDaemon(ctx, "", "bench/ipc", 16, 4096);
  if (!sd) return {};
  tools::DaemonProcess& daemon = *sd->daemon;
  Client* client = sd->client.get();
  std::vector<uint32_t> tokens(16, 7);
  std::vector<BlockKey> key = client->ComputeKeys(tokens);
  std::vector<std::byte> payload(4096);
  std::vector<std::span<const std::byte>> src = {payload};
  (void)client->Store(key, src);  // the lookup hits the index

  const std::string sock_path = daemon.dir() + "/echo.sock";
  const pid_t server = StartEchoServer(sock_path);
  auto conn = ipc::ConnectUnix(sock_path, SOCK_STREAM);
  if (server < 0 || !conn.ok()) {
    std::fprintf(stderr, "kvtier-bench: cannot start the socket baseline\n");
    return {};
  }
  const int64_t iters = ctx.quick ? 5000 : 200000;
  const int reps = ctx.quick ? 1 : 5;

  auto socket_rtt = [&](benchmark::State& st) {
    tools::Latencies lat;
    lat.Reserve(static_cast<size_t>(st.max_iterations));
    char req[kRequestBytes] = {}, resp[kResponseBytes];
    uint64_t id = 0;
    for (auto _ : st) {
      ++id;
      std::memcpy(req, &id, 8);
      const uint64_t t0 = MonotonicNanos();
      if (!WriteFull(conn->get(), req, sizeof(req)) || !ReadFull(conn->get(), resp, sizeof(resp))) {
        st.SkipWithError("socket baseline failed");
        break;
      }
      lat.Add(MonotonicNanos() - t0);
    }
    st.counters["p50_us"] = lat.PercentileUs(50);
    st.counters["p99_us"] = lat.PercentileUs(99);
  };
  auto ring_rtt = [&](benchmark::State& st) {
    tools::Latencies lat;
    lat.Reserve(static_cast<size_t>(st.max_iterations));
    for (auto _ : st) {
      const uint64_t t0 = MonotonicNanos();
      auto r = client->Lookup(key);
      lat.Add(MonotonicNanos() - t0);
      if (!r.ok() || r->hit_blocks != 1) {
        st.SkipWithError("lookup failed");
        break;
      }
    }
    st.counters["p50_us"] = lat.PercentileUs(50);
    st.counters["p99_us"] = lat.PercentileUs(99);
  };
  RegisterPairs("ipc/unix_socket_rtt", socket_rtt, "ipc/ring_lookup_rtt", ring_rtt, iters, reps);

  benchmark::RegisterBenchmark("ipc/ring_ping_rtt", [&](benchmark::State& st) {
    tools::Latencies lat;
    lat.Reserve(static_cast<size_t>(st.max_iterations));
    for (auto _ : st) {
      const uint64_t t0 = MonotonicNanos();
      (void)client->Ping();
      lat.Add(MonotonicNanos() - t0);
    }
    st.counters["p50_us"] = lat.PercentileUs(50);
    st.counters["p99_us"] = lat.PercentileUs(99);
  })->Iterations(iters)->Repetitions(reps)->UseRealTime()->Unit(benchmark::kMicrosecond);

  Runs runs = RunRegistered(ctx);
  conn->Reset();
  waitpid(server, nullptr, 0);

  std::vector<Metric> out;
  for (const char* p : {"p50", "p99"}) {
    const std::string c = std::string(p) + "_us";
    Metric m;
    m.suite = "ipc";
    m.metric = std::string("lookup_rtt_") + p;
    m.value = MedianCounter(runs, "ipc/ring_lookup_rtt", c);
    m.baseline_name = "unix_socket";
    m.baseline = MedianCounter(runs, "ipc/unix_socket_rtt", c);
    m.unit = "us";
    m.speedup = PairedSpeedup(runs, "ipc/ring_lookup_rtt", "ipc/unix_socket_rtt", c, false);
    if (std::string(p) == "p50") m.target = 10.0;
    m.note = "1-key lookup through the rings vs the same bytes over a Unix socket to a server process";
    out.push_back(m);
  }
  Metric ping;
  ping.suite = "ipc";
  ping.metric = "ping_rtt_p50";
  ping.value = MedianCounter(runs, "ipc/ring_ping_rtt", "p50_us");
  ping.baseline_name = "unix_socket";
  ping.baseline = MedianCounter(runs, "ipc/unix_socket_rtt", "p50_us");
  ping.unit = "us";
  ping.speedup = LowerIsBetter(ping.value, ping.baseline);
  ping.note = "empty round trip: the rings alone";
  out.push_back(ping);
  return out;
}

}  // namespace kvtier::bench
