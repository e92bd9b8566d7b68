// SPDX-License-Identifier: Apache-2.0
#include "daemon/session.h"

#include "daemon/log_limiter.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/namespace.h"
#include "core/status.h"
#include "core/units.h"
#include "os/futex.h"
#include "ipc/session_segment.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace kvtier {

using ipc::CloseReason;
using ipc::CompletionRecord;
using ipc::Opcode;
using ipc::RequestRecord;

Session::Session(SessionIdentity identity, NamespaceInfo ns, std::string tenant,
                 ipc::SessionSegment segment, UniqueFd socket, BlockStore* store,
                 DaemonStats* stats, SessionOptions opts, std::function<void()> on_exit,
                 DeviceBackend* device, std::byte* arena_base, GpuCache* gpu, KvCacheBudget* kv_budget)
    : identity_(std::move(identity)), ns_(ns), tenant_(std::move(tenant)),
      segment_(std::move(segment)), socket_(std::move(socket)), store_(store), stats_(stats),
      opts_(opts), on_exit_(std::move(on_exit)),
      device_(DeviceOps::Context{.session_id = identity_.id,
                                 .pid = identity_.peer.pid,
                                 .ns = ns,
                                 .arena_base = arena_base,
                                 .gpu = gpu,
                                 .store = store,
                                 .stats = stats,
                                 .log_ok = [this] { return LogOk(); }},
              device, kv_budget) {
  holdings_.ns = ns_;
}

ipc::KvRegisterReply Session::OnKvMessage(std::span<const std::byte> data, std::vector<UniqueFd> fds,
                                          std::vector<UniqueFd>* reply_fds) {
  return device_.OnKvMessage(data, std::move(fds), reply_fds);
}

bool Session::ReadPages(const RequestRecord& req, uint64_t n, std::vector<uint32_t>* pages, std::string* why) {
  const std::span<std::byte> scratch = segment_.scratch();
  const uint64_t bytes = n * sizeof(uint32_t);
  if (req.args[0] > scratch.size() || bytes > scratch.size() - req.args[0]) {
    *why = absl::StrCat(n, " page ids at scratch offset ", req.args[0], " lie outside scratch");
    return false;
  }
  pages->resize(n);
  std::memcpy(pages->data(), scratch.data() + req.args[0], bytes);
  return true;
}

bool Session::LogOk() { return opts_.log_limiter == nullptr || opts_.log_limiter->Allow(tenant_); }

Session::Outcome Session::Malformed(absl::string_view why) {
  Outcome o;
  o.status = KVTIER_EPROTO;
  o.message = absl::StrCat("malformed request (", why, "); kvtierd closed this session");
  o.fatal = true;
  return o;
}

std::optional<Session::Outcome> Session::ReadDeviceArgs(const RequestRecord& req, size_t keys,
                                                        std::shared_ptr<const EngineCache>* reg,
                                                        std::vector<uint32_t>* pages) {
  *reg = device_.Find(req.args[1]);
  if (!*reg) {
    return FromStatus(absl::NotFoundError(absl::StrCat("no KV-cache registration ", req.args[1],
                                                       " in this session; register the engine's cache first")));
  }
  std::string why;
  if (!ReadPages(req, uint64_t{keys} * (*reg)->pages_per_block, pages, &why)) return Malformed(why);
  for (uint32_t p : *pages) {
    if (p >= (*reg)->cache.num_pages) {
      return FromStatus(absl::InvalidArgumentError(
          absl::StrCat("page id ", p, " is past the registered cache's ", (*reg)->cache.num_pages, " pages")));
    }
  }
  return std::nullopt;
}

Session::Outcome Session::OnStoreDevice(Request& r) {
  std::shared_ptr<const EngineCache> reg;
  std::vector<uint32_t> pages;
  if (std::optional<Outcome> bad = ReadDeviceArgs(r.req, r.keys.size(), &reg, &pages)) return *bad;
  uint64_t ticket = 0;
  absl::StatusOr<uint32_t> needed = store_->StoreBegin(holdings_, r.keys, &ticket, std::span(r.locs));
  if (!needed.ok()) return FromStatus(needed.status());
  WriteResults(r.req, r.locs);
  stats_->device_stores.Add();
  if (*needed == 0) return Outcome{};
  // With a GPU tier the pages go to GPU slots first (DeviceOps::Gather).
  if (absl::Status g = device_.Gather(*reg, pages, r.keys, r.locs); !g.ok()) {
    (void)store_->StoreAbort(holdings_, ticket);
    return FromStatus(g);
  }
  stats_->device_blocks_stored.Add(*needed);
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  store_->StoreCommit(holdings_, ticket, false, [this, req = r.req, n = *needed](absl::Status st) {
    Deferred d{req, FromStatus(st), {}};
    if (st.ok()) d.outcome.count = n;
    Defer(std::move(d));
  });
  return Outcome{.deferred = true};
}

Session::Outcome Session::OnLoadDevice(Request& r) {
  const RequestRecord& req = r.req;
  const std::vector<BlockKey>& keys = r.keys;
  const uint64_t progress_at = req.out_offset + uint64_t{keys.size()} * sizeof(ipc::BlockResult);
  if (!OutRangeOk(req, uint64_t{keys.size()} * sizeof(ipc::BlockResult) + sizeof(ipc::DeviceLoadProgress)) ||
      progress_at % alignof(ipc::DeviceLoadProgress) != 0) {
    return Malformed("no aligned room for the load's progress after its results");
  }
  std::shared_ptr<const EngineCache> reg;
  std::vector<uint32_t> pages;
  if (std::optional<Outcome> bad = ReadDeviceArgs(req, keys.size(), &reg, &pages)) return *bad;
  auto* progress = reinterpret_cast<ipc::DeviceLoadProgress*>(segment_.scratch().data() + progress_at);
  progress->layers = reg->shape.layers;
  progress->layers_done.store(0, std::memory_order_relaxed);
  progress->failed.store(0, std::memory_order_relaxed);
  progress->armed.store(0, std::memory_order_relaxed);
  progress->blocks.store(ipc::kDeviceLoadUnknown, std::memory_order_release);
  stats_->device_loads.Add();
  // Runs here or on an I/O thread (after tier reads): scatters the prefix
  // that loaded, publishing layers as they land.
  auto finish = [this, req, reg, keys, pages = std::move(pages), progress](LoadOutcome lo) {
    Deferred d{req, {}, {}};
    if (lo.locations.empty() && !lo.status.ok()) {
      progress->failed.store(1, std::memory_order_release);
      os::FutexWakeAll(&progress->layers_done);
      os::FutexWakeAll(&progress->armed);
      d.outcome = FromStatus(lo.status);
      return d;
    }
    if (absl::Status st = device_.Scatter(*reg, pages, keys, lo, progress); !st.ok()) {
      d.outcome = FromStatus(st);
      return d;
    }
    stats_->device_blocks_loaded.Add(lo.loaded);
    d.outcome.count = lo.loaded;
    d.locations = std::move(lo.locations);
    return d;
  };
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  std::optional<LoadOutcome> now =
      store_->Load(holdings_, req.handle, keys, [this, finish](LoadOutcome lo) mutable { Defer(finish(std::move(lo))); });
  if (!now) return Outcome{.deferred = true};
  async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  Deferred d = finish(std::move(*now));
  if (!d.locations.empty()) WriteResults(req, d.locations);
  return d.outcome;
}

Session::~Session() {
  Stop(CloseReason::kShutdown);
  Join();
}

void Session::Start() { thread_ = std::thread([this] { Run(); }); }

void Session::Stop(CloseReason reason) {
  uint32_t expected = 0;
  stop_reason_.compare_exchange_strong(expected, static_cast<uint32_t>(reason));
  stop_.store(true, std::memory_order_seq_cst);
  // Whatever the client left in the doorbell word, the thread must wake.
  segment_.header()->daemon_sleeping.store(0, std::memory_order_seq_cst);
  os::FutexWakeAll(&segment_.header()->daemon_sleeping);
}

void Session::Defer(Deferred d) {
  // The doorbell rings under the lock: once the session thread has taken
  // this completion (under the same lock) it may finish and be destroyed, so
  // nothing here may touch the session after the unlock. (TSan caught the
  // segment being unmapped under a doorbell rung after the unlock.)
  MutexLock l(&deferred_mu_);
  deferred_.push_back(std::move(d));
  deferred_count_.fetch_add(1, std::memory_order_seq_cst);
  ipc::RingDaemonDoorbell(segment_.header());
}

bool Session::PostDeferred(ipc::RingProducer<CompletionRecord>& cq) {
  if (deferred_count_.load(std::memory_order_seq_cst) == 0) return true;
  std::vector<Deferred> ready;
  {
    MutexLock l(&deferred_mu_);
    ready.swap(deferred_);
    deferred_count_.store(0, std::memory_order_seq_cst);
  }
  for (size_t i = 0; i < ready.size(); ++i) {
    Deferred& queued = ready[i];
    // A lookup's last step runs here, on the session thread.
    Deferred d = queued.resume ? std::move(queued.resume)() : std::move(queued);
    if (!d.locations.empty()) WriteResults(d.req, d.locations);
    if (d.outcome.status != 0) WriteMessage(d.req, d.outcome.message);
    const Outcome& o = d.outcome;
    const bool posted = Post(cq, CompletionRecord{d.req.op_id, o.status, o.count, o.handle, o.value});
    if (auto it = deferred_started_.find(d.req.op_id); it != deferred_started_.end()) {
      if (d.req.opcode < stats_->op_latency.size()) {
        stats_->op_latency[d.req.opcode].Record(MonotonicNanos() - it->second);
      }
      deferred_started_.erase(it);
    }
    async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    if (!posted) {
      // The session ends: the completions not posted are dropped, and no
      // longer in flight (DropAsyncWork waits for that count to reach 0).
      async_in_flight_.fetch_sub(static_cast<uint32_t>(ready.size() - i - 1), std::memory_order_acq_rel);
      return false;
    }
    if (d.after_reply) store_->AfterReply(holdings_);
  }
  return true;
}

Session::Outcome Session::FromStatus(const absl::Status& s) {
  Outcome o;
  o.status = ToErrorCode(s);
  if (!s.ok()) o.message = std::string(s.message());
  return o;
}

void Session::Join() {
  if (thread_.joinable()) thread_.join();
}

SessionInfo Session::Info() const {
  return SessionInfo{identity_, tenant_, ns_, ops_.load(std::memory_order_relaxed),
                     holdings_.lease_count.load(std::memory_order_relaxed),
                     holdings_.pinned_blocks.load(std::memory_order_relaxed),
                     device_.kv_caches()};
}

bool Session::Post(ipc::RingProducer<CompletionRecord>& cq, const CompletionRecord& c) {
  ipc::SegmentHeader* h = segment_.header();
  // The client never has more operations in flight than the ring holds, so a
  // full ring means it is slow to reap; wait, but not past a stop.
  while (!cq.TryPush(c)) {
    if (stop_.load(std::memory_order_acquire)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (h->client_sleeping.load(std::memory_order_seq_cst) != 0) os::FutexWakeAll(&h->cq_tail);
  return true;
}

void Session::Run() {
  const std::string fatal_reason = Serve();
  DropAsyncWork();
  Close(fatal_reason);
}

std::string Session::Serve() {
  ipc::SegmentHeader* h = segment_.header();
  ipc::RingConsumer<RequestRecord> sq = segment_.DaemonSq();
  ipc::RingProducer<CompletionRecord> cq = segment_.DaemonCq();
  const uint64_t spin_ns = uint64_t{opts_.spin_us} * 1000;
  uint64_t idle_since = MonotonicNanos();
  std::string fatal_reason;

  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t next_expiry_ns = ExpireProbes();
    if (!PostDeferred(cq)) break;
    RequestRecord req;
    const ipc::PopResult pr = sq.TryPop(&req);
    if (pr == ipc::PopResult::kCorrupt) {
      fatal_reason = "request ring indices are corrupt";
      break;
    }
    if (pr == ipc::PopResult::kOk) {
      const uint64_t started = MonotonicNanos();
      Outcome o = Process(req);
      ops_.fetch_add(1, std::memory_order_relaxed);
      if (o.deferred) {
        deferred_started_[req.op_id] = started;
        idle_since = MonotonicNanos();
        continue;
      }
      if (req.opcode < stats_->op_latency.size()) stats_->op_latency[req.opcode].Record(MonotonicNanos() - started);
      if (o.status != 0) WriteMessage(req, o.message);
      if (!Post(cq, CompletionRecord{req.op_id, o.status, o.count, o.handle, o.value})) break;
      store_->AfterReply(holdings_);
      if (o.fatal) {
        fatal_reason = o.message;
        break;
      }
      idle_since = MonotonicNanos();
      continue;
    }
    if (const uint64_t idle = MonotonicNanos() - idle_since; idle < spin_ns) {
      os::PollPause(idle);
      continue;
    }
    // Sleep on the doorbell: announce, re-check, then wait while the word
    // stays 1 (whoever brings work sets it to 0 first).
    h->daemon_sleeping.store(1, std::memory_order_seq_cst);
    if (!sq.HasPending() && deferred_count_.load(std::memory_order_seq_cst) == 0 &&
        !stop_.load(std::memory_order_seq_cst)) {
      // No longer than until a waiting lookup's budget has passed.
      os::FutexWait(&h->daemon_sleeping, 1,
                    std::chrono::milliseconds(std::clamp<uint64_t>(next_expiry_ns / 1'000'000 + 1, 1, 500)));
    }
    h->daemon_sleeping.store(0, std::memory_order_relaxed);
    idle_since = MonotonicNanos();
  }
  return fatal_reason;
}

void Session::DropAsyncWork() {
  // Lookups waiting on the shared tier: nobody waits for their answers now
  // (an answer that comes later finds them claimed and leaves).
  for (PendingProbe& p : pending_probes_) {
    if (!p.claimed->exchange(true)) async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  }
  pending_probes_.clear();
  // Operations still on I/O threads reference this session: wait for them
  // (tier I/O is bounded), then drop their completions.
  while (async_in_flight_.load(std::memory_order_acquire) != 0) {
    {
      MutexLock l(&deferred_mu_);
      async_in_flight_.fetch_sub(static_cast<uint32_t>(deferred_.size()), std::memory_order_acq_rel);
      deferred_.clear();
      deferred_count_.store(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Session::Close(const std::string& fatal_reason) {
  ipc::SegmentHeader* h = segment_.header();
  CloseReason reason = static_cast<CloseReason>(stop_reason_.load(std::memory_order_acquire));
  if (!fatal_reason.empty()) {
    reason = CloseReason::kProtocolError;
    stats_->protocol_errors.Add();
    if (LogOk()) spdlog::warn("event=session_closed session={} pid={} reason=protocol_error detail=\"{}\" "
                 "hint=\"the client broke the ring protocol; other sessions are unaffected\"",
                 identity_.id, identity_.peer.pid, LogQuoted(fatal_reason));
  }
  const uint64_t leases = holdings_.leases.size();
  const uint64_t tickets = holdings_.tickets.size();
  store_->CloseSession(holdings_);
  // The engine's memory goes now, not when the session object is reaped: a
  // dead engine's device memory must not be touched again.
  device_.DropEverything();
  h->closed.store(static_cast<uint32_t>(reason == CloseReason::kOpen ? CloseReason::kShutdown : reason),
                  std::memory_order_release);
  os::FutexWakeAll(&h->cq_tail);
  // Tell the client through the socket too (it may be polling it).
  shutdown(socket_.get(), SHUT_RDWR);
  if (LogOk()) spdlog::info("event=session_end session={} pid={} ops={} leases_released={} stores_aborted={}",
               identity_.id, identity_.peer.pid, ops_.load(), leases, tickets);
  finished_.store(true, std::memory_order_release);
  if (on_exit_) on_exit_();
}

bool Session::OutRangeOk(const RequestRecord& req, uint64_t need) const {
  const uint64_t size = segment_.scratch().size();
  return req.out_bytes >= need && req.out_offset <= size && req.out_bytes <= size - req.out_offset;
}

bool Session::ReadKeys(const RequestRecord& req, std::vector<BlockKey>* keys, std::string* why) {
  const std::span<std::byte> scratch = segment_.scratch();
  if (req.count > segment_.max_keys_per_op()) {
    *why = absl::StrCat("request of ", req.count, " keys exceeds the limit of ",
                        segment_.max_keys_per_op(), " (ipc.max_keys_per_op)");
    return false;
  }
  const uint64_t bytes = uint64_t{req.count} * ipc::kKeyBytes;
  if (req.keys_offset > scratch.size() || bytes > scratch.size() - req.keys_offset) {
    *why = absl::StrCat("keys at scratch offset ", req.keys_offset, " (+", bytes,
                        " bytes) lie outside the ", scratch.size(), "-byte scratch region");
    return false;
  }
  keys->resize(req.count);
  // Copy out of shared memory before use: the client could change it under us.
  if (bytes > 0) std::memcpy(keys->data(), scratch.data() + req.keys_offset, bytes);
  return true;
}

void Session::WriteResults(const RequestRecord& req, const std::vector<BlockLocation>& locs,
                           std::span<const uint64_t> gpu_offsets) {
  std::byte* out = segment_.scratch().data() + req.out_offset;
  for (size_t i = 0; i < locs.size(); ++i) {
    ipc::BlockResult r{};
    r.arena_offset = locs[i].arena_offset;
    r.gpu_offset = i < gpu_offsets.size() ? gpu_offsets[i] : ipc::kNoGpuCopy;
    r.tier = static_cast<uint8_t>(locs[i].tier);
    r.lane = locs[i].lane;
    r.flags = static_cast<uint8_t>((locs[i].needed ? ipc::kBlockNeeded : 0) |
                                   (locs[i].recompute ? ipc::kBlockRecompute : 0));
    std::memcpy(out + i * sizeof(r), &r, sizeof(r));
  }
}

void Session::WriteMessage(const RequestRecord& req, const std::string& message) {
  if (!OutRangeOk(req, 1)) return;
  const size_t n = std::min<size_t>({message.size(), req.out_bytes - 1, ipc::kErrorMessageBytes - 1});
  std::byte* out = segment_.scratch().data() + req.out_offset;
  std::memcpy(out, message.data(), n);
  out[n] = std::byte{0};
}

std::optional<std::pair<size_t, size_t>> Session::FirstDuplicate(const std::vector<BlockKey>& keys) {
  if (keys.size() < 2) return std::nullopt;
  absl::flat_hash_map<BlockKey, size_t> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = seen.emplace(keys[i], i);
    if (!fresh) return std::pair{it->second, i};
  }
  return std::nullopt;
}

Session::Outcome Session::Process(const RequestRecord& req) {
  Outcome o;
  auto fail = [&](const absl::Status& s) {
    o.status = ToErrorCode(s);
    o.message = std::string(s.message());
    return o;
  };
  auto fatal = [](std::string why) { return Malformed(why); };
  if (req.opcode == 0 || req.opcode > ipc::kMaxOpcode) {
    return fatal(absl::StrCat("unknown opcode ", req.opcode));
  }
  const Opcode op = static_cast<Opcode>(req.opcode);
  const ipc::OpcodeInfo& info = ipc::InfoOf(op);
  const bool returns_blocks = info.returns_blocks;
  std::vector<BlockKey> keys;
  if (info.takes_keys) {
    std::string why;
    if (!ReadKeys(req, &keys, &why)) return fatal(why);
    if (returns_blocks && !OutRangeOk(req, uint64_t{req.count} * sizeof(ipc::BlockResult))) {
      return fatal(absl::StrCat("result area at scratch offset ", req.out_offset, " (", req.out_bytes,
                                " bytes) is outside scratch or smaller than ", req.count, " results"));
    }
    if (keys.empty()) return fail(absl::InvalidArgumentError("request carries no keys"));
    // A chain never repeats a key. Where a repeat would multiply pins, I/O
    // references or lease books by the request's length, the request is
    // refused; invalidations and prefetches (idempotent, no results per
    // key) fold repeats instead.
    if (info.folds_repeated_keys && keys.size() > 1) {
      absl::flat_hash_set<BlockKey> seen;
      seen.reserve(keys.size());
      std::erase_if(keys, [&](const BlockKey& k) { return !seen.insert(k).second; });
    } else if (std::optional<std::pair<size_t, size_t>> dup = FirstDuplicate(keys)) {
      stats_->Refused(Refusal::kDuplicateKeys);
      return fail(absl::InvalidArgumentError(absl::StrCat("block key ", dup->second, " repeats key ", dup->first,
                                                          "; a request names each block once")));
    }
  }
  if ((req.flags & ~info.allowed_flags) != 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat("unknown flags 0x", absl::Hex(req.flags))));
  }

  std::vector<BlockLocation> locs(returns_blocks ? keys.size() : 0);
  Request r{req, keys, locs};
  const Handler h = HandlerFor(op);
  return h != nullptr ? (this->*h)(r) : fatal("unhandled opcode");
}

// One row per opcode: what ipc::kOpcodes says about it is checked above.
const std::pair<Opcode, Session::Handler> Session::kHandlers[] = {
    {Opcode::kPing, &Session::OnPing},
    {Opcode::kLookup, &Session::OnLookup},
    {Opcode::kLoad, &Session::OnLoad},
    {Opcode::kPrefetch, &Session::OnPrefetch},
    {Opcode::kStoreBegin, &Session::OnStoreBegin},
    {Opcode::kStoreCommit, &Session::OnStoreCommit},
    {Opcode::kStoreAbort, &Session::OnStoreAbort},
    {Opcode::kRelease, &Session::OnRelease},
    {Opcode::kInvalidate, &Session::OnInvalidate},
    {Opcode::kReportPrefill, &Session::OnReportPrefill},
    {Opcode::kStoreDevice, &Session::OnStoreDevice},
    {Opcode::kLoadDevice, &Session::OnLoadDevice},
    {Opcode::kInvalidateNamespace, &Session::OnInvalidateNamespace},
};

Session::Handler Session::HandlerFor(Opcode op) {
  static const std::array<Handler, ipc::kMaxOpcode + 1> table = [] {
    std::array<Handler, ipc::kMaxOpcode + 1> t{};
    for (const auto& [code, handler] : kHandlers) t[static_cast<size_t>(code)] = handler;
    return t;
  }();
  const size_t i = static_cast<size_t>(op);
  return i < table.size() ? table[i] : nullptr;
}

bool Session::HandlesEveryOpcode() {
  for (uint32_t code = 1; code <= ipc::kMaxOpcode; ++code) {
    if (HandlerFor(static_cast<Opcode>(code)) == nullptr) return false;
  }
  return std::size(kHandlers) == ipc::kMaxOpcode;
}

Session::Outcome Session::OnPing(Request&) { return Outcome{}; }

Session::Deferred Session::FinishLookup(const RequestRecord& req, const std::vector<BlockKey>& keys,
                                        std::vector<BlockLocation>& locs, const BlockStore::SharedAnswer* shared) {
  uint64_t lease = 0;
  uint32_t recompute = 0;
  const BlockStore::Ask ask = (req.flags & ipc::kFlagAsk) != 0      ? BlockStore::Ask::kYes
                              : (req.flags & ipc::kFlagNotAsk) != 0 ? BlockStore::Ask::kNo
                                                                    : BlockStore::Ask::kIfLeased;
  absl::StatusOr<uint32_t> hit = store_->Lookup(holdings_, keys, (req.flags & ipc::kFlagLease) != 0, &lease,
                                                std::span(locs), &recompute, shared, ask);
  if (!hit.ok()) return Deferred{req, FromStatus(hit.status()), {}};
  std::vector<uint64_t> gpu_offsets(locs.size(), ipc::kNoGpuCopy);
  device_.MarkGpuCopies(keys, *hit, lease, std::span(locs), std::span(gpu_offsets));
  WriteResults(req, locs, gpu_offsets);
  Deferred d{req, Outcome{.count = *hit, .handle = lease, .value = recompute}, {}};
  d.after_reply = true;
  return d;
}

Session::Outcome Session::OnLookup(Request& r) {
  if ((r.req.flags & ipc::kFlagAsk) != 0 && (r.req.flags & ipc::kFlagNotAsk) != 0) {
    return FromStatus(absl::InvalidArgumentError("a lookup flagged both as its request's ask and not as it"));
  }
  if ((r.req.flags & ipc::kFlagNotAsk) != 0 && (r.req.flags & ipc::kFlagLease) == 0) {
    return FromStatus(absl::InvalidArgumentError(
        "a lookup flagged not its request's ask needs a lease (without one it is not an ask anyway)"));
  }
  // Past its local prefix a lookup may ask the shared tier (a network or a
  // shared file system away): the session serves its other requests while
  // the answer comes, and the lookup finishes on this thread when it does,
  // or when the budget has passed without it.
  const BlockStore::SharedAnswer none;
  if (!store_->shared_lane() || store_->shared_probe_budget_us() == 0) {
    return FinishLookup(r.req, r.keys, r.locs, &none).outcome;  // no shared tier to ask
  }
  auto claimed = std::make_shared<std::atomic<bool>>(false);
  auto keys = std::make_shared<std::vector<BlockKey>>(r.keys);
  const RequestRecord req = r.req;
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  const uint64_t started = MonotonicNanos();
  std::function<BlockStore::SharedAnswer()> so_far;
  if (store_->StartSharedProbe(holdings_, r.keys, [this, claimed, keys, req](BlockStore::SharedAnswer a) mutable {
        if (claimed->exchange(true)) return;  // the timer resumed it already
        Deferred d{req, {}, {}};
        d.resume = [this, keys, req, a = std::move(a)]() mutable {
          std::vector<BlockLocation> locs(keys->size());
          return FinishLookup(req, *keys, locs, &a);
        };
        Defer(std::move(d));
      }, &so_far)) {
    // The tiers answer by the budget; the timer covers one that does not
    // (a file system hung in a stat), with a little grace, and takes what
    // the others said (a cluster's blocks count while a directory hangs).
    const uint64_t budget_ns = uint64_t{store_->shared_probe_budget_us()} * 1000;
    pending_probes_.push_back(PendingProbe{
        started + budget_ns + 2'000'000, claimed, [this, keys, req, so_far = std::move(so_far)]() mutable {
          Deferred d{req, {}, {}};
          d.resume = [this, keys, req, a = so_far()]() mutable {
            std::vector<BlockLocation> locs(keys->size());
            return FinishLookup(req, *keys, locs, &a);
          };
          Defer(std::move(d));
        }});
    return Outcome{.deferred = true};
  }
  async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  // Nothing to ask (or the tenant's probe rate or busy bound said no): the
  // local tiers answer, and the session thread never waits on the tier.
  return FinishLookup(req, r.keys, r.locs, &none).outcome;
}

uint64_t Session::ExpireProbes() {
  if (pending_probes_.empty()) return UINT64_MAX;
  const uint64_t now = MonotonicNanos();
  uint64_t next = UINT64_MAX;
  std::erase_if(pending_probes_, [&](PendingProbe& p) {
    if (p.claimed->load(std::memory_order_acquire)) return true;  // answered
    if (now < p.expire_ns) {
      next = std::min(next, p.expire_ns - now);
      return false;
    }
    if (!p.claimed->exchange(true)) std::move(p.expire)();
    return true;
  });
  return next;
}

Session::Outcome Session::OnLoad(Request& r) {
  // Blocks that failed to come back from a lower tier are a shorter loaded
  // prefix (count), not an error: the engine recomputes them.
  auto finish = [](const RequestRecord& req, LoadOutcome lo) {
    Deferred d{req, {}, {}};
    if (lo.locations.empty() && !lo.status.ok()) {
      d.outcome = FromStatus(lo.status);
    } else {
      d.outcome.count = lo.loaded;
      d.locations = std::move(lo.locations);
    }
    return d;
  };
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  std::optional<LoadOutcome> now = store_->Load(holdings_, r.req.handle, r.keys, [this, req = r.req, finish](LoadOutcome lo) {
    Defer(finish(req, std::move(lo)));
  });
  if (!now) return Outcome{.deferred = true};
  async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  Deferred d = finish(r.req, std::move(*now));
  if (!d.locations.empty()) WriteResults(r.req, d.locations);
  return d.outcome;
}

Session::Outcome Session::OnPrefetch(Request& r) {
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  store_->Prefetch(holdings_, r.keys, [this, req = r.req](absl::StatusOr<uint32_t> n) {
    Deferred d{req, FromStatus(n.status()), {}};
    if (n.ok()) d.outcome.value = *n;
    Defer(std::move(d));
  });
  return Outcome{.deferred = true};
}

Session::Outcome Session::OnStoreBegin(Request& r) {
  uint64_t ticket = 0;
  absl::StatusOr<uint32_t> needed = store_->StoreBegin(holdings_, r.keys, &ticket, std::span(r.locs));
  if (!needed.ok()) return FromStatus(needed.status());
  WriteResults(r.req, r.locs);
  return Outcome{.count = *needed, .handle = ticket};
}

Session::Outcome Session::OnStoreCommit(Request& r) {
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  store_->StoreCommit(holdings_, r.req.handle, (r.req.flags & ipc::kFlagDurable) != 0,
                      [this, req = r.req](absl::Status s) { Defer(Deferred{req, FromStatus(s), {}}); });
  return Outcome{.deferred = true};
}

Session::Outcome Session::OnStoreAbort(Request& r) { return FromStatus(store_->StoreAbort(holdings_, r.req.handle)); }

Session::Outcome Session::OnRelease(Request& r) {
  absl::Status s = store_->Release(holdings_, r.req.handle);
  if (s.ok()) device_.ReleaseLease(r.req.handle);
  return FromStatus(s);
}

Session::Outcome Session::OnInvalidate(Request& r) {
  absl::StatusOr<uint32_t> n = store_->Invalidate(holdings_, r.keys);
  if (!n.ok()) return FromStatus(n.status());  // the store dropped their GPU copies
  return Outcome{.value = *n};
}

Session::Outcome Session::OnReportPrefill(Request& r) {
  absl::Status s = store_->cost().ReportPrefill(r.req.args[0], r.req.args[1], double(r.req.handle) / 1e9);
  if (!s.ok()) {
    stats_->prefill_reports_refused.Add();
    return FromStatus(s);
  }
  stats_->prefill_reports.Add();
  return Outcome{};
}

Session::Outcome Session::OnInvalidateNamespace(Request&) {
  absl::StatusOr<uint32_t> n = store_->InvalidateNamespace(holdings_);
  if (!n.ok()) return FromStatus(n.status());
  device_.DropNamespace();
  return Outcome{.value = *n};
}

}  // namespace kvtier
