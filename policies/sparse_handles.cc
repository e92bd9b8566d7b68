// SPDX-License-Identifier: Apache-2.0
// Any policy over sparse handles (the NVMe tier's segment<<16|slot): the
// adapter maps each tracked handle to a dense one (reused after Remove), so
// policies that keep per-handle arrays stay a few words per tracked block
// however large the handle space.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

class SparseHandleAdapter final : public EvictionPolicy {
 public:
  explicit SparseHandleAdapter(std::unique_ptr<EvictionPolicy> dense) : dense_(std::move(dense)) {}

  void Insert(uint32_t h) override { InsertAt(h, 0, 0); }
  void InsertWithKey(uint32_t h, uint64_t key) override { InsertAt(h, key, 0); }
  void InsertAt(uint32_t h, uint64_t key, uint64_t position) override {
    auto [it, fresh] = dense_of_.try_emplace(h, 0);
    if (fresh) {
      if (!free_.empty()) {
        it->second = free_.back();
        free_.pop_back();
      } else {
        it->second = static_cast<uint32_t>(sparse_of_.size());
        sparse_of_.push_back(0);
      }
      sparse_of_[it->second] = h;
    }
    dense_->InsertAt(it->second, key, position);
  }
  void Touch(uint32_t h) override {
    if (auto it = dense_of_.find(h); it != dense_of_.end()) dense_->Touch(it->second);
  }
  void Remove(uint32_t h) override {
    auto it = dense_of_.find(h);
    if (it == dense_of_.end()) return;
    dense_->Remove(it->second);
    free_.push_back(it->second);
    dense_of_.erase(it);
  }
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    std::optional<uint32_t> v = dense_->PickVictim([&](uint32_t d) { return evictable(sparse_of_[d]); });
    if (!v) return v;
    return sparse_of_[*v];
  }
  bool WantsOnlyEvictableOffers() const override { return dense_->WantsOnlyEvictableOffers(); }
  bool Contains(uint32_t h) const override { return dense_of_.contains(h); }
  size_t size() const override { return dense_->size(); }
  size_t bookkeeping() const override { return dense_->bookkeeping() + dense_of_.size() + free_.size(); }
  absl::string_view name() const override { return dense_->name(); }
  bool ObservesRequests() const override { return dense_->ObservesRequests(); }
  void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths, uint32_t block_tokens,
                      size_t held) override {
    dense_->ObserveRequest(chain, depths, block_tokens, held);  // keys, not handles
  }

 private:
  std::unique_ptr<EvictionPolicy> dense_;
  absl::flat_hash_map<uint32_t, uint32_t> dense_of_;
  std::vector<uint32_t> sparse_of_;  // by dense handle
  std::vector<uint32_t> free_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeSparseHandlePolicy(std::unique_ptr<EvictionPolicy> dense) {
  return std::make_unique<SparseHandleAdapter>(std::move(dense));
}

}  // namespace kvtier
