// SPDX-License-Identifier: Apache-2.0
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
// with the buffered batches from there, then [identity, "", -1, ""].
//
// What kvtierd cannot say: it never sees token ids (token_ids is empty) or
// a block's parent (parent_block_hash is nil; one BlockStored per block).
// Block hashes are the kvtier keys, which are vLLM's own block hashes when
// engines use the kvtier.vllm connector: as vLLM does by default, they go
// out as the key's low 64 bits (big-endian) or, with block_hash = "bytes",
// as the 32 bytes.
//
// Isolation. Events say which prefixes a tenant holds, so each tenant's go
// to endpoints of its own, which only its uid/gid may open — and every
// peer on them is hostile: ZeroMQ accepts connections without a bound and
// aborts the process when it runs out of descriptors, and a subscriber that
// never reads holds messages. So the sockets live in a publisher process
// per tenant (kvtierd --events-publisher, events/kv_events_publisher.cc),
// with descriptor and memory limits: a tenant that attacks its own
// endpoints stops its own events, never kvtierd or another tenant's. The
// daemon batches and encodes; a child that dies is restarted with backoff.
//
// Producers are the store's threads, under its locks: Stored/Removed only
// append to the tenant's bounded queue (never block, never do I/O); past
// the bound an event is dropped and counted, and the tenant's sequence
// numbers skip one, so subscribers see the loss as a gap (vLLM's signal to
// replay or resynchronize).
#ifndef KVTIER_EVENTS_KV_EVENTS_H_
#define KVTIER_EVENTS_KV_EVENTS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "kvtier/types.h"

namespace kvtier {

enum class KvMedium : uint8_t { kGpu, kCpu, kDisk, kRemote };
std::string_view KvMediumName(KvMedium m);  // "GPU", "CPU", "DISK", "REMOTE"

struct KvEventOptions {
  // Per tenant; "{tenant}" is replaced by the tenant's name. Empty: ipc
  // sockets in run_dir (kvtier-events-{tenant}.sock, kvtier-replay-{tenant}.sock).
  std::string endpoint;
  std::string replay_endpoint;  // "off": no replay socket
  std::string topic;            // the first frame of every message
  bool bytes_hashes = false;    // 32-byte hashes instead of 64-bit ints
  uint32_t batch_ms = 10;       // events gathered this long go out as one batch
  uint32_t buffer_batches = 10000;   // kept per tenant for replay
  uint64_t buffer_bytes = 64ull << 20;  // and at most this many bytes of them
  uint32_t max_pending = 100000;     // events queued per tenant; more are dropped
  uint32_t max_connections = 256;    // per publisher (its descriptor limit)
  uint64_t publisher_memory = 1ull << 30;  // per publisher (its address-space limit)
  uint32_t replays_per_s = 10;       // replay requests a publisher serves a second
  uint32_t replay_max_batches = 1000;  // batches one replay request gets
  std::string publisher_exe;  // the binary run as `<exe> --events-publisher`; empty: /proc/self/exe
};

struct KvEventTenant {
  std::string name;
  bool publish = false;
  std::vector<uid_t> uids;  // who may open its ipc sockets (owner, and group with gids)
  std::vector<gid_t> gids;
};

struct KvEventStats {
  uint64_t events = 0;    // events handed to the publishers
  uint64_t batches = 0;   // batches handed to the publishers
  uint64_t dropped = 0;   // events dropped (a full queue, a publisher behind or down)
  uint64_t replays = 0;   // replay requests served
  uint64_t bad_replays = 0;  // replay requests that were not [identity, "", 8 bytes]
  uint64_t replays_throttled = 0;  // over replays_per_s
  uint64_t publisher_restarts = 0;
  uint32_t publishers_up = 0;
};

class KvEvents {
 public:
  // Makes the queues and the encoder thread; no socket yet (events queue
  // until StartPublishers).
  static absl::StatusOr<std::unique_ptr<KvEvents>> Create(const KvEventOptions& opts,
                                                          const std::vector<KvEventTenant>& tenants,
                                                          const std::string& run_dir);
  // Starts each publishing tenant's publisher process and waits until its
  // sockets are bound (an error names the endpoint and why). After kvtierd
  // owns its run directory, so a second daemon cannot take the sockets.
  absl::Status StartPublishers();
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
  // Its publisher process (-1 while down); for tests.
  pid_t PublisherPidOf(uint16_t t) const;

  struct Event {
    BlockKey key;
    uint32_t block_tokens = 0;
    uint8_t kind = 0;  // 0 stored, 1 removed, 2 cleared
    KvMedium medium = KvMedium::kCpu;
  };
  // One tenant's events as the msgpack EventBatch vLLM sends (exposed for
  // tests). Consecutive removals of one medium share one BlockRemoved.
  static std::string EncodeBatch(double ts, const std::vector<Event>& events, bool bytes_hashes);
  static constexpr size_t kMaxEventsPerBatch = 1024;  // a batch fits one message to the publisher

 private:
  struct Tenant;
  explicit KvEvents(const KvEventOptions& opts);
  void Push(uint16_t tenant, const Event& e);
  void Run();
  absl::Status Spawn(Tenant& t, bool wait_ready);
  void Supervise(Tenant& t, int64_t now_ns);
  void Send(Tenant& t, std::vector<Event>& events, double ts);
  void Flush(Tenant& t);

  const KvEventOptions opts_;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  std::vector<bool> publish_;  // by tenant, set at Create
  std::string exe_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> events_{0}, batches_{0}, dropped_{0}, restarts_{0};
  std::thread thread_;
};

// The publisher process's main (kvtierd --events-publisher FD): serves one
// tenant's PUB and replay sockets, fed batches over FD by the daemon.
int RunEventsPublisher(int fd);

}  // namespace kvtier

#endif  // KVTIER_EVENTS_KV_EVENTS_H_
