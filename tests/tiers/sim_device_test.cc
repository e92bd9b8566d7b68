#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "gtest/gtest.h"
#include "tiers/device_backend.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

TEST(SimDeviceTest, CopiesRunInStreamOrder) {
  auto dev = MakeSimDevice();
  auto stream = dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto d = dev->Allocate(1 << 20);
  ASSERT_TRUE(d.ok());
  std::vector<uint8_t> a(1 << 20, 1), b(1 << 20, 2), out(1 << 20, 0);
  // Two copies to the same device bytes, then one back: order decides what we read.
  ASSERT_TRUE(dev->CopyAsync(*d, a.data(), a.size(), *stream).ok());
  ASSERT_TRUE(dev->CopyAsync(*d, b.data(), b.size(), *stream).ok());
  ASSERT_TRUE(dev->CopyAsync(out.data(), *d, out.size(), *stream).ok());
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(dev->RecordEvent(*ev, *stream).ok());
  ASSERT_TRUE(dev->WaitEvent(*ev, std::chrono::seconds(5)).ok());
  EXPECT_EQ(out, b);
  EXPECT_TRUE(*dev->QueryEvent(*ev));
  ASSERT_TRUE(dev->DestroyEvent(*ev).ok());
  ASSERT_TRUE(dev->DestroyStream(*stream).ok());
  ASSERT_TRUE(dev->Free(*d).ok());
}

TEST(SimDeviceTest, EventsReportPendingWorkAndBandwidthCapPaces) {
  auto dev = MakeSimDevice(SimDeviceOptions{100ull << 20});  // 100 MiB/s
  auto stream = *dev->CreateStream();
  auto d = *dev->Allocate(20 << 20);
  std::vector<uint8_t> src(20 << 20, 3);
  auto ev = *dev->CreateEvent();
  const auto t0 = Clock::now();
  ASSERT_TRUE(dev->CopyAsync(d, src.data(), src.size(), stream).ok());
  ASSERT_TRUE(dev->RecordEvent(ev, stream).ok());
  EXPECT_FALSE(*dev->QueryEvent(ev)) << "20 MiB at 100 MiB/s cannot be done yet";
  EXPECT_TRUE(absl::IsDeadlineExceeded(dev->WaitEvent(ev, std::chrono::milliseconds(10))));
  ASSERT_TRUE(dev->WaitEvent(ev, std::chrono::seconds(10)).ok());
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(180));
  EXPECT_EQ(std::memcmp(d, src.data(), src.size()), 0);
  ASSERT_TRUE(dev->SynchronizeStream(stream).ok());
}

TEST(SimDeviceTest, ExportedMemoryIsSharedWithAnotherProcess) {
  auto dev = MakeSimDevice();
  auto d = dev->Allocate(4096);
  ASSERT_TRUE(d.ok());
  auto handle = dev->ExportMemory(*d);
  ASSERT_TRUE(handle.ok()) << handle.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto other = MakeSimDevice();
    auto p = other->ImportMemory(*handle);
    if (!p.ok()) _exit(2);
    std::memcpy(*p, "from-child", 10);
    _exit(other->CloseImported(*p).ok() ? 0 : 3);
  }
  int st = 0;
  waitpid(child, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  EXPECT_EQ(std::memcmp(*d, "from-child", 10), 0);
}

TEST(SimDeviceTest, MisuseIsAnErrorNotACrash) {
  auto dev = MakeSimDevice();
  int x = 0;
  EXPECT_FALSE(dev->Free(&x).ok());
  EXPECT_FALSE(dev->CopyAsync(&x, &x, 4, 12345).ok());
  EXPECT_FALSE(dev->RecordEvent(999, 998).ok());
  EXPECT_FALSE(dev->QueryEvent(999).ok());
  EXPECT_FALSE(dev->ExportMemory(&x).ok());
  EXPECT_FALSE(dev->Allocate(0).ok());
  std::vector<char> host(4096);
  ASSERT_TRUE(dev->RegisterHost(host.data(), host.size()).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(dev->RegisterHost(host.data(), host.size())));
  ASSERT_TRUE(dev->UnregisterHost(host.data()).ok());
  EXPECT_FALSE(dev->UnregisterHost(host.data()).ok());
}

TEST(DeviceSelectTest, AutoFallsBackToSimWithAReason) {
  auto choice = OpenDeviceBackend("auto", {});
  ASSERT_TRUE(choice.ok());
  std::string why;
  if (ProbeCudaDevices(&why) == 0) {
    EXPECT_EQ(choice->backend->name(), "sim");
    EXPECT_NE(choice->reason.find("host-simulated"), std::string::npos);
    auto cuda = OpenDeviceBackend("cuda", {});
    ASSERT_FALSE(cuda.ok());
    EXPECT_NE(std::string(cuda.status().message()).find("no CUDA device"), std::string::npos);
  }
  EXPECT_EQ((*OpenDeviceBackend("sim", {})).backend->name(), "sim");
  EXPECT_FALSE(OpenDeviceBackend("tpu", {}).ok());
}

}  // namespace
}  // namespace kvtier
