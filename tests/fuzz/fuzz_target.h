// SPDX-License-Identifier: Apache-2.0
// Fuzz targets are libFuzzer entry points. Built with KVTIER_FUZZ (clang,
// -fsanitize=fuzzer: the "fuzz" preset) they run under libFuzzer
// (scripts/test --fuzz) from tests/fuzz/corpus/<target>/, after running
// their FuzzSeeds() once (fuzz_libfuzzer.cc); otherwise fuzz_driver.cc runs
// each target over its seeds, its corpus and a deterministic stream of
// mutations as an ordinary CTest test.
//
// Regenerate a corpus (either build):
//   KVTIER_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/<target> build/<preset>/tests/<target>
#ifndef KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_
#define KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Well-formed inputs the mutations start from.
std::vector<std::string> FuzzSeeds();

// Mutations the CTest driver runs when KVTIER_FUZZ_ITERS is not set.
long FuzzDefaultIterations();

// Writes FuzzSeeds() of at most 4 KiB to dir/seed-NN (fuzz_seeds.cc): how
// tests/fuzz/corpus/<target>/ was made. Larger seeds run only from
// FuzzSeeds(), so the checked-in corpus stays small. Returns 0.
int WriteFuzzSeeds(const char* dir);

#endif  // KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_
