// SPDX-License-Identifier: Apache-2.0
#include "daemon/heap_trim.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/units.h"

namespace kvtier {

std::optional<uint64_t> HeapTrimmer::MaybeTrim(uint64_t now_ns, uint64_t freed_total, uint64_t indexed) {
  // freed_total only grows (counters), so the difference cannot wrap.
  if (!Due(freed_total - freed_at_last_, indexed) || (trimmed_ && now_ns - last_ns_ < kMinIntervalNs)) return std::nullopt;
#if defined(__GLIBC__)
  freed_at_last_ = freed_total;
  last_ns_ = now_ns;
  const uint64_t t0 = MonotonicNanos();
  (void)malloc_trim(0);
  trimmed_ = true;
  return MonotonicNanos() - t0;
#else
  return std::nullopt;
#endif
}

}  // namespace kvtier
