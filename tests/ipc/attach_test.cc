// SPDX-License-Identifier: Apache-2.0
#include "ipc/attach.h"

#include <random>

#include "core/status.h"
#include "gtest/gtest.h"
#include "ipc/abi.h"
#include "ipc/wire.h"
#include "tests/support/test_support.h"

namespace kvtier::ipc {
namespace {

AttachRequest Sample() {
  AttachRequest r;
  r.ns = testing::TestNamespace(65536);
  r.ns.adapter_id = "lora-7";
  r.ns.cache_salt = "s3cret";
  r.client_name = "engine-0";
  return r;
}

TEST(AttachTest, RequestRoundTrips) {
  const AttachRequest in = Sample();
  auto out = DecodeAttachRequest(EncodeAttachRequest(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->ns.model_id, in.ns.model_id);
  EXPECT_EQ(out->ns.adapter_id, "lora-7");
  EXPECT_EQ(out->ns.cache_salt, "s3cret");
  EXPECT_EQ(out->ns.block_bytes, 65536u);
  EXPECT_EQ(out->ns.block_tokens, 16u);
  EXPECT_EQ(out->ns.tp_size, 1u);
  EXPECT_EQ(out->client_name, "engine-0");
  EXPECT_EQ(out->abi_version, kAbiVersion);
}

TEST(AttachTest, ReplyRoundTrips) {
  AttachReply in;
  in.status = 0;
  in.session_id = 42;
  in.namespace_id.bytes[0] = 0xab;
  in.hash = HashAlgorithm::kXxh3_128;
  in.block_tokens = 512;
  in.block_bytes = 1 << 20;
  in.arena_bytes = 1ull << 30;
  in.tenant = "team-a";
  auto out = DecodeAttachReply(EncodeAttachReply(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->session_id, 42u);
  EXPECT_EQ(out->namespace_id, in.namespace_id);
  EXPECT_EQ(out->hash, HashAlgorithm::kXxh3_128);
  EXPECT_EQ(out->block_bytes, 1u << 20);
  EXPECT_EQ(out->tenant, "team-a");
}

TEST(AttachTest, OtherAbiVersionIsRefusedWithBothVersions) {
  AttachRequest r = Sample();
  r.abi_version = kAbiVersion + 1;
  auto out = DecodeAttachRequest(EncodeAttachRequest(r));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(ToErrorCode(out.status()), KVTIER_EPROTONOSUPPORT);
  EXPECT_NE(std::string(out.status().message()).find("v" + std::to_string(kAbiVersion + 1)), std::string::npos);
}

TEST(AttachTest, EveryTruncationIsMalformedNotACrash) {
  const std::vector<std::byte> full = EncodeAttachRequest(Sample());
  for (size_t n = 0; n < full.size(); ++n) {
    auto out = DecodeAttachRequest(std::span(full).first(n));
    ASSERT_FALSE(out.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(ToErrorCode(out.status()), KVTIER_EPROTO);
  }
  std::vector<std::byte> longer = full;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(DecodeAttachRequest(longer).ok()) << "trailing bytes must be refused";
}

TEST(AttachTest, OverlongStringsAreRefused) {
  ByteWriter w;
  w.Put(kAttachRequestMagic);
  w.Put(kAbiVersion);
  w.PutString(std::string(kMaxDescriptorString + 1, 'x'));
  EXPECT_FALSE(DecodeAttachRequest(w.bytes()).ok());
}

TEST(AttachTest, RandomMutationsNeverCrashTheDecoder) {
  const std::vector<std::byte> seed = EncodeAttachRequest(Sample());
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> m = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 3) {
        case 0: m[rng() % m.size()] = static_cast<std::byte>(rng()); break;
        case 1: m.resize(rng() % (m.size() + 1)); if (m.empty()) m.push_back(std::byte{1}); break;
        case 2: m.insert(m.begin() + static_cast<long>(rng() % m.size()), static_cast<std::byte>(rng())); break;
      }
    }
    auto out = DecodeAttachRequest(m);
    if (out.ok()) {
      ++accepted;
      EXPECT_LE(out->ns.model_id.size(), kMaxDescriptorString);
      EXPECT_LE(out->client_name.size(), kMaxClientName);
    }
  }
  EXPECT_LT(accepted, 20000);
}

}  // namespace
}  // namespace kvtier::ipc
