// SPDX-License-Identifier: Apache-2.0
// A policy behind the sparse-handle adapter decides exactly as the same
// policy over dense handles: same victims, in the same order, for the same
// random operations, whatever the handles look like.
#include <algorithm>
#include <map>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

class SparseHandlesTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SparseHandlesTest, DecidesAsTheDensePolicyDoes) {
  auto dense = std::move(MakeEvictionPolicy(GetParam())).value();
  auto sparse = MakeSparseHandlePolicy(std::move(MakeEvictionPolicy(GetParam())).value());
  EXPECT_EQ(sparse->name(), dense->name());
  // NVMe-style handles: segment << 16 | slot, far apart.
  auto to_sparse = [](uint32_t d) { return ((d * 2654435761u) % 40000u) << 16 | (d % 997u); };
  std::map<uint32_t, uint32_t> back;  // sparse -> dense
  for (uint32_t d = 0; d < 400; ++d) ASSERT_TRUE(back.emplace(to_sparse(d), d).second) << "handles must be distinct";
  std::mt19937 rng(7);
  std::vector<uint8_t> in(400, 0);
  uint32_t victims = 0;
  for (int op = 0; op < 20000; ++op) {
    const uint32_t d = rng() % 400;
    switch (rng() % 4) {
      case 0:
      case 1:
        if (!in[d]) {
          dense->InsertAt(d, d + 1, (d % 7) * 4096);
          sparse->InsertAt(to_sparse(d), d + 1, (d % 7) * 4096);
          in[d] = 1;
        } else {
          dense->Touch(d);
          sparse->Touch(to_sparse(d));
        }
        break;
      case 2: {
        auto dv = dense->PickVictim([&](uint32_t h) { return h % 5 != 0; });  // some blocks are pinned
        auto sv = sparse->PickVictim([&](uint32_t h) { return back.at(h) % 5 != 0; });
        ASSERT_EQ(dv.has_value(), sv.has_value());
        if (dv) {
          ASSERT_EQ(back.at(*sv), *dv) << "at operation " << op;
          dense->Remove(*dv);
          sparse->Remove(*sv);
          in[*dv] = 0;
          ++victims;
        }
        break;
      }
      case 3:
        dense->Remove(d);
        sparse->Remove(to_sparse(d));
        in[d] = 0;
        break;
    }
    ASSERT_EQ(sparse->size(), dense->size());
    ASSERT_EQ(sparse->Contains(to_sparse(d)), dense->Contains(d));
  }
  EXPECT_GT(victims, 1000u);
}

INSTANTIATE_TEST_SUITE_P(Policies, SparseHandlesTest, ::testing::Values("lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc"),
                         [](const auto& info) {
                           std::string n(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace kvtier
