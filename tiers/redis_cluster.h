// SPDX-License-Identifier: Apache-2.0
// A Redis Cluster client: hiredis speaks the protocol to each node; the
// cluster logic is ours.
//
//   - Keys map to the cluster's 16384 slots (CRC16 of the key, or of its
//     {hash tag}); the slot map comes from CLUSTER SLOTS, asked of any node
//     that answers, again every refresh interval and soon after a redirect,
//     a failover or a node that stopped answering.
//   - One connection per node, owned by that node's thread, which pipelines
//     whatever is queued for it (up to max_pipeline commands a round trip).
//   - MOVED updates the slot's owner and goes there; ASK goes once to the
//     node named, after ASKING; TRYAGAIN and CLUSTERDOWN are tried again
//     after a short pause while the command's deadline allows.
//   - A node that does not answer is reconnected with exponential backoff
//     (10 ms to 1 s); meanwhile commands for it fail at once.
//   - Every command has a deadline and may be cancelled: one not sent by
//     then fails with DeadlineExceeded (or Cancelled), and a reply slower
//     than io_timeout breaks its connection (Unavailable).
// Every failure is a status, never a partial reply: callers (the remote
// tier) treat it as a miss. Connections authenticate as one ACL user, over
// TLS (OpenSSL on the connection's own socket) when RedisTlsOptions say so.
#ifndef KVTIER_TIERS_REDIS_CLUSTER_H_
#define KVTIER_TIERS_REDIS_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "core/cancel.h"
#include "tiers/tier.h"

struct redisReply;   // hiredis
struct redisReader;

namespace kvtier {

struct RedisReplyFree {
  void operator()(redisReply* r) const;
};
// A node's reply to one command, as hiredis parsed it (never an error reply:
// those arrive as a status).
using RedisReply = std::unique_ptr<redisReply, RedisReplyFree>;

// Sees a sunk reply (RedisCommand::SinkReplyInto) as it is read, on the
// node's thread: its kept head once, then each piece of the sink as it
// lands (after the XXH3 saw it), while it is in cache. It may change a
// piece in place (decrypt it). Must not block.
class SinkObserver {
 public:
  virtual ~SinkObserver() = default;
  virtual void Head(absl::string_view head) = 0;
  virtual void Piece(std::span<std::byte> piece) = 0;
};

// A command, formatted for the wire once, when it is made (a block's bytes
// are copied into it once), with the key that routes it.
class RedisCommand {
 public:
  // A command of `args` whose key is args[key_index]. Each argument may be
  // given in parts, sent as one argument (a value's header and payload).
  static RedisCommand Make(std::initializer_list<std::initializer_list<absl::string_view>> args, size_t key_index);
  // The same of as many whole arguments as a caller has (a script's).
  static RedisCommand MakeList(std::span<const absl::string_view> args, size_t key_index);
  // A command with no key (PING, CLUSTER SLOTS): any node answers it.
  static RedisCommand Keyless(std::initializer_list<absl::string_view> args);

  const std::string& key() const { return key_; }
  const std::string& wire() const { return wire_; }
  bool keyless() const { return keyless_; }

  // A bulk-string reply of exactly keep + dst.size() bytes is split as it is
  // read: its first `keep` bytes stay in the reply, the rest is copied
  // straight into dst (a block's payload into its host slot, without a copy
  // in between). Such a reply has len == keep and integer == the full length
  // (SunkLength); any other reply is whole. With xxh3_out, the XXH3-64 of
  // what went into dst is written there, computed as it is copied (while it
  // is in cache). dst and xxh3_out must outlive the command.
  void SinkReplyInto(std::span<std::byte> dst, size_t keep, uint64_t* xxh3_out = nullptr,
                     SinkObserver* observer = nullptr) {
    sink_ = dst;
    sink_keep_ = keep;
    sink_xxh3_ = xxh3_out;
    sink_observer_ = observer;
  }
  SinkObserver* sink_observer() const { return sink_observer_; }
  std::span<std::byte> sink() const { return sink_; }
  size_t sink_keep() const { return sink_keep_; }
  uint64_t* sink_xxh3() const { return sink_xxh3_; }

  // Argument i's bytes inside the formatted command (to patch a value's
  // header after its payload was copied in).
  std::span<char> arg(size_t i) { return {wire_.data() + args_[i].first, args_[i].second}; }

 private:
  std::string key_, wire_;
  std::vector<std::pair<size_t, size_t>> args_;  // offset and length in wire_
  bool keyless_ = false;
  std::span<std::byte> sink_;
  size_t sink_keep_ = 0;
  uint64_t* sink_xxh3_ = nullptr;
  SinkObserver* sink_observer_ = nullptr;
};

// The full length of a string reply split by SinkReplyInto; 0 for a whole one.
uint64_t SunkLength(const redisReply& r);

// TLS to every node: the server's certificate must chain to ca_file and
// name the node (its IP address or host name as the cluster announces it,
// or server_name for all). A client certificate is sent when cert_file is
// set. A node that fails the handshake gets nothing: no AUTH, no block.
struct RedisTlsOptions {
  bool enabled = false;
  std::string ca_file;      // PEM: the CA(s) the nodes' certificates chain to
  std::string cert_file;    // PEM: this client's certificate chain (optional)
  std::string key_file;     // PEM: its private key (with cert_file)
  std::string server_name;  // the name every node's certificate must carry ("" : the node's address)
};

struct RedisClusterOptions {
  std::vector<std::string> seeds;  // "host:port" of nodes to learn the cluster from
  std::string user;                // the ACL user ("" is the default user)
  std::string password;
  std::string name = "redis";     // in errors and logs (never the password)
  uint64_t connect_timeout_ms = 500;
  uint64_t io_timeout_ms = 1000;
  uint32_t max_redirects = 5;
  uint64_t refresh_interval_ms = 5000;
  uint32_t max_pipeline = 64;
  // The largest reply a node may send (a value of the largest block, and
  // room): one larger breaks the connection instead of filling memory.
  uint64_t max_reply_bytes = 80ull << 20;
  // Called when a node refuses AUTH (a wrong password, a user revoked or
  // disabled), with the node's words and never the password: at most once
  // every 10 s, on a cluster thread, so it may log but must not block.
  std::function<void(const std::string& why)> on_auth_failure;
  RedisTlsOptions tls;
};

// Decoders of what a node sends (fuzzed: tests/fuzz/redis_reply_fuzz.cc).
// A slot range's owner from CLUSTER SLOTS.
struct SlotRange {
  uint16_t first = 0, last = 0;
  std::string host;
  int port = 0;
};
// The ranges of a CLUSTER SLOTS reply; an empty host means the node asked
// (`asked_host`). InvalidArgument for anything else than ranges within the
// 16384 slots owned by host:port addresses.
absl::StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply* r, absl::string_view asked_host);
// A MOVED or ASK error's slot and address ("MOVED 3999 127.0.0.1:6381"; an
// address of ":port" is `from_host`'s). False for anything else.
struct Redirect {
  bool ask = false;
  uint16_t slot = 0;
  std::string host;
  int port = 0;
};
bool ParseRedirect(absl::string_view error, absl::string_view from_host, Redirect* out);
// Makes a hiredis reader refuse (as a protocol error) arrays of more than
// kMaxReplyElements elements and strings over max_string_bytes: hiredis
// 0.14 allocates an array of whatever length a peer announces ("*600000000"
// is a 5 GB calloc). The cluster's connections use it; so does the fuzz target.
inline constexpr int kMaxReplyElements = 1 << 16;
void BoundReplyObjects(redisReader* reader);

class RedisCluster {
 public:
  // The seeds are parsed (InvalidArgument for one that is not host:port)
  // and the TLS files loaded (InvalidArgument for one that does not load);
  // the cluster need not be up: the first slot map comes when a node answers.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(const RedisClusterOptions& opts);
  // Fails what is still queued with Cancelled and joins every thread.
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Thread-safe. Sends `cmd` to the node that holds its key's slot. `done`
  // runs exactly once, on one of the cluster's threads (it must not block):
  // with the reply, or a status (error replies become one: NOPERM is
  // PermissionDenied, OOM ResourceExhausted, an unreachable node or a broken
  // connection Unavailable, the deadline DeadlineExceeded). deadline_ns is
  // MonotonicNanos() by which it must be sent (0: io_timeout from now).
  using Callback = absl::AnyInvocable<void(absl::StatusOr<RedisReply>) &&>;
  void Submit(RedisCommand cmd, Callback done, uint64_t deadline_ns = 0, CancelToken cancel = {});
  // Several at once: each node gets its share in one hand-over, so a probe
  // of many keys costs one round trip per node touched.
  void SubmitAll(std::vector<std::pair<RedisCommand, Callback>> cmds, uint64_t deadline_ns = 0);
  // Submit and wait: for tools and tests.
  absl::StatusOr<RedisReply> Call(RedisCommand cmd, uint64_t timeout_ms);

  // Thread-safe. Asks for a new slot map now (it comes on the cluster's own thread).
  void RefreshSoon();
  // Thread-safe. Waits up to timeout_ms for a slot map that covers every slot.
  bool WaitForMap(uint64_t timeout_ms);

  struct NodeStats {
    std::string address;
    bool connected = false;
    uint64_t slots = 0;  // in the current map (0: a replica, or unknown)
    uint64_t commands = 0, errors = 0, connects = 0;
  };
  struct Stats {
    uint64_t commands = 0;
    uint64_t moved = 0, ask = 0, tryagain = 0, clusterdown = 0;
    uint64_t unavailable = 0, deadline = 0, cancelled = 0, errors = 0;  // how commands failed
    uint64_t refreshes = 0, refresh_failures = 0;
    uint64_t auth_failures = 0;  // connections a node refused to authenticate
    uint64_t slots_covered = 0;  // of 16384
    std::vector<NodeStats> nodes;
  };
  Stats GetStats() const;
  // Healthy with a full slot map and every mapped node connected or not yet
  // tried; degraded with part of one or a node in backoff; failed with no
  // map and no node answering.
  TierHealth Health() const;

  // The cluster slot of a key (CRC16-XMODEM mod 16384, of the {hash tag} if any).
  static uint16_t KeySlot(absl::string_view key);
  static constexpr uint32_t kSlots = 16384;

  struct Impl;

 private:
  explicit RedisCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_REDIS_CLUSTER_H_
