// SPDX-License-Identifier: Apache-2.0
// libkvtier's C++ API: operations on top of the session's rings.
#include "kvtier/client.h"

#include <cstring>
#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/internal/client_impl.h"
#include "client/internal/ring_session.h"
#include "core/checked.h"
#include "core/block_key.h"
#include "core/namespace.h"
#include "core/paths.h"
#include "core/status.h"

namespace kvtier {

using ipc::Opcode;

namespace {

std::string ProcessName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace


using client_internal::ClientImpl;

Client::Client(std::unique_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() {
  // Outstanding operations' scratch goes with the segment; the daemon releases
  // the session's pins when the socket closes.
}

Result<std::unique_ptr<Client>> Client::Attach(const AttachOptions& options) {
  if (absl::Status s = ValidateDescriptor(options.ns); !s.ok()) return ToPublic(s);
  ipc::AttachRequest req;
  req.ns = options.ns;
  // A name the caller chose goes as it is (kvtierd refuses one that is not
  // printable UTF-8, and says so); the process name is made printable.
  req.client_name = std::string(Utf8Prefix(
      options.client_name.empty() ? PrintableOrReplaced(ProcessName()) : options.client_name, ipc::kMaxClientName));
  const std::string path = options.socket_path.empty() ? DefaultDataSocketPath() : options.socket_path;
  absl::StatusOr<std::unique_ptr<client_internal::RingSession>> ring =
      client_internal::RingSession::Open(path, req, options.spin_us);
  if (!ring.ok()) return ToPublic(ring.status());
  auto impl = std::make_unique<ClientImpl>();
  impl->ring = std::move(*ring);
  impl->info = impl->ring->reply();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

uint64_t Client::session_id() const { return impl_->info.session_id; }
const BlockKey& Client::namespace_id() const { return impl_->info.namespace_id; }
uint64_t Client::block_bytes() const { return impl_->info.block_bytes; }
uint32_t Client::block_tokens() const { return impl_->info.block_tokens; }
HashAlgorithm Client::hash() const { return impl_->info.hash; }
const std::string& Client::tenant() const { return impl_->info.tenant; }
bool Client::connected() const { return impl_->ring->health().ok(); }
uint32_t Client::InFlight() const { return impl_->ring->in_flight(); }

std::vector<BlockKey> Client::ComputeKeys(std::span<const uint32_t> tokens, const BlockKey* parent,
                                          std::span<const std::byte> extra) const {
  return ChainBlockKeys(impl_->info.hash, tokens, impl_->info.block_tokens, parent, extra);
}

Result<OpId> Client::LookupAsync(std::span<const BlockKey> keys, LookupOptions options, LookupResult* out) {
  ClientImpl::OpState st;
  st.lookup = out;
  uint16_t flags = options.lease ? ipc::kFlagLease : 0;
  if (options.ask == LookupOptions::Ask::kYes) flags |= ipc::kFlagAsk;
  if (options.ask == LookupOptions::Ask::kNo) {
    if (!options.lease) {
      return Status(ErrorCode::kInvalidArgument,
                    "a lookup that is not its request's ask needs a lease (without one it is not an ask anyway)");
    }
    flags |= ipc::kFlagNotAsk;
  }
  return impl_->Submit(Opcode::kLookup, flags, 0, keys, st);
}

Result<OpId> Client::LoadAsync(uint64_t lease, std::span<const BlockKey> keys, std::vector<BlockView>* out) {
  ClientImpl::OpState st;
  st.views = out;
  return impl_->Submit(Opcode::kLoad, 0, lease, keys, st);
}

Result<OpId> Client::StoreBeginAsync(std::span<const BlockKey> keys, StoreTicket* out) {
  ClientImpl::OpState st;
  st.ticket = out;
  return impl_->Submit(Opcode::kStoreBegin, 0, 0, keys, st);
}

Result<OpId> Client::StoreCommitAsync(const StoreTicket& ticket, CommitOptions options) {
  return impl_->Submit(Opcode::kStoreCommit, options.durable ? ipc::kFlagDurable : 0, ticket.id, {}, {});
}

Result<OpId> Client::PrefetchAsync(std::span<const BlockKey> keys, uint32_t* promoted) {
  ClientImpl::OpState st;
  st.value = promoted;
  return impl_->Submit(Opcode::kPrefetch, 0, 0, keys, st);
}

Result<uint32_t> Client::Prefetch(std::span<const BlockKey> keys) {
  uint32_t n = 0;
  Result<OpId> op = PrefetchAsync(keys, &n);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return n;
}

Result<OpId> Client::ReleaseAsync(uint64_t lease) { return impl_->Submit(Opcode::kRelease, 0, lease, {}, {}); }

std::optional<Status> Client::Poll(OpId op) {
  if (auto done = impl_->finished_loads.find(op); done != impl_->finished_loads.end()) {
    // A device load whose completion a layer wait collected.
    const Status s = done->second.status;
    impl_->finished_loads.erase(done);
    return s;
  }
  if (!impl_->ops.contains(op)) return Status(ErrorCode::kNotFound, absl::StrCat("operation ", op, " is not outstanding"));
  std::optional<ipc::CompletionRecord> c = impl_->ring->TryTake(op);
  if (!c) {
    if (Status s = ToPublic(impl_->ring->health()); !s.ok()) return impl_->WaitOp(op, std::chrono::nanoseconds(0));
    return std::nullopt;
  }
  return impl_->Finish(op, *c);
}

Status Client::Wait(OpId op, std::chrono::nanoseconds timeout) {
  if (auto done = impl_->finished_loads.find(op); done != impl_->finished_loads.end()) {
    const Status s = done->second.status;
    impl_->finished_loads.erase(done);
    return s;
  }
  return impl_->WaitOp(op, timeout);
}

Result<LookupResult> Client::Lookup(std::span<const BlockKey> keys, LookupOptions options) {
  LookupResult out;
  Result<OpId> op = LookupAsync(keys, options, &out);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return out;
}

Result<std::vector<BlockView>> Client::Load(uint64_t lease, std::span<const BlockKey> keys) {
  std::vector<BlockView> out;
  Result<OpId> op = LoadAsync(lease, keys, &out);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return out;
}

Result<StoreTicket> Client::StoreBegin(std::span<const BlockKey> keys) {
  StoreTicket out;
  Result<OpId> op = StoreBeginAsync(keys, &out);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return out;
}

Status Client::StoreCommit(const StoreTicket& ticket, CommitOptions options) {
  if (ticket.id == 0) return Status();
  Result<OpId> op = StoreCommitAsync(ticket, options);
  return op.ok() ? Wait(*op) : op.status();
}

Status Client::StoreAbort(const StoreTicket& ticket) {
  if (ticket.id == 0) return Status();
  Result<OpId> op = impl_->Submit(Opcode::kStoreAbort, 0, ticket.id, {}, {});
  return op.ok() ? Wait(*op) : op.status();
}

Result<uint32_t> Client::Store(std::span<const BlockKey> keys, std::span<const std::span<const std::byte>> src) {
  if (src.size() != keys.size()) {
    return Status(ErrorCode::kInvalidArgument,
                  absl::StrCat(keys.size(), " keys but ", src.size(), " source buffers"));
  }
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i].size() != block_bytes()) {
      return Status(ErrorCode::kInvalidArgument,
                    absl::StrCat("source buffer ", i, " is ", src[i].size(), " bytes; blocks of this namespace are ",
                                 block_bytes()));
    }
  }
  Result<StoreTicket> ticket = StoreBegin(keys);
  if (!ticket.ok()) return ticket.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    const StoreSlot& slot = ticket->slots[i];
    if (slot.needed) std::memcpy(slot.data, src[i].data(), slot.size);
  }
  if (Status s = StoreCommit(*ticket); !s.ok()) return s;
  return ticket->needed;
}

Status Client::Release(uint64_t lease) {
  if (lease == 0) return Status();
  Result<OpId> op = ReleaseAsync(lease);
  return op.ok() ? Wait(*op) : op.status();
}

Result<uint32_t> Client::Invalidate(std::span<const BlockKey> keys) {
  uint32_t n = 0;
  ClientImpl::OpState st;
  st.value = &n;
  Result<OpId> op = impl_->Submit(Opcode::kInvalidate, 0, 0, keys, st);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return n;
}

Result<uint32_t> Client::InvalidateNamespace() {
  uint32_t n = 0;
  ClientImpl::OpState st;
  st.value = &n;
  Result<OpId> op = impl_->Submit(Opcode::kInvalidateNamespace, 0, 0, {}, st);
  if (!op.ok()) return op.status();
  if (Status s = Wait(*op); !s.ok()) return s;
  return n;
}

Status Client::Ping() {
  Result<OpId> op = impl_->Submit(Opcode::kPing, 0, 0, {}, {});
  return op.ok() ? Wait(*op) : op.status();
}

Status Client::ReportPrefill(uint64_t cached_tokens, uint64_t computed_tokens, std::chrono::nanoseconds elapsed) {
  if (elapsed.count() <= 0) return Status(ErrorCode::kInvalidArgument, "report_prefill: elapsed time must be positive");
  Result<OpId> op = impl_->Submit(Opcode::kReportPrefill, 0, static_cast<uint64_t>(elapsed.count()), {}, {},
                                  cached_tokens, computed_tokens);
  return op.ok() ? Wait(*op) : op.status();
}

}  // namespace kvtier
