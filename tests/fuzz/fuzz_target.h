// Fuzz targets are libFuzzer entry points. Built with KVTIER_FUZZ (clang,
// -fsanitize=fuzzer) they run under libFuzzer (scripts/fuzz); otherwise
// fuzz_driver.cc runs each target over its seeds and a deterministic stream
// of mutations as an ordinary CTest test.
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

#endif  // KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_
