// SPDX-License-Identifier: Apache-2.0
// kvtier-bench: microbenchmarks with a baseline measured in the same run.
//
//   kvtier-bench ipc|host|lookup|nvme|reclaim|gpu|remote|fs|all [--json] [--quick] [--kvtierd PATH]
//                [Google Benchmark flags, e.g. --benchmark_min_time=...]
//
// The tiny engine's time-to-first-token benchmark is not here: it runs the
// example engine, so it lives with it (examples/tiny-engine, tiny-engine-bench).
// Build with the release preset for meaningful figures.
#include <cstdio>
#include <string>

#include "tools/bench/driver.h"

int main(int argc, char** argv) {
  namespace b = kvtier::bench;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "engine") {
      std::fprintf(stderr, "kvtier-bench: the engine suite runs the example engine and is built with it: "
                           "build/release/examples/tiny-engine/tiny-engine-bench engine\n");
      return 2;
    }
  }
  return b::BenchMain(
      argc, argv, "kvtier-bench",
      {{"ipc", "1-key lookup round trip through the rings vs a Unix socket", b::RunIpcSuite},
       {"host", "store+load of 2 MiB blocks through the client API vs memcpy", b::RunHostSuite},
       {"lookup", "64-key lookups against 1M indexed blocks; daemon memory per block", b::RunLookupSuite},
       {"nvme",
        "NVMe tier writes/reads vs fio, journal group commit, restart time\n"
        "                (--dir PATH: put its files there, default a temp dir; --pairs N: runs\n"
        "                of ours and fio per point, default 5; --only TEXT: points whose name\n"
        "                contains TEXT, e.g. 256KiB_qd1, journal, restart)",
        b::RunNvmeSuite},
       {"reclaim", "store latency into a full host tier, background reclaim on vs off", b::RunReclaimSuite},
       {"gpu",
        "pinned host<->device copies vs cudaMemcpyAsync, gather/scatter kernels vs a\n"
        "                device-to-device copy, layer-wise load (--device sim: on the simulated device;\n"
        "                exit 77 when no CUDA device answers)",
        b::RunGpuSuite, /*needs_cuda=*/true},
       {"remote",
        "remote tier put/get of 256 KiB and 2 MiB blocks vs a pipelined hiredis loop on the same\n"
        "                node, and a 64-block probe (--cluster DIR: a cluster scripts/redis-cluster started\n"
        "                there with --tenant bench; exit 77 without one)",
        b::RunRemoteSuite, /*needs_cuda=*/false, /*needs_cluster=*/true},
       {"fs",
        "fs tier put/get of 256 KiB and 2 MiB blocks vs fio writing and reading one file per\n"
        "                block on the same directory (--dir PATH: the directory, e.g. a share; default a\n"
        "                temp dir; --pairs N)",
        b::RunFsSuite}});
}
