// SPDX-License-Identifier: Apache-2.0
// The shared-memory ABI between libkvtier and kvtierd: segment header, ring
// records and per-block results. Plain data with explicit layout, a magic and
// an ABI version; offsets, never pointers. Any change to a layout here bumps
// kAbiVersion.
//
// Session segment (one memfd per session, created by the daemon, sealed
// against resizing, mapped by both sides):
//
//   [SegmentHeader | request ring (sq) | completion ring (cq) | scratch ]
//
// The client writes request records into sq and the keys/results of each
// operation into the scratch region (it allocates there with
// Boost.Interprocess); the daemon copies what it reads out of shared memory
// before it validates it, and writes only into the result areas a request
// names.
#ifndef KVTIER_IPC_ABI_H_
#define KVTIER_IPC_ABI_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvtier::ipc {

inline constexpr uint64_t kSegmentMagic = 0x3130474553545654ull;  // "TVTSEG01" LE
// 4: event pages and the simulated GPU arena are sealed against writable
// mappings (clients map them read-only); client strings must be printable.
// 5: BlockResult::lane names which lower tier of the chain holds a block.
// 6: lookups say whether they are their request's ask (kFlagAsk, kFlagNotAsk),
// which a v5 kvtierd refuses: a mismatch is named at attach instead.
inline constexpr uint32_t kAbiVersion = 6;

enum class Opcode : uint16_t {
  kPing = 1,
  kLookup = 2,
  kLoad = 3,
  kStoreBegin = 4,
  kStoreCommit = 5,
  kStoreAbort = 6,
  kRelease = 7,
  kInvalidate = 8,
  kInvalidateNamespace = 9,
  kPrefetch = 10,
  kReportPrefill = 11,  // handle = prefill ns; args = {tokens reused, tokens computed}
  // Daemon-driven copies with a registered engine KV cache (ipc/kv_registration.h):
  // args = {scratch offset of the page ids (u32, pages-per-block per key), registration}.
  kStoreDevice = 12,  // StoreBegin + gather from the engine's pages + StoreCommit; count = blocks written
  kLoadDevice = 13,   // handle = lease; Load + scatter into the engine's pages by layer;
                      // DeviceLoadProgress follows the block results
};
inline constexpr uint16_t kMaxOpcode = 13;

// Request flags.
inline constexpr uint16_t kFlagLease = 1;    // kLookup: pin the hit prefix
inline constexpr uint16_t kFlagDurable = 2;  // kStoreCommit: complete once the blocks are on NVMe
// Which lookup is a request's ask: the one the eviction policies and the hit
// counters learn from, once per request. Without either flag a
// leased lookup is its request's ask and an unleased one is not (a probe).
// Engines that probe a request's whole chain first and lease only what they
// will load (kvtier.vllm) flag the probe kFlagAsk and the lease kFlagNotAsk.
inline constexpr uint16_t kFlagAsk = 4;     // kLookup: this lookup is its request's ask
inline constexpr uint16_t kFlagNotAsk = 8;  // kLookup with kFlagLease: pin (its blocks' uses count); no ask

// What each opcode carries, one row per opcode, indexed by its number: the
// daemon checks requests against it, and names its per-opcode metrics and
// latency histograms from it.
struct OpcodeInfo {
  const char* name;           // in status and metric labels; "none" for 0
  bool takes_keys;            // keys in scratch at keys_offset, count of them
  bool returns_blocks;        // one BlockResult per key at out_offset
  bool folds_repeated_keys;   // idempotent: a repeated key counts once (else a repeat is refused)
  uint16_t allowed_flags;
};
inline constexpr OpcodeInfo kOpcodes[] = {
    {"none", false, false, false, 0},
    {"ping", false, false, false, 0},
    {"lookup", true, true, false, kFlagLease | kFlagAsk | kFlagNotAsk},
    {"load", true, true, false, 0},
    {"store_begin", true, true, false, 0},
    {"store_commit", false, false, false, kFlagDurable},
    {"store_abort", false, false, false, 0},
    {"release", false, false, false, 0},
    {"invalidate", true, false, true, 0},
    {"invalidate_namespace", false, false, false, 0},
    {"prefetch", true, false, true, 0},
    {"report_prefill", false, false, false, 0},
    {"store_device", true, true, false, 0},
    {"load_device", true, true, false, 0},
};
static_assert(sizeof(kOpcodes) / sizeof(kOpcodes[0]) == kMaxOpcode + 1, "a row for every opcode");
inline constexpr const OpcodeInfo& InfoOf(Opcode op) { return kOpcodes[static_cast<uint16_t>(op)]; }

// One request (64 bytes). Keys live in scratch at keys_offset (count * 32
// bytes); results go to scratch at out_offset (out_bytes). On failure the
// daemon writes a NUL-terminated message at out_offset instead.
struct RequestRecord {
  uint64_t op_id;
  uint16_t opcode;
  uint16_t flags;
  uint32_t count;        // keys in this request
  uint64_t handle;       // lease id (kLoad, kRelease) or store ticket (commit/abort)
  uint64_t keys_offset;  // scratch-relative
  uint64_t out_offset;   // scratch-relative
  uint64_t out_bytes;
  uint64_t args[2];  // op-specific (kReportPrefill); 0 otherwise
};
static_assert(sizeof(RequestRecord) == 64);
static_assert(std::is_trivially_copyable_v<RequestRecord>);

// One completion (32 bytes).
struct CompletionRecord {
  uint64_t op_id;
  int32_t status;   // 0 or a negative KVTIER_E* code
  uint32_t count;   // kLookup: hit prefix length; kStoreBegin: blocks to fill
  uint64_t handle;  // kLookup: lease id (0 if none); kStoreBegin: ticket
  uint64_t value;   // op-specific (kLookup: blocks after the prefix to recompute)
};
static_assert(sizeof(CompletionRecord) == 32);
static_assert(std::is_trivially_copyable_v<CompletionRecord>);

// Per-key result of kLookup, kLoad and kStoreBegin (24 bytes).
inline constexpr uint8_t kBlockNeeded = 1;     // kStoreBegin: the client must fill this slot
inline constexpr uint8_t kBlockRecompute = 2;  // kLookup: present, but slower to load than to recompute
struct BlockResult {
  uint64_t arena_offset;  // offset of the block's bytes in the tenant's host arena
  // A leased lookup: offset of the block's GPU-tier copy in the tenant's GPU
  // arena, pinned until the lease is released; kNoGpuCopy otherwise.
  uint64_t gpu_offset;
  uint8_t tier;           // kvtier_tier
  uint8_t flags;
  // kLookup, where tier is a lower tier's kind: that tier's position in the
  // daemon's chain (0: the first below host memory: the `lane` of status and
  // metrics); kvtier::kNoLane otherwise.
  uint8_t lane;
  uint8_t pad[5];
};
static_assert(sizeof(BlockResult) == 24);
inline constexpr uint64_t kNoGpuCopy = ~uint64_t{0};

// kLoadDevice progress, in the result area right after the count block
// results (8-byte aligned). The daemon sets `blocks` (the prefix that loaded)
// before the first layer, then bumps layers_done as each layer lands in the
// engine's pages and wakes layers_done's futex; the client reads both with
// acquire. `armed` becomes 1 (with a wake) once the daemon has queued every
// layer and recorded each layer's event (KvRegisterReply::layer_events)
// behind it: from then on a stream wait on layer i's event waits for this
// load's layer i. `failed` is set when the scatter broke off.
struct DeviceLoadProgress {
  std::atomic<uint32_t> blocks;       // kDeviceLoadUnknown until known
  std::atomic<uint32_t> layers_done;
  std::atomic<uint32_t> failed;
  uint32_t layers;
  std::atomic<uint32_t> armed;
  uint32_t reserved[3];
};
static_assert(sizeof(DeviceLoadProgress) == 32);
inline constexpr uint32_t kDeviceLoadUnknown = 0xffffffffu;

inline constexpr size_t kKeyBytes = 32;
inline constexpr size_t kErrorMessageBytes = 256;  // clients reserve this much out space

// Why the daemon closed a session (SegmentHeader::closed).
enum class CloseReason : uint32_t {
  kOpen = 0,
  kProtocolError = 1,  // a malformed record; see the op's completion
  kShutdown = 2,       // the daemon is stopping
  kEvicted = 3,        // an administrator closed it
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct SegmentHeader {
  // Immutable after creation.
  uint64_t magic;
  uint32_t abi_version;
  uint32_t header_bytes;
  uint64_t segment_bytes;
  uint64_t session_id;
  uint64_t sq_offset;
  uint32_t sq_entries;  // power of two
  uint32_t sq_record_bytes;
  uint64_t cq_offset;
  uint32_t cq_entries;  // power of two
  uint32_t cq_record_bytes;
  uint64_t scratch_offset;
  uint64_t scratch_bytes;
  uint32_t max_keys_per_op;
  uint32_t reserved0;

  // Ring indices, one cache line each: each is written by one side only.
  alignas(64) std::atomic<uint32_t> sq_tail;  // client
  alignas(64) std::atomic<uint32_t> sq_head;  // daemon
  alignas(64) std::atomic<uint32_t> cq_tail;  // daemon; the client sleeps on it
  alignas(64) std::atomic<uint32_t> cq_head;  // client
  // Doorbells. The daemon sets daemon_sleeping to 1, re-checks its work, and
  // sleeps on that word while it is 1; anyone who gives it work (the client
  // after publishing sq_tail, a daemon I/O thread with a finished operation)
  // exchanges it to 0 and wakes the word if it was 1 - no lost wake-ups.
  // The client sets client_sleeping, re-checks cq_tail and sleeps on cq_tail;
  // the daemon wakes cq_tail when it sees the flag. All seq_cst.
  alignas(64) std::atomic<uint32_t> daemon_sleeping;  // the daemon sleeps on this word
  std::atomic<uint32_t> client_sleeping;              // client sleeps on cq_tail
  std::atomic<uint32_t> closed;                       // CloseReason, set by the daemon
  std::atomic<uint32_t> detached;                     // set by a client that detaches on purpose
};
static_assert(std::is_standard_layout_v<SegmentHeader>);
static_assert(sizeof(SegmentHeader) <= 4096);
static_assert(offsetof(SegmentHeader, sq_tail) % 64 == 0);

inline constexpr size_t kSegmentHeaderBytes = 4096;

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_ABI_H_
