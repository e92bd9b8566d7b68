// SPDX-License-Identifier: Apache-2.0
// Request records as a hostile client writes them: the input is a sequence
// of 64-byte records plus bytes for the scratch region, pushed through a live
// session (its own thread, the real BlockStore). The session must answer or
// close, never crash, hang or touch memory outside its segment.
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "store/block_store.h"
#include "daemon/session.h"
#include "os/futex.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/support/test_support.h"

namespace {

using namespace kvtier;

struct World {
  DaemonStats stats;
  std::unique_ptr<BlockStore> cache;
  World() {
    cache = std::move(BlockStore::Create({.max_leases_per_session = 64}, &stats)).value();
    (void)cache->AddTenant("t", std::move(HostTier::Create({"fuzz", 64 * 4096, false})).value());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();
  constexpr size_t kRec = sizeof(ipc::RequestRecord);
  auto seg = ipc::SessionSegment::Create(1, ipc::SegmentOptions{16, 16, 65536, 64});
  if (!seg.ok()) return 0;
  // The first 1 KiB of input seeds the scratch region (keys, garbage).
  const size_t scratch_seed = std::min<size_t>(size, 1024);
  std::memcpy(seg->scratch().data(), data, scratch_seed);
  auto sq = seg->ClientSq();
  auto cq = seg->ClientCq();
  ipc::SegmentHeader* h = seg->header();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  UniqueFd peer(sv[1]);
  NamespaceInfo ns;
  ns.block_bytes = 4096;
  ns.block_tokens = 16;
  Session session(SessionIdentity{1, {}, "fuzz", 0}, ns, "t", std::move(*seg), UniqueFd(sv[0]),
                  world->cache.get(), &world->stats, SessionOptions{0}, nullptr);
  session.Start();
  size_t pushed = 0, answered = 0;
  ipc::CompletionRecord c;
  for (size_t off = scratch_seed; off + kRec <= size && pushed < 64; off += kRec) {
    ipc::RequestRecord r;
    std::memcpy(&r, data + off, kRec);
    r.opcode = static_cast<uint16_t>(r.opcode % 12);  // mostly known opcodes, some not
    while (!sq.TryPush(r)) {
      if (session.finished()) break;
      while (cq.TryPop(&c) == ipc::PopResult::kOk) ++answered;
    }
    if (session.finished()) break;
    ++pushed;
    ipc::RingDaemonDoorbell(h);
  }
  // Wait until every record is answered or the session closed itself.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (answered < pushed && !session.finished()) {
    while (cq.TryPop(&c) == ipc::PopResult::kOk) ++answered;
    if (std::chrono::steady_clock::now() > end) __builtin_trap();  // a hang
    std::this_thread::yield();
  }
  session.Stop(ipc::CloseReason::kShutdown);
  session.Join();
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  // Scratch: 4 keys at offset 0, results at 512. Records: store, commit,
  // lookup with lease, load, release, invalidate.
  std::string scratch(1024, '\0');
  for (int k = 0; k < 4; ++k) {
    const BlockKey key = testing::KeyOf(k);
    std::memcpy(scratch.data() + k * 32, key.bytes.data(), 32);
  }
  auto rec = [](ipc::Opcode op, uint16_t flags, uint32_t count, uint64_t handle) {
    ipc::RequestRecord r{};
    r.op_id = 1;
    r.opcode = static_cast<uint16_t>(op);
    r.flags = flags;
    r.count = count;
    r.handle = handle;
    r.keys_offset = 0;
    r.out_offset = 512;
    r.out_bytes = 256;
    return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
  };
  std::string seq = scratch + rec(ipc::Opcode::kStoreBegin, 0, 4, 0) + rec(ipc::Opcode::kStoreCommit, 0, 0, 1) +
                    rec(ipc::Opcode::kLookup, ipc::kFlagLease, 4, 0) + rec(ipc::Opcode::kLoad, 0, 4, 2) +
                    rec(ipc::Opcode::kRelease, 0, 0, 2) + rec(ipc::Opcode::kInvalidate, 0, 2, 0) +
                    rec(ipc::Opcode::kInvalidateNamespace, 0, 0, 0) + rec(ipc::Opcode::kPing, 0, 0, 0);
  // A request's ask without a lease, then its lease that is not an ask
  // (kvtier.vllm's scheduler and worker), and the combinations refused.
  std::string asks = scratch + rec(ipc::Opcode::kStoreBegin, 0, 4, 0) + rec(ipc::Opcode::kStoreCommit, 0, 0, 1) +
                     rec(ipc::Opcode::kLookup, ipc::kFlagAsk, 4, 0) +
                     rec(ipc::Opcode::kLookup, ipc::kFlagLease | ipc::kFlagNotAsk, 4, 0) +
                     rec(ipc::Opcode::kLoad, 0, 4, 2) + rec(ipc::Opcode::kRelease, 0, 0, 2) +
                     rec(ipc::Opcode::kLookup, ipc::kFlagNotAsk, 4, 0) +
                     rec(ipc::Opcode::kLookup, ipc::kFlagAsk | ipc::kFlagNotAsk | ipc::kFlagLease, 4, 0) +
                     rec(ipc::Opcode::kStoreBegin, 0, 4, 0);
  return {seq, scratch + rec(ipc::Opcode::kLookup, 0, 4, 0), asks};
}

long FuzzDefaultIterations() { return 3000; }
