// SPDX-License-Identifier: Apache-2.0
// Python bindings of the libkvtier client API (pybind11): the module
// `kvtier._kvtier`, re-exported by the `kvtier` package. Block keys are
// 32-byte `bytes`; blocks are NumPy uint8 arrays (read-only views into the
// shared host arena for loads, any C-contiguous uint8 buffer for stores).
// Blocking calls release the GIL. A Client is used from one thread at a time.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "kvtier/client.h"

namespace py = pybind11;

namespace kvtier {
namespace {

// kvtier.KvtierError, created at import.
PyObject* g_error = nullptr;

[[noreturn]] void Raise(const Status& s) {
  py::object err = py::reinterpret_borrow<py::object>(g_error)(s.message());
  err.attr("code") = s.raw_code();
  PyErr_SetObject(g_error, err.ptr());
  throw py::error_already_set();
}

template <typename T>
T Check(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

BlockKey KeyFrom(const py::handle& h) {
  const std::string b = py::cast<py::bytes>(h);
  if (b.size() != 32) throw py::value_error("a block key is 32 bytes, got " + std::to_string(b.size()));
  BlockKey k;
  std::memcpy(k.bytes.data(), b.data(), 32);
  return k;
}

// lookup(ask=...): None, True, False.
LookupOptions::Ask AskOf(std::optional<bool> ask) {
  if (!ask) return LookupOptions::Ask::kIfLeased;
  return *ask ? LookupOptions::Ask::kYes : LookupOptions::Ask::kNo;
}

std::vector<BlockKey> KeysFrom(const py::sequence& seq) {
  std::vector<BlockKey> out;
  out.reserve(py::len(seq));
  for (const py::handle& h : seq) out.push_back(KeyFrom(h));
  return out;
}

py::bytes KeyBytes(const BlockKey& k) { return py::bytes(reinterpret_cast<const char*>(k.bytes.data()), 32); }

std::string TierString(TierKind t) { return std::string(TierName(t)); }

// What keeps the arena mapped under views: the C++ client itself, not the
// Python Client (which close() empties).
py::object KeepAlive(std::shared_ptr<Client> c) {
  auto* p = new std::shared_ptr<Client>(std::move(c));
  return py::capsule(p, [](void* v) { delete static_cast<std::shared_ptr<Client>*>(v); });
}

// A uint8 array over a block in the arena (read-only unless `writable`);
// `owner` keeps the arena mapped.
py::array View(const std::byte* data, size_t size, const py::object& owner, bool writable = false) {
  py::array a(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(size)}, {1}, reinterpret_cast<const void*>(data),
              owner);
  if (!writable) a.attr("flags").attr("writeable") = false;
  return a;
}
py::array View(const BlockView& v, const py::object& owner) { return View(v.data, v.size, owner); }

struct PyLookup {
  uint32_t hit_blocks = 0, recompute_blocks = 0;
  uint64_t lease = 0;
  std::vector<std::string> tiers;
  std::vector<std::optional<int>> lanes;
};

PyLookup ToPy(const LookupResult& v) {
  PyLookup r{v.hit_blocks, v.recompute_blocks, v.lease, {}, {}};
  for (TierKind t : v.tiers) r.tiers.push_back(TierString(t));
  for (uint8_t l : v.lanes) r.lanes.push_back(l == kNoLane ? std::nullopt : std::optional<int>(l));
  return r;
}

class PyClient;

// Leases a Client took and did not release: close() releases them.
using LeaseBook = std::shared_ptr<std::unordered_set<uint64_t>>;

// An asynchronous operation: wait() returns its result, poll() says whether
// it completed. Results of a load are views valid until the lease is released.
class PyOp {
 public:
  enum class Kind { kLoad, kPrefetch, kLookup };
  PyOp(std::shared_ptr<Client> client, py::object owner, Kind kind, OpId id, LeaseBook leases = nullptr)
      : client_(std::move(client)), owner_(std::move(owner)), kind_(kind), id_(id), leases_(std::move(leases)) {}

  std::vector<BlockView> views;
  uint32_t count = 0;
  LookupResult lookup;

  py::object Wait(std::optional<double> timeout_s) {
    if (!done_) {
      Status s;
      {
        py::gil_scoped_release nogil;
        s = client_->Wait(id_, timeout_s ? std::chrono::nanoseconds(static_cast<int64_t>(*timeout_s * 1e9))
                                         : std::chrono::nanoseconds::max());
      }
      if (s.code() == ErrorCode::kTimedOut) Raise(s);  // still in flight: wait again
      done_ = true;
      status_ = s;
    }
    Check(status_);
    return Value();
  }
  bool Poll() {
    if (done_) return true;
    std::optional<Status> s = client_->Poll(id_);
    if (!s) return false;
    done_ = true;
    status_ = *s;
    return true;
  }
  uint64_t id() const { return id_; }
  void set_id(OpId id) { id_ = id; }

 private:
  py::object Value() {
    switch (kind_) {
      case Kind::kLoad: {
        py::list out;
        for (const BlockView& v : views) out.append(View(v, owner_));
        return out;
      }
      case Kind::kPrefetch:
        return py::int_(count);
      case Kind::kLookup: {
        if (lookup.lease != 0 && leases_) leases_->insert(lookup.lease);
        return py::cast(ToPy(lookup));
      }
    }
    return py::none();
  }

  std::shared_ptr<Client> client_;
  py::object owner_;
  Kind kind_;
  OpId id_;
  LeaseBook leases_;
  bool done_ = false;
  Status status_;
};

// A daemon-driven load into a registered KV cache, landing layer by layer.
class PyDeviceLoad {
 public:
  PyDeviceLoad(std::shared_ptr<Client> client, DeviceLoad load) : client_(std::move(client)), load_(load) {}
  uint32_t layers() const { return load_.layers; }
  uint32_t LayersReady() const { return client_->LayersReady(load_); }
  uint32_t WaitLayers(uint32_t layers, std::optional<double> timeout_s) {
    Result<uint32_t> r = [&] {
      py::gil_scoped_release nogil;
      return client_->WaitLayers(load_, layers, Timeout(timeout_s));
    }();
    return Check(std::move(r));
  }
  uint32_t StreamWaitLayers(uint32_t layers, uint64_t stream, std::optional<double> timeout_s) {
    Result<uint32_t> r = [&] {
      py::gil_scoped_release nogil;
      return client_->StreamWaitLayers(load_, layers, stream, Timeout(timeout_s));
    }();
    return Check(std::move(r));
  }
  uint32_t Finish(std::optional<double> timeout_s) {
    Result<uint32_t> r = [&] {
      py::gil_scoped_release nogil;
      return client_->FinishLoad(load_, Timeout(timeout_s));
    }();
    return Check(std::move(r));
  }

 private:
  static std::chrono::nanoseconds Timeout(std::optional<double> s) {
    return s ? std::chrono::nanoseconds(static_cast<int64_t>(*s * 1e9)) : std::chrono::nanoseconds(30'000'000'000);
  }
  std::shared_ptr<Client> client_;
  DeviceLoad load_;
};

KvCacheLayout LayoutFrom(uint32_t layers, uint32_t page_tokens, uint32_t kv_heads, uint32_t head_dim,
                         uint64_t num_pages, const std::vector<uintptr_t>& k_layers,
                         const std::vector<uintptr_t>& v_layers,
                         const std::vector<std::tuple<uintptr_t, uint64_t, int>>& regions, const std::string& dtype,
                         const std::string& codec, uint64_t page_stride) {
  KvCacheLayout l;
  l.layers = layers;
  l.page_tokens = page_tokens;
  l.kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.dtype = dtype;
  l.codec = codec;
  l.num_pages = num_pages;
  l.page_stride = page_stride;
  for (uintptr_t a : k_layers) l.k_layers.push_back(reinterpret_cast<const void*>(a));
  for (uintptr_t a : v_layers) l.v_layers.push_back(reinterpret_cast<const void*>(a));
  for (const auto& [base, bytes, fd] : regions) l.regions.push_back({reinterpret_cast<const void*>(base), bytes, fd});
  return l;
}

struct ClosedError {};

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> c) : c_(std::move(c)) {}
  // The session; raises KvtierError (KVTIER_ENOTCONN) once closed. Called
  // with or without the GIL: a plain C++ exception, translated at the
  // boundary (where the GIL is held again).
  Client& c() {
    if (!c_) throw ClosedError{};
    return *c_;
  }
  std::shared_ptr<Client> shared() {
    c();
    return c_;
  }
  // Releases the leases this Client still holds and drops the session; it
  // ends (the daemon aborts its open stores) once no view, ticket or
  // operation of it is left: they keep its shared memory mapped.
  void Close() {
    std::shared_ptr<Client> c = std::move(c_);
    if (!c) return;
    std::vector<uint64_t> held(leases_->begin(), leases_->end());
    leases_->clear();
    py::gil_scoped_release nogil;
    for (uint64_t l : held) (void)c->Release(l);  // a lease the daemon already dropped is no matter
    c.reset();
  }
  bool closed() const { return !c_; }
  const LeaseBook& leases() const { return leases_; }

  uint64_t block_bytes() { return c().block_bytes(); }

 private:
  std::shared_ptr<Client> c_;
  LeaseBook leases_ = std::make_shared<std::unordered_set<uint64_t>>();
};

// A two-step store: writable views of the reserved slots, filled in place,
// then commit() (or abort()). As a context manager it commits on a normal
// exit and aborts when an exception leaves the block.
class PyStoreTicket {
 public:
  PyStoreTicket(std::shared_ptr<Client> client, StoreTicket t)
      : client_(std::move(client)), ticket_(std::move(t)), owner_(KeepAlive(client_)) {}
  uint64_t id() const { return ticket_.id; }
  uint32_t needed() const { return ticket_.needed; }
  py::list Needed() const {
    py::list out;
    for (const StoreSlot& s : ticket_.slots) out.append(s.needed);
    return out;
  }
  // One writable uint8 array per key whose block must be written; None for
  // keys already cached.
  py::list Blocks() {
    CheckOpen();
    py::list out;
    for (const StoreSlot& s : ticket_.slots) {
      if (s.needed) {
        out.append(View(s.data, s.size, owner_, /*writable=*/true));
      } else {
        out.append(py::none());
      }
    }
    return out;
  }
  void Commit(bool durable) {
    CheckOpen();
    done_ = true;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->StoreCommit(ticket_, {.durable = durable});
    }
    Check(s);
  }
  void Abort() {
    if (done_) return;
    done_ = true;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->StoreAbort(ticket_);
    }
    Check(s);
  }
  bool done() const { return done_; }

 private:
  void CheckOpen() const {
    if (done_) Raise(Status(ErrorCode::kInvalidArgument, "this store was already committed or aborted"));
  }
  std::shared_ptr<Client> client_;
  StoreTicket ticket_;
  py::object owner_;
  bool done_ = false;
};

std::vector<std::span<const std::byte>> BlocksFrom(const py::object& blocks, size_t n, uint64_t block_bytes,
                                                   std::vector<py::buffer_info>* keep) {
  std::vector<std::span<const std::byte>> out;
  if (py::isinstance<py::array>(blocks) && py::cast<py::array>(blocks).ndim() == 2) {
    auto a = py::cast<py::array_t<uint8_t, py::array::c_style>>(blocks);
    if (static_cast<size_t>(a.shape(0)) != n || static_cast<uint64_t>(a.shape(1)) != block_bytes) {
      throw py::value_error("blocks must have shape (" + std::to_string(n) + ", " + std::to_string(block_bytes) +
                            "), one row per key; got (" + std::to_string(a.shape(0)) + ", " +
                            std::to_string(a.shape(1)) + ")");
    }
    keep->push_back(a.request());
    const auto* base = static_cast<const std::byte*>(keep->back().ptr);
    for (size_t i = 0; i < n; ++i) out.emplace_back(base + i * block_bytes, block_bytes);
    return out;
  }
  const py::sequence seq = py::cast<py::sequence>(blocks);
  if (py::len(seq) != n) throw py::value_error("one block per key");
  for (const py::handle& h : seq) {
    keep->push_back(py::cast<py::buffer>(h).request());
    const py::buffer_info& b = keep->back();
    const uint64_t bytes = static_cast<uint64_t>(b.size) * static_cast<uint64_t>(b.itemsize);
    if (bytes != block_bytes) {
      throw py::value_error("every block must be block_bytes (" + std::to_string(block_bytes) + ") long, got " +
                            std::to_string(bytes));
    }
    out.emplace_back(static_cast<const std::byte*>(b.ptr), bytes);
  }
  return out;
}

}  // namespace
}  // namespace kvtier

PYBIND11_MODULE(_kvtier, m) {
  using namespace kvtier;
  m.doc() = "Python bindings of libkvtier, the kvtier engine client (see the kvtier package).";
  static py::exception<std::runtime_error> error(m, "KvtierError");
  g_error = error.ptr();
  error.doc() = "An error from kvtier: .code is the negative errno value (kvtier.h), str() says what to do.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ClosedError&) {
      py::object err = py::reinterpret_borrow<py::object>(g_error)("this kvtier Client is closed; attach a new one");
      err.attr("code") = static_cast<int>(KVTIER_ENOTCONN);
      PyErr_SetObject(g_error, err.ptr());
    }
  });

  py::class_<PyLookup>(m, "LookupResult", "What a lookup found.")
      .def_readonly("hit_blocks", &PyLookup::hit_blocks, "Longest present prefix worth loading, in blocks.")
      .def_readonly("recompute_blocks", &PyLookup::recompute_blocks,
                    "Blocks right after the prefix that are present but cheaper to recompute.")
      .def_readonly("lease", &PyLookup::lease, "The lease pinning the prefix (0 without one).")
      .def_readonly("tiers", &PyLookup::tiers, "Per key: 'gpu', 'host', 'nvme', 'remote' (a store other nodes share), 'fs' (a file system other nodes mount) or 'none'.")
      .def_readonly("lanes", &PyLookup::lanes,
                    "Per key: for a block in a lower tier ('nvme', 'remote', 'fs'), that tier's position in the daemon's "
                    "chain (0: the first below host memory, as kvtierctl tiers numbers them); None otherwise.")
      .def("__repr__", [](const PyLookup& r) {
        return "LookupResult(hit_blocks=" + std::to_string(r.hit_blocks) + ", lease=" + std::to_string(r.lease) + ")";
      });

  py::class_<PyStoreTicket, std::shared_ptr<PyStoreTicket>>(
      m, "StoreTicket", "Reserved slots of a two-step store (Client.store_begin).")
      .def_property_readonly("id", &PyStoreTicket::id)
      .def_property_readonly("needed", &PyStoreTicket::needed, "How many blocks must be written.")
      .def_property_readonly("needed_mask", &PyStoreTicket::Needed, "Per key: True when its block must be written.")
      .def_property_readonly("blocks", &PyStoreTicket::Blocks,
                             "Per key: a writable uint8 view of its slot (block_bytes), or None when cached already.")
      .def_property_readonly("done", &PyStoreTicket::done, "True once committed or aborted.")
      .def("commit", &PyStoreTicket::Commit, py::arg("durable") = false,
           "Makes the blocks visible; durable=True returns once they are on NVMe. The views must not be written "
           "afterwards.")
      .def("abort", &PyStoreTicket::Abort, "Gives the slots back without storing (a no-op once done).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyStoreTicket& t, const py::object& type, const py::object&, const py::object&) {
        if (t.done()) return;
        if (type.is_none()) {
          t.Commit(false);
        } else {
          t.Abort();
        }
      });

  py::class_<PyOp, std::shared_ptr<PyOp>>(m, "Operation", "An asynchronous operation in flight.")
      .def_property_readonly("id", &PyOp::id)
      .def("poll", &PyOp::Poll, "True once the operation completed (never blocks).")
      .def("wait", &PyOp::Wait, py::arg("timeout") = py::none(),
           "Blocks until it completes and returns its result (raises KvtierError on failure, and with code "
           "ETIMEDOUT after `timeout` seconds, leaving it in flight).");

  py::class_<PyDeviceLoad, std::shared_ptr<PyDeviceLoad>>(
      m, "DeviceLoad", "A daemon-driven load into a registered KV cache; its layers land in order.")
      .def_property_readonly("layers", &PyDeviceLoad::layers)
      .def("layers_ready", &PyDeviceLoad::LayersReady, "Layers already in the engine's pages (never blocks).")
      .def("wait_layers", &PyDeviceLoad::WaitLayers, py::arg("layers"), py::arg("timeout") = py::none(),
           "Blocks until the first `layers` layers are in the pages; returns the blocks they cover (the prefix "
           "that loaded: recompute the rest).")
      .def("stream_wait_layers", &PyDeviceLoad::StreamWaitLayers, py::arg("layers"), py::arg("stream") = 0,
           py::arg("timeout") = py::none(),
           "Makes CUDA `stream` (an int, e.g. torch.cuda.current_stream().cuda_stream) wait on the device for the "
           "first `layers` layers, without the host waiting for them; a host-memory cache waits here instead. "
           "Returns the blocks the load covers.")
      .def("finish", &PyDeviceLoad::Finish, py::arg("timeout") = py::none(),
           "Waits for the whole load and ends it; returns the blocks loaded.");

  // The vLLM / SGLang connectors move a block between the engine's cache
  // tensors and the arena as a list of byte runs (a layer's K and V of one
  // page lie apart); one call copies them all without the GIL, where a
  // Python loop of tensor copies would spend more time in the interpreter
  // than in memcpy. The addresses are the caller's own memory: this is
  // ctypes.memmove for many runs at once, no wider than that.
  m.def(
      "_copy_runs",
      [](py::array_t<uint64_t, py::array::c_style> dst, py::array_t<uint64_t, py::array::c_style> src,
         py::array_t<uint64_t, py::array::c_style> lengths) {
        if (dst.ndim() != 1 || src.ndim() != 1 || lengths.ndim() != 1 || dst.shape(0) != src.shape(0) ||
            dst.shape(0) != lengths.shape(0))
          throw py::value_error("_copy_runs: dst, src and lengths are 1-D and of one length");
        const uint64_t* d = dst.data();
        const uint64_t* s = src.data();
        const uint64_t* n = lengths.data();
        const py::ssize_t count = dst.shape(0);
        uint64_t total = 0;
        {
          py::gil_scoped_release unlocked;
          for (py::ssize_t i = 0; i < count; ++i) {
            std::memcpy(reinterpret_cast<void*>(d[i]), reinterpret_cast<const void*>(s[i]), n[i]);
            total += n[i];
          }
        }
        return total;
      },
      py::arg("dst"), py::arg("src"), py::arg("lengths"),
      "Copies lengths[i] bytes from address src[i] to address dst[i] (uint64 arrays); returns the bytes copied. "
      "Internal to the connectors.");

  m.def(
      "kv_block_bytes",
      [](uint32_t layers, uint32_t block_tokens, uint32_t kv_heads, uint32_t head_dim, const std::string& dtype,
         const std::string& codec) {
        KvCacheLayout l;
        l.layers = layers;
        l.kv_heads = kv_heads;
        l.head_dim = head_dim;
        l.dtype = dtype;
        l.codec = codec;
        return Check(KvBlockBytes(l, block_tokens));
      },
      py::arg("layers"), py::arg("block_tokens"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype") = "f16",
      py::arg("codec") = "none",
      "Bytes of one kvtier block of this KV shape: the block_bytes to attach with before register_kv_cache.");

  py::class_<PyClient>(m, "Client", "A session with kvtierd: lookups, loads and stores of KV-cache blocks.")
      .def_static(
          "attach",
          [](const std::string& model_id, uint32_t block_tokens, uint64_t block_bytes, const std::string& socket,
             const std::string& model_revision, const std::string& tokenizer_revision, const std::string& adapter_id,
             const std::string& attention_config_hash, const std::string& kv_dtype, const std::string& kv_layout,
             const std::string& cache_salt, uint32_t tp_rank, uint32_t tp_size, const std::string& client_name) {
            AttachOptions o;
            o.socket_path = socket;
            o.client_name = client_name.empty() ? "python" : client_name;
            o.ns = NamespaceDescriptor{model_id,  model_revision, tokenizer_revision, adapter_id,
                                       attention_config_hash, kv_dtype, kv_layout, cache_salt,
                                       block_tokens, block_bytes, tp_rank, tp_size};
            Result<std::unique_ptr<Client>> c = [&] {
              py::gil_scoped_release nogil;
              return Client::Attach(o);
            }();
            return PyClient(Check(std::move(c)));
          },
          py::arg("model_id"), py::arg("block_tokens"), py::arg("block_bytes"), py::kw_only(),
          py::arg("socket") = "", py::arg("model_revision") = "", py::arg("tokenizer_revision") = "",
          py::arg("adapter_id") = "", py::arg("attention_config_hash") = "", py::arg("kv_dtype"),
          py::arg("kv_layout"), py::arg("cache_salt") = "", py::arg("tp_rank") = 0,
          py::arg("tp_size") = 1, py::arg("client_name") = "",
          "Connects to kvtierd (socket: $KVTIER_SOCKET or the default run directory) and is admitted as one of "
          "its tenants. Everything that changes a block's bytes (model, revision, adapter, dtype, salt, ...) goes "
          "into the namespace: blocks are shared only within one. kv_dtype (\"bf16\", \"fp16\", \"fp8_e4m3\", ...) "
          "and kv_layout (\"layer_major\", ...) are required, as in C and C++: a guessed dtype would share blocks "
          "between engines whose bytes differ.")
      .def_property_readonly("session_id", [](PyClient& c) { return c.c().session_id(); })
      .def_property_readonly("block_bytes", [](PyClient& c) { return c.c().block_bytes(); })
      .def_property_readonly("block_tokens", [](PyClient& c) { return c.c().block_tokens(); })
      .def_property_readonly("tenant", [](PyClient& c) { return c.c().tenant(); })
      .def_property_readonly("hash", [](PyClient& c) { return std::string(HashAlgorithmName(c.c().hash())); })
      .def_property_readonly("namespace_id", [](PyClient& c) { return KeyBytes(c.c().namespace_id()); })
      .def_property_readonly("connected", [](PyClient& c) { return !c.closed() && c.c().connected(); })
      .def(
          "compute_keys",
          [](PyClient& c, py::array_t<uint32_t, py::array::c_style | py::array::forcecast> tokens,
             std::optional<py::bytes> parent, py::bytes extra) {
            const BlockKey p = parent ? KeyFrom(*parent) : BlockKey{};
            const std::string x = extra;
            std::vector<BlockKey> keys = c.c().ComputeKeys(
                std::span<const uint32_t>(tokens.data(), static_cast<size_t>(tokens.size())),
                parent ? &p : nullptr, std::span(reinterpret_cast<const std::byte*>(x.data()), x.size()));
            py::list out;
            for (const BlockKey& k : keys) out.append(KeyBytes(k));
            return out;
          },
          py::arg("tokens"), py::arg("parent") = py::none(), py::arg("extra") = py::bytes(),
          "Chained keys of every full block of `tokens` (the partial tail is not cached). `parent` continues an "
          "earlier chain; `extra` carries multimodal hashes or a per-request salt.")
      .def(
          "lookup",
          [](PyClient& c, const py::sequence& keys, bool lease, std::optional<bool> ask) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<LookupResult> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().Lookup(k, {.lease = lease, .ask = AskOf(ask)});
            }();
            const LookupResult v = Check(std::move(r));
            if (v.lease != 0) c.leases()->insert(v.lease);
            return ToPy(v);
          },
          py::arg("keys"), py::arg("lease") = false, py::arg("ask") = py::none(),
          "The longest present prefix of `keys`. With lease=True it is pinned until release(result.lease). "
          "ask: whether this lookup is its request's ask, the one kvtierd's policies and hit "
          "counters learn from (None: a leased lookup is, an unleased one is not). An engine that probes the "
          "whole chain first and leases only what it loads passes ask=True to the probe, ask=False to the lease.")
      .def(
          "load",
          [](py::object self, uint64_t lease, const py::sequence& keys) {
            PyClient& c = py::cast<PyClient&>(self);
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<std::vector<BlockView>> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().Load(lease, k);
            }();
            const std::vector<BlockView> views = Check(std::move(r));
            const py::object owner = KeepAlive(c.shared());
            py::list out;
            for (const BlockView& v : views) out.append(View(v, owner));
            return out;
          },
          py::arg("lease"), py::arg("keys"),
          "Read-only uint8 views of leased blocks, in place in the shared host arena (no copy). They are the "
          "blocks' bytes only while the lease holds: after release(lease), or once the client is closed, the "
          "daemon may give the slots to other blocks and a view then shows whatever lies there. Copy what you "
          "keep (numpy.array(view)) or use load_into. The list is the prefix that loaded: shorter than keys when "
          "a block failed to come back (recompute the rest).")
      .def(
          "load_into",
          [](PyClient& c, uint64_t lease, const py::sequence& keys, py::array_t<uint8_t, py::array::c_style> out) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            if (out.ndim() != 2 || static_cast<uint64_t>(out.shape(1)) != c.block_bytes() ||
                static_cast<size_t>(out.shape(0)) < k.size()) {
              throw py::value_error("out must be a writable uint8 array of shape (>= len(keys), block_bytes)");
            }
            uint8_t* dst = out.mutable_data();
            py::gil_scoped_release nogil;
            Result<std::vector<BlockView>> r = c.c().Load(lease, k);
            if (!r.ok()) {
              py::gil_scoped_acquire gil;
              Raise(r.status());
            }
            for (size_t i = 0; i < r->size(); ++i) std::memcpy(dst + i * c.block_bytes(), (*r)[i].data, (*r)[i].size);
            return static_cast<uint32_t>(r->size());
          },
          py::arg("lease"), py::arg("keys"), py::arg("out"),
          "Copies leased blocks into rows of `out`; returns how many loaded (a prefix).")
      .def(
          "store",
          [](PyClient& c, const py::sequence& keys, const py::object& blocks, bool durable) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            std::vector<py::buffer_info> keep;
            const std::vector<std::span<const std::byte>> src = BlocksFrom(blocks, k.size(), c.block_bytes(), &keep);
            py::gil_scoped_release nogil;
            Result<StoreTicket> t = c.c().StoreBegin(k);
            if (t.ok()) {
              for (size_t i = 0; i < t->slots.size(); ++i) {
                if (t->slots[i].needed) std::memcpy(t->slots[i].data, src[i].data(), src[i].size());
              }
              Status s = c.c().StoreCommit(*t, {.durable = durable});
              if (!s.ok()) t = s;
            }
            if (!t.ok()) {
              py::gil_scoped_acquire gil;
              Raise(t.status());
            }
            return t->needed;
          },
          py::arg("keys"), py::arg("blocks"), py::arg("durable") = false,
          "Stores one block per key: a (len(keys), block_bytes) uint8 array or a sequence of buffers. Returns how "
          "many were written (the rest were cached already). durable=True returns once they are on NVMe. Store "
          "after a lookup of the same chain (as an engine does: lookup, compute the rest, store it), so the "
          "daemon learns each block's depth in its chain and can price its recomputation; a store without one "
          "leaves the depth unknown (kvtierctl blocks ls: '-').")
      .def(
          "store_from_pointers",
          [](PyClient& c, const py::sequence& keys, const std::vector<uintptr_t>& ptrs) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            if (ptrs.size() != k.size()) throw py::value_error("one pointer per key");
            std::vector<std::span<const std::byte>> src;
            for (uintptr_t p : ptrs) src.emplace_back(reinterpret_cast<const std::byte*>(p), c.block_bytes());
            py::gil_scoped_release nogil;
            Result<uint32_t> n = c.c().Store(k, src);
            if (!n.ok()) {
              py::gil_scoped_acquire gil;
              Raise(n.status());
            }
            return *n;
          },
          py::arg("keys"), py::arg("pointers"),
          "Stores blocks from raw host addresses (block_bytes each), e.g. tensor.data_ptr() of pinned CPU tensors.")
      .def(
          "prefetch",
          [](PyClient& c, const py::sequence& keys) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().Prefetch(k);
            }();
            return Check(std::move(r));
          },
          py::arg("keys"), "Brings NVMe blocks of the present prefix into host memory ahead of need.")
      .def(
          "lookup_async",
          [](py::object self, const py::sequence& keys, bool lease, std::optional<bool> ask) {
            PyClient& c = py::cast<PyClient&>(self);
            const std::vector<BlockKey> k = KeysFrom(keys);
            auto op = std::make_shared<PyOp>(c.shared(), KeepAlive(c.shared()), PyOp::Kind::kLookup, 0, c.leases());
            // The results land in op's members when the completion is taken.
            op->set_id(Check(c.c().LookupAsync(k, {.lease = lease, .ask = AskOf(ask)}, &op->lookup)));
            return op;
          },
          py::arg("keys"), py::arg("lease") = false, py::arg("ask") = py::none(), "lookup(), returning an Operation.")
      .def(
          "load_async",
          [](py::object self, uint64_t lease, const py::sequence& keys) {
            PyClient& c = py::cast<PyClient&>(self);
            const std::vector<BlockKey> k = KeysFrom(keys);
            auto op = std::make_shared<PyOp>(c.shared(), KeepAlive(c.shared()), PyOp::Kind::kLoad, 0);
            // The results land in op's members when the completion is taken.
            op->set_id(Check(c.c().LoadAsync(lease, k, &op->views)));
            return op;
          },
          py::arg("lease"), py::arg("keys"), "load(), returning an Operation whose wait() gives the views.")
      .def(
          "prefetch_async",
          [](py::object self, const py::sequence& keys) {
            PyClient& c = py::cast<PyClient&>(self);
            const std::vector<BlockKey> k = KeysFrom(keys);
            auto op = std::make_shared<PyOp>(c.shared(), KeepAlive(c.shared()), PyOp::Kind::kPrefetch, 0);
            // The results land in op's members when the completion is taken.
            op->set_id(Check(c.c().PrefetchAsync(k, &op->count)));
            return op;
          },
          py::arg("keys"), "prefetch(), returning an Operation whose wait() gives the count.")
      .def(
          "release",
          [](PyClient& c, uint64_t lease) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.c().Release(lease);
            }
            c.leases()->erase(lease);
            Check(s);
          },
          py::arg("lease"),
          "Unpins a lease's blocks. Views load() gave of them stay mapped but no longer show those blocks: the "
          "slots may be reused at once.")
      .def(
          "invalidate",
          [](PyClient& c, const py::sequence& keys) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().Invalidate(k);
            }();
            return Check(std::move(r));
          },
          py::arg("keys"), "Removes these blocks of this namespace; returns how many.")
      .def(
          "invalidate_namespace",
          [](PyClient& c) {
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().InvalidateNamespace();
            }();
            return Check(std::move(r));
          },
          "Removes every block of this client's namespace (all tiers); returns how many.")
      .def(
          "store_begin",
          [](PyClient& c, const py::sequence& keys) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<StoreTicket> t = [&] {
              py::gil_scoped_release nogil;
              return c.c().StoreBegin(k);
            }();
            return std::make_shared<PyStoreTicket>(c.shared(), Check(std::move(t)));
          },
          py::arg("keys"),
          "Reserves host slots for keys (all or nothing) and returns a StoreTicket whose blocks are writable "
          "views of them: fill the needed ones in place (no staging copy), then commit(). Blocks are invisible "
          "to lookups until then.")
      .def("close", &PyClient::Close,
           "Closes the client (also on leaving a `with` block): releases the leases it still holds, and ends the "
           "session once no view, StoreTicket or Operation of it is left (they keep its shared memory mapped; "
           "the daemon then aborts its open stores). Later calls raise KvtierError (code -107).")
      .def_property_readonly("closed", &PyClient::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, const py::object&, const py::object&, const py::object&) { c.Close(); })
      .def(
          "report_prefill",
          [](PyClient& c, uint64_t cached_tokens, uint64_t computed_tokens, double seconds) {
            Check(c.c().ReportPrefill(cached_tokens, computed_tokens,
                                      std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9))));
          },
          py::arg("cached_tokens"), py::arg("computed_tokens"), py::arg("seconds"),
          "Tells the daemon what a prefill cost, so it can price recomputation.")
      .def(
          "register_kv_cache",
          [](PyClient& c, uint32_t layers, uint32_t page_tokens, uint32_t kv_heads, uint32_t head_dim,
             uint64_t num_pages, const std::vector<uintptr_t>& k_layers, const std::vector<uintptr_t>& v_layers,
             const std::vector<std::tuple<uintptr_t, uint64_t, int>>& regions, const std::string& dtype,
             const std::string& codec, uint64_t page_stride) {
            const KvCacheLayout l = LayoutFrom(layers, page_tokens, kv_heads, head_dim, num_pages, k_layers, v_layers,
                                               regions, dtype, codec, page_stride);
            Result<uint64_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().RegisterKvCache(l);
            }();
            return Check(std::move(r));
          },
          py::arg("layers"), py::arg("page_tokens"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("num_pages"),
          py::arg("k_layers"), py::arg("v_layers"), py::arg("regions"), py::kw_only(), py::arg("dtype") = "f16",
          py::arg("codec") = "none", py::arg("page_stride") = 0,
          "Registers the engine's paged KV cache: per layer the address of page 0 of K and of V "
          "([num_pages, page_tokens, kv_heads, head_dim] each), and the memory they lie in as (base, bytes, memfd) "
          "tuples: memfd -1 for CUDA memory (base as cudaMalloc returned it), else a memfd sealed against "
          "shrinking. codec 'int8' / 'fp8' quantizes blocks on offload. Returns the registration id.")
      .def(
          "unregister_kv_cache",
          [](PyClient& c, uint64_t reg) { Check(c.c().UnregisterKvCache(reg)); }, py::arg("registration"),
          "Forgets a registration.")
      .def(
          "store_from_cache",
          [](PyClient& c, uint64_t reg, const py::sequence& keys, const std::vector<uint32_t>& pages) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().StoreFromCache(reg, k, pages);
            }();
            return Check(std::move(r));
          },
          py::arg("registration"), py::arg("keys"), py::arg("pages"),
          "The daemon gathers each key's pages (block_tokens / page_tokens per key, key after key) from the "
          "registered cache into kvtier. Returns the blocks written.")
      .def(
          "load_into_cache_async",
          [](PyClient& c, uint64_t reg, uint64_t lease, const py::sequence& keys, const std::vector<uint32_t>& pages) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<DeviceLoad> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().LoadIntoCacheAsync(reg, lease, k, pages);
            }();
            return std::make_shared<PyDeviceLoad>(c.shared(), Check(std::move(r)));
          },
          py::arg("registration"), py::arg("lease"), py::arg("keys"), py::arg("pages"),
          "The daemon scatters leased blocks into the registered cache's pages, layer by layer. Returns a "
          "DeviceLoad: wait for layer l before running layer l (wait_layers), then finish().")
      .def(
          "load_into_cache",
          [](PyClient& c, uint64_t reg, uint64_t lease, const py::sequence& keys, const std::vector<uint32_t>& pages) {
            const std::vector<BlockKey> k = KeysFrom(keys);
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.c().LoadIntoCache(reg, lease, k, pages);
            }();
            return Check(std::move(r));
          },
          py::arg("registration"), py::arg("lease"), py::arg("keys"), py::arg("pages"),
          "load_into_cache_async + finish: returns the blocks loaded (a prefix; recompute the rest).")
      .def(
          "ping",
          [](PyClient& c) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.c().Ping();
            }
            Check(s);
          },
          "An empty round trip.");
}
