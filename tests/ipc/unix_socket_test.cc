// SPDX-License-Identifier: Apache-2.0
#include "ipc/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/status.h"
#include "gtest/gtest.h"
#include "os/shm.h"
#include "tests/support/test_support.h"

namespace kvtier::ipc {
namespace {

TEST(UnixSocketTest, PassesDescriptorsAndData) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto mem = os::CreateSealedMemfd("t", 8192);
  ASSERT_TRUE(mem.ok());
  auto map = os::MappedRegion::Map(mem->get(), 8192);
  ASSERT_TRUE(map.ok());
  std::memcpy(map->data(), "hello", 5);
  const std::string text = "payload";
  const int fds[1] = {mem->get()};
  ASSERT_TRUE(SendMessage(a.get(), std::as_bytes(std::span(text.data(), text.size())), fds).ok());
  auto got = ReceiveMessage(b.get(), 64, 1);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->fds.size(), 1u);
  EXPECT_FALSE(got->truncated);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data.data()), got->data.size()), "payload");
  auto other = os::MappedRegion::Map(got->fds[0].get(), 8192);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(std::memcmp(other->data(), "hello", 5), 0) << "the received fd maps the same memory";
}

TEST(UnixSocketTest, TooManyDescriptorsAreClosedAndFlagged) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const int fds[3] = {0, 1, 2};
  ASSERT_TRUE(SendMessage(a.get(), std::as_bytes(std::span("x", 1)), fds).ok());
  auto got = ReceiveMessage(b.get(), 64, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->truncated);
}

TEST(UnixSocketTest, PeerCredentialsAreOurs) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto cred = GetPeerCredentials(a.get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, getpid());
  EXPECT_EQ(cred->uid, geteuid());
}

TEST(UnixSocketTest, ListenRefusesALiveSocketAndReplacesAStaleOne) {
  testing::TempDir dir;
  const std::string path = dir.File("s.sock");
  {
    auto first = ListenUnix(path, SOCK_STREAM, 0660);
    ASSERT_TRUE(first.ok()) << first.status();
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u);
    auto second = ListenUnix(path, SOCK_STREAM, 0660);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(std::string(second.status().message()).find("already listening"), std::string::npos);
  }
  // The first listener is gone but its file remains: stale, replaced.
  auto third = ListenUnix(path, SOCK_STREAM, 0600);
  EXPECT_TRUE(third.ok()) << third.status();
  std::ofstream(dir.File("plain")) << "x";
  EXPECT_FALSE(ListenUnix(dir.File("plain"), SOCK_STREAM, 0600).ok()) << "never delete a non-socket";
}

TEST(UnixSocketTest, ConnectingToNothingSaysTheDaemonIsNotRunning) {
  testing::TempDir dir;
  auto c = ConnectUnix(dir.File("none.sock"), SOCK_SEQPACKET);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(ToErrorCode(c.status()), KVTIER_ENOTCONN);
  EXPECT_NE(std::string(c.status().message()).find("not running"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::ipc
