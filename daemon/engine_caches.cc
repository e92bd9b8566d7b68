// SPDX-License-Identifier: Apache-2.0
#include "daemon/engine_caches.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/units.h"
#include "os/futex.h"
#include "os/shm.h"

namespace kvtier {
namespace {

constexpr auto kDeviceTimeout = std::chrono::seconds(30);

}  // namespace

absl::Status KvCacheBudget::Charge(uint64_t bytes) {
  MutexLock l(&mu_);
  if (caches_ >= max_caches_) {
    if (stats_ != nullptr) stats_->Refused(Refusal::kTenantKvCaches);
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this tenant has ", caches_,
                                                     " KV caches registered (limits.kv_caches_per_tenant = ",
                                                     max_caches_, "); unregister one first"));
  }
  const std::optional<uint64_t> total = CheckedAdd(bytes_, bytes);
  if (!total || *total > max_bytes_) {
    if (stats_ != nullptr) stats_->Refused(Refusal::kTenantMappedBytes);
    return CodedStatus(KVTIER_EBUSY, absl::StrCat(
        "registering ", FormatBytes(bytes), " more would map ", total ? FormatBytes(*total) : "over 2^64 bytes",
        " of this tenant's KV caches into kvtierd (limits.kv_cache_bytes_per_tenant = ", FormatBytes(max_bytes_),
        "); register only the memory the cache lies in"));
  }
  ++caches_;
  bytes_ = *total;
  return absl::OkStatus();
}

void KvCacheBudget::Refund(uint64_t bytes) {
  MutexLock l(&mu_);
  --caches_;
  bytes_ -= bytes;
}

uint32_t KvCacheBudget::caches() const {
  MutexLock l(&mu_);
  return caches_;
}

uint64_t KvCacheBudget::bytes() const {
  MutexLock l(&mu_);
  return bytes_;
}

EngineCache::~EngineCache() {
  for (DeviceEvent e : layer_events) (void)device->DestroyEvent(e);
  for (void* p : imported) (void)device->CloseImported(p);
  if (budget != nullptr) budget->Refund(charged);
}

EngineCaches::~EngineCaches() {
  MutexLock l(&mu_);
  if (stream_ != 0) (void)device_->DestroyStream(stream_);
}

absl::StatusOr<Registered> EngineCaches::Register(const ipc::KvRegisterRequest& req, std::vector<UniqueFd> fds) {
  auto c = std::make_shared<EngineCache>(device_);
  ASSIGN_OR_RETURN(const uint64_t page_bytes, CheckLayout(req, *c));
  // The tenant's budget is charged before anything is mapped (and refunded
  // when the cache is destroyed, whatever ends it).
  uint64_t region_bytes = 0;
  for (const ipc::KvRegion& r : req.regions) {
    const std::optional<uint64_t> sum = CheckedAdd(region_bytes, r.bytes);
    if (!sum) return absl::InvalidArgumentError("the memory regions' sizes add up to more than 2^64 bytes");
    region_bytes = *sum;
  }
  if (budget_ != nullptr) {
    RETURN_IF_ERROR(budget_->Charge(region_bytes));
    c->budget = budget_;
    c->charged = region_bytes;
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> local, ImportRegions(req, std::move(fds), *c));
  RETURN_IF_ERROR(MapLayers(req, local, page_bytes, *c));
  RETURN_IF_ERROR(kernels::Validate(c->shape, c->cache));
  c->pages_per_block = kernels::PagesPerBlock(c->shape, c->cache);
  Registered out;
  RETURN_IF_ERROR(ExportLayerEvents(*c, &out));
  MutexLock l(&mu_);
  if (caches_.size() >= kMaxPerSession) {
    return absl::ResourceExhaustedError(absl::StrCat("a session registers at most ", kMaxPerSession,
                                                     " KV caches; unregister one first"));
  }
  c->id = next_id_++;
  caches_.emplace(c->id, c);
  out.id = c->id;
  return out;
}

absl::StatusOr<uint64_t> EngineCaches::CheckLayout(const ipc::KvRegisterRequest& req, EngineCache& c) const {
  if (req.dtype > static_cast<uint8_t>(kernels::KvDtype::kInt8)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown KV dtype code ", req.dtype));
  }
  if (req.codec > static_cast<uint8_t>(kernels::BlockCodec::kFp8E4M3)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown block codec code ", req.codec));
  }
  c.shape = kernels::KvShape{req.layers, ns_.block_tokens, req.kv_heads, req.head_dim,
                             static_cast<kernels::KvDtype>(req.dtype)};
  c.codec = static_cast<kernels::BlockCodec>(req.codec);
  RETURN_IF_ERROR(kernels::Validate(c.shape, c.codec));
  const uint64_t block_bytes = kernels::GeometryOf(c.shape, c.codec).block_bytes;
  if (block_bytes != ns_.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this layout makes blocks of ", block_bytes, " bytes (", req.layers, " layers x K,V x ", ns_.block_tokens,
        " tokens x ", req.kv_heads, " heads x ", req.head_dim, " x ", kernels::DtypeName(c.shape.dtype),
        ", codec ", kernels::CodecName(c.codec), ") but the namespace's blocks are ", ns_.block_bytes,
        " bytes; attach with the matching block_bytes"));
  }
  c.cache.page_tokens = req.page_tokens;
  c.cache.num_pages = req.num_pages;
  c.cache.page_stride = req.page_stride;
  if (req.page_tokens == 0 || ns_.block_tokens % req.page_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_tokens ", req.page_tokens, " does not divide the ",
                                                   ns_.block_tokens, "-token blocks"));
  }
  const uint64_t page_bytes = kernels::PageBytes(c.shape, c.cache);
  if (req.page_stride < page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_stride ", req.page_stride, " is smaller than a page (", page_bytes, " bytes)"));
  }
  if (req.num_pages == 0 || req.num_pages > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("num_pages ", req.num_pages, " is not in 1..2^32"));
  }
  return page_bytes;
}

absl::StatusOr<std::vector<uint64_t>> EngineCaches::ImportRegions(const ipc::KvRegisterRequest& req,
                                                                  std::vector<UniqueFd> fds, EngineCache& c) {
  // Memfd regions come with one descriptor each, in order.
  size_t next_fd = 0;
  std::vector<uint64_t> local(req.regions.size());
  for (size_t i = 0; i < req.regions.size(); ++i) {
    const ipc::KvRegion& r = req.regions[i];
    if (r.bytes == 0 || r.base == 0 || !CheckedAdd(r.base, r.bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("memory region ", i, " is empty or wraps around"));
    }
    IpcMemHandle h;
    h.bytes = r.bytes;
    if (r.kind == ipc::KvRegionKind::kHostMemfd) {
      if (next_fd < fds.size()) h.fd = std::move(fds[next_fd]);
      RETURN_IF_ERROR(CheckMemfdRegion(i, r, next_fd < fds.size(), h.fd));
      ++next_fd;
    } else {
      if (device_->name() != "cuda") {
        return absl::FailedPreconditionError(absl::StrCat(
            "memory region ", i, " is CUDA device memory but this kvtierd runs the ", device_->name(),
            " device backend (no GPU answered it at start)"));
      }
      std::copy(r.handle.begin(), r.handle.end(), h.opaque.begin());
    }
    absl::StatusOr<void*> p = device_->ImportMemory(h);
    if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat("memory region ", i, ": ", p.status().message()));
    c.imported.push_back(*p);
    local[i] = reinterpret_cast<uint64_t>(*p);
  }
  if (next_fd != fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat(fds.size(), " descriptors for ", next_fd, " host regions"));
  }
  return local;
}

absl::Status EngineCaches::CheckMemfdRegion(size_t i, const ipc::KvRegion& r, bool has_fd, const UniqueFd& fd) const {
  if (device_->name() != "sim") {
    return absl::FailedPreconditionError(absl::StrCat(
        "memory region ", i, " is host memory (a memfd), which this kvtierd's ", device_->name(),
        " device backend cannot reach; register CUDA device memory, or run kvtierd with device = \"sim\""));
  }
  if (!has_fd) {
    return absl::InvalidArgumentError(absl::StrCat("memory region ", i, " is host memory but came without its memfd"));
  }
  // A memfd the engine could still shrink would turn our next access into
  // SIGBUS: it must be sealed against that.
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memory region ", i, "'s memfd is not sealed against shrinking; create it with MFD_ALLOW_SEALING "
        "and fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) before registering"));
  }
  ASSIGN_OR_RETURN(uint64_t size, os::FdSize(fd.get()));
  if (size < r.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("memory region ", i, " claims ", r.bytes,
                                                   " bytes but its memfd holds ", size));
  }
  return absl::OkStatus();
}

absl::Status EngineCaches::MapLayers(const ipc::KvRegisterRequest& req, const std::vector<uint64_t>& local,
                                     uint64_t page_bytes, EngineCache& c) const {
  // Each layer's pages must lie inside one region; the extent they span is
  // computed with overflow checks (a wrapped extent once let a tenant
  // address another's arena).
  const std::optional<uint64_t> extent = StridedExtent(req.num_pages, req.page_stride, page_bytes);
  if (!extent) {
    return absl::InvalidArgumentError(absl::StrCat(req.num_pages, " pages of stride ", req.page_stride,
                                                   " bytes span more than 2^64 bytes"));
  }
  const uint64_t span = *extent;
  auto translate = [&](uint64_t addr, uint32_t layer, const char* kv) -> absl::StatusOr<uint64_t> {
    for (size_t i = 0; i < req.regions.size(); ++i) {
      const ipc::KvRegion& r = req.regions[i];
      if (addr >= r.base && RangeWithin(addr - r.base, span, r.bytes)) {
        return local[i] + (addr - r.base);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, "'s ", kv, " pages (", FormatBytes(span),
                                                   " from its address) lie in no registered memory region"));
  };
  for (uint32_t l = 0; l < req.layers; ++l) {
    ASSIGN_OR_RETURN(uint64_t k, translate(req.k_layers[l], l, "K"));
    ASSIGN_OR_RETURN(uint64_t v, translate(req.v_layers[l], l, "V"));
    c.cache.k_base.push_back(k);
    c.cache.v_base.push_back(v);
  }
  return absl::OkStatus();
}

absl::Status EngineCaches::ExportLayerEvents(EngineCache& c, Registered* out) {
  const bool cuda = device_->name() == "cuda";
  out->event_kind = cuda ? ipc::KvEventKind::kCudaIpc : ipc::KvEventKind::kSharedPage;
  // Simulated events share memfd pages: one descriptor per page.
  std::map<std::pair<dev_t, ino_t>, uint32_t> pages;
  // The registration's events are a group of their own: the pages the
  // engine gets hold no other registration's (or tenant's) events, and it
  // can only map them read-only.
  static std::atomic<uint64_t> next_group{1};
  const uint64_t group = next_group.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t l = 0; l < c.shape.layers; ++l) {
    ASSIGN_OR_RETURN(DeviceEvent e, device_->CreateEvent(group));
    c.layer_events.push_back(e);
    absl::StatusOr<IpcEventHandle> h = device_->ExportEvent(e);
    if (!h.ok()) return absl::Status(h.status().code(), absl::StrCat("layer ", l, "'s event: ", h.status().message()));
    ipc::KvEventRef& ref = out->layer_events.emplace_back();
    if (cuda) {
      ref.handle = h->opaque;
      continue;
    }
    struct stat st;
    if (fstat(h->fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat of an event page");
    auto [it, fresh] = pages.emplace(std::pair{st.st_dev, st.st_ino}, static_cast<uint32_t>(out->fds.size()));
    if (fresh) out->fds.push_back(std::move(h->fd));
    ref.fd_index = it->second;
    ref.offset = h->offset;
  }
  return absl::OkStatus();
}

absl::Status EngineCaches::Unregister(uint64_t id) {
  MutexLock l(&mu_);
  if (caches_.erase(id) == 0) return absl::NotFoundError(absl::StrCat("no KV-cache registration ", id));
  return absl::OkStatus();
}

void EngineCaches::Clear() {
  MutexLock l(&mu_);
  caches_.clear();
}

std::shared_ptr<const EngineCache> EngineCaches::Find(uint64_t id) const {
  MutexLock l(&mu_);
  auto it = caches_.find(id);
  return it == caches_.end() ? nullptr : it->second;
}

size_t EngineCaches::size() const {
  MutexLock l(&mu_);
  return caches_.size();
}

absl::StatusOr<DeviceStream> EngineCaches::Stream() {
  MutexLock l(&mu_);
  if (stream_ == 0) {
    ASSIGN_OR_RETURN(stream_, device_->CreateStream());
  }
  return stream_;
}

absl::Status EngineCaches::Gather(const EngineCache& c, std::span<const uint32_t> pages,
                                  std::span<const uint64_t> dst) {
  MutexLock work(&work_mu_);
  ASSIGN_OR_RETURN(DeviceStream s, Stream());
  RETURN_IF_ERROR(device_->kernels().Gather(c.shape, c.codec, c.cache, kernels::BlockIo{pages, dst}, s));
  return device_->SynchronizeStream(s);
}

absl::Status EngineCaches::Copy(std::span<const CopyOp> ops, uint64_t bytes) {
  MutexLock work(&work_mu_);
  ASSIGN_OR_RETURN(DeviceStream s, Stream());
  for (const CopyOp& op : ops) RETURN_IF_ERROR(device_->CopyAsync(op.dst, op.src, bytes, s));
  return device_->SynchronizeStream(s);
}

absl::Status EngineCaches::ScatterByLayer(const EngineCache& c, std::span<const uint32_t> pages,
                                          std::span<const uint64_t> src, ipc::DeviceLoadProgress* progress) {
  MutexLock work(&work_mu_);
  auto fail = [&](absl::Status st) {
    progress->failed.store(1, std::memory_order_release);
    os::FutexWakeAll(&progress->layers_done);
    os::FutexWakeAll(&progress->armed);
    return st;
  };
  absl::StatusOr<DeviceStream> s = Stream();
  if (!s.ok()) return fail(s.status());
  // Everything is queued first, so the device works on later layers while
  // earlier ones are announced.
  for (uint32_t l = 0; l < c.shape.layers; ++l) {
    absl::Status st = device_->kernels().Scatter(c.shape, c.codec, c.cache, kernels::BlockIo{pages, src, l, 1}, *s);
    if (st.ok()) st = device_->RecordEvent(c.layer_events[l], *s);
    if (!st.ok()) {
      (void)device_->SynchronizeStream(*s);  // nothing of ours may still write after we return
      return fail(st);
    }
  }
  progress->armed.store(1, std::memory_order_release);
  os::FutexWakeAll(&progress->armed);
  for (uint32_t l = 0; l < c.shape.layers; ++l) {
    if (absl::Status st = device_->WaitEvent(c.layer_events[l], kDeviceTimeout); !st.ok()) {
      (void)device_->SynchronizeStream(*s);
      return fail(st);
    }
    progress->layers_done.store(l + 1, std::memory_order_release);
    os::FutexWakeAll(&progress->layers_done);
  }
  return absl::OkStatus();
}

}  // namespace kvtier
