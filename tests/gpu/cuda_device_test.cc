// SPDX-License-Identifier: Apache-2.0
// The CUDA device backend on a real GPU: ordered copies, events, registered
// host memory (a memfd mapping, as the host arena is), IPC export to another
// process, and device = "auto" choosing CUDA. Skips (77) where no GPU answers.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "os/shm.h"
#include "tiers/device_backend.h"
#include "tiers/gpu_tier.h"

extern char** environ;

namespace kvtier {
namespace {

std::unique_ptr<DeviceBackend> Cuda() {
  auto dev = MakeCudaDevice(0);
  if (!dev.ok()) ADD_FAILURE() << dev.status();
  return dev.ok() ? std::move(*dev) : nullptr;
}

TEST(CudaDeviceTest, AutoChoosesCuda) {
  auto choice = OpenDeviceBackend("auto", {});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->backend->name(), "cuda");
  EXPECT_NE(choice->reason.find("CUDA device"), std::string::npos);
}

TEST(CudaDeviceTest, CopiesRunInStreamOrderAndEventsReportThem) {
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  const DeviceStream s = *dev->CreateStream();
  void* d = *dev->Allocate(64 << 20);
  std::vector<uint8_t> a(64 << 20, 1), b(64 << 20, 2), out(64 << 20, 0);
  ASSERT_TRUE(dev->CopyAsync(d, a.data(), a.size(), s).ok());
  ASSERT_TRUE(dev->CopyAsync(d, b.data(), b.size(), s).ok());
  ASSERT_TRUE(dev->CopyAsync(out.data(), d, out.size(), s).ok());
  const DeviceEvent e = *dev->CreateEvent();
  ASSERT_TRUE(dev->RecordEvent(e, s).ok());
  ASSERT_TRUE(dev->WaitEvent(e, std::chrono::seconds(10)).ok());
  EXPECT_TRUE(*dev->QueryEvent(e));
  EXPECT_EQ(out, b);
  EXPECT_FALSE(dev->Free(reinterpret_cast<void*>(0x1234)).ok());
  EXPECT_FALSE(dev->CopyAsync(d, a.data(), 8, 424242).ok());
  ASSERT_TRUE(dev->DestroyEvent(e).ok());
  ASSERT_TRUE(dev->DestroyStream(s).ok());
  ASSERT_TRUE(dev->Free(d).ok());
}

// A second stream reads what the first wrote only because it waits on the
// first's event: without the wait it would copy while 256 MiB still land.
TEST(CudaDeviceTest, StreamWaitEventOrdersTwoStreams) {
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  const DeviceStream a = *dev->CreateStream();
  const DeviceStream b = *dev->CreateStream();
  constexpr size_t kBytes = 256 << 20;
  void* d = *dev->Allocate(kBytes);
  std::vector<uint8_t> ones(kBytes, 1), twos(kBytes, 2), out(4096, 0);
  ASSERT_TRUE(dev->CopyAsync(d, ones.data(), kBytes, a).ok());
  ASSERT_TRUE(dev->SynchronizeStream(a).ok());
  ASSERT_TRUE(dev->CopyAsync(d, twos.data(), kBytes, a).ok());
  const DeviceEvent e = *dev->CreateEvent();
  ASSERT_TRUE(dev->RecordEvent(e, a).ok());
  ASSERT_TRUE(dev->StreamWaitEvent(b, e).ok());
  ASSERT_TRUE(dev->CopyAsync(out.data(), static_cast<uint8_t*>(d) + kBytes - out.size(), out.size(), b).ok());
  ASSERT_TRUE(dev->SynchronizeStream(b).ok());
  EXPECT_TRUE(*dev->QueryEvent(e));
  EXPECT_EQ(out, std::vector<uint8_t>(out.size(), 2));
  ASSERT_TRUE(dev->DestroyEvent(e).ok());
  ASSERT_TRUE(dev->DestroyStream(a).ok());
  ASSERT_TRUE(dev->DestroyStream(b).ok());
  ASSERT_TRUE(dev->Free(d).ok());
}

TEST(CudaDeviceTest, RegistersASharedMemoryMapping) {
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  auto fd = os::CreateSealedMemfd("kvtier-gpu-test", 8 << 20);
  ASSERT_TRUE(fd.ok());
  auto region = os::MappedRegion::Map(fd->get(), 8 << 20);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(dev->RegisterHost(region->data(), region->size()).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(dev->RegisterHost(region->data(), region->size())));
  const DeviceStream s = *dev->CreateStream();
  void* d = *dev->Allocate(8 << 20);
  std::vector<uint8_t> pattern(8 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(dev->CopyAsync(d, pattern.data(), pattern.size(), s).ok());
  ASSERT_TRUE(dev->CopyAsync(region->data(), d, pattern.size(), s).ok());
  ASSERT_TRUE(dev->SynchronizeStream(s).ok());
  EXPECT_EQ(std::memcmp(region->data(), pattern.data(), pattern.size()), 0);
  ASSERT_TRUE(dev->UnregisterHost(region->data()).ok());
  ASSERT_TRUE(dev->DestroyStream(s).ok());
  ASSERT_TRUE(dev->Free(d).ok());
}

// The child half of ExportsMemoryToAnotherProcess: opens the handle in
// KVTIER_TEST_IPC_HANDLE and checks the pattern the parent wrote.
TEST(CudaDeviceTest, ImportChild) {
  const char* hex = std::getenv("KVTIER_TEST_IPC_HANDLE");
  if (hex == nullptr) GTEST_SKIP() << "run by ExportsMemoryToAnotherProcess";
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  IpcMemHandle h;
  const std::string bytes = absl::HexStringToBytes(hex);
  ASSERT_EQ(bytes.size(), h.opaque.size());
  std::memcpy(h.opaque.data(), bytes.data(), bytes.size());
  h.bytes = 1 << 20;
  auto p = dev->ImportMemory(h);
  ASSERT_TRUE(p.ok()) << p.status();
  const DeviceStream s = *dev->CreateStream();
  // The parent's event, recorded after it wrote the pattern: this stream
  // waits on it before reading.
  IpcEventHandle eh;
  const std::string event_bytes = absl::HexStringToBytes(std::getenv("KVTIER_TEST_IPC_EVENT"));
  ASSERT_GE(eh.opaque.size(), event_bytes.size());
  std::memcpy(eh.opaque.data(), event_bytes.data(), event_bytes.size());
  auto ev = dev->ImportEvent(eh);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_TRUE(dev->StreamWaitEvent(s, *ev).ok());
  ASSERT_TRUE(dev->WaitEvent(*ev, std::chrono::seconds(10)).ok());
  EXPECT_FALSE(dev->ExportEvent(*ev).ok());
  std::vector<uint8_t> got(1 << 20);
  ASSERT_TRUE(dev->CopyAsync(got.data(), *p, got.size(), s).ok());
  ASSERT_TRUE(dev->SynchronizeStream(s).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<uint8_t>(i * 13 + 5)) << i;
  ASSERT_TRUE(dev->CloseImported(*p).ok());
  ASSERT_TRUE(dev->DestroyEvent(*ev).ok());
}

TEST(CudaDeviceTest, ExportsMemoryToAnotherProcess) {
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  void* d = *dev->Allocate(1 << 20);
  const DeviceStream s = *dev->CreateStream();
  std::vector<uint8_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_TRUE(dev->CopyAsync(d, pattern.data(), pattern.size(), s).ok());
  const DeviceEvent written = *dev->CreateEvent();
  ASSERT_TRUE(dev->RecordEvent(written, s).ok());
  auto eh = dev->ExportEvent(written);
  ASSERT_TRUE(eh.ok()) << eh.status();
  ASSERT_TRUE(dev->SynchronizeStream(s).ok());
  auto h = dev->ExportMemory(d);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes, 1u << 20);
  EXPECT_FALSE(dev->ExportMemory(static_cast<uint8_t*>(d) + 1).ok());
  const std::string env = "KVTIER_TEST_IPC_HANDLE=" +
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h->opaque.data()), h->opaque.size()));
  const std::string env_event = "KVTIER_TEST_IPC_EVENT=" +
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(eh->opaque.data()), eh->opaque.size()));
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(const_cast<char*>(env_event.c_str()));
  envp.push_back(nullptr);
  char filter[] = "--gtest_filter=CudaDeviceTest.ImportChild";
  char self[] = "/proc/self/exe";
  char* argv[] = {self, filter, nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_TRUE(dev->DestroyEvent(written).ok());
  ASSERT_TRUE(dev->DestroyStream(s).ok());
  ASSERT_TRUE(dev->Free(d).ok());
}

TEST(CudaDeviceTest, GpuTierRoundTripsBlocksInDeviceMemory) {
  auto dev = Cuda();
  ASSERT_NE(dev, nullptr);
  auto tier = GpuTier::Create(dev.get(), {64 << 20});
  ASSERT_TRUE(tier.ok()) << tier.status();
  std::vector<std::byte> data(2 << 20), back(2 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 31 + 7);
  BlockMeta meta;
  meta.key.bytes[0] = 1;
  auto slot = (*tier)->Allocate(data.size());
  ASSERT_TRUE(slot.ok());
  absl::Status w = absl::UnknownError("no callback"), r = absl::UnknownError("no callback");
  (*tier)->Write(*slot, meta, data, IoPriority::kDemote, [&](absl::Status s) { w = s; });
  ASSERT_TRUE(w.ok()) << w;
  (*tier)->Read(*slot, meta, back, IoPriority::kLoad, [&](absl::Status s) { r = s; });
  ASSERT_TRUE(r.ok()) << r;
  EXPECT_EQ(back, data);
  BlockMeta other = meta;
  other.key.bytes[0] = 2;
  (*tier)->Read(*slot, other, back, IoPriority::kLoad, [&](absl::Status s) { r = s; });
  EXPECT_TRUE(absl::IsDataLoss(r));
  auto h = (*tier)->ExportArena();
  EXPECT_TRUE(h.ok()) << h.status();
}

}  // namespace
}  // namespace kvtier
