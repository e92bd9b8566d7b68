// SPDX-License-Identifier: Apache-2.0
// Sealed values (value_seal.h): what opens is exactly what the tenant's key
// sealed, for exactly that header; everything else is DataLoss.
#include "tiers/value_seal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tiers/remote_tier.h"

#include <xxhash.h>
#include <cstring>

namespace kvtier {
namespace {

constexpr char kKeyA[] = "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
constexpr char kKeyB[] = "a0b1c2d3e4f5061728394a5b6c7d8e9ffedcba98765432100123456789abcdef";

std::unique_ptr<ValueSealer> SealerOf(std::vector<std::string> hex, bool encrypt) {
  std::vector<SealKey> keys;
  for (const std::string& h : hex) keys.push_back(*ParseSealKey(h));
  return *ValueSealer::Create(std::move(keys), encrypt);
}

std::vector<std::byte> Payload(size_t n) {
  std::vector<std::byte> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::byte(i * 37 + 11);
  return p;
}

TEST(SealKeyTest, KeysAre64HexDigits) {
  EXPECT_TRUE(ParseSealKey(kKeyA).ok());
  EXPECT_TRUE(ParseSealKey(std::string(kKeyA) + "\n").ok()) << "a trailing newline is the file's, not the key's";
  EXPECT_FALSE(ParseSealKey("").ok());
  EXPECT_FALSE(ParseSealKey(std::string(kKeyA).substr(0, 62)).ok());
  EXPECT_FALSE(ParseSealKey(std::string(kKeyA) + "00").ok());
  std::string bad = kKeyA;
  bad[10] = 'g';
  const absl::StatusOr<SealKey> k = ParseSealKey(bad);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(std::string(k.status().message()).find(bad), std::string::npos) << "an error never quotes a key";
  EXPECT_FALSE(ParseSealKey(std::string(64, '0')).ok()) << "one repeated byte is not a key";
  EXPECT_NE(ParseSealKey(kKeyA)->id, ParseSealKey(kKeyB)->id);
  EXPECT_EQ(ParseSealKey(kKeyA)->id, ParseSealKey(kKeyA)->id) << "a key's id is derived from it: every node agrees";
}

TEST(SealKeyTest, AFileListsTheCurrentKeyFirst) {
  const absl::StatusOr<std::vector<SealKey>> keys =
      ParseSealKeys(std::string("# rotated 2026-12-05\n") + kKeyB + "\n\n" + kKeyA + "\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].id, ParseSealKey(kKeyB)->id);
  EXPECT_FALSE(ParseSealKeys("# nothing\n\n").ok());
  EXPECT_FALSE(ParseSealKeys(std::string(kKeyA) + "\n" + kKeyA).ok()) << "the same key twice";
  const absl::StatusOr<std::vector<SealKey>> bad = ParseSealKeys(std::string(kKeyA) + "\nnot-a-key\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("line 2"), std::string::npos) << bad.status();
}

class SealTest : public ::testing::TestWithParam<bool> {};

TEST_P(SealTest, WhatTheKeySealedOpensAndNothingElse) {
  const bool encrypt = GetParam();
  auto sealer = SealerOf({kKeyA}, encrypt);
  const std::string aad = "header of block 7";
  const std::vector<std::byte> clear = Payload(64 << 10);
  std::vector<std::byte> stored = clear;
  const absl::StatusOr<SealFields> f = sealer->Seal(aad, stored);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->encrypted, encrypt);
  EXPECT_EQ(f->key_id, ParseSealKey(kKeyA)->id);
  EXPECT_EQ(stored == clear, !encrypt) << "encrypted at rest only when asked";

  std::vector<std::byte> opened = stored;
  ASSERT_TRUE(sealer->Open(*f, aad, opened).ok());
  EXPECT_EQ(opened, clear) << "byte-exact after opening";

  // One bit anywhere, another header, another tag, nonce or flag: DataLoss.
  for (size_t at : {size_t{0}, stored.size() / 2, stored.size() - 1}) {
    std::vector<std::byte> flipped = stored;
    flipped[at] ^= std::byte{1};
    EXPECT_TRUE(absl::IsDataLoss(sealer->Open(*f, aad, flipped))) << "bit at " << at;
  }
  std::vector<std::byte> copy = stored;
  EXPECT_TRUE(absl::IsDataLoss(sealer->Open(*f, "header of block 8", copy)));
  SealFields g = *f;
  g.tag[3] ^= 0x80;
  copy = stored;
  EXPECT_TRUE(absl::IsDataLoss(sealer->Open(g, aad, copy)));
  g = *f;
  g.nonce[0] ^= 1;
  copy = stored;
  EXPECT_TRUE(absl::IsDataLoss(sealer->Open(g, aad, copy)));
  g = *f;
  g.encrypted = !g.encrypted;
  copy = stored;
  EXPECT_TRUE(absl::IsDataLoss(sealer->Open(g, aad, copy))) << "the flag is bound too";
  std::vector<std::byte> shorter(stored.begin(), stored.end() - 1);
  EXPECT_TRUE(absl::IsDataLoss(sealer->Open(*f, aad, shorter)));
}

TEST_P(SealTest, AnotherKeyCannotSealOrOpen) {
  auto alice = SealerOf({kKeyA}, GetParam());
  auto mallory = SealerOf({kKeyB}, GetParam());
  std::vector<std::byte> stored = Payload(4096);
  absl::StatusOr<SealFields> f = mallory->Seal("h", stored);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(absl::IsDataLoss(alice->Open(*f, "h", stored))) << "sealed by a key alice lacks";
  // Even claiming alice's key id.
  f->key_id = alice->current_key_id();
  EXPECT_TRUE(absl::IsDataLoss(alice->Open(*f, "h", stored)));
}

TEST_P(SealTest, RotatedKeysStillOpenWhatTheySealed) {
  auto before = SealerOf({kKeyA}, GetParam());
  auto after = SealerOf({kKeyB, kKeyA}, GetParam());
  auto dropped = SealerOf({kKeyB}, GetParam());
  const std::vector<std::byte> clear = Payload(1000);
  std::vector<std::byte> old_value = clear;
  const SealFields f = *before->Seal("h", old_value);
  std::vector<std::byte> v = old_value;
  ASSERT_TRUE(after->Open(f, "h", v).ok()) << "the previous key still opens";
  EXPECT_EQ(v, clear);
  v = old_value;
  EXPECT_TRUE(absl::IsDataLoss(dropped->Open(f, "h", v))) << "a key removed from the file opens nothing";
  EXPECT_EQ(after->Seal("h", v)->key_id, ParseSealKey(kKeyB)->id) << "the first key seals";
}

TEST_P(SealTest, NoncesAreFresh) {
  auto sealer = SealerOf({kKeyA}, GetParam());
  std::vector<std::byte> a = Payload(100), b = Payload(100);
  const SealFields fa = *sealer->Seal("h", a), fb = *sealer->Seal("h", b);
  EXPECT_NE(fa.nonce, fb.nonce);
  EXPECT_NE(fa.tag, fb.tag);
}

// A value read from a socket is opened piece by piece as it lands: the
// same answer as opening it whole, for any cut into pieces.
TEST_P(SealTest, OpeningInPiecesIsOpeningWhole) {
  auto sealer = SealerOf({kKeyA}, GetParam());
  const std::vector<std::byte> clear = Payload(300000);
  std::vector<std::byte> stored = clear;
  const SealFields f = *sealer->Seal("h", stored);
  for (size_t piece : {size_t{1} << 10, size_t{256} << 10, size_t{7777}}) {
    std::vector<std::byte> v = stored;
    auto stream = sealer->StartOpen(f, "h");
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (size_t at = 0; at < v.size(); at += piece) {
      (*stream)->Update(std::span(v).subspan(at, std::min(piece, v.size() - at)));
    }
    EXPECT_TRUE((*stream)->Finish().ok()) << piece;
    EXPECT_EQ(v, clear) << piece;
  }
  std::vector<std::byte> v = stored;
  v[123456] ^= std::byte{4};
  auto stream = sealer->StartOpen(f, "h");
  ASSERT_TRUE(stream.ok());
  (*stream)->Update(std::span(v).first(200000));
  (*stream)->Update(std::span(v).subspan(200000));
  EXPECT_TRUE(absl::IsDataLoss((*stream)->Finish()));
  SealFields unknown = f;
  unknown.key_id ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(sealer->StartOpen(unknown, "h").status())) << "an unknown key fails at once";
}

INSTANTIATE_TEST_SUITE_P(ClearAndEncrypted, SealTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Encrypted" : "Clear"; });

// The remote tier's values: a forger who recomputes the checksum (the
// attack that once served a wrong block) gets a DataLoss, never the block.
TEST(RemoteValueTest, ARecomputedChecksumDoesNotForgeAValue) {
  auto sealer = SealerOf({kKeyA}, false);
  BlockMeta m;
  m.ns.bytes.fill(3);
  m.key.bytes.fill(4);
  m.payload_bytes = 4096;
  m.tenant_hash = TenantHash("alice");
  const std::vector<std::byte> p = Payload(4096);
  const std::string good = *MakeRemoteValue(m, p, *sealer);
  ASSERT_TRUE(CheckRemoteValue(good, m, sealer.get()).ok());
  EXPECT_TRUE(CheckRemoteValue(good, m).ok()) << "shape and checksum alone";

  std::string forged = good;
  forged[sizeof(RemoteValueHeader) + 100] ^= 0x55;
  RemoteValueHeader h;
  std::memcpy(&h, forged.data(), sizeof(h));
  h.checksum = XXH3_64bits(forged.data() + sizeof(h), 4096);
  std::memcpy(forged.data(), &h, sizeof(h));
  EXPECT_TRUE(CheckRemoteValue(forged, m).ok()) << "the checksum alone is fooled";
  const absl::Status s = CheckRemoteValue(forged, m, sealer.get());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;

  // Another tenant's or block's sealed value under this key: refused.
  BlockMeta other = m;
  other.tenant_hash = TenantHash("bob");
  EXPECT_FALSE(CheckRemoteValue(*MakeRemoteValue(other, p, *sealer), m, sealer.get()).ok());
  other = m;
  other.key.bytes[0] ^= 1;
  EXPECT_FALSE(CheckRemoteValue(*MakeRemoteValue(other, p, *sealer), m, sealer.get()).ok());
}

TEST(RemoteValueTest, EncryptedValuesHoldNoPlaintext) {
  auto sealer = SealerOf({kKeyA}, true);
  BlockMeta m;
  m.key.bytes.fill(1);
  m.payload_bytes = 8192;
  m.tenant_hash = 5;
  std::vector<std::byte> p(8192, std::byte{'K'});
  const std::string v = *MakeRemoteValue(m, p, *sealer);
  EXPECT_EQ(v.find(std::string(64, 'K')), std::string::npos);
  EXPECT_TRUE(CheckRemoteValue(v, m, sealer.get()).ok());
}

}  // namespace
}  // namespace kvtier
