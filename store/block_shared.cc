// SPDX-License-Identifier: Apache-2.0
// A session's side of the shared tiers (tiers.remote, tiers.fs): starting a
// lookup's probe past its local hit prefix without waiting for it, and what
// follows a reply (the lookup's uses, the write policy's publishes, the
// adaptive policy's shadows). The probe, adoption and publishes themselves
// are SharedTiers' (shared_tiers.h); moves down the chain the migrator's.
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>

#include "core/units.h"
#include "store/block_store.h"
#include "policies/adaptive_policy.h"

namespace kvtier {

bool BlockStore::StartSharedProbe(SessionHoldings& s, std::span<const BlockKey> keys,
                                  absl::AnyInvocable<void(SharedAnswer) &&> answered,
                                  std::function<SharedAnswer()>* so_far) {
  if (shared_.empty() || shared_.budget_us() == 0) return false;
  // Where the local tiers end the prefix, without pinning anything: the
  // lookup that follows the answer probes (and pins) again.
  std::vector<BlockLocation> scratch(keys.size());
  const ChainHits h = ProbeChain(s, keys, /*lease=*/false, scratch);
  if (h.cut_for_cost || h.hit >= keys.size()) return false;
  const size_t from = h.hit;
  const size_t n = shared_.ProbeBlocks(s, keys, from);
  if (n == 0) return false;
  const uint32_t budget_us = shared_.budget_us();
  const uint64_t start = MonotonicNanos();
  std::atomic<uint32_t>* busy = &books_.tenants[s.ns.tenant]->shared_probes;
  DaemonStats* stats = books_.stats;
  std::function<std::vector<uint8_t>()> holders = shared_.Ask(
      s, keys, from, n, start + uint64_t{budget_us} * 1000,
                 [busy, stats, start, budget_us, from, answered = std::move(answered)](std::vector<uint8_t> holder) mutable {
                   busy->fetch_sub(1, std::memory_order_relaxed);
                   const uint64_t took = MonotonicNanos() - start;
                   stats->remote_probe_latency.Record(took);
                   // Past the budget it counts as late; what it did confirm
                   // is still true (a tier answers "absent" for what it
                   // could not check in time).
                   if (took > uint64_t{budget_us} * 1000) stats->remote_probes_late.Add();
                   std::move(answered)(SharedAnswer{.from = from, .holder = std::move(holder)});
                 });
  if (so_far != nullptr) {
    *so_far = [holders = std::move(holders), from] { return SharedAnswer{.from = from, .holder = holders()}; };
  }
  return true;
}

void BlockStore::AfterReply(SessionHoldings& s) {
  // The lookup's uses count before its publishes ask the shared tier's gate.
  const bool observe = s.observe_pending;
  s.observe_pending = false;
  if (s.uses_pending) {
    s.uses_pending = false;
    for (uint64_t k : s.last_chain) books_.reuse->Record(k);
  }
  shared_.StartPublishes(s);
  if (!observe) return;
  HostResidency& t = *books_.tenants[s.ns.tenant];
  AdaptivePolicy* a;
  {
    // Policies live as long as the cache: the pointer outlives the lock.
    MutexLock l(&t.mu);
    ChainGuard* g = t.PolicyForLocked(t.host->SlotSizeFor(s.ns.block_bytes));
    // The holds policy's plan and deadlines (alone, or as an adaptive
    // expert) are the tier's: its lock.
    if (g->ObservesRequests()) g->ObserveRequest(s.ask_chain, {}, s.ns.block_tokens, s.ask_held);
    if (!adaptive_) return;
    a = static_cast<AdaptivePolicy*>(g->inner());
  }
  a->Observe(s.ask_chain, s.ns.block_tokens);  // on the shadows' own lock, not the tier's
}

}  // namespace kvtier
