#include "daemon/kv_events.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/strings/match.h"
#include "spdlog/spdlog.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvtier {
namespace {

constexpr size_t kMaxEventsPerBatch = 4096;

void PackStr(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(msgpack::packer<msgpack::sbuffer>& pk, const BlockKey& key, bool bytes_hashes) {
  if (bytes_hashes) {
    pk.pack_bin(32);
    pk.pack_bin_body(reinterpret_cast<const char*>(key.bytes.data()), 32);
    return;
  }
  // vLLM: int.from_bytes(hash, "big") & (2**64 - 1): the last 8 bytes.
  uint64_t v = 0;
  for (size_t i = 24; i < 32; ++i) v = (v << 8) | key.bytes[i];
  pk.pack_uint64(v);
}

std::string BigEndian(int64_t v) {
  std::string s(8, '\0');
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((u >> (56 - 8 * i)) & 0xff);
  return s;
}

std::string Expand(std::string pattern, const std::string& tenant) {
  return absl::StrReplaceAll(pattern, {{"{tenant}", tenant}});
}

}  // namespace

std::string_view KvMediumName(KvMedium m) {
  switch (m) {
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kCpu:
      return "CPU";
    case KvMedium::kDisk:
      return "DISK";
    case KvMedium::kRemote:
      return "REMOTE";
  }
  return "CPU";
}

struct KvEvents::Sockets {
  zmq::context_t ctx{1};
  struct Tenant {
    std::string endpoint, replay_endpoint;
    std::unique_ptr<zmq::socket_t> pub, replay;
    int64_t seq = 0;
    std::deque<std::pair<int64_t, std::string>> buffer;
  };
  std::vector<Tenant> tenants;
};

KvEvents::KvEvents(const KvEventOptions& opts, std::vector<bool> publish)
    : opts_(opts), publish_(std::move(publish)), sockets_(std::make_unique<Sockets>()) {}

absl::StatusOr<std::unique_ptr<KvEvents>> KvEvents::Start(const KvEventOptions& opts,
                                                         const std::vector<KvEventTenant>& tenants,
                                                         const std::string& run_dir) {
  std::vector<bool> publish;
  for (const KvEventTenant& t : tenants) publish.push_back(t.publish);
  std::unique_ptr<KvEvents> ev(new KvEvents(opts, publish));
  ev->sockets_->tenants.resize(tenants.size());
  for (size_t i = 0; i < tenants.size(); ++i) {
    const KvEventTenant& t = tenants[i];
    if (!t.publish) continue;
    Sockets::Tenant& s = ev->sockets_->tenants[i];
    s.endpoint = Expand(opts.endpoint.empty() ? absl::StrCat("ipc://", run_dir, "/kvtier-events-{tenant}.sock")
                                              : opts.endpoint,
                        t.name);
    if (opts.replay_endpoint != "off") {
      s.replay_endpoint =
          Expand(opts.replay_endpoint.empty() ? absl::StrCat("ipc://", run_dir, "/kvtier-events-{tenant}-replay.sock")
                                              : opts.replay_endpoint,
                 t.name);
    }
    for (auto [endpoint, sock, type] :
         {std::tuple{&s.endpoint, &s.pub, zmq::socket_type::pub},
          std::tuple{&s.replay_endpoint, &s.replay, zmq::socket_type::router}}) {
      if (endpoint->empty()) continue;
      try {
        *sock = std::make_unique<zmq::socket_t>(ev->sockets_->ctx, type);
        (*sock)->set(zmq::sockopt::linger, 0);
        if (type == zmq::socket_type::pub) {
          (*sock)->set(zmq::sockopt::sndhwm, 100000);
        } else {
          // A replay request is three short frames; anything longer is not
          // one (the peer is cut off instead of buffered).
          (*sock)->set(zmq::sockopt::maxmsgsize, int64_t{64});
          (*sock)->set(zmq::sockopt::sndhwm, static_cast<int>(opts.buffer_batches) + 16);
        }
        // The socket file appears owner-only, then is given to the tenant.
        const mode_t old_mask = umask(0177);
        (*sock)->bind(*endpoint);
        umask(old_mask);
      } catch (const zmq::error_t& e) {
        return absl::FailedPreconditionError(absl::StrCat("events: cannot bind ", *endpoint, " for tenant \"", t.name,
                                                          "\": ", e.what(), "; check [events] endpoint"));
      }
      if (absl::StartsWith(*endpoint, "ipc://")) {
        const std::string path = endpoint->substr(6);
        mode_t mode = 0600;
        if (t.uids.empty() && t.gids.empty()) {
          mode = 0666;  // a tenant every local user belongs to
        } else {
          const uid_t uid = t.uids.empty() ? static_cast<uid_t>(-1) : t.uids.front();
          const gid_t gid = t.gids.empty() ? static_cast<gid_t>(-1) : t.gids.front();
          if (!t.gids.empty()) mode = 0660;
          // Not root: the group alone, when kvtierd's user is in it.
          if (chown(path.c_str(), uid, gid) != 0 && (t.gids.empty() || chown(path.c_str(), -1, gid) != 0)) {
            spdlog::warn("event=kv_events_chown_failed tenant={} path={} errno={} hint=\"give the tenant a gid kvtierd's user "
                       "belongs to ([[tenants]] gids), or run kvtierd as root, so the tenant's router can open its "
                       "event socket; only kvtierd's user can now\"",
                       t.name, path, errno);
          }
        }
        chmod(path.c_str(), mode);
      } else {
        spdlog::warn("event=kv_events_unprotected tenant={} endpoint={} hint=\"whoever reaches this endpoint sees which "
                   "prefixes the tenant holds; prefer an ipc:// endpoint (docs/security.md)\"",
                   t.name, *endpoint);
      }
    }
    spdlog::info("event=kv_events_publishing tenant={} endpoint={} replay={}", t.name, s.endpoint,
               s.replay_endpoint.empty() ? "off" : s.replay_endpoint);
  }
  ev->thread_ = std::thread([p = ev.get()] { p->Run(); });
  return ev;
}

KvEvents::~KvEvents() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  for (Sockets::Tenant& s : sockets_->tenants) {
    for (const std::string* ep : {&s.endpoint, &s.replay_endpoint}) {
      if (absl::StartsWith(*ep, "ipc://")) unlink(ep->substr(6).c_str());
    }
    s.pub.reset();
    s.replay.reset();
  }
}

void KvEvents::Push(const Event& e) {
  MutexLock l(&mu_);
  if (pending_.size() >= opts_.max_pending) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  pending_.push_back(e);
}

void KvEvents::Stored(uint16_t tenant, const BlockKey& key, uint32_t block_tokens, KvMedium medium) {
  if (!Publishes(tenant)) return;
  Push(Event{key, block_tokens, tenant, 0, medium});
}

void KvEvents::Removed(uint16_t tenant, const BlockKey& key, KvMedium medium) {
  if (!Publishes(tenant)) return;
  Push(Event{key, 0, tenant, 1, medium});
}

void KvEvents::Cleared(uint16_t tenant) {
  if (!Publishes(tenant)) return;
  Push(Event{BlockKey{}, 0, tenant, 2, KvMedium::kCpu});
}

std::string KvEvents::EncodeBatch(double ts, const std::vector<Event>& events, bool bytes_hashes) {
  // Group: one BlockStored per block (kvtierd knows no parent), consecutive
  // removals of one medium in one BlockRemoved.
  struct Out {
    uint8_t kind;
    KvMedium medium;
    uint32_t block_tokens;
    size_t first, count;
  };
  std::vector<Out> out;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == 1 && !out.empty() && out.back().kind == 1 && out.back().medium == e.medium &&
        out.back().first + out.back().count == i) {
      ++out.back().count;
      continue;
    }
    out.push_back(Out{e.kind, e.medium, e.block_tokens, i, 1});
  }
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(&buf);
  pk.pack_map(2);
  PackStr(pk, "ts");
  pk.pack_double(ts);
  PackStr(pk, "events");
  pk.pack_array(static_cast<uint32_t>(out.size()));
  for (const Out& o : out) {
    if (o.kind == 0) {
      pk.pack_map(8);
      PackStr(pk, "type");
      PackStr(pk, "BlockStored");
      PackStr(pk, "block_hashes");
      pk.pack_array(1);
      PackHash(pk, events[o.first].key, bytes_hashes);
      PackStr(pk, "parent_block_hash");
      pk.pack_nil();
      PackStr(pk, "token_ids");
      pk.pack_array(0);
      PackStr(pk, "block_size");
      pk.pack_uint32(o.block_tokens);
      PackStr(pk, "lora_id");
      pk.pack_nil();
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(o.medium));
      PackStr(pk, "lora_name");
      pk.pack_nil();
    } else if (o.kind == 1) {
      pk.pack_map(3);
      PackStr(pk, "type");
      PackStr(pk, "BlockRemoved");
      PackStr(pk, "block_hashes");
      pk.pack_array(static_cast<uint32_t>(o.count));
      for (size_t i = o.first; i < o.first + o.count; ++i) PackHash(pk, events[i].key, bytes_hashes);
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(o.medium));
    } else {
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, "AllBlocksCleared");
    }
  }
  return std::string(buf.data(), buf.size());
}

void KvEvents::Run() {
  std::vector<Event> batch;
  std::vector<std::vector<Event>> per_tenant(sockets_->tenants.size());
  std::vector<zmq::pollitem_t> items;
  std::vector<size_t> item_tenant;
  for (size_t i = 0; i < sockets_->tenants.size(); ++i) {
    if (sockets_->tenants[i].replay) {
      items.push_back(zmq::pollitem_t{sockets_->tenants[i].replay->handle(), 0, ZMQ_POLLIN, 0});
      item_tenant.push_back(i);
    }
  }
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    // Replay requests, then the batch due.
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
    // At most 100 ms, so that a stop is seen soon whatever batch_ms is.
    const long timeout = stopping ? 0 : std::clamp<long>(static_cast<long>(wait.count()), 0, 100);
    try {
      if (!items.empty()) {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout));
      } else if (timeout > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(timeout));
      }
    } catch (const zmq::error_t&) {
    }
    for (size_t k = 0; k < items.size(); ++k) {
      if (!(items[k].revents & ZMQ_POLLIN)) continue;
      Sockets::Tenant& s = sockets_->tenants[item_tenant[k]];
      for (int served = 0; served < 16; ++served) {
        std::vector<zmq::message_t> frames;
        try {
          if (!zmq::recv_multipart(*s.replay, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        } catch (const zmq::error_t&) {
          break;
        }
        if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
          bad_replays_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        int64_t start = 0;
        const auto* p = static_cast<const uint8_t*>(frames[2].data());
        for (int i = 0; i < 8; ++i) start = static_cast<int64_t>((static_cast<uint64_t>(start) << 8) | p[i]);
        replays_.fetch_add(1, std::memory_order_relaxed);
        const std::string id(static_cast<const char*>(frames[0].data()), frames[0].size());
        try {
          for (const auto& [seq, payload] : s.buffer) {
            if (seq < start) continue;
            const std::string seq_bytes = BigEndian(seq);
            std::array<zmq::const_buffer, 4> reply{zmq::buffer(id), zmq::const_buffer(), zmq::buffer(seq_bytes),
                                                   zmq::buffer(payload)};
            if (!zmq::send_multipart(*s.replay, reply, zmq::send_flags::dontwait)) break;
          }
          const std::string end = BigEndian(-1);
          std::array<zmq::const_buffer, 4> fin{zmq::buffer(id), zmq::const_buffer(), zmq::buffer(end),
                                               zmq::const_buffer()};
          zmq::send_multipart(*s.replay, fin, zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
          send_errors_.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    if (!stopping && std::chrono::steady_clock::now() < next) continue;
    next = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.batch_ms);
    {
      MutexLock l(&mu_);
      batch.swap(pending_);
    }
    if (!batch.empty()) {
      for (const Event& e : batch) per_tenant[e.tenant].push_back(e);
      batch.clear();
      const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
      for (size_t t = 0; t < per_tenant.size(); ++t) {
        std::vector<Event>& evs = per_tenant[t];
        Sockets::Tenant& s = sockets_->tenants[t];
        for (size_t first = 0; first < evs.size() && s.pub; first += kMaxEventsPerBatch) {
          const std::vector<Event> part(evs.begin() + static_cast<ptrdiff_t>(first),
                                        evs.begin() + static_cast<ptrdiff_t>(std::min(evs.size(), first + kMaxEventsPerBatch)));
          std::string payload = EncodeBatch(ts, part, opts_.bytes_hashes);
          const int64_t seq = s.seq++;
          const std::string seq_bytes = BigEndian(seq);
          try {
            std::array<zmq::const_buffer, 3> msg{zmq::buffer(opts_.topic), zmq::buffer(seq_bytes), zmq::buffer(payload)};
            zmq::send_multipart(*s.pub, msg, zmq::send_flags::dontwait);
            batches_.fetch_add(1, std::memory_order_relaxed);
            events_.fetch_add(part.size(), std::memory_order_relaxed);
          } catch (const zmq::error_t&) {
            send_errors_.fetch_add(1, std::memory_order_relaxed);
          }
          if (s.replay) {
            s.buffer.emplace_back(seq, std::move(payload));
            while (s.buffer.size() > opts_.buffer_batches) s.buffer.pop_front();
          }
        }
        evs.clear();
      }
    }
    if (stopping) {
      MutexLock l(&mu_);
      if (pending_.empty()) return;
    }
  }
}

KvEventStats KvEvents::stats() const {
  KvEventStats s;
  s.events = events_.load(std::memory_order_relaxed);
  s.batches = batches_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.replays = replays_.load(std::memory_order_relaxed);
  s.bad_replays = bad_replays_.load(std::memory_order_relaxed);
  s.send_errors = send_errors_.load(std::memory_order_relaxed);
  return s;
}

std::string KvEvents::EndpointOf(uint16_t t) const {
  return t < sockets_->tenants.size() ? sockets_->tenants[t].endpoint : std::string();
}

std::string KvEvents::ReplayEndpointOf(uint16_t t) const {
  return t < sockets_->tenants.size() ? sockets_->tenants[t].replay_endpoint : std::string();
}

}  // namespace kvtier
