// SPDX-License-Identifier: Apache-2.0
// The C ABI (include/kvtier/kvtier.h) over the C++ client.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <new>

#include "absl/container/flat_hash_map.h"
#include "kvtier/client.h"
#include "kvtier/kvtier.h"

struct kvtier_client {
  std::unique_ptr<kvtier::Client> client;
  std::string last_error;
  std::string hash_name;  // kvtier_hash_name's, NUL-terminated for the client's life
  // Async C operations whose results are translated when they complete.
  struct Pending {
    kvtier::LookupResult lookup;
    kvtier_lookup_result* lookup_out = nullptr;
    uint8_t* tiers_out = nullptr;
    uint8_t* lanes_out = nullptr;
    std::vector<kvtier::BlockView> views;
    kvtier_block* blocks_out = nullptr;
    size_t requested = 0;
    // kvtier_store_begin_async
    kvtier::StoreTicket ticket;
    uint64_t* ticket_out = nullptr;
    kvtier_block* slots_out = nullptr;
  };
  absl::flat_hash_map<kvtier_op, std::unique_ptr<Pending>> pending;
  // Open stores by ticket id: their slots, for kvtier_gather_from_cache.
  // Forgotten at commit or abort (the daemon bounds how many are open).
  absl::flat_hash_map<uint64_t, kvtier::StoreTicket> tickets;
};

namespace {

using kvtier::BlockKey;

// The message of the last failed call made on this thread without a client
// (kvtier_attach, or a call given a NULL client): kvtier_last_error(NULL).
thread_local std::string tls_last_error;

std::string& ErrorOf(kvtier_client* c) { return c != nullptr ? c->last_error : tls_last_error; }

// Every call starts with this: the last error belongs to the last call.
void Begin(kvtier_client* c) { ErrorOf(c).clear(); }

int Fail(kvtier_client* c, const kvtier::Status& s) {
  ErrorOf(c) = s.message();
  return s.raw_code();
}

int Fail(kvtier_client* c, int code, std::string message) {
  ErrorOf(c) = std::move(message);
  return code;
}

int NullArg(kvtier_client* c, const char* what) {
  return Fail(c, KVTIER_EINVAL, std::string(what) + " is NULL");
}

// The checks every call that takes keys makes.
int CheckKeys(kvtier_client* c, const kvtier_key* keys, size_t n) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  if (keys == nullptr && n > 0) return Fail(c, KVTIER_EINVAL, "keys is NULL but n is " + std::to_string(n));
  return KVTIER_OK;
}

// A count, as the C++ API returns it, or the failure's code.
int Count(kvtier_client* c, const kvtier::Result<uint32_t>& r) {
  if (!r.ok()) return Fail(c, r.status());
  return static_cast<int>(std::min<uint32_t>(*r, INT32_MAX));
}

std::string Str(const char* s) { return s ? std::string(s) : std::string(); }

std::span<const BlockKey> Keys(const kvtier_key* keys, size_t n) {
  static_assert(sizeof(kvtier_key) == sizeof(BlockKey));
  return {reinterpret_cast<const BlockKey*>(keys), n};
}

void Slots(const kvtier::StoreTicket& t, kvtier_block* out) {
  for (size_t i = 0; i < t.slots.size(); ++i) {
    out[i] = kvtier_block{t.slots[i].data, t.slots[i].size, KVTIER_TIER_HOST,
                          static_cast<uint8_t>(t.slots[i].needed ? 1 : 0)};
  }
}

void Translate(kvtier_client* c, kvtier_client::Pending& p) {
  if (p.ticket_out != nullptr) {
    *p.ticket_out = p.ticket.id;
    Slots(p.ticket, p.slots_out);
    if (p.ticket.id != 0) c->tickets[p.ticket.id] = p.ticket;
  }
  if (p.lookup_out != nullptr) {
    p.lookup_out->hit_blocks = p.lookup.hit_blocks;
    p.lookup_out->recompute_blocks = p.lookup.recompute_blocks;
    p.lookup_out->lease = p.lookup.lease;
    if (p.tiers_out != nullptr) {
      for (size_t i = 0; i < p.lookup.tiers.size(); ++i) p.tiers_out[i] = static_cast<uint8_t>(p.lookup.tiers[i]);
    }
    if (p.lanes_out != nullptr) {
      for (size_t i = 0; i < p.lookup.lanes.size(); ++i) p.lanes_out[i] = p.lookup.lanes[i];
    }
  }
  if (p.blocks_out != nullptr) {
    for (size_t i = p.views.size(); i < p.requested; ++i) p.blocks_out[i] = kvtier_block{nullptr, 0, KVTIER_TIER_NONE, 0};
    for (size_t i = 0; i < p.views.size(); ++i) {
      p.blocks_out[i] = kvtier_block{const_cast<std::byte*>(p.views[i].data), p.views[i].size,
                                     static_cast<uint8_t>(p.views[i].tier), 0};
    }
  }
}

int Finish(kvtier_client* c, kvtier_op op, const kvtier::Status& s) {
  auto it = c->pending.find(op);
  if (it != c->pending.end()) {
    if (s.ok()) Translate(c, *it->second);
    if (s.code() != kvtier::ErrorCode::kTimedOut) c->pending.erase(it);
  }
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

}  // namespace

extern "C" {

int kvtier_attach(const char* socket_path, const kvtier_namespace_desc* ns, kvtier_client** out) {
  Begin(nullptr);
  if (ns == nullptr) return NullArg(nullptr, "the namespace descriptor");
  if (out == nullptr) return NullArg(nullptr, "out");
  kvtier::AttachOptions opts;
  opts.socket_path = Str(socket_path);
  opts.ns = kvtier::NamespaceDescriptor{Str(ns->model_id),  Str(ns->model_revision), Str(ns->tokenizer_revision),
                                        Str(ns->adapter_id), Str(ns->attention_config_hash), Str(ns->kv_dtype),
                                        Str(ns->kv_layout), Str(ns->cache_salt), ns->block_tokens,
                                        ns->block_bytes,    ns->tp_rank,           ns->tp_size};
  auto client = kvtier::Client::Attach(opts);
  if (!client.ok()) return Fail(nullptr, client.status());
  auto* c = new (std::nothrow) kvtier_client;
  if (c == nullptr) return Fail(nullptr, KVTIER_ENOMEM, "out of memory for the client");
  c->client = std::move(*client);
  c->hash_name = std::string(kvtier::HashAlgorithmName(c->client->hash()));
  *out = c;
  return KVTIER_OK;
}

void kvtier_detach(kvtier_client* c) { delete c; }

int kvtier_compute_keys(kvtier_client* c, const uint32_t* tokens, size_t n_tokens, const kvtier_key* parent,
                        const void* extra, size_t extra_len, kvtier_key* out, size_t max_keys, size_t* n_out) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (tokens == nullptr && n_tokens > 0) return NullArg(c, "tokens");
  if (n_out == nullptr) return NullArg(c, "n_out");
  std::vector<BlockKey> keys = c->client->ComputeKeys(
      {tokens, n_tokens}, parent ? reinterpret_cast<const BlockKey*>(parent) : nullptr,
      {static_cast<const std::byte*>(extra), extra ? extra_len : 0});
  *n_out = keys.size();
  if (keys.size() > max_keys || (out == nullptr && !keys.empty())) {
    return Fail(c, kvtier::Status(kvtier::ErrorCode::kInvalidArgument, "output holds fewer keys than the tokens make"));
  }
  if (!keys.empty()) std::memcpy(out, keys.data(), keys.size() * sizeof(BlockKey));
  return KVTIER_OK;
}

int kvtier_lookup_lanes_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                              kvtier_lookup_result* result, uint8_t* tiers, uint8_t* lanes, kvtier_op* op) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (result == nullptr) return NullArg(c, "result");
  if (op == nullptr) return NullArg(c, "op");
  auto p = std::make_unique<kvtier_client::Pending>();
  p->lookup_out = result;
  p->tiers_out = tiers;
  p->lanes_out = lanes;
  constexpr uint32_t kKnown = KVTIER_LOOKUP_LEASE | KVTIER_LOOKUP_ASK | KVTIER_LOOKUP_NOT_ASK;
  if ((flags & ~kKnown) != 0 || ((flags & KVTIER_LOOKUP_ASK) != 0 && (flags & KVTIER_LOOKUP_NOT_ASK) != 0)) {
    return Fail(c, kvtier::Status(kvtier::ErrorCode::kInvalidArgument,
                                  "lookup flags: LEASE, and at most one of ASK and NOT_ASK"));
  }
  const kvtier::LookupOptions::Ask ask = (flags & KVTIER_LOOKUP_ASK) != 0       ? kvtier::LookupOptions::Ask::kYes
                                         : (flags & KVTIER_LOOKUP_NOT_ASK) != 0 ? kvtier::LookupOptions::Ask::kNo
                                                                                : kvtier::LookupOptions::Ask::kIfLeased;
  auto r = c->client->LookupAsync(Keys(keys, n), {.lease = (flags & KVTIER_LOOKUP_LEASE) != 0, .ask = ask},
                                  &p->lookup);
  if (!r.ok()) return Fail(c, r.status());
  *op = *r;
  c->pending.emplace(*r, std::move(p));
  return KVTIER_OK;
}

int kvtier_lookup_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                        kvtier_lookup_result* result, uint8_t* tiers, kvtier_op* op) {
  return kvtier_lookup_lanes_async(c, keys, n, flags, result, tiers, nullptr, op);
}

int kvtier_load_async(kvtier_client* c, uint64_t lease, const kvtier_key* keys, size_t n, kvtier_block* blocks,
                      kvtier_op* op) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (blocks == nullptr) return NullArg(c, "blocks");
  if (op == nullptr) return NullArg(c, "op");
  auto p = std::make_unique<kvtier_client::Pending>();
  p->blocks_out = blocks;
  p->requested = n;
  auto r = c->client->LoadAsync(lease, Keys(keys, n), &p->views);
  if (!r.ok()) return Fail(c, r.status());
  *op = *r;
  c->pending.emplace(*r, std::move(p));
  return KVTIER_OK;
}

// An operation this client started and whose result was not yet taken;
// else KVTIER_ENOENT (the C++ Poll reports such an id as done with kNotFound).
int CheckOutstanding(kvtier_client* c, kvtier_op op) {
  if (c->pending.contains(op)) return KVTIER_OK;
  return Fail(c, KVTIER_ENOENT, "operation " + std::to_string(op) +
                                    " is not outstanding: unknown, or its result was already taken");
}

int kvtier_poll(kvtier_client* c, kvtier_op op, int* status) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (int rc = CheckOutstanding(c, op); rc != 0) return rc;
  std::optional<kvtier::Status> s = c->client->Poll(op);
  if (!s) return 0;
  const int code = Finish(c, op, *s);
  if (status != nullptr) *status = code;
  return 1;
}

int kvtier_wait(kvtier_client* c, kvtier_op op, int timeout_ms) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (int rc = CheckOutstanding(c, op); rc != 0) return rc;
  const auto timeout = timeout_ms < 0 ? std::chrono::nanoseconds::max()
                                      : std::chrono::nanoseconds(std::chrono::milliseconds(timeout_ms));
  return Finish(c, op, c->client->Wait(op, timeout));
}

int kvtier_lookup(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags, kvtier_lookup_result* result,
                  uint8_t* tiers) {
  return kvtier_lookup_lanes(c, keys, n, flags, result, tiers, nullptr);
}

int kvtier_lookup_lanes(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                        kvtier_lookup_result* result, uint8_t* tiers, uint8_t* lanes) {
  kvtier_op op;
  if (int rc = kvtier_lookup_lanes_async(c, keys, n, flags, result, tiers, lanes, &op); rc != 0) return rc;
  return kvtier_wait(c, op, -1);
}

int kvtier_load(kvtier_client* c, uint64_t lease, const kvtier_key* keys, size_t n, kvtier_block* blocks) {
  kvtier_op op;
  if (int rc = kvtier_load_async(c, lease, keys, n, blocks, &op); rc != 0) return rc;
  if (int rc = kvtier_wait(c, op, -1); rc != 0) return rc;
  // The loaded prefix, as the C++ Load returns it.
  int loaded = 0;
  while (static_cast<size_t>(loaded) < n && loaded < INT32_MAX && blocks[loaded].data != nullptr) ++loaded;
  return loaded;
}

int kvtier_store_begin(kvtier_client* c, const kvtier_key* keys, size_t n, uint64_t* ticket, kvtier_block* blocks) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (ticket == nullptr) return NullArg(c, "ticket");
  if (blocks == nullptr) return NullArg(c, "blocks");
  auto t = c->client->StoreBegin(Keys(keys, n));
  if (!t.ok()) return Fail(c, t.status());
  *ticket = t->id;
  Slots(*t, blocks);
  if (t->id != 0) c->tickets[t->id] = std::move(*t);
  return KVTIER_OK;
}

int kvtier_store_commit(kvtier_client* c, uint64_t ticket) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::StoreTicket t;
  t.id = ticket;
  c->tickets.erase(ticket);
  kvtier::Status s = c->client->StoreCommit(t);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_store_commit_durable(kvtier_client* c, uint64_t ticket) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::StoreTicket t;
  t.id = ticket;
  c->tickets.erase(ticket);
  kvtier::Status s = c->client->StoreCommit(t, {.durable = true});
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_prefetch(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t* promoted) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  auto r = c->client->Prefetch(Keys(keys, n));
  if (!r.ok()) return Fail(c, r.status());
  if (promoted != nullptr) *promoted = *r;
  return KVTIER_OK;
}

int kvtier_store_abort(kvtier_client* c, uint64_t ticket) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::StoreTicket t;
  t.id = ticket;
  c->tickets.erase(ticket);
  kvtier::Status s = c->client->StoreAbort(t);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_store(kvtier_client* c, const kvtier_key* keys, size_t n, const void* const* src) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (n > 0 && src == nullptr) return NullArg(c, "src");
  std::vector<std::span<const std::byte>> spans(n);
  for (size_t i = 0; i < n; ++i) {
    if (src[i] == nullptr) return Fail(c, KVTIER_EINVAL, "src[" + std::to_string(i) + "] is NULL");
    spans[i] = {static_cast<const std::byte*>(src[i]), c->client->block_bytes()};
  }
  return Count(c, c->client->Store(Keys(keys, n), spans));
}

int kvtier_release(kvtier_client* c, uint64_t lease) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::Status s = c->client->Release(lease);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_invalidate(kvtier_client* c, const kvtier_key* keys, size_t n) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  return Count(c, c->client->Invalidate(Keys(keys, n)));
}

int kvtier_invalidate_namespace(kvtier_client* c) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  return Count(c, c->client->InvalidateNamespace());
}

int kvtier_report_prefill(kvtier_client* c, uint64_t cached_tokens, uint64_t computed_tokens, uint64_t elapsed_ns) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (elapsed_ns == 0 || elapsed_ns > INT64_MAX) {
    return Fail(c, KVTIER_EINVAL, "elapsed_ns must be in 1..INT64_MAX, got " + std::to_string(elapsed_ns));
  }
  kvtier::Status s = c->client->ReportPrefill(cached_tokens, computed_tokens,
                                              std::chrono::nanoseconds(static_cast<int64_t>(elapsed_ns)));
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

uint64_t kvtier_block_bytes(const kvtier_client* c) { return c ? c->client->block_bytes() : 0; }

uint32_t kvtier_block_tokens(const kvtier_client* c) { return c ? c->client->block_tokens() : 0; }

uint64_t kvtier_session_id(const kvtier_client* c) { return c ? c->client->session_id() : 0; }

const char* kvtier_tenant(const kvtier_client* c) { return c ? c->client->tenant().c_str() : ""; }

const char* kvtier_hash_name(const kvtier_client* c) { return c ? c->hash_name.c_str() : ""; }

int kvtier_connected(const kvtier_client* c) { return c != nullptr && c->client->connected() ? 1 : 0; }

int kvtier_in_flight(const kvtier_client* c) {
  return c ? static_cast<int>(std::min<uint32_t>(c->client->InFlight(), INT32_MAX)) : 0;
}

int kvtier_ping(kvtier_client* c) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::Status s = c->client->Ping();
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_store_begin_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint64_t* ticket,
                             kvtier_block* blocks, kvtier_op* op) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (ticket == nullptr) return NullArg(c, "ticket");
  if (blocks == nullptr && n > 0) return NullArg(c, "blocks");
  if (op == nullptr) return NullArg(c, "op");
  auto p = std::make_unique<kvtier_client::Pending>();
  p->ticket_out = ticket;
  p->slots_out = blocks;
  auto r = c->client->StoreBeginAsync(Keys(keys, n), &p->ticket);
  if (!r.ok()) return Fail(c, r.status());
  *op = *r;
  c->pending.emplace(*r, std::move(p));
  return KVTIER_OK;
}

int kvtier_store_commit_async(kvtier_client* c, uint64_t ticket, uint32_t flags, kvtier_op* op) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (op == nullptr) return NullArg(c, "op");
  if ((flags & ~KVTIER_COMMIT_DURABLE) != 0) return Fail(c, KVTIER_EINVAL, "unknown commit flags " + std::to_string(flags));
  kvtier::StoreTicket t;
  t.id = ticket;
  auto r = c->client->StoreCommitAsync(t, {.durable = (flags & KVTIER_COMMIT_DURABLE) != 0});
  if (!r.ok()) return Fail(c, r.status());
  c->tickets.erase(ticket);
  *op = *r;
  c->pending.emplace(*r, std::make_unique<kvtier_client::Pending>());
  return KVTIER_OK;
}

int kvtier_prefetch_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t* promoted, kvtier_op* op) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (promoted == nullptr) return NullArg(c, "promoted");
  if (op == nullptr) return NullArg(c, "op");
  auto r = c->client->PrefetchAsync(Keys(keys, n), promoted);
  if (!r.ok()) return Fail(c, r.status());
  *op = *r;
  c->pending.emplace(*r, std::make_unique<kvtier_client::Pending>());
  return KVTIER_OK;
}

int kvtier_release_async(kvtier_client* c, uint64_t lease, kvtier_op* op) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (op == nullptr) return NullArg(c, "op");
  auto r = c->client->ReleaseAsync(lease);
  if (!r.ok()) return Fail(c, r.status());
  *op = *r;
  c->pending.emplace(*r, std::make_unique<kvtier_client::Pending>());
  return KVTIER_OK;
}

void kvtier_namespace_id(const kvtier_client* c, uint8_t out[32]) {
  if (c != nullptr && out != nullptr) std::memcpy(out, c->client->namespace_id().bytes.data(), 32);
}

const char* kvtier_last_error(const kvtier_client* c) { return c ? c->last_error.c_str() : tls_last_error.c_str(); }

// ---- engine KV caches

namespace {

int LayoutOf(kvtier_client* c, const kvtier_kv_cache_layout* in, kvtier::KvCacheLayout* out, bool addresses) {
  if (in == nullptr) return NullArg(c, "the layout");
  out->layers = in->layers;
  out->page_tokens = in->page_tokens;
  out->kv_heads = in->kv_heads;
  out->head_dim = in->head_dim;
  out->dtype = in->dtype ? in->dtype : "f16";
  out->codec = in->codec ? in->codec : "none";
  out->num_pages = in->num_pages;
  out->page_stride = in->page_stride;
  if (!addresses) return KVTIER_OK;
  if (in->layers > 0 && (in->k_layers == nullptr || in->v_layers == nullptr)) {
    return NullArg(c, "k_layers or v_layers");
  }
  if (in->n_regions > 0 && in->regions == nullptr) return NullArg(c, "regions");
  if (in->layers > 65536 || in->n_regions > 4096) {
    return Fail(c, KVTIER_EINVAL, "a layout of " + std::to_string(in->layers) + " layers in " +
                                      std::to_string(in->n_regions) + " regions is not a KV cache");
  }
  out->k_layers.assign(in->k_layers, in->k_layers + in->layers);
  out->v_layers.assign(in->v_layers, in->v_layers + in->layers);
  for (size_t i = 0; i < in->n_regions; ++i) {
    out->regions.push_back({in->regions[i].base, in->regions[i].bytes, in->regions[i].memfd});
  }
  return KVTIER_OK;
}

int CheckPagesArg(kvtier_client* c, const uint32_t* pages, size_t n_pages) {
  if (pages == nullptr && n_pages > 0) return NullArg(c, "pages");
  return KVTIER_OK;
}

kvtier::DeviceLoad LoadOf(const kvtier_device_load* l) { return kvtier::DeviceLoad{l->op, l->layers, l->registration}; }

std::chrono::nanoseconds TimeoutOf(int timeout_ms) {
  return timeout_ms < 0 ? std::chrono::nanoseconds(std::chrono::seconds(30))
                        : std::chrono::nanoseconds(std::chrono::milliseconds(timeout_ms));
}

}  // namespace

int kvtier_kv_block_bytes(const kvtier_kv_cache_layout* layout, uint32_t block_tokens, uint64_t* out) {
  Begin(nullptr);
  if (out == nullptr) return NullArg(nullptr, "out");
  kvtier::KvCacheLayout l;
  if (int rc = LayoutOf(nullptr, layout, &l, false); rc != 0) return rc;
  auto r = kvtier::KvBlockBytes(l, block_tokens);
  if (!r.ok()) return Fail(nullptr, r.status());
  *out = *r;
  return KVTIER_OK;
}

int kvtier_register_kv_cache(kvtier_client* c, const kvtier_kv_cache_layout* layout, uint64_t* registration) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (registration == nullptr) return NullArg(c, "registration");
  kvtier::KvCacheLayout l;
  if (int rc = LayoutOf(c, layout, &l, true); rc != 0) return rc;
  auto r = c->client->RegisterKvCache(l);
  if (!r.ok()) return Fail(c, r.status());
  *registration = *r;
  return KVTIER_OK;
}

int kvtier_unregister_kv_cache(kvtier_client* c, uint64_t registration) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  kvtier::Status s = c->client->UnregisterKvCache(registration);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_store_from_cache(kvtier_client* c, uint64_t registration, const kvtier_key* keys, size_t n,
                            const uint32_t* pages, size_t n_pages) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (int rc = CheckPagesArg(c, pages, n_pages); rc != 0) return rc;
  return Count(c, c->client->StoreFromCache(registration, Keys(keys, n), {pages, n_pages}));
}

int kvtier_load_into_cache_async(kvtier_client* c, uint64_t registration, uint64_t lease, const kvtier_key* keys,
                                 size_t n, const uint32_t* pages, size_t n_pages, kvtier_device_load* load) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (int rc = CheckPagesArg(c, pages, n_pages); rc != 0) return rc;
  if (load == nullptr) return NullArg(c, "load");
  auto r = c->client->LoadIntoCacheAsync(registration, lease, Keys(keys, n), {pages, n_pages});
  if (!r.ok()) return Fail(c, r.status());
  *load = kvtier_device_load{r->op, r->layers, r->registration};
  return KVTIER_OK;
}

int kvtier_layers_ready(const kvtier_client* c, const kvtier_device_load* load) {
  if (c == nullptr || load == nullptr) return KVTIER_EINVAL;
  return static_cast<int>(std::min<uint32_t>(c->client->LayersReady(LoadOf(load)), INT32_MAX));
}

int kvtier_wait_layers(kvtier_client* c, const kvtier_device_load* load, uint32_t layers, int timeout_ms) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (load == nullptr) return NullArg(c, "load");
  return Count(c, c->client->WaitLayers(LoadOf(load), layers, TimeoutOf(timeout_ms)));
}

int kvtier_stream_wait_layers(kvtier_client* c, const kvtier_device_load* load, uint32_t layers, uint64_t stream,
                              int timeout_ms) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (load == nullptr) return NullArg(c, "load");
  return Count(c, c->client->StreamWaitLayers(LoadOf(load), layers, stream, TimeoutOf(timeout_ms)));
}

int kvtier_finish_load(kvtier_client* c, const kvtier_device_load* load, int timeout_ms) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (load == nullptr) return NullArg(c, "load");
  return Count(c, c->client->FinishLoad(LoadOf(load), TimeoutOf(timeout_ms)));
}

int kvtier_load_into_cache(kvtier_client* c, uint64_t registration, uint64_t lease, const kvtier_key* keys,
                           size_t n, const uint32_t* pages, size_t n_pages) {
  if (int rc = CheckKeys(c, keys, n); rc != 0) return rc;
  Begin(c);
  if (int rc = CheckPagesArg(c, pages, n_pages); rc != 0) return rc;
  return Count(c, c->client->LoadIntoCache(registration, lease, Keys(keys, n), {pages, n_pages}));
}

int kvtier_scatter_to_cache(kvtier_client* c, uint64_t registration, const kvtier_block* blocks, size_t n,
                            const uint32_t* pages, size_t n_pages, uint64_t stream, uint32_t first_layer,
                            uint32_t layer_count) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (blocks == nullptr && n > 0) return NullArg(c, "blocks");
  if (int rc = CheckPagesArg(c, pages, n_pages); rc != 0) return rc;
  if (n > n_pages) {  // each block needs its pages; also bounds the allocation below by the caller's own arrays
    return Fail(c, KVTIER_EINVAL, std::to_string(n) + " blocks for " + std::to_string(n_pages) + " pages");
  }
  std::vector<kvtier::BlockView> views;
  try {
    views.resize(n);
  } catch (const std::exception&) {
    return Fail(c, KVTIER_ENOMEM, "out of memory for " + std::to_string(n) + " block views");
  }
  for (size_t i = 0; i < n; ++i) {
    if (blocks[i].data == nullptr) return Fail(c, KVTIER_EINVAL, "blocks[" + std::to_string(i) + "] has no data");
    views[i] = kvtier::BlockView{static_cast<const std::byte*>(blocks[i].data), blocks[i].size,
                                 static_cast<kvtier::TierKind>(blocks[i].tier)};
  }
  kvtier::Status s = c->client->ScatterToCache(registration, views, {pages, n_pages}, stream, first_layer, layer_count);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_gather_from_cache(kvtier_client* c, uint64_t registration, uint64_t ticket, const uint32_t* pages,
                             size_t n_pages, uint64_t stream) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  if (int rc = CheckPagesArg(c, pages, n_pages); rc != 0) return rc;
  auto it = c->tickets.find(ticket);
  if (it == c->tickets.end()) {
    return Fail(c, KVTIER_ENOENT, "store ticket " + std::to_string(ticket) + " is not open in this client");
  }
  kvtier::Status s = c->client->GatherFromCache(registration, it->second, {pages, n_pages}, stream);
  return s.ok() ? KVTIER_OK : Fail(c, s);
}

int kvtier_map_gpu_arena(kvtier_client* c, uint64_t* bytes) {
  if (c == nullptr) return NullArg(nullptr, "the client");
  Begin(c);
  auto r = c->client->MapGpuArena();
  if (!r.ok()) return Fail(c, r.status());
  if (bytes != nullptr) *bytes = *r;
  return KVTIER_OK;
}

}  // extern "C"
