// SPDX-License-Identifier: Apache-2.0
// main() for the CUDA tests: exit 77 (CTest "skipped") with the reason when
// no CUDA device answers, so machines without a GPU skip cleanly; run every
// test otherwise.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tiers/device_backend.h"

int main(int argc, char** argv) {
  std::string why;
  if (kvtier::ProbeCudaDevices(&why) == 0) {
    std::printf("SKIPPED: no CUDA device answers (%s)\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
