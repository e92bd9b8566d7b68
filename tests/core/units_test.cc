// SPDX-License-Identifier: Apache-2.0
#include "core/units.h"

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(UnitsTest, ParsesBytes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseBytes("2 kib"), 2048u);
  EXPECT_EQ(*ParseBytes("1GB"), 1000000000u);
  EXPECT_EQ(*ParseBytes("10B"), 10u);
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("MiB").ok());
  EXPECT_FALSE(ParseBytes("12 parsecs").ok());
  EXPECT_FALSE(ParseBytes("-5").ok());
  EXPECT_FALSE(ParseBytes("99999999999TiB").ok());
}

TEST(UnitsTest, ParsesCounts) {
  EXPECT_EQ(*ParseCount("3M"), 3000000u);
  EXPECT_EQ(*ParseCount("500K"), 500000u);
  EXPECT_EQ(*ParseCount("7"), 7u);
  EXPECT_FALSE(ParseCount("3MiB").ok());
}

TEST(UnitsTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3ull << 30), "3.00 GiB");
}

}  // namespace
}  // namespace kvtier
