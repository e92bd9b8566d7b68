// SPDX-License-Identifier: Apache-2.0
// A block tier in a shared Redis Cluster (or Valkey cluster): blocks that
// several kvtierd nodes can reuse.
//
// Each block is one string value under kvtier:<tenant>:<namespace>:<key>
// (hex), written and read with that tenant's own ACL user, so the server
// itself keeps tenants apart: a tenant's connections cannot name another
// tenant's keys even if kvtier had a bug. The value is a header (magic,
// version, namespace id, block key, payload length, XXH3 of the payload,
// tenant, key id, nonce, AES-GCM tag) and the payload, checked on every
// read: a value that does not prove itself is a miss (DataLoss, counted),
// never served, and is deleted. The tag is under a key of the tenant's own
// (value_seal.h), not the cluster password: whoever can write the key in
// the cluster (another tenant's bug, an administrator, a stolen password, a
// process squatting a dead node's port) cannot make a block that opens.
//
// A tenant with a budget (RemoteTenant::budget_bytes) keeps a ledger in
// the cluster, next to its blocks: a sorted set of what every node wrote
// for it, oldest first, and the bytes that adds up to, changed only by one
// call of a Redis function per write (atomic on the ledger's node; loaded
// by the cluster's administrator, tiers/ledger.lua). A write that takes
// the tenant past its budget deletes the tenant's own least recently used
// blocks (a read moves a block to the young end), never another tenant's:
// one tenant's flood costs itself. Without budgets the cluster's maxmemory
// policy evicts across every tenant's keys; a block written here may be
// gone at the next read (NotFound, a miss) either way. The tier is
// addressed by the block's identity alone: the store keeps the books of
// what this node placed there (bounded by capacity_bytes), and Remove
// leaves the value to the cluster, where other nodes may still read it.
// Not durable. Every read and
// write has a deadline (op_timeout_ms unless the caller gives one); any
// error or timeout fails the op, never returns part of a block, and never
// waits on a node that is down (RedisCluster).
#ifndef KVTIER_TIERS_REMOTE_TIER_H_
#define KVTIER_TIERS_REMOTE_TIER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "tiers/block_tier.h"
#include "tiers/redis_cluster.h"
#include "tiers/remote_defaults.h"
#include "tiers/value_seal.h"

namespace kvtier {

// The value's header, little-endian, in front of the payload.
struct RemoteValueHeader {
  static constexpr uint32_t kMagic = 0x4252564b;  // "KVRB"
  static constexpr uint16_t kVersion = 2;         // 2: sealed (value_seal.h)
  static constexpr uint8_t kEncrypted = 1;        // flags: the payload is AES-GCM ciphertext
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t header_bytes = sizeof(RemoteValueHeader);
  uint8_t ns[32] = {};
  uint8_t key[32] = {};
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload as stored: catches accidents; the seal proves the rest
  uint64_t tenant_hash = 0;
  uint32_t key_id = 0;  // which of the tenant's keys sealed it
  uint8_t flags = 0;
  uint8_t reserved[3] = {};
  uint8_t nonce[12] = {};
  uint8_t tag[16] = {};  // AES-GCM over this header (checksum, nonce, tag zeroed) and the payload
  uint8_t reserved2[4] = {};
};
static_assert(sizeof(RemoteValueHeader) == 136, "the remote value header is 136 bytes on the wire");

// Whether a stored value is the block `meta` names, intact and sealed by
// one of `sealer`'s keys: OK, or DataLoss saying why not (fuzzed:
// tests/fuzz/redis_reply_fuzz.cc). Without a sealer, only the shape and
// checksum are checked.
absl::Status CheckRemoteValue(absl::string_view value, const BlockMeta& meta, const ValueSealer* sealer = nullptr);
// A sealed value of `payload` for `meta`, as the tier writes it (for tools and tests).
absl::StatusOr<std::string> MakeRemoteValue(const BlockMeta& meta, std::span<const std::byte> payload,
                                            const ValueSealer& sealer);

struct RemoteTenant {
  std::string name;      // as in kvtierd's [[tenants]]: its keys are kvtier:<name>:...
  std::string user;      // its ACL user
  std::string password;  // never logged
  std::vector<SealKey> keys;  // seal its values: [0] seals, all open (rotation); never logged
  std::vector<std::string> seeds;  // its own cluster; empty: RemoteTierOptions::seeds
  // What its blocks may take in the cluster, from every node together
  // (each counts its value's bytes and kLedgerEntryBytes); 0: no ledger,
  // the cluster's own eviction alone.
  uint64_t budget_bytes = 0;
};

// What one block costs a tenant's budget besides its value: its key and its
// ledger entry in the cluster's memory.
inline constexpr uint64_t kLedgerEntryBytes = 384;
// The ledger's two keys for `tenant` (a sorted set and a hash), in one slot
// by their {hash tag}, under the tenant's own key pattern (its ACL user may
// name them, no other tenant's may).
std::string LedgerKey(const std::string& prefix, const std::string& tenant);
std::string LedgerUsedKey(const std::string& prefix, const std::string& tenant);
// The function that keeps a ledger, and the Redis Functions library that
// defines it (tiers/ledger.lua): an administrator loads the library on every
// primary (FUNCTION LOAD REPLACE); a tenant's ACL user needs +fcall and the
// commands it calls, never +eval (docs/remote-tier.md).
extern const char* const kLedgerFunction;
const char* LedgerLibrary();

struct RemoteTierOptions {
  std::vector<std::string> seeds;  // "host:port" of cluster nodes
  std::vector<RemoteTenant> tenants;
  std::string key_prefix = remote_defaults::kKeyPrefix;
  std::string name = "remote";
  TierKind kind = TierKind::kRemote;  // what lookups report a block here as
  uint64_t capacity_bytes = remote_defaults::kCapacityBytes;  // what this node may place there (the store's books)
  uint64_t max_block_bytes = 64ull << 20;
  uint64_t op_timeout_ms = remote_defaults::kOpTimeoutMs;  // a read or write's deadline when its caller gives none
  uint64_t connect_timeout_ms = remote_defaults::kConnectTimeoutMs;
  uint64_t io_timeout_ms = remote_defaults::kIoTimeoutMs;  // a reply slower than this breaks its connection
  uint32_t max_pipeline = 64;
  bool encrypt = false;  // encrypt payloads at rest (always sealed)
  RedisTlsOptions tls;   // TLS to every node (redis_cluster.h)
  // A node refused a tenant's AUTH (rate-limited per tenant; never the password).
  std::function<void(const std::string& tenant, const std::string& why)> on_auth_failure;
  // A tenant's budget ledger refused an update (a user without +fcall, the
  // library not loaded, the node out of memory): its writes fail until it
  // works. At most once every
  // 10 s, on a cluster thread; never a key or a block.
  std::function<void(const std::string& tenant, const std::string& why)> on_ledger_failure;
};

class RemoteTier final : public KeyAddressedBlockTier {
 public:
  // InvalidArgument for bad seeds or a tenant without a user; the cluster
  // need not be up (the tier is degraded until it answers).
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Create(const RemoteTierOptions& opts);
  ~RemoteTier() override;  // waits for every op in flight

  // The key a block of `tenant` lives under.
  std::string KeyFor(const std::string& tenant, const BlockMeta& meta) const;

  TierKind kind() const override { return opts_.kind; }
  // Addressed by key alone (KeyAddressedBlockTier): the store keeps the
  // books of what this node placed here against capacity_bytes.
  uint64_t CostFor(uint64_t payload_bytes) const override { return payload_bytes + sizeof(RemoteValueHeader); }
  using BlockTier::Get;
  using BlockTier::Put;
  void Put(BlockLocator at, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
           IoCallback done) override;
  // NotFound when the cluster no longer holds the block; DataLoss when the
  // value does not prove itself (then it is deleted).
  void Get(BlockLocator at, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
           IoCallback done) override;
  // Which of `metas` the cluster holds now (pipelined EXISTS, one round trip
  // per node touched); an unanswered one counts as absent. `done` runs once,
  // on a cluster thread.
  void Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
              uint64_t deadline_ns) override;
  // Other nodes write the cluster too.
  bool shared() const override { return true; }
  TierUsage Usage() const override;
  TierHealth Health() const override;

  std::string_view name() const override { return opts_.name; }
  bool durable() const override { return false; }
  uint64_t max_block_bytes() const override { return opts_.max_block_bytes; }
  absl::Status Sync() override;  // waits for the writes in flight
  void Drain() override;
  void CommitSoon() override {}
  BlockTierStats BlockStats() const override;
  void SetReadObserver(ReadObserver observer) override { read_observer_ = std::move(observer); }
  uint32_t CalibrationRead(uint32_t) override { return 0; }  // every read is timed

  // Per cause, for status and metrics.
  struct Misses {
    uint64_t not_found = 0;   // evicted by the cluster, or never there
    uint64_t bad_value = 0;   // failed its checks (deleted)
    uint64_t forged = 0;      // of those, passed the checksum but not the seal: written without the key
    uint64_t unavailable = 0;  // node down, connection broken, cluster down
    uint64_t deadline = 0;    // not answered in time
    uint64_t other = 0;       // refused (NOPERM, OOM, ...)
  };
  Misses misses() const;
  // The tenants' budgets (ledger), summed over tenants.
  struct Budget {
    uint64_t updates = 0;         // ledger calls that answered
    uint64_t evictions = 0;       // blocks deleted to keep a tenant within its budget
    uint64_t refused = 0;         // writes refused: the block alone is past its tenant's budget
    uint64_t failures = 0;        // ledger calls that failed (the write failed with them)
    uint64_t touches = 0;         // reads that moved a block to the young end
    uint64_t touches_dropped = 0;  // reads whose touch was dropped (too many pending)
    uint64_t bad_entries = 0;     // ledger entries that named no block of ours (ignored)
  };
  Budget budget() const;
  RedisCluster::Stats ClusterStats(const std::string& tenant) const;

 private:
  explicit RemoteTier(const RemoteTierOptions& opts);
  // Reads waiting to move their blocks to the young end of the ledger:
  // sent with the next write's ledger call, or alone when kTouchBatch wait.
  struct Touches {
    Mutex mu;
    std::vector<std::string> members ABSL_GUARDED_BY(mu);
  };
  struct TenantLink {
    std::string name;
    uint64_t hash;
    std::unique_ptr<RedisCluster> cluster;
    std::unique_ptr<ValueSealer> sealer;
    uint64_t budget_bytes = 0;
    std::string ledger_key, ledger_used_key;
    std::unique_ptr<Touches> touches;
  };
  static constexpr size_t kTouchBatch = 256, kMaxTouches = 4096;
  std::string LedgerMember(const BlockMeta& meta) const;
  // A read hit `meta`: it moves to the young end of its tenant's ledger.
  void Touch(const TenantLink& link, const BlockMeta& meta);
  // The ledger call: `added` enter (or move to the young end),
  // the link's pending touches move to the young end.
  RedisCommand LedgerCommand(const TenantLink& link, const std::vector<std::string>& added);
  // Deletes the blocks a ledger call evicted; whether `self` was one.
  bool DeleteEvicted(const TenantLink& link, const RedisReply& reply, const std::string& self);
  void SubmitSet(const TenantLink& link, RedisCommand cmd, uint64_t bytes, uint64_t deadline_ns, CancelToken cancel,
                 IoCallback done);
  const TenantLink* LinkFor(uint64_t tenant_hash) const;
  void CountMiss(const absl::Status& s);
  void Began(bool write);
  void Ended(bool write);

  const RemoteTierOptions opts_;
  std::vector<TenantLink> tenants_;  // fixed after Create

  mutable Mutex mu_;
  uint64_t reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0, writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::condition_variable_any idle_;

  ReadObserver read_observer_;  // set before the first read
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0};
  std::atomic<uint64_t> io_errors_{0}, writes_refused_{0}, abandoned_{0}, checksum_failures_{0}, seal_failures_{0};
  std::atomic<uint64_t> miss_not_found_{0}, miss_unavailable_{0}, miss_deadline_{0}, miss_other_{0};
  std::atomic<uint64_t> ledger_updates_{0}, budget_evictions_{0}, budget_refused_{0}, ledger_failures_{0};
  std::atomic<uint64_t> touches_{0}, touches_dropped_{0}, ledger_bad_entries_{0};
  std::atomic<uint64_t> ledger_failure_reported_ns_{0};
  void LedgerFailed(const TenantLink& link, const absl::Status& why);
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_REMOTE_TIER_H_
