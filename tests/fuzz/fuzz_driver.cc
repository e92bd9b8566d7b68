// SPDX-License-Identifier: Apache-2.0
// Runs a fuzz target without libFuzzer: every seed (FuzzSeeds() and the
// files of the target's checked-in corpus, tests/fuzz/corpus/<target>/),
// then KVTIER_FUZZ_ITERS (default: the target's FuzzDefaultIterations)
// mutations drawn from a fixed-seed generator, so a failure reproduces. A
// crash or sanitizer report fails the test.
//
//   <target> --write-seeds DIR   writes FuzzSeeds() to DIR (WriteFuzzSeeds)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "tests/fuzz/fuzz_target.h"

namespace {

// The checked-in corpus: crash reproducers added there become regression
// tests of the ordinary (non-libFuzzer) build too.
std::vector<std::string> CorpusFiles() {
  std::vector<std::string> out;
#ifdef KVTIER_FUZZ_CORPUS_DIR
  std::error_code ec;
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(KVTIER_FUZZ_CORPUS_DIR, ec)) {
    if (e.is_regular_file()) paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    out.push_back(s.str());
  }
#endif
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write-seeds") == 0) return WriteFuzzSeeds(argv[2]);
  const char* env = std::getenv("KVTIER_FUZZ_ITERS");
  const long iters = env ? std::atol(env) : FuzzDefaultIterations();
  std::vector<std::string> seeds = FuzzSeeds();
  const std::vector<std::string> corpus = CorpusFiles();
  seeds.insert(seeds.end(), corpus.begin(), corpus.end());
  for (const std::string& s : seeds) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  std::mt19937_64 rng(0x6b767469);
  for (long i = 0; i < iters; ++i) {
    std::string m = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = m.empty() ? 0 : rng() % m.size();
      switch (rng() % 6) {
        case 0: if (!m.empty()) m[pos] = static_cast<char>(m[pos] ^ (1 << (rng() % 8))); break;
        case 1: if (!m.empty()) m[pos] = static_cast<char>(rng()); break;
        case 2: m.resize(pos); break;
        case 3: m.insert(pos, 1 + rng() % 16, static_cast<char>(rng())); break;
        case 4: {  // interesting integers where 8 bytes fit
          static const uint64_t kVals[] = {0, 1, 0x7f, 0xff, 0xffff, 0xffffffff, 0x80000000, ~0ull, 1ull << 40};
          if (m.size() >= 8) {
            const size_t p = rng() % (m.size() - 7);
            const uint64_t v = kVals[rng() % std::size(kVals)];
            std::memcpy(m.data() + p, &v, 8);
          }
          break;
        }
        case 5: {  // splice another seed in
          const std::string& o = seeds[rng() % seeds.size()];
          if (!o.empty()) m.insert(pos, o.substr(rng() % o.size()));
          break;
        }
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(m.data()), m.size());
  }
  std::printf("fuzz driver: %zu seeds (%zu from the corpus) and %ld mutations ran clean\n", seeds.size(),
              corpus.size(), iters);
  return 0;
}
