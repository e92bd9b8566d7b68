// SPDX-License-Identifier: Apache-2.0
// The request tables agree: every opcode the ABI lists (ipc::kOpcodes) has
// one handler in the session's table, and names are unique.
#include <set>
#include <string>

#include "daemon/session.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(OpcodeTableTest, EveryOpcodeHasOneHandlerAndAUniqueName) {
  EXPECT_TRUE(Session::HandlesEveryOpcode());
  std::set<std::string> names;
  for (uint32_t code = 0; code <= ipc::kMaxOpcode; ++code) {
    const ipc::OpcodeInfo& info = ipc::InfoOf(static_cast<ipc::Opcode>(code));
    ASSERT_NE(info.name, nullptr);
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    if (info.returns_blocks) {
      EXPECT_TRUE(info.takes_keys) << info.name << ": one result per key needs keys";
    }
  }
}

}  // namespace
}  // namespace kvtier
