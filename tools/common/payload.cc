// SPDX-License-Identifier: Apache-2.0
#include "tools/common/payload.h"

#include <xxhash.h>

#include <cstring>

namespace kvtier::tools {
namespace {

class Stream {
 public:
  explicit Stream(const BlockKey& key) : s_(XXH3_64bits(key.bytes.data(), key.bytes.size()) | 1) {}
  uint64_t Next() {
    // splitmix64: fast, and every output differs for a different seed.
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

}  // namespace

void FillPayload(const BlockKey& key, std::span<std::byte> out) {
  Stream s(key);
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = s.Next();
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = s.Next();
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

bool VerifyPayload(const BlockKey& key, std::span<const std::byte> data) {
  Stream s(key);
  size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    const uint64_t v = s.Next();
    if (std::memcmp(data.data() + i, &v, 8) != 0) return false;
  }
  if (i < data.size()) {
    const uint64_t v = s.Next();
    if (std::memcmp(data.data() + i, &v, data.size() - i) != 0) return false;
  }
  return true;
}

}  // namespace kvtier::tools
