#include "daemon/session.h"

#include "daemon/log_limiter.h"

#include <fcntl.h>
#include <sys/socket.h>

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
                 ipc::SessionSegment segment, UniqueFd socket, BlockCache* cache,
                 DaemonStats* stats, SessionOptions opts, std::function<void()> on_exit,
                 DeviceBackend* device, std::byte* arena_base, GpuCache* gpu, KvCacheBudget* kv_budget)
    : identity_(std::move(identity)), ns_(ns), tenant_(std::move(tenant)),
      segment_(std::move(segment)), socket_(std::move(socket)), cache_(cache), stats_(stats),
      opts_(opts), on_exit_(std::move(on_exit)), arena_base_(arena_base), gpu_(gpu),
      engines_(device != nullptr && arena_base != nullptr ? std::make_unique<EngineCaches>(device, ns, kv_budget)
                                                          : nullptr) {
  holdings_.ns = ns_;
}

ipc::KvRegisterReply Session::OnKvMessage(std::span<const std::byte> data, std::vector<UniqueFd> fds,
                                          std::vector<UniqueFd>* reply_fds) {
  ipc::KvRegisterReply reply;
  absl::StatusOr<ipc::KvMessage> m = ipc::DecodeKvMessage(data);
  absl::Status st = m.status();
  if (st.ok() && engines_ == nullptr) st = absl::FailedPreconditionError("this kvtierd has no device backend");
  if (st.ok() && m->gpu_arena) {
    if (gpu_ == nullptr) {
      st = absl::NotFoundError("this kvtierd has no GPU tier for this tenant (tiers.gpu.capacity = 0)");
    } else if (absl::StatusOr<IpcMemHandle> h = gpu_->ExportArena(); !h.ok()) {
      st = h.status();
    } else {
      reply.arena_bytes = gpu_->arena_bytes();
      if (h->fd.valid()) {
        // Engines read pinned copies in place and never write them: the
        // simulated device's arena goes out as a read-only descriptor.
        UniqueFd ro(open(absl::StrCat("/proc/self/fd/", h->fd.get()).c_str(), O_RDONLY | O_CLOEXEC));
        if (ro.valid()) {
          reply.arena_kind = ipc::KvArenaKind::kMemfd;
          reply_fds->push_back(std::move(ro));
        } else {
          st = ErrnoStatus(errno, "reopening the GPU-tier arena read-only");
        }
      } else {
        reply.arena_kind = ipc::KvArenaKind::kCudaIpc;
        reply.arena_handle = h->opaque;
      }
      if (LogOk()) spdlog::info("event=gpu_arena_exported session={} bytes={}", identity_.id, reply.arena_bytes);
    }
  } else if (st.ok() && m->unregister) {
    st = engines_->Unregister(m->registration);
    reply.registration = m->registration;
  } else if (st.ok()) {
    absl::StatusOr<Registered> r = engines_->Register(m->request, std::move(fds));
    st = r.status();
    if (r.ok()) {
      reply.registration = r->id;
      reply.event_kind = r->event_kind;
      reply.layer_events = std::move(r->layer_events);
      *reply_fds = std::move(r->fds);
      stats_->kv_registrations.Add();
      if (LogOk()) spdlog::info("event=kv_cache_registered session={} registration={} layers={} page_tokens={} pages={} "
                   "regions={}",
                   identity_.id, r->id, m->request.layers, m->request.page_tokens, m->request.num_pages,
                   m->request.regions.size());
    }
  }
  if (!st.ok() && m.ok() && m->gpu_arena) {
    reply.status = ToErrorCode(st);
    reply.message = std::string(st.message());
    if (LogOk()) spdlog::info("event=gpu_arena_refused session={} reason=\"{}\"", identity_.id, LogQuoted(reply.message));
  } else if (!st.ok()) {
    stats_->kv_registrations_refused.Add();
    reply.status = ToErrorCode(st);
    reply.message = std::string(st.message());
    if (LogOk()) spdlog::warn("event=kv_cache_refused session={} pid={} reason=\"{}\"", identity_.id, identity_.peer.pid,
                 LogQuoted(reply.message));
  }
  return reply;
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
  *reg = engines_ ? engines_->Find(req.args[1]) : nullptr;
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

Session::Outcome Session::StoreDevice(const RequestRecord& req, const std::vector<BlockKey>& keys,
                                      std::vector<BlockLocation>& locs) {
  std::shared_ptr<const EngineCache> reg;
  std::vector<uint32_t> pages;
  if (std::optional<Outcome> bad = ReadDeviceArgs(req, keys.size(), &reg, &pages)) return *bad;
  uint64_t ticket = 0;
  absl::StatusOr<uint32_t> needed = cache_->StoreBegin(holdings_, keys, &ticket, std::span(locs));
  if (!needed.ok()) return FromStatus(needed.status());
  WriteResults(req, locs);
  stats_->device_stores.Add();
  if (*needed == 0) return Outcome{};
  // With a GPU tier the pages are gathered into GPU slots (device to
  // device) and the blocks demoted from there to their host slots; blocks
  // without room in the GPU tier go straight to the host.
  std::vector<uint32_t> sel;
  std::vector<uint64_t> dst;
  std::vector<EngineCaches::CopyOp> demote;
  std::vector<const BlockKey*> in_gpu;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!locs[i].needed) continue;
    std::byte* host = arena_base_ + locs[i].arena_offset;
    std::optional<GpuCache::Pin> pin = gpu_ ? gpu_->Reserve(ns_.handle, keys[i], ns_.block_bytes) : std::nullopt;
    if (pin) {
      dst.push_back(reinterpret_cast<uint64_t>(pin->data));
      demote.push_back({host, pin->data});
      in_gpu.push_back(&keys[i]);
    } else {
      dst.push_back(reinterpret_cast<uint64_t>(host));
    }
    sel.insert(sel.end(), pages.begin() + i * reg->pages_per_block, pages.begin() + (i + 1) * reg->pages_per_block);
  }
  absl::Status g = engines_->Gather(*reg, sel, dst);
  if (g.ok() && !demote.empty()) g = engines_->Copy(demote, ns_.block_bytes);
  for (const BlockKey* k : in_gpu) {
    if (g.ok()) {
      gpu_->Publish(ns_.handle, *k);
      gpu_->CountDemotion();
    }
    gpu_->Release(ns_.handle, *k);  // frees it when unpublished
  }
  if (!g.ok()) {
    (void)cache_->StoreAbort(holdings_, ticket);
    stats_->device_errors.Add();
    if (LogOk()) spdlog::warn("event=device_store_failed session={} reason=\"{}\"", identity_.id, LogQuoted(g.message()));
    return FromStatus(g);
  }
  stats_->device_blocks_stored.Add(*needed);
  async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  cache_->StoreCommit(holdings_, ticket, false, [this, req, n = *needed](absl::Status st) {
    Deferred d{req, FromStatus(st), {}};
    if (st.ok()) d.outcome.count = n;
    Defer(std::move(d));
  });
  return Outcome{.deferred = true};
}

void Session::PromoteToGpu(const std::vector<BlockKey>& keys, const LoadOutcome& lo,
                           const std::vector<bool>& from_gpu) {
  std::vector<EngineCaches::CopyOp> copies;
  std::vector<const BlockKey*> reserved;
  for (uint32_t i = 0; i < lo.loaded; ++i) {
    if (from_gpu[i]) continue;
    std::optional<GpuCache::Pin> pin = gpu_->Reserve(ns_.handle, keys[i], ns_.block_bytes);
    if (!pin) continue;  // no room: every copy is pinned
    copies.push_back({pin->data, arena_base_ + lo.locations[i].arena_offset});
    reserved.push_back(&keys[i]);
  }
  const absl::Status st = copies.empty() ? absl::OkStatus() : engines_->Copy(copies, ns_.block_bytes);
  if (!st.ok()) {
    stats_->device_errors.Add();
    if (LogOk()) spdlog::warn("event=gpu_promotion_failed session={} reason=\"{}\"", identity_.id, LogQuoted(st.message()));
  }
  for (const BlockKey* k : reserved) {
    if (st.ok()) {
      gpu_->Publish(ns_.handle, *k);
      gpu_->CountPromotion();
    }
    gpu_->Release(ns_.handle, *k);
  }
}

Session::Outcome Session::LoadDevice(const RequestRecord& req, const std::vector<BlockKey>& keys) {
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
  // Runs here or on an I/O thread (after NVMe reads): scatters the prefix that
  // loaded, publishing layers as they land.
  auto finish = [this, req, reg, keys, pages = std::move(pages), progress](LoadOutcome lo) {
    Deferred d{req, {}, {}};
    if (lo.locations.empty() && !lo.status.ok()) {
      progress->failed.store(1, std::memory_order_release);
      os::FutexWakeAll(&progress->layers_done);
      os::FutexWakeAll(&progress->armed);
      d.outcome = FromStatus(lo.status);
      return d;
    }
    // Each block comes from its GPU copy when it has one (pinned meanwhile),
    // else from its host slot.
    std::vector<uint64_t> src;
    std::vector<bool> from_gpu(lo.loaded, false);
    for (uint32_t i = 0; i < lo.loaded; ++i) {
      std::optional<GpuCache::Pin> pin = gpu_ ? gpu_->Acquire(ns_.handle, keys[i]) : std::nullopt;
      from_gpu[i] = pin.has_value();
      src.push_back(pin ? reinterpret_cast<uint64_t>(pin->data)
                        : reinterpret_cast<uint64_t>(arena_base_ + lo.locations[i].arena_offset));
    }
    progress->blocks.store(lo.loaded, std::memory_order_release);
    absl::Status st = absl::OkStatus();
    if (lo.loaded > 0) {
      st = engines_->ScatterByLayer(
          *reg, std::span(pages).first(uint64_t{lo.loaded} * reg->pages_per_block), src, progress);
    } else {
      // Nothing to wait for, on the host or on a stream.
      progress->armed.store(1, std::memory_order_release);
      progress->layers_done.store(reg->shape.layers, std::memory_order_release);
      os::FutexWakeAll(&progress->armed);
      os::FutexWakeAll(&progress->layers_done);
    }
    for (uint32_t i = 0; i < lo.loaded; ++i) {
      if (from_gpu[i]) gpu_->Release(ns_.handle, keys[i]);
    }
    // The engine has its layers; now promote what came from host memory, so
    // the next load of these blocks stays on the device.
    if (st.ok() && gpu_ != nullptr) PromoteToGpu(keys, lo, from_gpu);
    if (!st.ok()) {
      stats_->device_errors.Add();
      if (LogOk()) spdlog::warn("event=device_load_failed session={} reason=\"{}\"", identity_.id, LogQuoted(st.message()));
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
      cache_->Load(holdings_, req.handle, keys, [this, finish](LoadOutcome lo) mutable { Defer(finish(std::move(lo))); });
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
  for (Deferred& d : ready) {
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
    if (!posted) return false;
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
                     engines_ ? engines_->size() : 0};
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
  ipc::SegmentHeader* h = segment_.header();
  ipc::RingConsumer<RequestRecord> sq = segment_.DaemonSq();
  ipc::RingProducer<CompletionRecord> cq = segment_.DaemonCq();
  const uint64_t spin_ns = uint64_t{opts_.spin_us} * 1000;
  uint64_t idle_since = MonotonicNanos();
  std::string fatal_reason;

  while (!stop_.load(std::memory_order_acquire)) {
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
      cache_->ObservePending(holdings_);
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
      os::FutexWait(&h->daemon_sleeping, 1, std::chrono::milliseconds(500));
    }
    h->daemon_sleeping.store(0, std::memory_order_relaxed);
    idle_since = MonotonicNanos();
  }
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
  cache_->CloseSession(holdings_);
  while (!gpu_pins_.empty()) ReleaseGpuPins(gpu_pins_.begin()->first);
  // The engine's memory goes now, not when the session object is reaped: a
  // dead engine's device memory must not be touched again.
  if (engines_) engines_->Clear();
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

void Session::ReleaseGpuPins(uint64_t lease) {
  auto it = gpu_pins_.find(lease);
  if (it == gpu_pins_.end()) return;
  for (const BlockKey& k : it->second) gpu_->Release(ns_.handle, k);
  gpu_pins_.erase(it);
}

void Session::WriteResults(const RequestRecord& req, const std::vector<BlockLocation>& locs,
                           std::span<const uint64_t> gpu_offsets) {
  std::byte* out = segment_.scratch().data() + req.out_offset;
  for (size_t i = 0; i < locs.size(); ++i) {
    ipc::BlockResult r{};
    r.arena_offset = locs[i].arena_offset;
    r.gpu_offset = i < gpu_offsets.size() ? gpu_offsets[i] : ipc::kNoGpuCopy;
    r.tier = static_cast<uint8_t>(locs[i].tier);
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
  switch (op) {
    case Opcode::kPing:
      return o;
    case Opcode::kLookup: {
      uint64_t lease = 0;
      uint32_t recompute = 0;
      absl::StatusOr<uint32_t> hit =
          cache_->Lookup(holdings_, keys, (req.flags & ipc::kFlagLease) != 0, &lease, std::span(locs), &recompute);
      if (!hit.ok()) return fail(hit.status());
      std::vector<uint64_t> gpu_offsets(locs.size(), ipc::kNoGpuCopy);
      if (gpu_ != nullptr) {
        for (uint32_t i = 0; i < *hit && i < keys.size(); ++i) {
          if (lease == 0) {
            if (gpu_->Contains(ns_.handle, keys[i])) locs[i].tier = TierKind::kGpu;
            continue;
          }
          // Leased: pin the copy, so the engine may read it in place until
          // it releases the lease.
          if (std::optional<GpuCache::Pin> pin = gpu_->Acquire(ns_.handle, keys[i], /*count_hit=*/false)) {
            locs[i].tier = TierKind::kGpu;
            gpu_offsets[i] = gpu_->OffsetOf(*pin);
            gpu_pins_[lease].push_back(keys[i]);
          }
        }
      }
      WriteResults(req, locs, gpu_offsets);
      o.count = *hit;
      o.handle = lease;
      o.value = recompute;
      return o;
    }
    case Opcode::kLoad: {
      // Blocks that failed to come back from NVMe are a shorter loaded
      // prefix (count), not an error: the engine recomputes them.
      auto finish = [](const RequestRecord& r, LoadOutcome lo) {
        Deferred d{r, {}, {}};
        if (lo.locations.empty() && !lo.status.ok()) {
          d.outcome = FromStatus(lo.status);
        } else {
          d.outcome.count = lo.loaded;
          d.locations = std::move(lo.locations);
        }
        return d;
      };
      async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
      std::optional<LoadOutcome> now =
          cache_->Load(holdings_, req.handle, keys, [this, req, finish](LoadOutcome lo) { Defer(finish(req, std::move(lo))); });
      if (!now) return Outcome{.deferred = true};
      async_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      Deferred d = finish(req, std::move(*now));
      if (!d.locations.empty()) WriteResults(req, d.locations);
      return d.outcome;
    }
    case Opcode::kPrefetch: {
      async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
      cache_->Prefetch(holdings_, keys, [this, req](absl::StatusOr<uint32_t> n) {
        Deferred d{req, FromStatus(n.status()), {}};
        if (n.ok()) d.outcome.value = *n;
        Defer(std::move(d));
      });
      return Outcome{.deferred = true};
    }
    case Opcode::kStoreBegin: {
      uint64_t ticket = 0;
      absl::StatusOr<uint32_t> needed = cache_->StoreBegin(holdings_, keys, &ticket, std::span(locs));
      if (!needed.ok()) return fail(needed.status());
      WriteResults(req, locs);
      o.count = *needed;
      o.handle = ticket;
      return o;
    }
    case Opcode::kStoreCommit: {
      async_in_flight_.fetch_add(1, std::memory_order_acq_rel);
      cache_->StoreCommit(holdings_, req.handle, (req.flags & ipc::kFlagDurable) != 0,
                          [this, req](absl::Status s) { Defer(Deferred{req, FromStatus(s), {}}); });
      return Outcome{.deferred = true};
    }
    case Opcode::kStoreAbort: {
      absl::Status s = cache_->StoreAbort(holdings_, req.handle);
      return s.ok() ? o : fail(s);
    }
    case Opcode::kRelease: {
      absl::Status s = cache_->Release(holdings_, req.handle);
      if (s.ok()) ReleaseGpuPins(req.handle);
      return s.ok() ? o : fail(s);
    }
    case Opcode::kInvalidate: {
      absl::StatusOr<uint32_t> n = cache_->Invalidate(holdings_, keys);
      if (!n.ok()) return fail(n.status());
      if (gpu_ != nullptr) {
        for (const BlockKey& k : keys) gpu_->Drop(ns_.handle, k);
      }
      o.value = *n;
      return o;
    }
    case Opcode::kReportPrefill: {
      absl::Status s = cache_->cost().ReportPrefill(req.args[0], req.args[1], double(req.handle) / 1e9);
      if (!s.ok()) {
        stats_->prefill_reports_refused.Add();
        return fail(s);
      }
      stats_->prefill_reports.Add();
      return o;
    }
    case Opcode::kStoreDevice:
      return StoreDevice(req, keys, locs);
    case Opcode::kLoadDevice:
      return LoadDevice(req, keys);
    case Opcode::kInvalidateNamespace: {
      absl::StatusOr<uint32_t> n = cache_->InvalidateNamespace(holdings_);
      if (!n.ok()) return fail(n.status());
      if (gpu_ != nullptr) gpu_->DropNamespace(ns_.handle);
      o.value = *n;
      return o;
    }
  }
  return fatal("unhandled opcode");
}

}  // namespace kvtier
