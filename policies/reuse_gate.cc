// SPDX-License-Identifier: Apache-2.0
#include "policies/reuse_gate.h"

#include <algorithm>
#include <bit>

namespace kvtier {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

}  // namespace

ReuseGate::ReuseGate(uint32_t min_uses, uint64_t counters) : min_uses_(min_uses) {
  if (min_uses_ <= 1) return;
  words_ = std::bit_ceil(std::max<uint64_t>(counters, 1024) / 16);
  table_ = std::make_unique<std::atomic<uint64_t>[]>(words_);
  for (uint64_t i = 0; i < words_; ++i) table_[i].store(0, std::memory_order_relaxed);
  // Each use adds to four counters: after counters / 8 uses of distinct
  // blocks a counter holds 0.5 on average, and a block asked for once has
  // all four of its counters at 2 or more with a chance of ~1e-4.
  reset_every_ = words_ * 16 / 8;
}

void ReuseGate::Positions(uint64_t key, uint64_t (&word)[4], uint32_t (&shift)[4]) const {
  uint64_t h = Mix(key);
  for (int i = 0; i < 4; ++i) {
    const uint64_t g = Mix(h + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    word[i] = g & (words_ - 1);
    shift[i] = static_cast<uint32_t>((g >> 58) & 15) * 4;
  }
}

void ReuseGate::Record(uint64_t key) {
  if (!enabled()) return;
  uint64_t word[4];
  uint32_t shift[4];
  Positions(key, word, shift);
  for (int i = 0; i < 4; ++i) {
    std::atomic<uint64_t>& w = table_[word[i]];
    uint64_t v = w.load(std::memory_order_relaxed);
    while (((v >> shift[i]) & 15) < 15 &&
           !w.compare_exchange_weak(v, v + (uint64_t{1} << shift[i]), std::memory_order_relaxed)) {
    }
  }
  if (uses_.fetch_add(1, std::memory_order_relaxed) + 1 == reset_every_) {
    uses_.store(0, std::memory_order_relaxed);
    Halve();
  }
}

uint32_t ReuseGate::Estimate(uint64_t key) const {
  if (!enabled()) return 0;
  uint64_t word[4];
  uint32_t shift[4];
  Positions(key, word, shift);
  uint32_t est = 15;
  for (int i = 0; i < 4; ++i) {
    est = std::min(est, static_cast<uint32_t>((table_[word[i]].load(std::memory_order_relaxed) >> shift[i]) & 15));
  }
  return est;
}

void ReuseGate::Halve() {
  // Every 4-bit field halved at once: shift the word right by one and clear
  // the bit each field took from its neighbour.
  constexpr uint64_t kKeep = 0x7777777777777777ull;
  for (uint64_t i = 0; i < words_; ++i) {
    uint64_t v = table_[i].load(std::memory_order_relaxed);
    while (!table_[i].compare_exchange_weak(v, (v >> 1) & kKeep, std::memory_order_relaxed)) {
    }
  }
}

}  // namespace kvtier
