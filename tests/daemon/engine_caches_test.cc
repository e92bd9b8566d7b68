// SPDX-License-Identifier: Apache-2.0
// EngineCaches::Register is where an engine's numbers (page counts, strides,
// addresses, region sizes) become addresses the daemon's kernels write
// through: a geometry that overflows 64 bits must be refused, and every
// geometry it accepts must keep every page of every layer inside the
// engine's own registered memory.
#include "daemon/engine_caches.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>

#include "gtest/gtest.h"
#include "kernels/kv_layout.h"

namespace kvtier {
namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8, kBlockTokens = 16;
constexpr uint64_t kBlockBytes = uint64_t{kLayers} * 2 * kBlockTokens * kHeads * kDim * 2;  // f16
constexpr uint64_t kEngineBase = 0x7f0000000000;  // the engine's address of its region

class EngineCachesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_.handle = 1;
    ns_.block_tokens = kBlockTokens;
    ns_.block_bytes = kBlockBytes;
    caches_ = std::make_unique<EngineCaches>(device_.get(), ns_);
  }
  // A sparse memfd, sealed against shrinking: costs nothing however large.
  std::vector<UniqueFd> Memfd(uint64_t bytes) {
    const int fd = memfd_create("engine-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    std::vector<UniqueFd> v;
    v.emplace_back(fd);
    return v;
  }
  // Layer l's K pages start at k_off + l * layer_gap into the region (V at v_off + ...).
  static ipc::KvRegisterRequest Request(uint32_t page_tokens, uint64_t num_pages, uint64_t stride,
                                        uint64_t region_bytes, uint64_t k_off, uint64_t v_off,
                                        uint64_t layer_gap = 0) {
    ipc::KvRegisterRequest r;
    r.layers = kLayers;
    r.page_tokens = page_tokens;
    r.kv_heads = kHeads;
    r.head_dim = kDim;
    r.dtype = static_cast<uint8_t>(kernels::KvDtype::kF16);
    r.num_pages = num_pages;
    r.page_stride = stride;
    ipc::KvRegion g;
    g.kind = ipc::KvRegionKind::kHostMemfd;
    g.base = kEngineBase;
    g.bytes = region_bytes;
    r.regions.push_back(g);
    for (uint32_t l = 0; l < kLayers; ++l) {
      r.k_layers.push_back(kEngineBase + k_off + l * layer_gap);
      r.v_layers.push_back(kEngineBase + v_off + l * layer_gap);
    }
    return r;
  }

  std::unique_ptr<DeviceBackend> device_ = MakeSimDevice();
  NamespaceInfo ns_;
  std::unique_ptr<EngineCaches> caches_;
};

TEST_F(EngineCachesTest, AnOrdinaryCacheIsAccepted) {
  const uint64_t page = 4ull * kHeads * kDim * 2;
  auto r = caches_->Register(Request(4, 64, page, 1 << 20, 0, 512 * 1024), Memfd(1 << 20));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layer_events.size(), kLayers);
}

TEST_F(EngineCachesTest, GeometryThatWrapsSixtyFourBitsIsRefused) {
  // (2^32 - 1) * (2^32 + 1) + page_bytes wraps to page_bytes - 2: the old
  // span check saw a tiny cache inside a 1 MiB region, while page 1 already
  // lay 4 GiB past it, in whatever the daemon had mapped there.
  const uint64_t wrap_stride = (uint64_t{1} << 32) + 1;
  auto r = caches_->Register(Request(4, uint64_t{1} << 32, wrap_stride, 1 << 20, 0, 4096), Memfd(1 << 20));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  // Strides near 2^63 with two pages wrap too.
  r = caches_->Register(Request(4, 2, (uint64_t{1} << 63) + 1, 1 << 20, 0, 4096), Memfd(1 << 20));
  EXPECT_FALSE(r.ok());
  r = caches_->Register(Request(4, 3, UINT64_MAX / 2 + 7, 1 << 20, 0, 4096), Memfd(1 << 20));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(caches_->size(), 0u);
}

TEST_F(EngineCachesTest, RandomGeometriesNeverAddressOutsideTheirRegion) {
  // Property: whatever the numbers, a registration that is accepted keeps
  // [base + p * stride, + page_bytes) of every layer, for every valid page
  // id p, inside the registered region, computed here in exact 128-bit
  // arithmetic.
  using u128 = unsigned __int128;
  std::mt19937_64 rng(2026);
  const uint64_t region = uint64_t{1} << 24;
  int accepted = 0;
  auto pick = [&](int max_bits) { return rng() >> (64 - 1 - static_cast<int>(rng() % max_bits)); };
  for (int i = 0; i < 3000; ++i) {
    const uint32_t page_tokens = uint32_t{1} << (rng() % 5);  // 1..16, divides 16
    const uint64_t page_bytes = uint64_t{page_tokens} * kHeads * kDim * 2;
    uint64_t num_pages = rng() % 4 == 0 ? pick(63) : 1 + rng() % 4096;
    uint64_t stride = rng() % 4 == 0 ? pick(63) : page_bytes * (1 + rng() % 4);
    if (rng() % 8 == 0) num_pages = (uint64_t{1} << 32) - rng() % 3;
    if (rng() % 8 == 0) stride = (uint64_t{1} << 32) + rng() % 3;
    if (rng() % 4 == 0) {
      // (num_pages - 1) * stride just past 2^64: the product wraps to a
      // small number, the shape of the attack.
      num_pages = 2 + rng() % (uint64_t{1} << 32);
      stride = static_cast<uint64_t>(((u128{1} << 64) + (num_pages - 2)) / (num_pages - 1)) + rng() % 2;
    }
    const uint64_t k_off = rng() % 2 == 0 ? rng() % region : pick(63);
    const uint64_t v_off = rng() % 2 == 0 ? rng() % region : pick(63);
    const uint64_t gap = rng() % 2 == 0 ? stride : rng() % region;
    const ipc::KvRegisterRequest req = Request(page_tokens, num_pages, stride, region, k_off, v_off, gap);
    auto r = caches_->Register(req, Memfd(region));
    if (!r.ok()) continue;
    ++accepted;
    auto c = caches_->Find(r->id);
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(c->cache.num_pages, num_pages);
    ASSERT_EQ(c->cache.page_stride, stride);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint64_t addr : {req.k_layers[l], req.v_layers[l]}) {
        ASSERT_GE(addr, kEngineBase);
        const uint64_t off = addr - kEngineBase;
        const u128 last_end = u128{off} + u128{num_pages - 1} * stride + page_bytes;
        ASSERT_LE(last_end, u128{region}) << "pages " << num_pages << " stride " << stride << " offset " << off;
      }
    }
    ASSERT_TRUE(caches_->Unregister(r->id).ok());
  }
  EXPECT_GT(accepted, 100) << "the property was checked on too few accepted geometries";
}

}  // namespace
}  // namespace kvtier
