// SPDX-License-Identifier: Apache-2.0
// One attached engine: its shared segment, its socket, and the thread that
// serves its request ring. The thread spins briefly when idle, then sleeps on
// the futex doorbell; it ends when asked (hang-up, shutdown) or when the
// client breaks the protocol, and then releases everything the session held.
// Operations that wait for tier I/O (loads from NVMe, durable commits,
// prefetches) finish on I/O threads, which hand their completions back to
// the session thread: it alone writes the completion ring.
#ifndef KVTIER_DAEMON_SESSION_H_
#define KVTIER_DAEMON_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "store/block_store.h"
#include "daemon/device_ops.h"
#include "daemon/engine_caches.h"
#include "store/gpu_cache.h"
#include "store/stats.h"
#include "ipc/abi.h"
#include "ipc/session_segment.h"
#include "ipc/unix_socket.h"

namespace kvtier {

struct SessionIdentity {
  uint64_t id = 0;
  ipc::PeerCredentials peer;
  std::string client_name;
  uint64_t attached_unix_s = 0;
};

class LogLimiter;
struct SessionOptions {
  uint32_t spin_us = 50;
  LogLimiter* log_limiter = nullptr;  // per-tenant rate of this session's log lines; null: none
};

// What the admin endpoint shows about a session.
struct SessionInfo {
  SessionIdentity identity;
  std::string tenant;
  NamespaceInfo ns;
  uint64_t ops = 0;
  uint64_t leases = 0;
  uint64_t pinned_blocks = 0;
  uint64_t kv_caches = 0;  // engine KV caches registered
};

class Session {
 public:
  // on_exit runs on the session thread after it released everything.
  // `device` and `arena_base` (the tenant's host arena in the daemon) serve
  // the engine caches the client registers.
  Session(SessionIdentity identity, NamespaceInfo ns, std::string tenant, ipc::SessionSegment segment,
          UniqueFd socket, BlockStore* store, DaemonStats* stats, SessionOptions opts,
          std::function<void()> on_exit, DeviceBackend* device = nullptr, std::byte* arena_base = nullptr,
          GpuCache* gpu = nullptr, KvCacheBudget* kv_budget = nullptr);
  ~Session();  // stops and joins
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void Start();
  // Thread-safe. Asks the thread to close the session with `reason`.
  void Stop(ipc::CloseReason reason);
  // Thread-safe. True once the thread has released everything and ended.
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  void Join();

  uint64_t id() const { return identity_.id; }
  int socket_fd() const { return socket_.get(); }
  const SessionIdentity& identity() const { return identity_; }
  const std::string& tenant() const { return tenant_; }
  uint32_t ns_handle() const { return ns_.handle; }
  // Thread-safe. True when the client said it detaches (versus crashing).
  bool client_detached() const {
    return segment_.header()->detached.load(std::memory_order_acquire) != 0;
  }
  // Thread-safe.
  SessionInfo Info() const;
  // Whether every opcode ipc::kOpcodes lists has exactly one handler (tests).
  static bool HandlesEveryOpcode();
  // Thread-safe. No store open (begun, not committed or aborted) and no
  // operation waiting for its completion: nothing in flight to lose.
  bool Idle() const {
    return async_in_flight_.load(std::memory_order_acquire) == 0 &&
           holdings_.ticket_count.load(std::memory_order_acquire) == 0;
  }
  // Thread-safe (the daemon's main thread calls it): a KV-cache registration
  // message from the session socket, with its descriptors; the reply to send.
  // *reply_fds: descriptors to send with the reply (the layer events' pages).
  ipc::KvRegisterReply OnKvMessage(std::span<const std::byte> data, std::vector<UniqueFd> fds,
                                   std::vector<UniqueFd>* reply_fds);

 private:
  struct Outcome {
    int32_t status = 0;
    uint32_t count = 0;
    uint64_t handle = 0;
    uint64_t value = 0;
    std::string message;  // on failure
    bool fatal = false;   // malformed: close the session after answering
    bool deferred = false;  // completes later through Defer()
  };
  // An operation that finished on another thread.
  struct Deferred {
    ipc::RequestRecord req;
    Outcome outcome;
    std::vector<BlockLocation> locations;  // written to the result area when not empty
    // Set: the operation's last step, which must run on the session thread
    // (it touches the holdings); PostDeferred runs it for the completion.
    absl::AnyInvocable<Deferred() &&> resume;
    bool after_reply = false;  // BlockStore::AfterReply once posted (a lookup)
  };
  // A lookup waiting for the shared tier's answer: whichever comes first,
  // the answer or the session thread's timer past the budget, claims it.
  struct PendingProbe {
    uint64_t expire_ns;
    std::shared_ptr<std::atomic<bool>> claimed;
    absl::AnyInvocable<void() &&> expire;  // resumes the lookup without an answer
  };
  // The lookup itself, on the session thread, with the shared tier's answer
  // (nullptr: it asks and waits itself).
  // Results go through `locs` (one per key) to the request's result area.
  Deferred FinishLookup(const ipc::RequestRecord& req, const std::vector<BlockKey>& keys,
                        std::vector<BlockLocation>& locs, const BlockStore::SharedAnswer* shared);
  // Session thread: resumes the lookups whose answer is past its time;
  // the nanoseconds until the next one is (UINT64_MAX: none waits).
  uint64_t ExpireProbes();

  // The session thread: serve the rings until stopped or the client breaks
  // the protocol (Serve returns why, or ""), drop the completions of work
  // still on I/O threads once it is done, then release everything the
  // session held and tell the client.
  void Run();
  std::string Serve();
  void DropAsyncWork();
  void Close(const std::string& fatal_reason);
  Outcome Process(const ipc::RequestRecord& req);
  // Thread-safe: queues a completion for the session thread and wakes it.
  void Defer(Deferred d);
  // Session thread: posts queued completions; false if stopped meanwhile.
  bool PostDeferred(ipc::RingProducer<ipc::CompletionRecord>& cq);
  static Outcome FromStatus(const absl::Status& s);
  // Copies `count` keys out of scratch; false (with *why) if out of bounds.
  bool ReadKeys(const ipc::RequestRecord& req, std::vector<BlockKey>* keys, std::string* why);
  bool OutRangeOk(const ipc::RequestRecord& req, uint64_t need) const;
  // A malformed request: EPROTO, and the session closes after answering.
  static Outcome Malformed(absl::string_view why);
  // True when this tenant may write one more log line now (LogLimiter).
  bool LogOk();
  // The positions of the first key that repeats an earlier one, if any.
  static std::optional<std::pair<size_t, size_t>> FirstDuplicate(const std::vector<BlockKey>& keys);
  // The registration (args[1]) and page ids (args[0]) of a device operation
  // on `keys` blocks; the outcome to answer with when they are not usable.
  std::optional<Outcome> ReadDeviceArgs(const ipc::RequestRecord& req, size_t keys,
                                        std::shared_ptr<const EngineCache>* reg, std::vector<uint32_t>* pages);
  // Copies `n` page ids from scratch at req.args[0]; false (with *why) if out of bounds.
  bool ReadPages(const ipc::RequestRecord& req, uint64_t n, std::vector<uint32_t>* pages, std::string* why);

  // A request that passed the checks Process makes for every opcode
  // (ipc::kOpcodes): its keys copied out of scratch, room for its results.
  struct Request {
    const ipc::RequestRecord& req;
    std::vector<BlockKey>& keys;
    std::vector<BlockLocation>& locs;  // one per key when the opcode returns blocks
  };
  using Handler = Outcome (Session::*)(Request&);
  static const std::pair<ipc::Opcode, Handler> kHandlers[];
  static Handler HandlerFor(ipc::Opcode op);  // null for an opcode without one
  Outcome OnPing(Request& r);
  Outcome OnLookup(Request& r);
  Outcome OnLoad(Request& r);
  Outcome OnPrefetch(Request& r);
  Outcome OnStoreBegin(Request& r);
  Outcome OnStoreCommit(Request& r);
  Outcome OnStoreAbort(Request& r);
  Outcome OnRelease(Request& r);
  Outcome OnInvalidate(Request& r);
  Outcome OnReportPrefill(Request& r);
  Outcome OnStoreDevice(Request& r);
  Outcome OnLoadDevice(Request& r);
  Outcome OnInvalidateNamespace(Request& r);
  // gpu_offsets: per block, its pinned GPU copy's arena offset (leased lookups).
  void WriteResults(const ipc::RequestRecord& req, const std::vector<BlockLocation>& locs,
                    std::span<const uint64_t> gpu_offsets = {});
  void WriteMessage(const ipc::RequestRecord& req, const std::string& message);
  // Pushes a completion, waiting for room; false if stopped meanwhile.
  bool Post(ipc::RingProducer<ipc::CompletionRecord>& cq, const ipc::CompletionRecord& c);

  const SessionIdentity identity_;
  const NamespaceInfo ns_;
  const std::string tenant_;
  ipc::SessionSegment segment_;
  UniqueFd socket_;
  BlockStore* const store_;
  DaemonStats* const stats_;
  const SessionOptions opts_;
  std::function<void()> on_exit_;

  DeviceOps device_;  // engine caches, device stores and loads, GPU-tier copies and pins
  // When each deferred operation was taken (for its latency). Session thread.
  absl::flat_hash_map<uint64_t, uint64_t> deferred_started_;
  std::vector<PendingProbe> pending_probes_;  // session thread
  SessionHoldings holdings_;  // session thread only (atomics inside are shared)
  Mutex deferred_mu_;
  std::vector<Deferred> deferred_ ABSL_GUARDED_BY(deferred_mu_);
  std::atomic<uint32_t> deferred_count_{0};  // deferred_.size(), readable without the lock
  std::atomic<uint32_t> async_in_flight_{0};  // operations whose completion is still to come
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> stop_reason_{0};
  std::atomic<bool> finished_{false};
  std::atomic<uint64_t> ops_{0};
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_SESSION_H_
