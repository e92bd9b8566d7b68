// KV events for cache-aware routers: which blocks each tenant holds in which
// tier, published in vLLM's wire format so that consumers written for vLLM's
// events (llm-d's KV indexer, Dynamo's KV router, vLLM's own subscriber)
// read kvtierd's unchanged.
//
// Wire format (vLLM's vllm/distributed/kv_events.py at commit 0181ea3 of
// vllm-project/vllm): a ZeroMQ PUB socket sends three frames per batch —
// topic, an 8-byte big-endian sequence number, and a msgpack EventBatch
// {ts: float, events: [...]}; each event a msgpack map tagged by
// "type": BlockStored {block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, lora_name}, BlockRemoved {block_hashes,
// medium}, AllBlocksCleared {}. (Older vLLM releases encoded the same
// structs as arrays; this is the map form of current releases.) A ROUTER
// replay socket answers a request [identity, "", start seq (8 bytes BE)]
// with every buffered batch from there, then [identity, "", -1, ""].
//
// One PUB socket (and replay socket) per tenant: events say which prefixes a
// tenant holds, so each tenant's go to its own endpoint, an ipc socket that
// only the tenant's uid (and gid) may open when the tenant names uids.
//
// What kvtierd cannot say: it never sees token ids (token_ids is empty) or
// a block's parent (parent_block_hash is nil; one BlockStored per block).
// Block hashes are the kvtier keys, which are vLLM's own block hashes when
// engines use the kvtier.vllm connector: as vLLM does by default, they go
// out as the key's low 64 bits (big-endian) or, with block_hash = "bytes",
// as the 32 bytes.
//
// Producers are the store's threads, under its locks: Stored/Removed only
// append to a bounded queue (never block, never do I/O); past the bound an
// event is dropped and counted. One thread batches, encodes and sends.
#ifndef KVTIER_DAEMON_KV_EVENTS_H_
#define KVTIER_DAEMON_KV_EVENTS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "kvtier/types.h"

namespace kvtier {

enum class KvMedium : uint8_t { kGpu, kCpu, kDisk, kRemote };
std::string_view KvMediumName(KvMedium m);  // "GPU", "CPU", "DISK", "REMOTE"

struct KvEventOptions {
  // Per tenant; "{tenant}" is replaced by the tenant's name. Empty: ipc
  // sockets in run_dir (kvtier-events-{tenant}.sock, ...-replay.sock).
  std::string endpoint;
  std::string replay_endpoint;  // "off": no replay socket
  std::string topic;            // the first frame of every message
  bool bytes_hashes = false;    // 32-byte hashes instead of 64-bit ints
  uint32_t batch_ms = 10;       // events gathered this long go out as one batch
  uint32_t buffer_batches = 10000;  // kept per tenant for replay
  uint32_t max_pending = 100000;    // events queued for the thread; more are dropped
};

struct KvEventTenant {
  std::string name;
  bool publish = false;
  std::vector<uid_t> uids;  // who may open its ipc sockets (chown + mode 0660/0600)
  std::vector<gid_t> gids;
};

struct KvEventStats {
  uint64_t events = 0;    // events sent
  uint64_t batches = 0;   // batches sent
  uint64_t dropped = 0;   // events dropped (queue full)
  uint64_t replays = 0;   // replay requests served
  uint64_t bad_replays = 0;  // replay requests that were not [identity, "", 8 bytes]
  uint64_t send_errors = 0;
};

class KvEvents {
 public:
  // Binds every publishing tenant's sockets (an error names the endpoint and
  // why) and starts the publisher thread.
  static absl::StatusOr<std::unique_ptr<KvEvents>> Start(const KvEventOptions& opts,
                                                         const std::vector<KvEventTenant>& tenants,
                                                         const std::string& run_dir);
  ~KvEvents();
  KvEvents(const KvEvents&) = delete;
  KvEvents& operator=(const KvEvents&) = delete;

  // Whether tenant `t` publishes (cheap; callers skip building events otherwise).
  bool Publishes(uint16_t t) const { return t < publish_.size() && publish_[t]; }
  // Thread-safe, non-blocking.
  void Stored(uint16_t tenant, const BlockKey& key, uint32_t block_tokens, KvMedium medium);
  void Removed(uint16_t tenant, const BlockKey& key, KvMedium medium);
  void Cleared(uint16_t tenant);

  KvEventStats stats() const;
  // The endpoints tenant `t` publishes on (empty when it does not).
  std::string EndpointOf(uint16_t t) const;
  std::string ReplayEndpointOf(uint16_t t) const;

  struct Event {
    BlockKey key;
    uint32_t block_tokens = 0;
    uint16_t tenant = 0;
    uint8_t kind = 0;  // 0 stored, 1 removed, 2 cleared
    KvMedium medium = KvMedium::kCpu;
  };
  // One tenant's events as the msgpack EventBatch vLLM sends (exposed for
  // tests). Consecutive removals of one medium share one BlockRemoved.
  static std::string EncodeBatch(double ts, const std::vector<Event>& events, bool bytes_hashes);

 private:
  KvEvents(const KvEventOptions& opts, std::vector<bool> publish);
  void Push(const Event& e);
  void Run();
  struct Sockets;

  const KvEventOptions opts_;
  const std::vector<bool> publish_;
  std::unique_ptr<Sockets> sockets_;
  mutable Mutex mu_;
  std::vector<Event> pending_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> events_{0}, batches_{0}, replays_{0}, bad_replays_{0}, send_errors_{0};
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_KV_EVENTS_H_
