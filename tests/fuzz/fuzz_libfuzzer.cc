// SPDX-License-Identifier: Apache-2.0
// Linked into every target built for libFuzzer (KVTIER_FUZZ): before
// fuzzing, each of the target's FuzzSeeds() runs once, so the seeds made at
// run time (too large for the checked-in corpus, e.g. nesting 100,000 deep)
// are checked under libFuzzer as they are by fuzz_driver.cc.
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const std::string& s : FuzzSeeds()) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  return 0;
}
