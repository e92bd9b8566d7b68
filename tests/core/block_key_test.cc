// SPDX-License-Identifier: Apache-2.0
#include "core/block_key.h"

#include <numeric>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

std::vector<uint32_t> Tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Fixed vectors: key_i = SHA-256(parent || u32le(16) || tokens || u32le(0)),
// computed independently (Python hashlib) from the documented encoding. If
// these change, every cache on disk and every engine's keys change with them.
TEST(BlockKeyTest, Sha256VectorsNeverChange) {
  std::vector<BlockKey> keys = ChainBlockKeys(HashAlgorithm::kSha256, Tokens(1000, 32), 16);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].Hex(), "a79314b9c10a8966d97734d03916bf630c7675daf0419f1c9d69a005cf30836a");
  EXPECT_EQ(keys[1].Hex(), "fe42e9156e40c8d0e9b49b92c27a008bcebe3912513b64270729cb1419a99063");
}

TEST(BlockKeyTest, ExtraKeysVectorNeverChanges) {
  const char extra[] = "img:abc";
  const std::vector<uint32_t> t = Tokens(1000, 16);
  BlockKey k = NextBlockKey(HashAlgorithm::kSha256, BlockKey{}, t, std::as_bytes(std::span(extra, 7)));
  EXPECT_EQ(k.Hex(), "807a73eaa4d92874f48b90f0f5e875d8f73df906c2f969d7675b603ac324a38b");
}

TEST(BlockKeyTest, Xxh3VectorsNeverChange) {
  std::vector<BlockKey> keys = ChainBlockKeys(HashAlgorithm::kXxh3_128, Tokens(1000, 32), 16);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].Hex(), "9936c21db96b0385e6e4277d430f07b600000000000000000000000000000000");
  EXPECT_EQ(keys[1].Hex(), "2fd051aae2325d7785208975ee773b1700000000000000000000000000000000");
}

TEST(BlockKeyTest, OnlyFullBlocksGetKeys) {
  EXPECT_EQ(ChainBlockKeys(HashAlgorithm::kSha256, Tokens(0, 47), 16).size(), 2u);
  EXPECT_EQ(ChainBlockKeys(HashAlgorithm::kSha256, Tokens(0, 15), 16).size(), 0u);
  EXPECT_EQ(ChainBlockKeys(HashAlgorithm::kSha256, Tokens(0, 48), 16).size(), 3u);
  // The partial tail does not change the full blocks' keys.
  EXPECT_EQ(ChainBlockKeys(HashAlgorithm::kSha256, Tokens(0, 47), 16),
            ChainBlockKeys(HashAlgorithm::kSha256, Tokens(0, 32), 16));
}

TEST(BlockKeyTest, AKeyStandsForItsWholePrefix) {
  std::vector<uint32_t> a = Tokens(0, 64);
  std::vector<uint32_t> b = a;
  b[3] = 999999;  // differs in block 0 only
  auto ka = ChainBlockKeys(HashAlgorithm::kSha256, a, 16);
  auto kb = ChainBlockKeys(HashAlgorithm::kSha256, b, 16);
  for (size_t i = 0; i < ka.size(); ++i) EXPECT_NE(ka[i], kb[i]) << "block " << i;
  // A change in block 2 leaves blocks 0 and 1 alone.
  std::vector<uint32_t> c = a;
  c[40] = 7;
  auto kc = ChainBlockKeys(HashAlgorithm::kSha256, c, 16);
  EXPECT_EQ(kc[0], ka[0]);
  EXPECT_EQ(kc[1], ka[1]);
  EXPECT_NE(kc[2], ka[2]);
  EXPECT_NE(kc[3], ka[3]);
}

TEST(BlockKeyTest, ContinuingFromAParentEqualsTheFullChain) {
  std::vector<uint32_t> t = Tokens(5, 64);
  auto full = ChainBlockKeys(HashAlgorithm::kSha256, t, 16);
  auto head = ChainBlockKeys(HashAlgorithm::kSha256, std::span(t).first(32), 16);
  auto tail = ChainBlockKeys(HashAlgorithm::kSha256, std::span(t).subspan(32), 16, &head.back());
  EXPECT_EQ(tail[0], full[2]);
  EXPECT_EQ(tail[1], full[3]);
}

TEST(BlockKeyTest, ExtraKeysAndAlgorithmSeparateKeys) {
  std::vector<uint32_t> t = Tokens(0, 16);
  const char s1[] = "salt-a", s2[] = "salt-b";
  BlockKey plain = NextBlockKey(HashAlgorithm::kSha256, {}, t);
  BlockKey a = NextBlockKey(HashAlgorithm::kSha256, {}, t, std::as_bytes(std::span(s1, 6)));
  BlockKey b = NextBlockKey(HashAlgorithm::kSha256, {}, t, std::as_bytes(std::span(s2, 6)));
  EXPECT_NE(plain, a);
  EXPECT_NE(a, b);
  EXPECT_NE(plain, NextBlockKey(HashAlgorithm::kXxh3_128, {}, t));
  // Length prefixes: moving a token into the extra bytes is not the same input.
  std::vector<uint32_t> t15(t.begin(), t.begin() + 15);
  const uint32_t last = t[15];
  EXPECT_NE(plain, NextBlockKey(HashAlgorithm::kSha256, {}, t15, std::as_bytes(std::span(&last, 1))));
}

TEST(BlockKeyTest, ParsesHexAndNames) {
  auto k = ParseBlockKeyHex("a79314b9c10a8966d97734d03916bf630c7675daf0419f1c9d69a005cf30836a");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->Hex(), "a79314b9c10a8966d97734d03916bf630c7675daf0419f1c9d69a005cf30836a");
  EXPECT_FALSE(ParseBlockKeyHex("abc").ok());
  EXPECT_FALSE(ParseBlockKeyHex(std::string(64, 'g')).ok());
  EXPECT_EQ(*ParseHashAlgorithm("sha256"), HashAlgorithm::kSha256);
  EXPECT_EQ(*ParseHashAlgorithm("xxh3-128"), HashAlgorithm::kXxh3_128);
  EXPECT_FALSE(ParseHashAlgorithm("md5").ok());
}

}  // namespace
}  // namespace kvtier
