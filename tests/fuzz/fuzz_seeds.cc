// SPDX-License-Identifier: Apache-2.0
// WriteFuzzSeeds, and KVTIER_FUZZ_WRITE_SEEDS for both kinds of build.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/fuzz_target.h"

int WriteFuzzSeeds(const char* dir) {
  std::filesystem::create_directories(dir);
  int n = 0;
  for (const std::string& s : FuzzSeeds()) {
    if (s.size() > 4096) continue;
    char name[32];
    std::snprintf(name, sizeof(name), "/seed-%02d", n++);
    std::ofstream(std::string(dir) + name, std::ios::binary) << s;
  }
  std::printf("wrote %d seeds to %s\n", n, dir);
  return 0;
}

namespace {
// Runs before main (the driver's or libFuzzer's): writes and exits.
[[maybe_unused]] const bool kWritten = [] {
  if (const char* dir = std::getenv("KVTIER_FUZZ_WRITE_SEEDS")) std::exit(WriteFuzzSeeds(dir));
  return false;
}();
}  // namespace
