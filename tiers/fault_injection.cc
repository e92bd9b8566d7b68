// SPDX-License-Identifier: Apache-2.0
#include "tiers/fault_injection.h"

#include <algorithm>
#include <thread>

namespace kvtier {
namespace {

class FaultInjectingEngine final : public IoEngine {
 public:
  FaultInjectingEngine(std::unique_ptr<IoEngine> target, std::shared_ptr<IoFaults> faults)
      : target_(std::move(target)), faults_(std::move(faults)) {}

  std::string name() const override { return target_->name() + " + faults"; }
  void Drain() override { target_->Drain(); }
  IoEngineStats Stats() const override { return target_->Stats(); }

  void Submit(IoOp op) override {
    IoFaults& f = *faults_;
    const int err = op.write ? f.write_errno.load() : f.read_errno.load();
    if (err != 0 && Take()) {
      std::move(op.done)(-err);
      return;
    }
    const uint32_t full_len = op.len + op.tail_len;
    if (op.write) {
      const int64_t bit = f.flip_write_bit.load();
      if (bit >= 0 && static_cast<uint64_t>(bit / 8) < op.len && Take()) {
        op.buf[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      }
      if (f.torn_writes.load() && full_len >= 8192 && Take()) {
        // Half, still sector aligned: drop the tail, cut the head.
        const uint32_t half = full_len / 2 / 4096 * 4096;
        op.tail = nullptr;
        op.tail_len = 0;
        op.len = std::min(op.len, half);
      }
    }
    // A read's bit flip is decided here, in submission order, so a test that
    // budgets one flip knows which op gets it whatever order completions take.
    bool flip_this_read = false;
    if (!op.write) {
      const int64_t bit = f.flip_read_bit.load();
      flip_this_read = bit >= 0 && bit / 8 < full_len && Take();
    }
    auto done = std::move(op.done);
    std::byte* buf = op.buf;
    std::byte* tail = op.tail;
    const int64_t head_len = op.len;
    const bool is_read = !op.write;
    const int64_t read_bit = f.flip_read_bit.load();
    IoTiming* timing = op.timing;
    op.done = [this, done = std::move(done), full_len, buf, tail, head_len, is_read, flip_this_read, read_bit,
               timing](int32_t res) mutable {
      IoFaults& f = *faults_;
      if (const uint32_t d = f.delay_us.load(); d > 0) {
        // A slow device: the delay is the device's time, not a queue's.
        std::this_thread::sleep_for(std::chrono::microseconds(d));
        if (timing != nullptr) timing->service_ns += uint64_t{d} * 1000;
      }
      if (is_read && flip_this_read && res > 0) {
        // Bit offsets count from the op's first byte, across both buffers.
        const int64_t bit = read_bit;
        if (bit / 8 < res) {
          const int64_t byte = bit / 8;
          std::byte* at = byte < head_len ? buf + byte : tail + (byte - head_len);
          *at ^= static_cast<std::byte>(1u << (bit % 8));
        }
      }
      // A torn write claims success for everything it was given.
      std::move(done)(res >= 0 && !is_read ? static_cast<int32_t>(full_len) : res);
    };
    target_->Submit(std::move(op));
  }

 private:
  // Spends one unit of the fault budget; false when it is exhausted.
  bool Take() {
    if (faults_->budget.fetch_sub(1) <= 0) {
      faults_->budget.fetch_add(1);
      return false;
    }
    faults_->injected.fetch_add(1);
    return true;
  }

  std::unique_ptr<IoEngine> target_;
  std::shared_ptr<IoFaults> faults_;
};

}  // namespace

std::unique_ptr<IoEngine> MakeFaultInjectingEngine(std::unique_ptr<IoEngine> target,
                                                   std::shared_ptr<IoFaults> faults) {
  return std::make_unique<FaultInjectingEngine>(std::move(target), std::move(faults));
}

}  // namespace kvtier
