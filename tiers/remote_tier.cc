// SPDX-License-Identifier: Apache-2.0
// RemoteTier (remote_tier.h): blocks as self-checking values in a Redis
// Cluster, one ACL user per tenant.
#include "tiers/remote_tier.h"

#include <hiredis/hiredis.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 on AVX2 / AVX-512 where the CPU has them: the same hashes, twice as fast
#endif

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"
#include "tiers/ledger_lua.h"

namespace kvtier {

namespace {

// The header of a value, less its checksum.
RemoteValueHeader HeaderFor(const BlockMeta& meta, uint64_t payload_bytes) {
  RemoteValueHeader h;
  std::memcpy(h.ns, meta.ns.bytes.data(), sizeof(h.ns));
  std::memcpy(h.key, meta.key.bytes.data(), sizeof(h.key));
  h.payload_bytes = payload_bytes;
  h.tenant_hash = meta.tenant_hash;
  return h;
}

// With `payload`, v is the header alone and the payload is there (whose
// XXH3 is `payload_xxh3`, when known). The shape and checksum only: the
// seal is checked by OpenSealed.
std::string WhyNotTheBlock(absl::string_view v, const BlockMeta& meta,
                           std::optional<std::span<const std::byte>> payload = std::nullopt,
                           std::optional<uint64_t> payload_xxh3 = std::nullopt) {
  if (v.size() < sizeof(RemoteValueHeader)) return absl::StrCat("value of ", v.size(), " bytes is shorter than its header");
  RemoteValueHeader h;
  std::memcpy(&h, v.data(), sizeof(h));
  if (h.magic != RemoteValueHeader::kMagic) return "not a kvtier block (magic)";
  if (h.version != RemoteValueHeader::kVersion || h.header_bytes != sizeof(RemoteValueHeader)) {
    return absl::StrCat("header version ", h.version, " / ", h.header_bytes, " bytes is not this kvtier's");
  }
  if ((h.flags & ~RemoteValueHeader::kEncrypted) != 0) return "unknown header flags";
  if (std::memcmp(h.ns, meta.ns.bytes.data(), sizeof(h.ns)) != 0) return "another namespace's block";
  if (std::memcmp(h.key, meta.key.bytes.data(), sizeof(h.key)) != 0) return "another block's value";
  if (h.tenant_hash != meta.tenant_hash) return "another tenant's block";
  const uint64_t have = payload ? payload->size() : v.size() - sizeof(h);
  if (h.payload_bytes != meta.payload_bytes || have != meta.payload_bytes || (payload && v.size() != sizeof(h))) {
    return absl::StrCat("payload of ", have, " bytes (header says ", h.payload_bytes, "), expected ",
                        meta.payload_bytes);
  }
  const void* p = payload ? static_cast<const void*>(payload->data()) : static_cast<const void*>(v.data() + sizeof(h));
  const uint64_t sum = payload_xxh3 ? *payload_xxh3 : XXH3_64bits(p, meta.payload_bytes);
  if (sum != h.checksum) return "payload checksum mismatch";
  return "";
}

// The header as the seal binds it: its checksum, nonce and tag zeroed.
RemoteValueHeader AadOf(const RemoteValueHeader& h) {
  RemoteValueHeader a = h;
  a.checksum = 0;
  std::memset(a.nonce, 0, sizeof(a.nonce));
  std::memset(a.tag, 0, sizeof(a.tag));
  return a;
}

absl::string_view Bytes(const RemoteValueHeader& h) { return {reinterpret_cast<const char*>(&h), sizeof(h)}; }

SealFields FieldsOf(const RemoteValueHeader& h) {
  SealFields f;
  f.key_id = h.key_id;
  f.encrypted = (h.flags & RemoteValueHeader::kEncrypted) != 0;
  std::memcpy(f.nonce.data(), h.nonce, f.nonce.size());
  std::memcpy(f.tag.data(), h.tag, f.tag.size());
  return f;
}

// Opens a value's seal as its payload is read from the socket, piece by
// piece while each is in cache, on the node's thread: the header comes
// first, so the check can start before the payload. Finish says whether
// the value opened.
class StreamingOpen final : public SinkObserver {
 public:
  explicit StreamingOpen(const ValueSealer& sealer) : sealer_(sealer) {}
  void Head(absl::string_view head) override {
    if (head.size() != sizeof(RemoteValueHeader)) return;  // the reply's checks refuse it
    std::memcpy(&header_, head.data(), sizeof(header_));
    const RemoteValueHeader aad = AadOf(header_);
    absl::StatusOr<std::unique_ptr<SealStream>> s = sealer_.StartOpen(FieldsOf(header_), Bytes(aad));
    if (s.ok()) {
      stream_ = *std::move(s);
    } else {
      why_ = s.status();
    }
  }
  void Piece(std::span<std::byte> piece) override {
    if (stream_ != nullptr) stream_->Update(piece);
  }
  // `header` is the one the reply kept: the one the stream was started on.
  absl::Status Finish(const RemoteValueHeader& header) {
    if (stream_ == nullptr) return why_.ok() ? absl::DataLossError("the value's header never arrived") : why_;
    if (std::memcmp(&header, &header_, sizeof(header)) != 0) return absl::DataLossError("header changed while read");
    return stream_->Finish();
  }

 private:
  const ValueSealer& sealer_;
  RemoteValueHeader header_;
  std::unique_ptr<SealStream> stream_;
  absl::Status why_;
};

// Opens (and decrypts in place) a payload whose header WhyNotTheBlock passed.
absl::Status OpenSealed(const RemoteValueHeader& h, const ValueSealer& sealer, std::span<std::byte> payload) {
  const RemoteValueHeader aad = AadOf(h);
  return sealer.Open(FieldsOf(h), Bytes(aad), payload);
}

// Seals `payload` in place (encrypting it when the sealer does) and fills
// h's key id, flags, nonce, tag and checksum.
absl::Status SealInto(RemoteValueHeader& h, const ValueSealer& sealer, std::span<std::byte> payload) {
  h.key_id = sealer.current_key_id();
  h.flags = sealer.encrypt() ? RemoteValueHeader::kEncrypted : 0;
  const RemoteValueHeader aad = AadOf(h);
  ASSIGN_OR_RETURN(SealFields f, sealer.Seal(Bytes(aad), payload));
  std::memcpy(h.nonce, f.nonce.data(), sizeof(h.nonce));
  std::memcpy(h.tag, f.tag.data(), sizeof(h.tag));
  h.checksum = XXH3_64bits(payload.data(), payload.size());
  return absl::OkStatus();
}

uint64_t DeadlineOf(const IoOptions& io, uint64_t timeout_ms) {
  return io.deadline_ns != 0 ? io.deadline_ns : MonotonicNanos() + timeout_ms * 1'000'000;
}

// Whether a ledger entry from the cluster is one we write:
// "<bytes>:<64 hex>:<64 hex>" (the cluster's bytes are not trusted).
bool IsLedgerMember(absl::string_view m) {
  const size_t colon = m.find(':');
  if (colon == 0 || colon == absl::string_view::npos || colon > 20) return false;
  for (size_t i = 0; i < colon; ++i) {
    if (m[i] < '0' || m[i] > '9') return false;
  }
  if (m.size() != colon + 1 + 64 + 1 + 64 || m[colon + 65] != ':') return false;
  for (size_t i = colon + 1; i < m.size(); ++i) {
    if (i == colon + 65) continue;
    const char c = m[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

const char* const kLedgerFunction = "kvtier_ledger_v1";
const char* LedgerLibrary() { return kLedgerLibraryText; }

std::string LedgerKey(const std::string& prefix, const std::string& tenant) {
  return absl::StrCat(prefix, ":", tenant, ":{", tenant, "}:ledger");
}
std::string LedgerUsedKey(const std::string& prefix, const std::string& tenant) {
  return absl::StrCat(prefix, ":", tenant, ":{", tenant, "}:used");
}

absl::Status CheckRemoteValue(absl::string_view value, const BlockMeta& meta, const ValueSealer* sealer) {
  if (const std::string why = WhyNotTheBlock(value, meta); !why.empty()) return absl::DataLossError(why);
  if (sealer == nullptr) return absl::OkStatus();
  RemoteValueHeader h;
  std::memcpy(&h, value.data(), sizeof(h));
  std::vector<std::byte> payload(value.size() - sizeof(h));
  std::memcpy(payload.data(), value.data() + sizeof(h), payload.size());
  return OpenSealed(h, *sealer, payload);
}

absl::StatusOr<std::string> MakeRemoteValue(const BlockMeta& meta, std::span<const std::byte> payload,
                                            const ValueSealer& sealer) {
  RemoteValueHeader h = HeaderFor(meta, payload.size());
  std::string v(sizeof(h) + payload.size(), '\0');
  std::memcpy(v.data() + sizeof(h), payload.data(), payload.size());
  RETURN_IF_ERROR(SealInto(h, sealer, {reinterpret_cast<std::byte*>(v.data() + sizeof(h)), payload.size()}));
  std::memcpy(v.data(), &h, sizeof(h));
  return v;
}

RemoteTier::RemoteTier(const RemoteTierOptions& opts)
    : opts_(opts) {}

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const RemoteTierOptions& opts) {
  if (opts.tenants.empty()) return absl::InvalidArgumentError("the remote tier has no tenant credentials");
  if (opts.max_block_bytes == 0 || opts.capacity_bytes == 0) {
    return absl::InvalidArgumentError("the remote tier's max_block_bytes and capacity_bytes must be above 0");
  }
  auto tier = std::unique_ptr<RemoteTier>(new RemoteTier(opts));
  for (const RemoteTenant& t : opts.tenants) {
    if (t.name.empty() || t.user.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote tier: tenant \"", t.name, "\" needs its own ACL user (a user and a password)"));
    }
    for (const TenantLink& other : tier->tenants_) {
      if (other.name == t.name) return absl::InvalidArgumentError(absl::StrCat("remote tier: tenant \"", t.name, "\" twice"));
    }
    RedisClusterOptions c;
    // A tenant with a cluster of its own shares no memory with the others.
    c.seeds = t.seeds.empty() ? opts.seeds : t.seeds;
    c.user = t.user;
    c.password = t.password;
    c.name = absl::StrCat(opts.name, " (tenant \"", t.name, "\")");
    c.connect_timeout_ms = opts.connect_timeout_ms;
    c.io_timeout_ms = opts.io_timeout_ms;
    c.max_pipeline = opts.max_pipeline;
    c.max_reply_bytes = opts.max_block_bytes + sizeof(RemoteValueHeader) + (64 << 10);
    c.tls = opts.tls;
    if (opts.on_auth_failure) {
      c.on_auth_failure = [report = opts.on_auth_failure, name = t.name](const std::string& why) { report(name, why); };
    }
    if (t.keys.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("remote tier: tenant \"", t.name,
                                                     "\" needs a key to seal its values (remote_key_file)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ValueSealer> sealer, ValueSealer::Create(t.keys, opts.encrypt));
    ASSIGN_OR_RETURN(std::unique_ptr<RedisCluster> cluster, RedisCluster::Create(c));
    tier->tenants_.push_back({t.name, TenantHash(t.name), std::move(cluster), std::move(sealer), t.budget_bytes,
                              LedgerKey(opts.key_prefix, t.name), LedgerUsedKey(opts.key_prefix, t.name),
                              std::make_unique<Touches>()});
  }
  return tier;
}

RemoteTier::~RemoteTier() {
  Drain();
  // Each cluster fails what is still queued (nothing: drained) and joins.
  tenants_.clear();
}

std::string RemoteTier::KeyFor(const std::string& tenant, const BlockMeta& meta) const {
  return absl::StrCat(opts_.key_prefix, ":", tenant, ":", meta.ns.Hex(), ":", meta.key.Hex());
}

const RemoteTier::TenantLink* RemoteTier::LinkFor(uint64_t tenant_hash) const {
  for (const TenantLink& t : tenants_) {
    if (t.hash == tenant_hash) return &t;
  }
  return nullptr;
}

void RemoteTier::Began(bool write) {
  MutexLock l(&mu_);
  ++(write ? writes_in_flight_ : reads_in_flight_);
}

void RemoteTier::Ended(bool write) {
  // Notified under the lock: a Drain that sees the count reach 0 may be the
  // destructor's, and the condition variable goes with the tier.
  MutexLock l(&mu_);
  --(write ? writes_in_flight_ : reads_in_flight_);
  idle_.notify_all();
}

void RemoteTier::CountMiss(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound: miss_not_found_.fetch_add(1, std::memory_order_relaxed); break;
    case absl::StatusCode::kDataLoss: break;  // counted where it is found
    case absl::StatusCode::kUnavailable: miss_unavailable_.fetch_add(1, std::memory_order_relaxed); break;
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      miss_deadline_.fetch_add(1, std::memory_order_relaxed);
      abandoned_.fetch_add(1, std::memory_order_relaxed);
      break;
    default: miss_other_.fetch_add(1, std::memory_order_relaxed); break;
  }
}

void RemoteTier::Put(BlockLocator, const BlockMeta& meta, std::span<const std::byte> src, const IoOptions& io,
                       IoCallback done) {
  if (src.empty() || src.size() != meta.payload_bytes || src.size() > opts_.max_block_bytes) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("a write of ", src.size(), " bytes (", meta.payload_bytes,
                                                            " in its meta) to the ", opts_.name, " tier, which takes 1 to ",
                                                            opts_.max_block_bytes)));
    return;
  }
  const TenantLink* link = LinkFor(meta.tenant_hash);
  if (link == nullptr) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("the ", opts_.name, " tier has no credentials for this block's tenant")));
    return;
  }
  RemoteValueHeader h = HeaderFor(meta, src.size());
  // The payload is copied once, into the command (src is the caller's again
  // when Put returns), and hashed there, just written, into the header.
  RedisCommand cmd = RedisCommand::Make(
      {{"SET"},
       {KeyFor(link->name, meta)},
       {absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h)),
        absl::string_view(reinterpret_cast<const char*>(src.data()), src.size())}},
      1);
  const std::span<char> value = cmd.arg(2);
  if (absl::Status sealed =
          SealInto(h, *link->sealer, {reinterpret_cast<std::byte*>(value.data() + sizeof(h)), src.size()});
      !sealed.ok()) {
    writes_refused_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(std::move(sealed));
    return;
  }
  std::memcpy(value.data(), &h, sizeof(h));
  const uint64_t deadline = DeadlineOf(io, opts_.op_timeout_ms);
  Began(true);
  if (link->budget_bytes == 0) {
    SubmitSet(*link, std::move(cmd), src.size(), deadline, io.cancel, std::move(done));
    return;
  }
  // The ledger first: the block is counted (and the tenant's oldest blocks
  // evicted) before it is there to be read, so the tenant's bytes never
  // pass its budget by more than the writes in flight.
  std::string member = LedgerMember(meta);
  RedisCommand ledger = LedgerCommand(*link, {member});
  link->cluster->Submit(
      std::move(ledger),
      [this, link, member = std::move(member), cmd = std::move(cmd), bytes = src.size(), deadline,
       cancel = io.cancel, done = std::move(done)](absl::StatusOr<RedisReply> r) mutable {
        if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY) {
          if (r.ok()) r = absl::UnknownError(absl::StrCat(opts_.name, ": the ledger function answered with reply type ", (*r)->type));
          LedgerFailed(*link, r.status());
          if (!absl::IsDeadlineExceeded(r.status()) && !absl::IsCancelled(r.status())) {
            io_errors_.fetch_add(1, std::memory_order_relaxed);
          } else {
            abandoned_.fetch_add(1, std::memory_order_relaxed);
          }
          std::move(done)(absl::Status(r.status().code(),
                                       absl::StrCat("tenant \"", link->name, "\"'s budget ledger: ", r.status().message())));
          Ended(true);
          return;
        }
        ledger_updates_.fetch_add(1, std::memory_order_relaxed);
        if (DeleteEvicted(*link, *r, member)) {
          budget_refused_.fetch_add(1, std::memory_order_relaxed);
          writes_refused_.fetch_add(1, std::memory_order_relaxed);
          std::move(done)(absl::ResourceExhaustedError(absl::StrCat(
              "a block of ", FormatBytes(bytes), " does not fit tenant \"", link->name, "\"'s budget of ",
              FormatBytes(link->budget_bytes), " in the ", opts_.name, " tier")));
          Ended(true);
          return;
        }
        SubmitSet(*link, std::move(cmd), bytes, deadline, std::move(cancel), std::move(done));
      },
      deadline, io.cancel);
}

void RemoteTier::Touch(const TenantLink& link, const BlockMeta& meta) {
  {
    MutexLock l(&link.touches->mu);
    if (link.touches->members.size() >= kMaxTouches) {
      touches_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    link.touches->members.push_back(LedgerMember(meta));
    if (link.touches->members.size() < kTouchBatch) return;
  }
  // Enough reads waiting: a ledger call of their own (no write to carry them).
  Began(false);  // Drain waits for it
  link.cluster->Submit(LedgerCommand(link, {}), [this, &link](absl::StatusOr<RedisReply> r) {
    if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY) {
      LedgerFailed(link, r.ok() ? absl::UnknownError("the ledger function answered with another reply type") : r.status());
    } else {
      ledger_updates_.fetch_add(1, std::memory_order_relaxed);
      DeleteEvicted(link, *r, "");
    }
    Ended(false);
  });
}

void RemoteTier::LedgerFailed(const TenantLink& link, const absl::Status& why) {
  ledger_failures_.fetch_add(1, std::memory_order_relaxed);
  if (!opts_.on_ledger_failure || absl::IsDeadlineExceeded(why) || absl::IsCancelled(why)) return;
  const uint64_t now = MonotonicNanos();
  uint64_t last = ledger_failure_reported_ns_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < 10'000'000'000ull) return;
  if (!ledger_failure_reported_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  opts_.on_ledger_failure(link.name, std::string(why.message()));
}

std::string RemoteTier::LedgerMember(const BlockMeta& meta) const {
  return absl::StrCat(CostFor(meta.payload_bytes) + kLedgerEntryBytes, ":", meta.ns.Hex(), ":", meta.key.Hex());
}

RedisCommand RemoteTier::LedgerCommand(const TenantLink& link, const std::vector<std::string>& added) {
  std::vector<std::string> touched;
  {
    MutexLock l(&link.touches->mu);
    touched.swap(link.touches->members);
  }
  const std::string budget = absl::StrCat(link.budget_bytes), n = absl::StrCat(added.size());
  std::vector<absl::string_view> args = {"FCALL", kLedgerFunction, "2", link.ledger_key, link.ledger_used_key, budget, n};
  for (const std::string& m : added) args.push_back(m);
  for (const std::string& m : touched) args.push_back(m);
  touches_.fetch_add(touched.size(), std::memory_order_relaxed);
  return RedisCommand::MakeList(args, 3);
}

bool RemoteTier::DeleteEvicted(const TenantLink& link, const RedisReply& reply, const std::string& self) {
  bool evicted_self = false;
  std::vector<std::pair<RedisCommand, RedisCluster::Callback>> dels;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e == nullptr || e->type != REDIS_REPLY_STRING || !IsLedgerMember({e->str, e->len})) {
      ledger_bad_entries_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const absl::string_view m(e->str, e->len);
    // The block being written may be its own victim (it alone is past the
    // budget): not written, and any older copy of it deleted too.
    if (m == self) evicted_self = true;
    // "<prefix>:<tenant>:" and the entry's "<namespace>:<block>".
    const std::string key = absl::StrCat(opts_.key_prefix, ":", link.name, ":", m.substr(m.find(':') + 1));
    dels.emplace_back(RedisCommand::Make({{"DEL"}, {key}}, 1), [](absl::StatusOr<RedisReply>) {});
  }
  if (!dels.empty()) {
    budget_evictions_.fetch_add(dels.size(), std::memory_order_relaxed);
    link.cluster->SubmitAll(std::move(dels));
  }
  return evicted_self;
}

void RemoteTier::SubmitSet(const TenantLink& link, RedisCommand cmd, uint64_t bytes, uint64_t deadline_ns,
                           CancelToken cancel, IoCallback done) {
  link.cluster->Submit(
      std::move(cmd),
      [this, bytes, done = std::move(done)](absl::StatusOr<RedisReply> r) mutable {
        absl::Status s;
        if (!r.ok()) {
          s = r.status();
        } else if ((*r)->type != REDIS_REPLY_STATUS) {
          s = absl::UnknownError(absl::StrCat(opts_.name, ": SET answered with reply type ", (*r)->type));
        }
        if (s.ok()) {
          writes_.fetch_add(1, std::memory_order_relaxed);
          bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
        } else if (!absl::IsDeadlineExceeded(s) && !absl::IsCancelled(s)) {
          io_errors_.fetch_add(1, std::memory_order_relaxed);
        } else {
          abandoned_.fetch_add(1, std::memory_order_relaxed);
        }
        std::move(done)(std::move(s));
        Ended(true);
      },
      deadline_ns, std::move(cancel));
}

void RemoteTier::Get(BlockLocator, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                      IoCallback done) {
  const TenantLink* link = LinkFor(meta.tenant_hash);
  if (meta.payload_bytes == 0 || meta.payload_bytes > opts_.max_block_bytes || dst.size() < meta.payload_bytes ||
      link == nullptr) {
    miss_other_.fetch_add(1, std::memory_order_relaxed);
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "a read of ", meta.payload_bytes, " bytes from the ", opts_.name, " tier: ",
        link == nullptr ? "no credentials for the block's tenant" : "a length out of range, or a buffer too small")));
    return;
  }
  std::string key = KeyFor(link->name, meta);
  RedisCommand cmd = RedisCommand::Make({{"GET"}, {key}}, 1);
  // The payload lands in dst as it is read; the header stays in the reply.
  auto digest = std::make_unique<uint64_t>(0);
  auto opening = std::make_unique<StreamingOpen>(*link->sealer);
  cmd.SinkReplyInto(dst.first(meta.payload_bytes), sizeof(RemoteValueHeader), digest.get(), opening.get());
  Began(false);
  const uint64_t start = MonotonicNanos();
  link->cluster->Submit(
      std::move(cmd),
      [this, link, meta, dst, start, key = std::move(key), digest = std::move(digest), opening = std::move(opening),
       done = std::move(done)](absl::StatusOr<RedisReply> r) mutable {
        absl::Status s;
        if (!r.ok()) {
          s = r.status();
        } else if ((*r)->type == REDIS_REPLY_NIL) {
          s = absl::NotFoundError(absl::StrCat("the block is not in the ", opts_.name, " tier (evicted there)"));
        } else if ((*r)->type != REDIS_REPLY_STRING) {
          s = absl::DataLossError(absl::StrCat(opts_.name, ": GET answered with reply type ", (*r)->type));
        } else if (SunkLength(**r) != 0) {
          // Header in the reply, payload already in dst.
          const absl::string_view header((*r)->str, (*r)->len);
          if (const std::string why = WhyNotTheBlock(header, meta, dst.first(meta.payload_bytes), *digest);
              !why.empty()) {
            s = absl::DataLossError(absl::StrCat("the ", opts_.name, " tier's copy is not the block: ", why));
          } else {
            RemoteValueHeader h;
            std::memcpy(&h, header.data(), sizeof(h));
            // Opened as it was read (StreamingOpen); only the tag is left.
            if (absl::Status open = opening->Finish(h); !open.ok()) {
              seal_failures_.fetch_add(1, std::memory_order_relaxed);
              s = absl::DataLossError(absl::StrCat("the ", opts_.name, " tier's copy is not the block: ", open.message()));
            }
          }
        } else {
          // A value of another length: never the block (WhyNotTheBlock says why).
          const absl::string_view v((*r)->str, (*r)->len);
          const std::string why = WhyNotTheBlock(v, meta);
          s = absl::DataLossError(absl::StrCat("the ", opts_.name, " tier's copy is not the block: ",
                                               why.empty() ? "unexpected length" : why));
        }
        if (absl::IsDataLoss(s)) {
          // Never served, and gone for every node: the next store writes it again.
          checksum_failures_.fetch_add(1, std::memory_order_relaxed);
          link->cluster->Submit(RedisCommand::Make({{"DEL"}, {key}}, 1), [](absl::StatusOr<RedisReply>) {});
        }
        if (s.ok()) {
          if (link->budget_bytes != 0) Touch(*link, meta);
          reads_.fetch_add(1, std::memory_order_relaxed);
          bytes_read_.fetch_add(meta.payload_bytes, std::memory_order_relaxed);
          if (read_observer_) read_observer_(meta.payload_bytes, IoTiming{MonotonicNanos() - start, 1});
        } else {
          CountMiss(s);
          if (absl::IsUnavailable(s) || absl::IsUnknown(s)) io_errors_.fetch_add(1, std::memory_order_relaxed);
        }
        std::move(done)(std::move(s));
        Ended(false);
      },
      DeadlineOf(io, opts_.op_timeout_ms), io.cancel);
}

void RemoteTier::Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
                        uint64_t deadline_ns) {
  struct Probe {
    Mutex mu;
    std::vector<bool> present ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu) = 0;
    absl::AnyInvocable<void(std::vector<bool>) &&> done;
  };
  auto p = std::make_shared<Probe>();
  {
    MutexLock l(&p->mu);
    p->present.assign(metas.size(), false);
    p->left = metas.size() + 1;  // +1 until every EXISTS is sent
  }
  // In flight as a read until its answer is given: Drain waits for it.
  Began(false);
  p->done = [this, done = std::move(done)](std::vector<bool> v) mutable {
    std::move(done)(std::move(v));
    Ended(false);
  };
  auto arrive = [p](size_t i, bool there) {
    std::vector<bool> out;
    {
      MutexLock l(&p->mu);
      if (there) p->present[i] = true;
      if (--p->left != 0) return;
      out = std::move(p->present);
    }
    std::move(p->done)(std::move(out));
  };
  const uint64_t deadline = deadline_ns != 0 ? deadline_ns : MonotonicNanos() + opts_.op_timeout_ms * 1'000'000;
  // One batch per tenant's cluster: each node gets its keys in one round trip.
  std::vector<std::vector<std::pair<RedisCommand, RedisCluster::Callback>>> by_tenant(tenants_.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    const TenantLink* link = LinkFor(metas[i].tenant_hash);
    if (link == nullptr) {
      arrive(i, false);
      continue;
    }
    by_tenant[static_cast<size_t>(link - tenants_.data())].emplace_back(
        RedisCommand::Make({{"EXISTS"}, {KeyFor(link->name, metas[i])}}, 1),
        [arrive, i](absl::StatusOr<RedisReply> r) {
          arrive(i, r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1);
        });
  }
  for (size_t t = 0; t < tenants_.size(); ++t) {
    if (!by_tenant[t].empty()) tenants_[t].cluster->SubmitAll(std::move(by_tenant[t]), deadline);
  }
  arrive(0, false);  // the +1
}

TierUsage RemoteTier::Usage() const {
  return TierUsage{.capacity_bytes = opts_.capacity_bytes};  // what this node claims is in the store's books
}

TierHealth RemoteTier::Health() const {
  TierHealth worst = TierHealth::kHealthy;
  for (const TenantLink& t : tenants_) {
    const TierHealth h = t.cluster->Health();
    if (h == TierHealth::kFailed || (h == TierHealth::kDegraded && worst == TierHealth::kHealthy)) worst = h;
  }
  return worst;
}

absl::Status RemoteTier::Sync() {
  MutexLock l(&mu_);
  mu_.Await(idle_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return writes_in_flight_ == 0; });
  return absl::OkStatus();
}

void RemoteTier::Drain() {
  MutexLock l(&mu_);
  mu_.Await(idle_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return writes_in_flight_ == 0 && reads_in_flight_ == 0; });
}

BlockTierStats RemoteTier::BlockStats() const {
  BlockTierStats s;
  s.capacity_bytes = opts_.capacity_bytes;
  {
    MutexLock l(&mu_);
    s.in_flight = reads_in_flight_ + writes_in_flight_;
  }
  s.reads = reads_.load(std::memory_order_relaxed);
  s.writes = writes_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  s.io_errors = io_errors_.load(std::memory_order_relaxed);
  s.writes_refused = writes_refused_.load(std::memory_order_relaxed);
  s.abandoned = abandoned_.load(std::memory_order_relaxed);
  return s;
}

RemoteTier::Misses RemoteTier::misses() const {
  return {.not_found = miss_not_found_.load(std::memory_order_relaxed),
          .bad_value = checksum_failures_.load(std::memory_order_relaxed),
          .forged = seal_failures_.load(std::memory_order_relaxed),
          .unavailable = miss_unavailable_.load(std::memory_order_relaxed),
          .deadline = miss_deadline_.load(std::memory_order_relaxed),
          .other = miss_other_.load(std::memory_order_relaxed)};
}

RemoteTier::Budget RemoteTier::budget() const {
  return {.updates = ledger_updates_.load(std::memory_order_relaxed),
          .evictions = budget_evictions_.load(std::memory_order_relaxed),
          .refused = budget_refused_.load(std::memory_order_relaxed),
          .failures = ledger_failures_.load(std::memory_order_relaxed),
          .touches = touches_.load(std::memory_order_relaxed),
          .touches_dropped = touches_dropped_.load(std::memory_order_relaxed),
          .bad_entries = ledger_bad_entries_.load(std::memory_order_relaxed)};
}

RedisCluster::Stats RemoteTier::ClusterStats(const std::string& tenant) const {
  for (const TenantLink& t : tenants_) {
    if (t.name == tenant) return t.cluster->GetStats();
  }
  return {};
}

}  // namespace kvtier
