// SPDX-License-Identifier: Apache-2.0
#include "ipc/session_segment.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "core/status.h"
#include "gtest/gtest.h"

namespace kvtier::ipc {
namespace {

UniqueFd Dup(int fd) { return UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

TEST(SessionSegmentTest, ClientSeesWhatTheDaemonCreated) {
  auto seg = SessionSegment::Create(7, SegmentOptions{100, 100, 1 << 20, 1000});
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(seg->header()->sq_entries, 128u) << "entries round up to a power of two";
  auto client = SessionSegment::Open(Dup(seg->fd()));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->header()->session_id, 7u);
  EXPECT_EQ(client->max_keys_per_op(), 1000u);
  EXPECT_GE(client->scratch().size(), 1u << 20);

  // A record pushed by the client appears on the daemon's side (same memory).
  auto csq = client->ClientSq();
  auto dsq = seg->DaemonSq();
  RequestRecord r{};
  r.op_id = 99;
  ASSERT_TRUE(csq.TryPush(r));
  RequestRecord got;
  ASSERT_EQ(dsq.TryPop(&got), PopResult::kOk);
  EXPECT_EQ(got.op_id, 99u);
}

TEST(SessionSegmentTest, TheSegmentCannotBeShrunkByThePeer) {
  auto seg = SessionSegment::Create(1, {});
  ASSERT_TRUE(seg.ok());
  EXPECT_NE(ftruncate(seg->fd(), 4096), 0) << "sealed memfd must refuse to shrink";
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE(os::IsSealedAgainstShrink(seg->fd()));
}

TEST(SessionSegmentTest, WrongMagicOrVersionIsRefused) {
  auto seg = SessionSegment::Create(1, {});
  ASSERT_TRUE(seg.ok());
  seg->header()->abi_version = kAbiVersion + 1;
  auto bad_version = SessionSegment::Open(Dup(seg->fd()));
  ASSERT_FALSE(bad_version.ok());
  EXPECT_EQ(ToErrorCode(bad_version.status()), KVTIER_EPROTONOSUPPORT);
  seg->header()->abi_version = kAbiVersion;
  seg->header()->magic = 0;
  auto bad_magic = SessionSegment::Open(Dup(seg->fd()));
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_EQ(ToErrorCode(bad_magic.status()), KVTIER_EPROTO);
}

TEST(SessionSegmentTest, InconsistentLayoutIsRefused) {
  auto seg = SessionSegment::Create(1, {});
  ASSERT_TRUE(seg.ok());
  seg->header()->sq_entries = 3;  // not a power of two
  EXPECT_FALSE(SessionSegment::Open(Dup(seg->fd())).ok());
  seg->header()->sq_entries = 256;
  seg->header()->scratch_offset += 4096;  // would reach past the end
  EXPECT_FALSE(SessionSegment::Open(Dup(seg->fd())).ok());
}

TEST(SessionSegmentTest, DaemonKeepsItsOwnLayoutCopy) {
  auto seg = SessionSegment::Create(1, SegmentOptions{8, 8, 65536, 16});
  ASSERT_TRUE(seg.ok());
  const size_t scratch = seg->scratch().size();
  seg->header()->scratch_bytes = 1ull << 40;  // a hostile client rewrites the header
  seg->header()->sq_entries = 1u << 30;
  EXPECT_EQ(seg->scratch().size(), scratch);
  EXPECT_EQ(seg->DaemonSq().entries(), 8u);
}

}  // namespace
}  // namespace kvtier::ipc
