// SPDX-License-Identifier: Apache-2.0
// The host-simulated device: device memory is host memory (memfds, so it can
// be "exported" to another process), streams are worker threads that run
// copies in order, events are counters in shared memfd pages (so another
// process can import and wait on them), and an optional bandwidth cap
// imitates a PCIe link.
#include <fcntl.h>
#include <sys/mman.h>

#include <cstring>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <optional>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "core/mutex.h"
#include "core/status.h"
#include "os/shared_event.h"
#include "os/shm.h"
#include "kernels/kv_kernels.h"
#include "tiers/device_backend.h"

namespace kvtier {
namespace {

// One in-order work queue on its own thread.
class SimStream {
 public:
  SimStream() : thread_([this] { Run(); }) {}
  ~SimStream() {
    stopping_.store(true, std::memory_order_release);
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Enqueue(absl::AnyInvocable<void() &&> fn) {
    {
      MutexLock l(&mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  void Synchronize() {
    MutexLock l(&mu_);
    mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queue_.empty() && !busy_; });
  }
  // True once the stream is being destroyed: work that waits on another
  // stream's (or process's) event gives up then, so destruction never hangs.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

 private:
  void Run() {
    for (;;) {
      absl::AnyInvocable<void() &&> fn;
      {
        MutexLock l(&mu_);
        mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::move(fn)();
      {
        MutexLock l(&mu_);
        busy_ = false;
      }
      cv_.notify_all();
    }
  }

  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// An event of ours (a slot of the pool, returned when the last reference
// goes: queued work may still complete it after DestroyEvent), or one
// imported from another process (its page mapped here).
struct SimEvent {
  SimEvent(os::SharedEventPool* pool, os::SharedEventPool::Slot slot)
      : state(slot.state), pool(pool), slot(slot) {}
  explicit SimEvent(os::ImportedEvent imp) : state(&imp.state()), imported(std::move(imp)) {}
  ~SimEvent() {
    if (pool != nullptr) pool->Free(slot);
  }
  SimEvent(const SimEvent&) = delete;
  SimEvent& operator=(const SimEvent&) = delete;

  os::SharedEventState* const state;
  os::SharedEventPool* const pool = nullptr;
  const os::SharedEventPool::Slot slot{};
  const std::optional<os::ImportedEvent> imported;
};

// The CPU reference kernels, run on a simulated stream in order with its
// copies. Arguments are checked at the call (errors come back at once) and
// copied, since the work runs later. A bandwidth cap paces gathers and
// scatters by the block bytes they move, as it paces copies.
class SimKernels final : public kernels::KvKernels {
 public:
  using StreamLookup = absl::AnyInvocable<std::shared_ptr<SimStream>(DeviceStream)>;
  SimKernels(StreamLookup lookup, uint64_t bandwidth) : lookup_(std::move(lookup)), bandwidth_(bandwidth) {}

  absl::string_view name() const override { return "reference"; }

  absl::Status Gather(const kernels::KvShape& shape, kernels::BlockCodec codec, const kernels::PagedCache& cache,
                      const kernels::BlockIo& io, DeviceStream stream) override {
    return Enqueue(shape, codec, cache, io, stream, /*gather=*/true);
  }
  absl::Status Scatter(const kernels::KvShape& shape, kernels::BlockCodec codec,
                       const kernels::PagedCache& cache, const kernels::BlockIo& io,
                       DeviceStream stream) override {
    return Enqueue(shape, codec, cache, io, stream, /*gather=*/false);
  }
  absl::Status Checksum(absl::Span<const uint64_t> blocks, uint64_t bytes, uint64_t* out,
                        DeviceStream stream) override {
    if (out == nullptr && !blocks.empty()) return absl::InvalidArgumentError("checksum: null output");
    std::shared_ptr<SimStream> s = lookup_(stream);
    if (!s) return absl::InvalidArgumentError(absl::StrCat("unknown stream ", stream));
    s->Enqueue([this, blocks = std::vector<uint64_t>(blocks.begin(), blocks.end()), bytes, out] {
      (void)ref_->Checksum(blocks, bytes, out, 0);
    });
    return absl::OkStatus();
  }

 private:
  absl::Status Enqueue(const kernels::KvShape& shape, kernels::BlockCodec codec, const kernels::PagedCache& cache,
                       const kernels::BlockIo& io, DeviceStream stream, bool gather) {
    RETURN_IF_ERROR(kernels::ValidateIo(shape, codec, cache, io));
    std::shared_ptr<SimStream> s = lookup_(stream);
    if (!s) return absl::InvalidArgumentError(absl::StrCat("unknown stream ", stream));
    const uint32_t layers = io.layer_count == 0 ? shape.layers - io.first_layer : io.layer_count;
    const uint64_t bytes = uint64_t{io.blocks.size()} * layers * kernels::GeometryOf(shape, codec).layer_bytes;
    s->Enqueue([this, shape, codec, cache, gather, pages = std::vector<uint32_t>(io.pages.begin(), io.pages.end()),
                blocks = std::vector<uint64_t>(io.blocks.begin(), io.blocks.end()), first = io.first_layer,
                count = io.layer_count, bytes] {
      const auto start = std::chrono::steady_clock::now();
      const kernels::BlockIo copy{pages, blocks, first, count};
      // Validated above; the reference cannot fail on what ValidateIo accepts.
      (void)(gather ? ref_->Gather(shape, codec, cache, copy, 0) : ref_->Scatter(shape, codec, cache, copy, 0));
      if (bandwidth_ > 0) {
        std::this_thread::sleep_until(start + std::chrono::nanoseconds(static_cast<int64_t>(bytes * 1e9 / bandwidth_)));
      }
    });
    return absl::OkStatus();
  }

  StreamLookup lookup_;
  const uint64_t bandwidth_;
  const std::unique_ptr<kernels::KvKernels> ref_ = kernels::MakeReferenceKernels();
};

struct SimAllocation {
  UniqueFd fd;
  os::MappedRegion region;
};

class SimDevice final : public DeviceBackend {
 public:
  explicit SimDevice(const SimDeviceOptions& opts)
      : opts_(opts), kernels_([this](DeviceStream id) { return FindStream(id); }, opts.bandwidth_bytes_per_s) {}

  absl::string_view name() const override { return "sim"; }

  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("device allocation of 0 bytes");
    auto a = std::make_unique<SimAllocation>();
    ASSIGN_OR_RETURN(a->fd, os::CreateSealedMemfd("kvtier-sim-device", bytes));
    ASSIGN_OR_RETURN(a->region, os::MappedRegion::Map(a->fd.get(), bytes));
    void* p = a->region.data();
    MutexLock l(&mu_);
    allocations_.emplace(p, std::move(a));
    return p;
  }

  absl::Status Free(void* ptr) override {
    MutexLock l(&mu_);
    if (allocations_.erase(ptr) == 0) {
      return absl::InvalidArgumentError("free of a pointer the simulated device did not allocate");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceStream> CreateStream() override {
    MutexLock l(&mu_);
    const DeviceStream id = ++next_id_;
    streams_.emplace(id, std::make_shared<SimStream>());
    return id;
  }

  absl::Status DestroyStream(DeviceStream stream) override {
    std::shared_ptr<SimStream> s;
    {
      MutexLock l(&mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) return UnknownStream(stream);
      s = std::move(it->second);
      streams_.erase(it);
    }
    s.reset();  // the last owner joins the thread after it drains
    return absl::OkStatus();
  }

  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, DeviceStream stream) override {
    if (bytes > 0 && (dst == nullptr || src == nullptr)) {
      return absl::InvalidArgumentError("copy with a null pointer");
    }
    std::shared_ptr<SimStream> s = FindStream(stream);
    if (!s) return UnknownStream(stream);
    const uint64_t bw = opts_.bandwidth_bytes_per_s;
    s->Enqueue([dst, src, bytes, bw] {
      const auto start = std::chrono::steady_clock::now();
      if (bytes > 0) std::memcpy(dst, src, bytes);
      if (bw > 0) {
        const auto want = std::chrono::nanoseconds(static_cast<int64_t>(bytes * 1e9 / bw));
        std::this_thread::sleep_until(start + want);
      }
    });
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(DeviceStream stream) override {
    std::shared_ptr<SimStream> s = FindStream(stream);
    if (!s) return UnknownStream(stream);
    s->Synchronize();
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceEvent> CreateEvent(uint64_t group) override {
    ASSIGN_OR_RETURN(os::SharedEventPool::Slot slot, event_pool_.Allocate(group));
    auto e = std::make_shared<SimEvent>(&event_pool_, slot);
    MutexLock l(&mu_);
    const DeviceEvent id = ++next_id_;
    events_.emplace(id, std::move(e));
    return id;
  }

  absl::Status DestroyEvent(DeviceEvent event) override {
    MutexLock l(&mu_);
    if (events_.erase(event) == 0) return UnknownEvent(event);
    return absl::OkStatus();
  }

  absl::Status RecordEvent(DeviceEvent event, DeviceStream stream) override {
    std::shared_ptr<SimEvent> e = FindEvent(event);
    if (!e) return UnknownEvent(event);
    std::shared_ptr<SimStream> s = FindStream(stream);
    if (!s) return UnknownStream(stream);
    // An imported event's page is mapped read-only: its exporter records it.
    if (e->pool == nullptr) return absl::InvalidArgumentError("an imported event can be waited for, not recorded");
    const uint32_t gen = os::EventRecord(*e->state);
    s->Enqueue([e, gen] { os::EventComplete(*e->state, gen); });
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(DeviceEvent event) override {
    std::shared_ptr<SimEvent> e = FindEvent(event);
    if (!e) return UnknownEvent(event);
    return os::EventReached(*e->state, os::EventTarget(*e->state));
  }

  absl::Status WaitEvent(DeviceEvent event, std::chrono::nanoseconds timeout) override {
    std::shared_ptr<SimEvent> e = FindEvent(event);
    if (!e) return UnknownEvent(event);
    if (!os::EventWait(*e->state, os::EventTarget(*e->state), timeout)) {
      return absl::DeadlineExceededError("simulated device event did not complete in time");
    }
    return absl::OkStatus();
  }

  absl::Status StreamWaitEvent(DeviceStream stream, DeviceEvent event) override {
    std::shared_ptr<SimEvent> e = FindEvent(event);
    if (!e) return UnknownEvent(event);
    std::shared_ptr<SimStream> s = FindStream(stream);
    if (!s) return UnknownStream(stream);
    const uint32_t gen = os::EventTarget(*e->state);
    // The stream owns this work: the raw pointer lives as long as it runs.
    s->Enqueue([e, gen, self = s.get()] {
      while (!os::EventWait(*e->state, gen, std::chrono::milliseconds(50)) && !self->stopping()) {
      }
    });
    return absl::OkStatus();
  }

  absl::StatusOr<IpcEventHandle> ExportEvent(DeviceEvent event) override {
    std::shared_ptr<SimEvent> e = FindEvent(event);
    if (!e) return UnknownEvent(event);
    if (e->pool == nullptr) return absl::InvalidArgumentError("export of an event this device imported");
    IpcEventHandle h;
    h.fd = UniqueFd(fcntl(event_pool_.PageFd(e->slot.page), F_DUPFD_CLOEXEC, 0));
    if (!h.fd.valid()) return ErrnoStatus(errno, "dup of a simulated event page");
    h.offset = os::SharedEventPool::OffsetOf(e->slot);
    return h;
  }

  absl::StatusOr<DeviceEvent> ImportEvent(const IpcEventHandle& handle) override {
    ASSIGN_OR_RETURN(os::ImportedEvent imported, os::ImportedEvent::Open(handle.fd.get(), handle.offset));
    auto e = std::make_shared<SimEvent>(std::move(imported));
    MutexLock l(&mu_);
    const DeviceEvent id = ++next_id_;
    events_.emplace(id, std::move(e));
    return id;
  }

  absl::Status RegisterHost(void* ptr, uint64_t bytes) override {
    if (ptr == nullptr || bytes == 0) return absl::InvalidArgumentError("register of an empty range");
    MutexLock l(&mu_);
    if (!registered_.emplace(ptr, bytes).second) {
      return absl::AlreadyExistsError("host memory is already registered");
    }
    return absl::OkStatus();
  }

  absl::Status UnregisterHost(void* ptr) override {
    MutexLock l(&mu_);
    if (registered_.erase(ptr) == 0) {
      return absl::InvalidArgumentError("unregister of host memory that was not registered");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<IpcMemHandle> ExportMemory(void* device_ptr) override {
    MutexLock l(&mu_);
    auto it = allocations_.find(device_ptr);
    if (it == allocations_.end()) {
      return absl::InvalidArgumentError("export of a pointer that is not an allocation's start");
    }
    IpcMemHandle h;
    h.fd = UniqueFd(fcntl(it->second->fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!h.fd.valid()) return ErrnoStatus(errno, "dup of simulated device memory");
    h.bytes = it->second->region.size();
    return h;
  }

  absl::StatusOr<void*> ImportMemory(const IpcMemHandle& handle) override {
    if (!handle.fd.valid() || handle.bytes == 0) {
      return absl::InvalidArgumentError("simulated IPC handle without a memory descriptor");
    }
    ASSIGN_OR_RETURN(uint64_t size, os::FdSize(handle.fd.get()));
    if (size < handle.bytes) return absl::InvalidArgumentError("IPC handle larger than its memory");
    ASSIGN_OR_RETURN(os::MappedRegion region, os::MappedRegion::Map(handle.fd.get(), handle.bytes));
    void* p = region.data();
    MutexLock l(&mu_);
    imported_.emplace(p, std::move(region));
    return p;
  }

  absl::Status CloseImported(void* ptr) override {
    MutexLock l(&mu_);
    if (imported_.erase(ptr) == 0) return absl::InvalidArgumentError("close of memory not imported");
    return absl::OkStatus();
  }

  kernels::KvKernels& kernels() override { return kernels_; }

 private:
  static absl::Status UnknownStream(DeviceStream s) {
    return absl::InvalidArgumentError(absl::StrCat("unknown stream ", s));
  }
  static absl::Status UnknownEvent(DeviceEvent e) {
    return absl::InvalidArgumentError(absl::StrCat("unknown event ", e));
  }
  std::shared_ptr<SimStream> FindStream(DeviceStream id) {
    MutexLock l(&mu_);
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
  }
  std::shared_ptr<SimEvent> FindEvent(DeviceEvent id) {
    MutexLock l(&mu_);
    auto it = events_.find(id);
    return it == events_.end() ? nullptr : it->second;
  }

  const SimDeviceOptions opts_;
  // Before streams_ and events_: queued work returns event slots here.
  os::SharedEventPool event_pool_;
  // Before streams_, so it outlives the stream threads that run its work.
  SimKernels kernels_;
  Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<void*, std::unique_ptr<SimAllocation>> allocations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DeviceStream, std::shared_ptr<SimStream>> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DeviceEvent, std::shared_ptr<SimEvent>> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, uint64_t> registered_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, os::MappedRegion> imported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeSimDevice(const SimDeviceOptions& opts) {
  return std::make_unique<SimDevice>(opts);
}

}  // namespace kvtier
