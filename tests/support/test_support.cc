// SPDX-License-Identifier: Apache-2.0
#include "tests/support/test_support.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstring>

#include "tools/common/payload.h"

namespace kvtier::testing {

NamespaceDescriptor TestNamespace(uint64_t block_bytes, std::string model) {
  NamespaceDescriptor d;
  d.model_id = std::move(model);
  d.model_revision = "rev1";
  d.tokenizer_revision = "tok1";
  d.kv_dtype = "fp16";
  d.kv_layout = "layer_major";
  d.block_tokens = 16;
  d.block_bytes = block_bytes;
  d.tp_rank = 0;
  d.tp_size = 1;
  return d;
}

void FillFromKey(const BlockKey& key, std::span<std::byte> out) { tools::FillPayload(key, out); }
bool MatchesKey(const BlockKey& key, std::span<const std::byte> data) { return tools::VerifyPayload(key, data); }

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 0x5a;
  return k;
}

CommandOutput RunCommand(const std::string& cmd) {
  CommandOutput o;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) o.out.append(buf, n);
  const int st = pclose(p);
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

}  // namespace kvtier::testing
