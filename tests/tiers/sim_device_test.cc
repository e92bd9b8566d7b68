// SPDX-License-Identifier: Apache-2.0
#include <sys/mman.h>
#include <sys/stat.h>
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

// Work on one stream waits for an event recorded on another.
TEST(SimDeviceTest, StreamWaitEventHoldsLaterWorkBehindTheEvent) {
  auto dev = MakeSimDevice(SimDeviceOptions{40ull << 20});  // 40 MiB/s: 500 ms per copy below
  auto slow = *dev->CreateStream();
  auto other = *dev->CreateStream();
  auto d = *dev->Allocate(20 << 20);
  std::vector<uint8_t> src(20 << 20, 5);
  auto done_slow = *dev->CreateEvent();
  auto done_other = *dev->CreateEvent();
  auto never = *dev->CreateEvent();
  // An event never recorded holds nothing back.
  ASSERT_TRUE(dev->StreamWaitEvent(other, never).ok());
  ASSERT_TRUE(dev->RecordEvent(done_other, other).ok());
  ASSERT_TRUE(dev->WaitEvent(done_other, std::chrono::seconds(5)).ok());

  ASSERT_TRUE(dev->CopyAsync(d, src.data(), src.size(), slow).ok());
  ASSERT_TRUE(dev->RecordEvent(done_slow, slow).ok());
  uint32_t word = 0, one = 1;
  ASSERT_TRUE(dev->StreamWaitEvent(other, done_slow).ok());
  ASSERT_TRUE(dev->CopyAsync(&word, &one, sizeof(one), other).ok());
  ASSERT_TRUE(dev->RecordEvent(done_other, other).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(dev->WaitEvent(done_other, std::chrono::milliseconds(20))))
      << "the 4-byte copy ran before the 500 ms one it waits for";
  ASSERT_TRUE(dev->WaitEvent(done_other, std::chrono::seconds(10)).ok());
  EXPECT_TRUE(*dev->QueryEvent(done_slow));
  EXPECT_EQ(word, 1u);
  // A wait takes the record current when it is issued: recording the event
  // again afterwards does not hold the earlier wait back.
  ASSERT_TRUE(dev->StreamWaitEvent(other, done_slow).ok());
  ASSERT_TRUE(dev->CopyAsync(d, src.data(), src.size(), slow).ok());
  ASSERT_TRUE(dev->RecordEvent(done_slow, slow).ok());
  ASSERT_TRUE(dev->RecordEvent(done_other, other).ok());
  ASSERT_TRUE(dev->WaitEvent(done_other, std::chrono::milliseconds(300)).ok());
  EXPECT_FALSE(*dev->QueryEvent(done_slow));
  ASSERT_TRUE(dev->SynchronizeStream(slow).ok());
}

// The daemon's side of a layer-wise load: it records, an engine process
// waits on the exported event and then reads what the work wrote.
TEST(SimDeviceTest, ExportedEventsAreWaitedOnInAnotherProcess) {
  auto dev = MakeSimDevice(SimDeviceOptions{100ull << 20});
  auto stream = *dev->CreateStream();
  constexpr size_t kBytes = 50 << 20;  // 500 ms at 100 MiB/s
  auto d = *dev->Allocate(kBytes);
  auto ev = *dev->CreateEvent();
  auto mem = dev->ExportMemory(d);
  auto handle = dev->ExportEvent(ev);
  ASSERT_TRUE(mem.ok() && handle.ok()) << handle.status();
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto other = MakeSimDevice();
    auto p = other->ImportMemory(*mem);
    auto e = other->ImportEvent(*handle);
    if (!p.ok() || !e.ok()) _exit(2);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(3);
    if (!absl::IsDeadlineExceeded(other->WaitEvent(*e, std::chrono::milliseconds(1)))) _exit(4);
    if (!other->WaitEvent(*e, std::chrono::seconds(20)).ok()) _exit(5);
    const auto* bytes = static_cast<const uint8_t*>(*p);
    for (size_t i = 0; i < kBytes; i += 4093) {
      if (bytes[i] != 7) _exit(6);
    }
    if (other->ExportEvent(*e).ok()) _exit(7);  // an imported event is not ours to hand on
    _exit(other->DestroyEvent(*e).ok() ? 0 : 8);
  }
  std::vector<uint8_t> src(kBytes, 7);
  ASSERT_TRUE(dev->CopyAsync(d, src.data(), src.size(), stream).ok());
  ASSERT_TRUE(dev->RecordEvent(ev, stream).ok());
  ASSERT_EQ(write(go[1], "g", 1), 1);
  int st = 0;
  waitpid(child, &st, 0);
  close(go[0]);
  close(go[1]);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "2: import, 4: the wait did not wait, 5: it never ended, 6: bytes, 7/8: handles";
  ASSERT_TRUE(dev->SynchronizeStream(stream).ok());
}

TEST(SimDeviceTest, BadEventHandlesAreRefused) {
  auto dev = MakeSimDevice();
  EXPECT_FALSE(dev->ExportEvent(12345).ok());
  EXPECT_FALSE(dev->StreamWaitEvent(12345, 12345).ok());
  IpcEventHandle none;
  EXPECT_FALSE(dev->ImportEvent(none).ok());
  auto ev = *dev->CreateEvent();
  auto h = *dev->ExportEvent(ev);
  h.offset = 4093;  // not a state's start
  EXPECT_FALSE(dev->ImportEvent(h).ok());
  h.offset = 4096;  // past the page
  EXPECT_FALSE(dev->ImportEvent(h).ok());
  auto mem = *dev->ExportMemory(*dev->Allocate(1 << 20));  // a memfd, but not an event page
  IpcEventHandle wrong;
  wrong.fd = std::move(mem.fd);
  EXPECT_FALSE(dev->ImportEvent(wrong).ok());
}

TEST(SimDeviceTest, ExportedEventPagesAreReadOnlyAndPerGroup) {
  // Whoever an event page is exported to cannot map it writable (so it can
  // neither complete another's event early nor hold one back), and events
  // of different groups (registrations) never share a page.
  auto dev = MakeSimDevice();
  auto a1 = *dev->CreateEvent(1), a2 = *dev->CreateEvent(1), b = *dev->CreateEvent(2);
  auto ha1 = *dev->ExportEvent(a1), ha2 = *dev->ExportEvent(a2), hb = *dev->ExportEvent(b);
  struct stat s1, s2, sb;
  ASSERT_EQ(fstat(ha1.fd.get(), &s1), 0);
  ASSERT_EQ(fstat(ha2.fd.get(), &s2), 0);
  ASSERT_EQ(fstat(hb.fd.get(), &sb), 0);
  EXPECT_EQ(s1.st_ino, s2.st_ino) << "one group's events share a page";
  EXPECT_NE(s1.st_ino, sb.st_ino) << "another group's events are on another page";
  for (const IpcEventHandle* h : {&ha1, &hb}) {
    void* w = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd.get(), 0);
    EXPECT_EQ(w, MAP_FAILED) << "an exported event page could be mapped writable";
    if (w != MAP_FAILED) munmap(w, 4096);
    void* r = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, h->fd.get(), 0);
    EXPECT_NE(r, MAP_FAILED);
    if (r != MAP_FAILED) munmap(r, 4096);
  }
  // The importer waits; recording is the exporter's.
  auto other = MakeSimDevice();
  auto imported = other->ImportEvent(ha1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto stream = *other->CreateStream();
  EXPECT_FALSE(other->RecordEvent(*imported, stream).ok());
  auto mine = *dev->CreateStream();
  ASSERT_TRUE(dev->RecordEvent(a1, mine).ok());
  ASSERT_TRUE(dev->SynchronizeStream(mine).ok());
  EXPECT_TRUE(other->WaitEvent(*imported, std::chrono::seconds(5)).ok());
  // A page whose events are all destroyed goes back to any group.
  ASSERT_TRUE(dev->DestroyEvent(b).ok());
  auto c = *dev->CreateEvent(3);
  auto hc = *dev->ExportEvent(c);
  struct stat sc;
  ASSERT_EQ(fstat(hc.fd.get(), &sc), 0);
  EXPECT_NE(sc.st_ino, s1.st_ino);
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
