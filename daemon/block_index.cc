#include "daemon/block_index.h"

namespace kvtier {

BlockIndex::~BlockIndex() {
  for (Shard& s : shards_) {
    MutexLock l(&s.mu);
    for (BlockRecord* r : s.set) delete r;
    s.set.clear();
  }
}

}  // namespace kvtier
