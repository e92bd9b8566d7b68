// SPDX-License-Identifier: Apache-2.0
// Faults for tests, injected below the NVMe tier's checks so they exercise
// the real recovery paths: errors, a full device, torn writes, bit flips in
// what is written or read, a slow device. Switches are atomics a test flips
// while I/O runs (as LevelDB's SpecialEnv and RocksDB's FaultInjectionTestFS).
#ifndef KVTIER_TIERS_FAULT_INJECTION_H_
#define KVTIER_TIERS_FAULT_INJECTION_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "tiers/io_engine.h"

namespace kvtier {

struct IoFaults {
  std::atomic<int> read_errno{0};     // reads fail with -read_errno
  std::atomic<int> write_errno{0};    // writes fail with -write_errno (ENOSPC, EIO)
  std::atomic<bool> torn_writes{false};  // write the first half only, report all written
  // Flip this bit (counted from the op's first byte) in data written / read.
  std::atomic<int64_t> flip_write_bit{-1};
  std::atomic<int64_t> flip_read_bit{-1};
  std::atomic<uint32_t> delay_us{0};  // before each completion
  // Ops left to fault (decremented per faulted op); reads and writes share it.
  std::atomic<int64_t> budget{INT64_MAX};
  std::atomic<uint64_t> injected{0};   // faults delivered

  void Clear() {
    read_errno = 0;
    write_errno = 0;
    torn_writes = false;
    flip_write_bit = -1;
    flip_read_bit = -1;
    delay_us = 0;
    budget = INT64_MAX;
  }
};

std::unique_ptr<IoEngine> MakeFaultInjectingEngine(std::unique_ptr<IoEngine> target,
                                                   std::shared_ptr<IoFaults> faults);

}  // namespace kvtier

#endif  // KVTIER_TIERS_FAULT_INJECTION_H_
