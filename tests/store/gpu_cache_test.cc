// SPDX-License-Identifier: Apache-2.0
// The GPU tier's block cache: reserve, publish, pin, least recently used
// out, pinned copies never evicted, drops that wait for the last pin.
#include "store/gpu_cache.h"

#include <cstring>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

BlockKey K(uint64_t i) {
  BlockKey k{};
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  return k;
}

class GpuCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = MakeSimDevice();
    auto tier = GpuTier::Create(dev_.get(), {4 * 4096});  // four 4 KiB slots
    ASSERT_TRUE(tier.ok());
    cache_ = std::make_unique<GpuCache>(std::move(*tier));
  }
  // Reserve + publish + release: a resident, unpinned copy.
  bool Put(uint64_t i, uint32_t ns = 1) {
    auto pin = cache_->Reserve(ns, K(i), 4096);
    if (!pin) return false;
    std::memset(pin->data, static_cast<int>(i), 4096);
    cache_->Publish(ns, K(i));
    cache_->Release(ns, K(i));
    return true;
  }
  std::unique_ptr<DeviceBackend> dev_;
  std::unique_ptr<GpuCache> cache_;
};

TEST_F(GpuCacheTest, ReservedCopiesAreInvisibleUntilPublished) {
  auto pin = cache_->Reserve(1, K(1), 4096);
  ASSERT_TRUE(pin.has_value());
  EXPECT_FALSE(cache_->Contains(1, K(1)));
  EXPECT_FALSE(cache_->Acquire(1, K(1)).has_value());
  EXPECT_FALSE(cache_->Reserve(1, K(1), 4096).has_value()) << "one copy per block";
  cache_->Publish(1, K(1));
  cache_->Release(1, K(1));
  EXPECT_TRUE(cache_->Contains(1, K(1)));
  EXPECT_FALSE(cache_->Contains(2, K(1))) << "namespaces apart";
  auto a = cache_->Acquire(1, K(1));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->data, pin->data);
  cache_->Release(1, K(1));
  // A reservation given up without publishing frees its slot.
  ASSERT_TRUE(cache_->Reserve(1, K(2), 4096).has_value());
  cache_->Release(1, K(2));
  EXPECT_FALSE(cache_->Contains(1, K(2)));
  EXPECT_EQ(cache_->usage().blocks, 1u);
  EXPECT_EQ(cache_->usage().used_bytes, 4096u);
}

TEST_F(GpuCacheTest, LeastRecentlyUsedGoesFirstAndPinnedCopiesStay) {
  for (uint64_t i = 1; i <= 4; ++i) ASSERT_TRUE(Put(i));
  // Touch 1, pin 2: the next block evicts 3 (the coldest unpinned).
  ASSERT_TRUE(cache_->Acquire(1, K(1)).has_value());
  cache_->Release(1, K(1));
  ASSERT_TRUE(cache_->Acquire(1, K(2)).has_value());
  ASSERT_TRUE(Put(5));
  EXPECT_TRUE(cache_->Contains(1, K(1)));
  EXPECT_TRUE(cache_->Contains(1, K(2)));
  EXPECT_FALSE(cache_->Contains(1, K(3)));
  EXPECT_TRUE(cache_->Contains(1, K(4)));
  EXPECT_EQ(cache_->usage().evictions, 1u);
  // With every copy pinned nothing can be reserved.
  for (uint64_t i : {1, 4, 5}) ASSERT_TRUE(cache_->Acquire(1, K(i)).has_value());
  EXPECT_FALSE(cache_->Reserve(1, K(6), 4096).has_value());
  EXPECT_EQ(cache_->usage().pinned, 4u);
  for (uint64_t i : {1, 2, 4, 5}) cache_->Release(1, K(i));
  EXPECT_TRUE(cache_->Reserve(1, K(6), 4096).has_value());
}

TEST_F(GpuCacheTest, DropsWaitForTheLastPin) {
  ASSERT_TRUE(Put(1));
  ASSERT_TRUE(Put(2, /*ns=*/2));
  auto a = cache_->Acquire(1, K(1));
  ASSERT_TRUE(a.has_value());
  cache_->Drop(1, K(1));
  EXPECT_FALSE(cache_->Contains(1, K(1))) << "invisible at once";
  EXPECT_EQ(cache_->usage().used_bytes, 2u * 4096) << "but its slot stays while pinned";
  cache_->Release(1, K(1));
  EXPECT_EQ(cache_->usage().used_bytes, 4096u);
  cache_->DropNamespace(2);
  EXPECT_FALSE(cache_->Contains(2, K(2)));
  EXPECT_EQ(cache_->usage().used_bytes, 0u);
}

}  // namespace
}  // namespace kvtier
