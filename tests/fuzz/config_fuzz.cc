// The TOML config: an operator's file is input too.
#include "daemon/config.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = kvtier::ParseConfig(text, "fuzz.toml");
  if (c.ok() && !kvtier::ValidateConfig(*c).ok()) __builtin_trap();  // parsed means valid
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  return {kvtier::DefaultConfigToml(), "[ipc]\nring_entries = 64\n",
          "[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\ngids = [2]\n",
          "[tiers.host]\ncapacity = \"1GiB\"\n"};
}

long FuzzDefaultIterations() { return 20000; }
