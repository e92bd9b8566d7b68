// SPDX-License-Identifier: Apache-2.0
// Where clients look for kvtierd's sockets.
#include "core/paths.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

// A listening socket at path (closed with the returned fd).
int Listen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 1), 0);
  return fd;
}

// A non-root engine's own run directory has no daemon; the systemd
// service's has one: the engine finds the service's (it looked only in its
// own before, and a member of the kvtier group got "not running").
TEST(PathsTest, ClientsFindTheServicesSocketWhenTheirOwnRunDirHasNone) {
  testing::TempDir dir;
  const std::string own = dir.File("own"), service = dir.File("service");
  std::filesystem::create_directories(own);
  std::filesystem::create_directories(service);
  EXPECT_EQ(FindSocket(kDataSocketName, {own, service}), own + "/kvtierd.sock") << "none anywhere: the first, for the error";
  const int s = Listen(service + "/kvtierd.sock");
  EXPECT_EQ(FindSocket(kDataSocketName, {own, service}), service + "/kvtierd.sock");
  const int o = Listen(own + "/kvtierd.sock");
  EXPECT_EQ(FindSocket(kDataSocketName, {own, service}), own + "/kvtierd.sock") << "its own run dir first";
  // A plain file of that name is not a daemon.
  close(o);
  std::filesystem::remove(own + "/kvtierd.sock");
  { std::ofstream(own + "/kvtierd.sock") << "x"; }
  EXPECT_EQ(FindSocket(kDataSocketName, {own, service}), service + "/kvtierd.sock");
  close(s);
}

TEST(PathsTest, TheEnvironmentStillWins) {
  setenv("KVTIER_SOCKET", "/somewhere/else.sock", 1);
  setenv("KVTIER_ADMIN_SOCKET", "/somewhere/admin.sock", 1);
  EXPECT_EQ(DefaultDataSocketPath(), "/somewhere/else.sock");
  EXPECT_EQ(DefaultAdminSocketPath(), "/somewhere/admin.sock");
  unsetenv("KVTIER_SOCKET");
  unsetenv("KVTIER_ADMIN_SOCKET");
  setenv("KVTIER_RUN_DIR", "/nonexistent-run-dir", 1);
  const std::string found = DefaultDataSocketPath();
  EXPECT_TRUE(found == "/nonexistent-run-dir/kvtierd.sock" || found == std::string(kServiceRunDir) + "/kvtierd.sock")
      << found;
  unsetenv("KVTIER_RUN_DIR");
}

}  // namespace
}  // namespace kvtier
