// SPDX-License-Identifier: Apache-2.0
// The command line shared by kvtier-bench and the example engine's benchmark
// (tiny-engine-bench): flags, suite choice, and the figures as a table or as
// JSON lines.
#ifndef KVTIER_TOOLS_BENCH_DRIVER_H_
#define KVTIER_TOOLS_BENCH_DRIVER_H_

#include <functional>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

namespace kvtier::bench {

struct Suite {
  std::string name;
  std::string help;  // usage lines after the name; continuation lines start with spaces
  std::function<std::vector<Metric>(const Context&)> run;
  // Runs only where a CUDA device answers (unless --device sim); skipped in
  // `all` elsewhere, exit 77 when asked for alone.
  bool needs_cuda = false;
  // Runs only against a Redis Cluster (--cluster DIR); skipped in `all`
  // without one, exit 77 when asked for alone.
  bool needs_cluster = false;
};

// Parses argv, runs the chosen suite (or every one for "all"), prints the
// figures. Exit code: 0, 1 when a target was missed or nothing was measured,
// 2 on a usage error, 77 when a CUDA-only suite had no device.
int BenchMain(int argc, char** argv, const std::string& program, const std::vector<Suite>& suites);

}  // namespace kvtier::bench

#endif  // KVTIER_TOOLS_BENCH_DRIVER_H_
