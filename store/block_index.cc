// SPDX-License-Identifier: Apache-2.0
#include "store/block_index.h"

#include <sanitizer/asan_interface.h>

#include <new>

namespace kvtier {

BlockRecord* RecordPool::New() {
  void* cell;
  if (!free_.empty()) {
    cell = free_.back();
    free_.pop_back();
    ASAN_UNPOISON_MEMORY_REGION(cell, sizeof(BlockRecord));
  } else {
    if (carved_ == kChunkRecords) {
      // Not value-initialised: a chunk's pages cost memory once records use them.
      chunks_.push_back(std::make_unique_for_overwrite<Cell[]>(kChunkRecords));
      carved_ = 0;
    }
    cell = &chunks_.back()[carved_++];
  }
  ++live_;
  return new (cell) BlockRecord{};
}

void RecordPool::Delete(BlockRecord* r) {
  r->~BlockRecord();
  ASAN_POISON_MEMORY_REGION(r, sizeof(BlockRecord));
  free_.push_back(r);
  --live_;
}

}  // namespace kvtier
