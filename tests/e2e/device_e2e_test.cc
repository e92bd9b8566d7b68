// SPDX-License-Identifier: Apache-2.0
// Engine KV caches end to end on the host-simulated device: an engine
// registers its paged cache ("device" memory: a memfd the daemon maps), the
// daemon gathers blocks straight from its pages and scatters them back layer
// by layer, the client copies them itself on the engine's stream, INT8 blocks
// come back within their bound, bad registrations are refused with the
// reason, and an engine killed with -9 leaves a daemon that serves the next
// one. Bytes are checked against naive indexing every time.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "client/internal/client_impl.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

// A small model: 4 layers, 2 KV heads of 16, f16, 4-token pages, 16-token
// blocks (4 pages per block per layer).
constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 16, kPageTokens = 4, kBlockTokens = 16;
constexpr uint32_t kPpb = kBlockTokens / kPageTokens;
constexpr uint64_t kPageBytes = uint64_t{kPageTokens} * kHeads * kDim * 2;
constexpr uint64_t kBlockBytes = uint64_t{kLayers} * 2 * kBlockTokens * kHeads * kDim * 2;  // 8 KiB
constexpr uint32_t kPages = 96;

const char* kConfig = "device = \"sim\"\n[tiers.host]\ncapacity = \"4MiB\"\n";

// The engine's paged cache in a memfd: per layer, K then V, each kPages pages.
struct EngineMemory {
  int fd = -1;
  std::byte* base = nullptr;
  uint64_t bytes = uint64_t{kLayers} * 2 * kPages * kPageBytes;
  EngineMemory() {
    fd = memfd_create("engine-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the daemon requires it
    base = static_cast<std::byte*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(base, MAP_FAILED);
  }
  ~EngineMemory() {
    munmap(base, bytes);
    close(fd);
  }
  std::byte* Page(uint32_t layer, int kv, uint32_t page) const {
    return base + ((uint64_t{layer} * 2 + kv) * kPages + page) * kPageBytes;
  }
  KvCacheLayout Layout(std::string codec = "none") const {
    KvCacheLayout l;
    l.layers = kLayers;
    l.page_tokens = kPageTokens;
    l.kv_heads = kHeads;
    l.head_dim = kDim;
    l.dtype = "f16";
    l.codec = std::move(codec);
    l.num_pages = kPages;
    for (uint32_t i = 0; i < kLayers; ++i) {
      l.k_layers.push_back(Page(i, 0, 0));
      l.v_layers.push_back(Page(i, 1, 0));
    }
    l.regions.push_back({base, bytes, fd});
    return l;
  }
};

// A short pause that varies where a wait lands against the daemon's work.
inline void ipc_relax() { std::atomic_signal_fence(std::memory_order_seq_cst); std::this_thread::yield(); }

std::vector<uint32_t> PagesFrom(uint32_t first, size_t blocks) {
  std::vector<uint32_t> p;
  for (uint32_t i = 0; i < blocks * kPpb; ++i) p.push_back(first + (i * 7) % (blocks * kPpb));  // shuffled
  return p;
}

void FillPages(const EngineMemory& m, std::span<const uint32_t> pages, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t p : pages) {
        for (uint64_t i = 0; i < kPageBytes; ++i) m.Page(l, kv, p)[i] = static_cast<std::byte>(rng());
      }
    }
  }
}

// True when `block` is the layer-major form of block b's pages:
// [layer][K|V][tokens][heads][dim].
bool BlockMatchesPages(const std::byte* block, const EngineMemory& m, std::span<const uint32_t> pages, size_t b) {
  const uint64_t token_bytes = uint64_t{kHeads} * kDim * 2;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t t = 0; t < kBlockTokens; ++t) {
        const std::byte* want = m.Page(l, kv, pages[b * kPpb + t / kPageTokens]) + (t % kPageTokens) * token_bytes;
        const std::byte* got = block + ((uint64_t{l} * 2 + kv) * kBlockTokens + t) * token_bytes;
        if (std::memcmp(want, got, token_bytes) != 0) return false;
      }
    }
  }
  return true;
}

bool SamePages(const EngineMemory& m, std::span<const uint32_t> a, std::span<const uint32_t> b, uint32_t layers) {
  for (uint32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(m.Page(l, kv, a[i]), m.Page(l, kv, b[i]), kPageBytes) != 0) return false;
      }
    }
  }
  return true;
}

NamespaceDescriptor Ns(uint64_t block_bytes = kBlockBytes) { return testing::TestNamespace(block_bytes, "device/e2e"); }

// A daemon on the simulated device and one engine attached to it, its cache
// registered.
class DeviceE2eTest : public ::testing::Test {
 protected:
  void StartEngine() {
    ASSERT_TRUE(d_.Start().ok()) << d_.Log();
    c_ = testing::AttachTo(d_.socket_path(), Ns());
    ASSERT_NE(c_, nullptr);
    auto reg = c_->RegisterKvCache(mem_.Layout());
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    reg_ = *reg;
  }
  DaemonProcess d_{kConfig};
  std::unique_ptr<Client> c_;
  EngineMemory mem_;
  uint64_t reg_ = 0;
};

TEST_F(DeviceE2eTest, DaemonGathersFromPagesAndScattersBackLayerByLayer) {
  ASSERT_NO_FATAL_FAILURE(StartEngine());
  const auto keys = testing::SeededKeys(*c_, 1, 6);
  const auto src = PagesFrom(0, 6);   // pages 0..23
  const auto dst = PagesFrom(40, 6);  // pages 40..63
  FillPages(mem_, src, 11);
  auto written = c_->StoreFromCache(reg_, keys, src);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(*written, 6u);
  // Storing again writes nothing: the blocks are cached.
  EXPECT_EQ(*c_->StoreFromCache(reg_, keys, src), 0u);

  // The stored blocks are the layer-major form of the pages.
  auto hit = c_->Lookup(keys, {.lease = true});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->hit_blocks, 6u);
  auto views = c_->Load(hit->lease, keys);
  ASSERT_TRUE(views.ok());
  for (size_t b = 0; b < keys.size(); ++b) EXPECT_TRUE(BlockMatchesPages((*views)[b].data, mem_, src, b)) << b;

  // Daemon-driven load into other pages, layer by layer.
  auto load = c_->LoadIntoCacheAsync(reg_, hit->lease, keys, dst);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(load->layers, kLayers);
  auto blocks = c_->WaitLayers(*load, 1);
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  EXPECT_EQ(*blocks, 6u);
  EXPECT_GE(c_->LayersReady(*load), 1u);
  EXPECT_TRUE(SamePages(mem_, src, dst, 1)) << "layer 0 is in place once WaitLayers(1) returns";
  auto loaded = c_->FinishLoad(*load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, 6u);
  EXPECT_EQ(c_->LayersReady(*load), kLayers);
  EXPECT_TRUE(SamePages(mem_, src, dst, kLayers));
  ASSERT_TRUE(c_->Release(hit->lease).ok());

  auto s = d_.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["stats"]["kv_registrations"].get<int>(), 1);
  EXPECT_EQ((*s)["stats"]["device_blocks_stored"].get<int>(), 6);
  EXPECT_EQ((*s)["stats"]["device_blocks_loaded"].get<int>(), 6);
  EXPECT_EQ((*s)["stats"]["device_errors"].get<int>(), 0);
  EXPECT_EQ((*s)["sessions"][0]["kv_caches"].get<int>(), 1);
  EXPECT_TRUE(c_->UnregisterKvCache(reg_).ok());
  EXPECT_EQ(c_->StoreFromCache(reg_, keys, src).status().code(), ErrorCode::kNotFound);
}

// The registration brought one event per layer (the simulated device's
// shared states, as CUDA IPC events would be on a GPU); StreamWaitLayers waits
// on them once the daemon armed the load.
TEST_F(DeviceE2eTest, StreamWaitLayersWaitsOnTheDaemonsLayerEvents) {
  ASSERT_NO_FATAL_FAILURE(StartEngine());
  const auto src = PagesFrom(0, 4);
  FillPages(mem_, src, 23);
  const auto keys = testing::SeededKeys(*c_, 3, 4);
  ASSERT_EQ(*c_->StoreFromCache(reg_, keys, src), 4u);
  for (int round = 0; round < 3; ++round) {  // the same events serve load after load
    const auto dst = PagesFrom(40 + 16 * round, 4);
    auto hit = c_->Lookup(keys, {.lease = true});
    ASSERT_TRUE(hit.ok());
    auto load = c_->LoadIntoCacheAsync(reg_, hit->lease, keys, dst);
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    EXPECT_EQ(load->registration, reg_);
    auto blocks = c_->StreamWaitLayers(*load, 2);
    ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
    EXPECT_EQ(*blocks, 4u);
    EXPECT_TRUE(SamePages(mem_, src, dst, 2)) << "layers 0 and 1 are in place once their events completed";
    ASSERT_TRUE(c_->StreamWaitLayers(*load, kLayers).ok());
    EXPECT_TRUE(SamePages(mem_, src, dst, kLayers));
    EXPECT_EQ(*c_->FinishLoad(*load), 4u);
    EXPECT_EQ(c_->StreamWaitLayers(*load, 1).status().code(), ErrorCode::kNotFound) << "the load is over";
    ASSERT_TRUE(c_->Release(hit->lease).ok());
  }
  DeviceLoad bogus = {12345, kLayers, reg_ + 100};
  EXPECT_EQ(c_->StreamWaitLayers(bogus, 1).status().code(), ErrorCode::kNotFound);
}

TEST_F(DeviceE2eTest, EveryCompletedLoadIsReportedAsCompleted) {
  // A layer wait that finds the load's completion already posted (the
  // daemon finished every layer between the wait's two looks) used to report
  // a load that succeeded as failed: ~1 in 14,000 loads. Thousands of loads,
  // waited for at varying delays, must all succeed, and FinishLoad must still
  // answer after a wait collected the completion.
  ASSERT_NO_FATAL_FAILURE(StartEngine());
  const auto keys = testing::SeededKeys(*c_, 9, 1);
  ASSERT_EQ(*c_->StoreFromCache(reg_, keys, PagesFrom(0, 1)), 1u);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int kLoads = 300;  // ~45 ms a load under ASan on 2 busy cores
#else
  constexpr int kLoads = 4000;
#endif
  int failed = 0;
  for (int i = 0; i < kLoads; ++i) {
    auto hit = c_->Lookup(keys, {.lease = true});
    ASSERT_TRUE(hit.ok());
    auto load = c_->LoadIntoCacheAsync(reg_, hit->lease, keys, PagesFrom(8 + (i % 16) * kPpb, 1));
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    for (int spin = 0; spin < i % 64; ++spin) ipc_relax();
    auto blocks = c_->WaitLayers(*load, kLayers);
    if (!blocks.ok() || *blocks != 1) ++failed;
    auto loaded = c_->FinishLoad(*load);
    if (!loaded.ok() || *loaded != 1) ++failed;
    ASSERT_TRUE(c_->Release(hit->lease).ok());
  }
  EXPECT_EQ(failed, 0);
}

}  // namespace

// Reaches a load's progress words in the session's scratch memory (the
// client's own memory, which the daemon writes).
class ClientTestPeer {
 public:
  static ipc::DeviceLoadProgress* Progress(Client& c, OpId op) {
    auto it = c.impl_->ops.find(op);
    return it == c.impl_->ops.end() ? nullptr : it->second.progress;
  }
};

namespace {

// The same race, replayed step by step so it happens every time: the layer
// wait reads the progress word while the last layer is still missing, the
// daemon then publishes that layer and posts the completion, and the wait
// finds the completion. Before the fix the wait reported the load as
// failed (kIo) and FinishLoad then said it was not outstanding.
TEST_F(DeviceE2eTest, AWaitThatFindsTheCompletionAfterAStaleReadReportsSuccess) {
  ASSERT_NO_FATAL_FAILURE(StartEngine());
  const auto keys = testing::SeededKeys(*c_, 10, 2);
  const auto src = PagesFrom(0, 2), dst = PagesFrom(20, 2);
  FillPages(mem_, src, 31);
  ASSERT_EQ(*c_->StoreFromCache(reg_, keys, src), 2u);
  auto hit = c_->Lookup(keys, {.lease = true});
  ASSERT_TRUE(hit.ok());
  auto load = c_->LoadIntoCacheAsync(reg_, hit->lease, keys, dst);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ipc::DeviceLoadProgress* p = ClientTestPeer::Progress(*c_, load->op);
  ASSERT_NE(p, nullptr);
  // The daemon publishes every layer, then posts the completion.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (p->layers_done.load(std::memory_order_acquire) < kLayers && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(p->layers_done.load(), kLayers);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the completion follows within microseconds
  // What the waiter saw: the word before the last layer landed.
  p->layers_done.store(kLayers - 1, std::memory_order_release);
  auto blocks = c_->WaitLayers(*load, kLayers, std::chrono::seconds(5));
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  EXPECT_EQ(*blocks, 2u);
  auto loaded = c_->FinishLoad(*load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, 2u);
  EXPECT_TRUE(SamePages(mem_, src, dst, kLayers)) << "the engine's pages hold the blocks";
  EXPECT_TRUE(c_->Release(hit->lease).ok());
}

TEST_F(DeviceE2eTest, ClientCopiesOnTheEnginesStreamMatchTheDaemons) {
  ASSERT_NO_FATAL_FAILURE(StartEngine());
  const auto keys = testing::SeededKeys(*c_, 2, 4);
  const auto src = PagesFrom(0, 4), dst = PagesFrom(50, 4);
  FillPages(mem_, src, 12);
  // Client-driven store: gather into the ticket's slots, then commit.
  auto ticket = c_->StoreBegin(keys);
  ASSERT_TRUE(ticket.ok());
  ASSERT_EQ(ticket->needed, 4u);
  ASSERT_TRUE(c_->GatherFromCache(reg_, *ticket, src).ok());
  ASSERT_TRUE(c_->StoreCommit(*ticket).ok());
  auto hit = c_->Lookup(keys, {.lease = true});
  ASSERT_EQ(hit->hit_blocks, 4u);
  auto views = c_->Load(hit->lease, keys);
  ASSERT_TRUE(views.ok());
  for (size_t b = 0; b < keys.size(); ++b) EXPECT_TRUE(BlockMatchesPages((*views)[b].data, mem_, src, b)) << b;
  // Client-driven load, layer by layer.
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(c_->ScatterToCache(reg_, *views, dst, 0, l, 1).ok());
    EXPECT_TRUE(SamePages(mem_, src, dst, l + 1));
  }
  // Wrong page counts and foreign views are refused.
  EXPECT_EQ(c_->ScatterToCache(reg_, *views, std::span(dst).first(3)).code(), ErrorCode::kInvalidArgument);
  std::vector<BlockView> bogus = {BlockView{nullptr, 0, TierKind::kHost}};
  EXPECT_EQ(c_->ScatterToCache(reg_, bogus, std::span(dst).first(kPpb)).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(c_->Release(hit->lease).ok());
}

int GpuTier(const DaemonProcess& d, const char* key) {
  auto s = d.Status();
  if (!s.ok()) return -1;
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] == "gpu") return t[key].get<int>();
  }
  return -1;
}

// A daemon with a GPU tier of 8 blocks (on the simulated device) and one
// engine attached to it, its cache registered.
class GpuTierE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.Start().ok()) << d_.Log();
    c_ = testing::AttachTo(d_.socket_path(), Ns());
    ASSERT_NE(c_, nullptr);
    auto reg = c_->RegisterKvCache(mem_.Layout());
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    reg_ = *reg;
  }
  DaemonProcess d_{std::string(kConfig) + "[tiers.gpu]\ncapacity = \"64KiB\"\n"};
  std::unique_ptr<Client> c_;
  EngineMemory mem_;
  uint64_t reg_ = 0;
};

// With a GPU tier (8 blocks here) stores land in it and are demoted to host
// memory, loads come from it, and what it had to drop is promoted back.
TEST_F(GpuTierE2eTest, TheGpuTierHoldsStoresAndServesLoads) {
  const auto a = testing::SeededKeys(*c_, 21, 6), b = testing::SeededKeys(*c_, 22, 6);
  const auto a_src = PagesFrom(0, 6), b_src = PagesFrom(24, 6), dst = PagesFrom(60, 6);
  FillPages(mem_, a_src, 21);
  FillPages(mem_, b_src, 22);
  ASSERT_EQ(*c_->StoreFromCache(reg_, a, a_src), 6u);
  EXPECT_EQ(GpuTier(d_, "blocks"), 6);
  EXPECT_EQ(GpuTier(d_, "demotions"), 6);
  auto tiers_of = [&](std::span<const BlockKey> keys) {
    std::vector<TierKind> t = c_->Lookup(keys)->tiers;
    return std::make_pair(std::count(t.begin(), t.end(), TierKind::kGpu),
                          std::count(t.begin(), t.end(), TierKind::kHost));
  };
  EXPECT_EQ(tiers_of(a), std::make_pair(6l, 0l));
  // Demoted to host memory intact, and loaded from the GPU copies.
  auto hit = c_->Lookup(a, {.lease = true});
  auto views = c_->Load(hit->lease, a);
  ASSERT_TRUE(views.ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BlockMatchesPages((*views)[i].data, mem_, a_src, i)) << i;
  ASSERT_EQ(*c_->LoadIntoCache(reg_, hit->lease, a, dst), 6u);
  EXPECT_TRUE(SamePages(mem_, a_src, dst, kLayers));
  EXPECT_EQ(GpuTier(d_, "hits"), 6);
  ASSERT_TRUE(c_->Release(hit->lease).ok());
  // Six more blocks need four of A's slots.
  ASSERT_EQ(*c_->StoreFromCache(reg_, b, b_src), 6u);
  EXPECT_EQ(GpuTier(d_, "evictions"), 4);
  EXPECT_EQ(tiers_of(a), std::make_pair(2l, 4l));
  // Loading A takes four from host memory and promotes them.
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t p : dst) std::memset(mem_.Page(l, kv, p), 0, kPageBytes);
    }
  }
  hit = c_->Lookup(a, {.lease = true});
  ASSERT_EQ(*c_->LoadIntoCache(reg_, hit->lease, a, dst), 6u);
  EXPECT_TRUE(SamePages(mem_, a_src, dst, kLayers));
  ASSERT_TRUE(c_->Release(hit->lease).ok());
  EXPECT_EQ(GpuTier(d_, "promotions"), 4);
  EXPECT_EQ(tiers_of(a), std::make_pair(6l, 0l));
  // Invalidated blocks leave the GPU tier too.
  EXPECT_EQ(*c_->Invalidate(std::span(a).first(2)), 2u);
  EXPECT_EQ(GpuTier(d_, "blocks"), 6);  // 4 of A and 2 of B
  EXPECT_EQ(GpuTier(d_, "pinned_blocks"), 0);
}

// An engine maps the tenant's GPU-tier arena and copies leased blocks out of
// it itself (device to device on a GPU); a lease pins the copies it names
// against eviction until it is released.
TEST_F(GpuTierE2eTest, EnginesReadPinnedGpuCopiesThroughTheExportedArena) {
  const auto a = testing::SeededKeys(*c_, 31, 4), b = testing::SeededKeys(*c_, 32, 8);
  const auto a_src = PagesFrom(0, 4), b_src = PagesFrom(16, 8), dst = PagesFrom(60, 4);
  FillPages(mem_, a_src, 31);
  FillPages(mem_, b_src, 32);
  ASSERT_EQ(*c_->StoreFromCache(reg_, a, a_src), 4u);

  // Before the arena is mapped a leased lookup names no GPU addresses.
  auto hit = c_->Lookup(a, {.lease = true});
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->gpu_blocks, std::vector<const std::byte*>(4, nullptr));
  ASSERT_TRUE(c_->Release(hit->lease).ok());

  auto bytes = c_->MapGpuArena();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, 64u << 10);
  EXPECT_EQ(*c_->MapGpuArena(), *bytes) << "mapping again is a no-op";
  hit = c_->Lookup(a, {.lease = true});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->hit_blocks, 4u);
  std::vector<BlockView> gpu;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NE(hit->gpu_blocks[i], nullptr) << i;
    EXPECT_EQ(hit->tiers[i], TierKind::kGpu);
    EXPECT_TRUE(BlockMatchesPages(hit->gpu_blocks[i], mem_, a_src, i)) << "the GPU copy of block " << i;
    gpu.push_back(BlockView{hit->gpu_blocks[i], c_->block_bytes(), TierKind::kGpu});
  }
  EXPECT_EQ(GpuTier(d_, "pinned_blocks"), 4);
  // B needs every slot, but A's four are pinned by the lease: only four of
  // B get GPU copies, and A's copies stay intact.
  ASSERT_EQ(*c_->StoreFromCache(reg_, b, b_src), 8u);
  EXPECT_EQ(GpuTier(d_, "blocks"), 8);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BlockMatchesPages(gpu[i].data, mem_, a_src, i)) << i;
  // The engine scatters straight from the GPU copies into its pages.
  ASSERT_TRUE(c_->ScatterToCache(reg_, gpu, dst).ok());
  EXPECT_TRUE(SamePages(mem_, a_src, dst, kLayers));
  ASSERT_TRUE(c_->Release(hit->lease).ok());
  EXPECT_EQ(GpuTier(d_, "pinned_blocks"), 0);
  EXPECT_EQ(GpuTier(d_, "hits"), 0) << "pinning for a lookup is not a load";

  // Without a lease nothing is pinned and no address is given.
  auto peek = c_->Lookup(a);
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(std::count(peek->gpu_blocks.begin(), peek->gpu_blocks.end(), nullptr), 4);
  EXPECT_EQ(GpuTier(d_, "pinned_blocks"), 0);

  // An engine that dies holding a lease leaves no pins behind.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto cc = testing::AttachTo(d_.socket_path(), Ns());
    if (cc == nullptr || !cc->MapGpuArena().ok()) _exit(2);
    auto h = cc->Lookup(a, {.lease = true});
    if (!h.ok() || h->gpu_blocks[0] == nullptr) _exit(3);
    kill(getpid(), SIGKILL);
  }
  int st = 0;
  waitpid(child, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "child exit " << WEXITSTATUS(st);
  EXPECT_TRUE(testing::Eventually([&] { return GpuTier(d_, "pinned_blocks") == 0; }));
}

TEST(DeviceE2eOneOffTest, AGpuArenaRequestWithoutAGpuTierSaysSo) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = testing::AttachTo(d.socket_path(), Ns());
  ASSERT_NE(c, nullptr);
  auto bytes = c->MapGpuArena();
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(bytes.status().message().find("tiers.gpu.capacity"), std::string::npos) << bytes.status().message();
  EXPECT_TRUE(c->Ping().ok()) << "the session goes on";
}

TEST(DeviceE2eOneOffTest, Int8BlocksComeBackWithinTheirBound) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  // INT8 layer: K codes + 16-aligned per-channel scales + V codes + per-token scales.
  const uint64_t codes = uint64_t{kBlockTokens} * kHeads * kDim;               // 512
  const uint64_t layer = codes + kHeads * kDim * 4 + codes + kBlockTokens * kHeads * 4;  // aligned already
  auto c = testing::AttachTo(d.socket_path(), Ns(layer * kLayers));
  ASSERT_NE(c, nullptr);
  EngineMemory mem;
  // A lossless layout does not fit this namespace's block size: refused, with why.
  auto wrong = c->RegisterKvCache(mem.Layout("none"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("block"), std::string::npos) << wrong.status().message();
  auto reg = c->RegisterKvCache(mem.Layout("int8"));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const auto keys = testing::SeededKeys(*c, 3, 3);
  const auto src = PagesFrom(0, 3), dst = PagesFrom(30, 3);
  // f16 values around 1 with a few larger ones.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t p : src) {
        auto* h = reinterpret_cast<_Float16*>(mem.Page(l, kv, p));
        for (uint64_t i = 0; i < kPageBytes / 2; ++i) h[i] = static_cast<_Float16>(normal(rng));
      }
    }
  }
  ASSERT_EQ(*c->StoreFromCache(*reg, keys, src), 3u);
  auto hit = c->Lookup(keys, {.lease = true});
  ASSERT_EQ(hit->hit_blocks, 3u);
  ASSERT_EQ(*c->LoadIntoCache(*reg, hit->lease, keys, dst), 3u);
  // Each value within half a step of its group's scale (max |x| / 127),
  // plus f16 rounding: the largest |x| here is below 6, so 6/254 + slack.
  double worst = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < src.size(); ++i) {
        auto* a = reinterpret_cast<const _Float16*>(mem.Page(l, kv, src[i]));
        auto* b = reinterpret_cast<const _Float16*>(mem.Page(l, kv, dst[i]));
        for (uint64_t e = 0; e < kPageBytes / 2; ++e) {
          worst = std::max(worst, std::fabs(double(a[e]) - double(b[e])));
        }
      }
    }
  }
  EXPECT_GT(worst, 0.0) << "INT8 is lossy";
  EXPECT_LT(worst, 6.0 / 254 + 0.01);
  ASSERT_TRUE(c->Release(hit->lease).ok());
}

TEST(DeviceE2eOneOffTest, BadRegistrationsAndRequestsAreRefusedWithTheReason) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = testing::AttachTo(d.socket_path(), Ns());
  ASSERT_NE(c, nullptr);
  EngineMemory mem;
  auto expect_refused = [&](KvCacheLayout l, const char* needle) {
    auto r = c->RegisterKvCache(l);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  KvCacheLayout outside = mem.Layout();
  outside.v_layers[3] = mem.base + mem.bytes - kPageBytes;  // its pages run past the region
  expect_refused(outside, "no registered memory region");
  KvCacheLayout short_region = mem.Layout();
  short_region.regions[0].bytes = mem.bytes * 2;  // more than the memfd holds
  expect_refused(short_region, "memfd holds");
  KvCacheLayout odd_page = mem.Layout();
  odd_page.page_tokens = 3;
  expect_refused(odd_page, "whole number");
  KvCacheLayout fp8_int8 = mem.Layout("int8");
  fp8_int8.dtype = "fp8_e4m3";
  expect_refused(fp8_int8, "quantizes");
  KvCacheLayout bad_dtype = mem.Layout();
  bad_dtype.dtype = "fp4";
  expect_refused(bad_dtype, "fp4");
  {
    const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_EQ(ftruncate(unsealed, static_cast<off_t>(mem.bytes)), 0);
    KvCacheLayout l = mem.Layout();
    l.regions[0].memfd = unsealed;  // the engine could shrink it under the daemon
    expect_refused(l, "sealed");
    close(unsealed);
  }
  KvCacheLayout cuda = mem.Layout();
  cuda.regions[0].memfd = -1;  // claims CUDA memory
  auto r = c->RegisterKvCache(cuda);
  EXPECT_FALSE(r.ok());
  // The session still works, and a good registration succeeds after them.
  auto reg = c->RegisterKvCache(mem.Layout());
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const auto keys = testing::SeededKeys(*c, 4, 2);
  std::vector<uint32_t> past = PagesFrom(kPages - 2, 2);  // runs past the cache's pages
  EXPECT_EQ(c->StoreFromCache(*reg, keys, past).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->StoreFromCache(*reg, keys, std::span(past).first(3)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->StoreFromCache(999, keys, PagesFrom(0, 2)).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(*c->StoreFromCache(*reg, keys, PagesFrom(0, 2)), 2u);
  auto s = d.Status();
  // Three reach the daemon (outside, memfd size, unsealed); the client catches the rest.
  EXPECT_EQ((*s)["stats"]["kv_registrations_refused"].get<int>(), 3);
  EXPECT_EQ((*s)["stats"]["kv_registrations"].get<int>(), 1);
}

// Several engines store and load through their caches at once, into a host
// tier too small for all of them (evictions race the device copies): every
// block that loads carries its own bytes.
TEST(DeviceE2eOneOffTest, ConcurrentEnginesEachGetTheirOwnBytesBack) {
  DaemonProcess d("device = \"sim\"\n[tiers.host]\ncapacity = \"1MiB\"\n");  // 128 blocks
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  constexpr int kEngines = 3, kRounds = 40;
  std::atomic<int> wrong{0}, loaded{0}, errors{0};
  std::vector<std::thread> engines;
  for (int e = 0; e < kEngines; ++e) {
    engines.emplace_back([&, e] {
      auto c = testing::AttachTo(d.socket_path(), Ns());
      if (!c) {
        ++errors;
        return;
      }
      EngineMemory mem;
      auto reg = c->RegisterKvCache(mem.Layout());
      if (!reg.ok()) {
        ++errors;
        return;
      }
      for (int r = 0; r < kRounds; ++r) {
        const auto keys = testing::SeededKeys(*c, 1000 * (e + 1) + r % 20, 4);
        const auto src = PagesFrom(0, 4), dst = PagesFrom(50, 4);
        FillPages(mem, src, 1000 * (e + 1) + r % 20);  // the same bytes for the same keys
        if (!c->StoreFromCache(*reg, keys, src).ok()) ++errors;
        auto hit = c->Lookup(keys, {.lease = true});
        if (!hit.ok()) {
          ++errors;
          continue;
        }
        if (hit->hit_blocks > 0) {
          auto n = c->LoadIntoCache(*reg, hit->lease, std::span(keys).first(hit->hit_blocks),
                                    std::span(dst).first(hit->hit_blocks * kPpb));
          if (!n.ok()) {
            ++errors;
          } else {
            loaded += *n;
            if (!SamePages(mem, std::span(src).first(*n * kPpb), std::span(dst).first(*n * kPpb), kLayers)) ++wrong;
          }
          (void)c->Release(hit->lease);
        }
      }
    });
  }
  for (auto& t : engines) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(loaded.load(), kEngines * kRounds);
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_GT((*s)["stats"]["evictions"].get<int>(), 0) << "the tier was meant to overflow";
  EXPECT_EQ((*s)["stats"]["device_errors"].get<int>(), 0);
}

TEST(DeviceE2eOneOffTest, AnEngineKilledMidLoadLeavesADaemonThatServesTheNext) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t engine = fork();
  if (engine == 0) {
    auto c = testing::AttachTo(d.socket_path(), Ns());
    EngineMemory mem;
    auto reg = c ? c->RegisterKvCache(mem.Layout()) : Result<uint64_t>(Status(ErrorCode::kIo, "attach"));
    if (!reg.ok()) _exit(2);
    const auto keys = testing::SeededKeys(*c, 9, 6);
    FillPages(mem, PagesFrom(0, 6), 99);
    if (*c->StoreFromCache(*reg, keys, PagesFrom(0, 6)) != 6) _exit(3);
    (void)!write(ready[1], "y", 1);
    // Load over and over until killed.
    for (;;) {
      auto hit = c->Lookup(keys, {.lease = true});
      if (!hit.ok() || !c->LoadIntoCache(*reg, hit->lease, keys, PagesFrom(40, 6)).ok()) _exit(4);
      (void)c->Release(hit->lease);
    }
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(engine, SIGKILL);
  int st;
  waitpid(engine, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the engine ran into an error instead: exit " << WEXITSTATUS(st);
  // The daemon dropped the dead session (its leases and its registration)...
  EXPECT_TRUE(testing::Eventually([&] {
    auto s = d.Status();
    return s.ok() && (*s)["sessions"].size() == 0;
  })) << d.Status()->dump();
  // ...and a new engine reuses what the first one stored, into its own cache.
  auto c = testing::AttachTo(d.socket_path(), Ns());
  ASSERT_NE(c, nullptr);
  EngineMemory mem;
  FillPages(mem, PagesFrom(0, 6), 99);  // what the first engine had, to compare with
  auto reg = c->RegisterKvCache(mem.Layout());
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const auto keys = testing::SeededKeys(*c, 9, 6);
  auto hit = c->Lookup(keys, {.lease = true});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->hit_blocks, 6u);
  ASSERT_EQ(*c->LoadIntoCache(*reg, hit->lease, keys, PagesFrom(40, 6)), 6u);
  EXPECT_TRUE(SamePages(mem, PagesFrom(0, 6), PagesFrom(40, 6), kLayers));
  ASSERT_TRUE(c->Release(hit->lease).ok());
}

}  // namespace
}  // namespace kvtier
