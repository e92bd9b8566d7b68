// SPDX-License-Identifier: Apache-2.0
#include "store/block_index.h"

#include <sanitizer/asan_interface.h>

#include <algorithm>
#include <cassert>
#include <new>

namespace kvtier {

BlockRecord* RecordPool::New() {
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
    ASAN_UNPOISON_MEMORY_REGION(CellAt(id), sizeof(BlockRecord));
  } else {
    if (carved_ == kChunkRecords) {
      const size_t c = chunks_.size();
      std::unique_ptr<Cell*[]>& page = dir_[c >> kDirBits];
      if (page == nullptr) page = std::make_unique<Cell*[]>(size_t{1} << kDirBits);
      // Not value-initialised: a chunk's pages cost memory once records use them.
      chunks_.push_back(std::make_unique_for_overwrite<Cell[]>(kChunkRecords));
      page[c & ((1u << kDirBits) - 1)] = chunks_.back().get();
      const std::pair<uintptr_t, uint32_t> entry{reinterpret_cast<uintptr_t>(chunks_.back().get()),
                                                 static_cast<uint32_t>(c)};
      by_address_.insert(std::upper_bound(by_address_.begin(), by_address_.end(), entry), entry);
      carved_ = 0;
    }
    id = static_cast<uint32_t>(((chunks_.size() - 1) << kChunkBits) + carved_);
    if (id >= limit_ - 1) return nullptr;
    ++carved_;
  }
  ++live_;
  return new (CellAt(id)) BlockRecord{};
}

uint32_t RecordPool::IdOf(const BlockRecord* r) const {
  const auto a = reinterpret_cast<uintptr_t>(r);
  // The last chunk starting at or before r.
  auto it = std::upper_bound(by_address_.begin(), by_address_.end(), a,
                             [](uintptr_t x, const std::pair<uintptr_t, uint32_t>& e) { return x < e.first; });
  assert(it != by_address_.begin());
  --it;
  const uintptr_t cell = (a - it->first) / sizeof(Cell);
  assert(cell < kChunkRecords && (a - it->first) % sizeof(Cell) == 0);
  return (it->second << kChunkBits) + static_cast<uint32_t>(cell);
}

void RecordPool::Delete(BlockRecord* r) {
  const uint32_t id = IdOf(r);
  r->~BlockRecord();
  ASAN_POISON_MEMORY_REGION(r, sizeof(BlockRecord));
  free_.push_back(id);
  --live_;
}

}  // namespace kvtier
