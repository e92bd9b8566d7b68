// SPDX-License-Identifier: Apache-2.0
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
  // Nesting past what toml++'s recursion survives: the pre-scan must refuse
  // it, and mutations of it, before toml++ sees it.
  std::string deep = "a";
  for (int i = 0; i < 100000; ++i) deep += ".a";
  return {kvtier::DefaultConfigToml(), "[ipc]\nring_entries = 64\n",
          "[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\ngids = [2]\n",
          "[tiers.host]\ncapacity = \"1GiB\"\n", "[" + deep + "]\n", "x = { " + deep + " = [[[[1]]]] }\n",
          "[daemon]\nrun_dir = \"/tmp/a.b[[[\" # {{{.\ndata_dir = '''\n..[[\n'''\n",
          // A chain with repeated fs tiers, named and not.
          "[[tiers.lower]]\nkind = \"nvme\"\ncapacity = \"1GiB\"\n[[tiers.lower]]\nkind = \"fs\"\ndir = \"/a\"\n"
          "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/b\"\ncapacity = \"1GiB\"\n[[tiers.lower]]\nkind = \"fs\"\n"
          "name = \"c\"\ndir = \"/c\"\nwrite_policy = \"reused\"\n",
          "[[tiers.lower]]\nkind = \"fs\"\nname = \"fs-2\"\ndir = \"/a/\"\n[[tiers.lower]]\nkind = \"fs\"\ndir = \"/a/b\"\n"};
}

long FuzzDefaultIterations() { return 20000; }
