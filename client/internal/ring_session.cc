// SPDX-License-Identifier: Apache-2.0
#include "client/internal/ring_session.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/interprocess/managed_external_buffer.hpp>
#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"
#include "os/futex.h"
#include "ipc/kv_registration.h"
#include "ipc/unix_socket.h"

namespace kvtier::client_internal {

namespace bip = boost::interprocess;

// Variable-size allocations inside the session's scratch region, made with
// Boost.Interprocess's best-fit allocator. One issuing thread per session, so
// no mutex. The allocator's metadata lives in the shared region too: the
// daemon never runs it, it only reads and writes the byte ranges a request
// names (after checking them), so a client that corrupts it hurts only itself.
class ScratchAllocator {
 public:
  ScratchAllocator(std::byte* base, size_t bytes)
      : base_(base), buffer_(bip::create_only, base, bytes) {}
  std::byte* Allocate(size_t bytes) {
    return static_cast<std::byte*>(buffer_.allocate(bytes, std::nothrow));
  }
  void Free(std::byte* p) { buffer_.deallocate(p); }
  uint64_t Offset(const std::byte* p) const { return static_cast<uint64_t>(p - base_); }

 private:
  using Buffer = bip::basic_managed_external_buffer<
      char, bip::rbtree_best_fit<bip::null_mutex_family>, bip::iset_index>;
  std::byte* base_;
  Buffer buffer_;
};

RingSession::~RingSession() {
  if (segment_.header() != nullptr) segment_.header()->detached.store(1, std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<RingSession>> RingSession::Open(const std::string& socket_path,
                                                               const ipc::AttachRequest& request,
                                                               uint32_t spin_us) {
  std::unique_ptr<RingSession> s(new RingSession());
  s->spin_us_ = spin_us;
  ASSIGN_OR_RETURN(s->socket_, ipc::ConnectUnix(socket_path, SOCK_SEQPACKET));
  // The handshake is bounded: a daemon that does not answer is an error.
  RETURN_IF_ERROR(ipc::SetSocketTimeouts(s->socket_.get(), std::chrono::seconds(5)));
  RETURN_IF_ERROR(ipc::SendMessage(s->socket_.get(), ipc::EncodeAttachRequest(request)));
  absl::StatusOr<ipc::ReceivedMessage> msg =
      ipc::ReceiveMessage(s->socket_.get(), ipc::kMaxAttachMessage, 2);
  if (!msg.ok()) {
    return CodedStatus(KVTIER_ENOTCONN, absl::StrCat("kvtierd at ", socket_path,
                                                     " did not answer the attach: ", msg.status().message()));
  }
  if (msg->eof) {
    return CodedStatus(KVTIER_ENOTCONN,
                       absl::StrCat("kvtierd at ", socket_path, " closed the connection during attach"));
  }
  ASSIGN_OR_RETURN(s->reply_, ipc::DecodeAttachReply(msg->data));
  if (s->reply_.status != 0) {
    return CodedStatus(s->reply_.status, absl::StrCat("kvtierd refused the attach: ", s->reply_.message));
  }
  if (msg->fds.size() != 2) {
    return CodedStatus(KVTIER_EPROTO, "kvtierd's attach reply did not carry the segment and arena");
  }
  ASSIGN_OR_RETURN(s->segment_, ipc::SessionSegment::Open(std::move(msg->fds[0])));
  ASSIGN_OR_RETURN(uint64_t arena_size, os::FdSize(msg->fds[1].get()));
  if (arena_size < s->reply_.arena_bytes || s->reply_.arena_bytes == 0) {
    return CodedStatus(KVTIER_EPROTO, "host arena is smaller than kvtierd announced");
  }
  ASSIGN_OR_RETURN(s->arena_, os::MappedRegion::Map(msg->fds[1].get(), s->reply_.arena_bytes));
  RETURN_IF_ERROR(ipc::SetSocketTimeouts(s->socket_.get(), std::chrono::milliseconds(0)));

  s->sq_ = s->segment_.ClientSq();
  s->cq_ = s->segment_.ClientCq();
  const uint32_t entries = std::min(s->sq_.entries(), s->cq_.entries());
  s->slots_.resize(entries);
  s->slots_mask_ = entries - 1;
  std::span<std::byte> scratch = s->segment_.scratch();
  try {
    s->scratch_ = std::make_unique<ScratchAllocator>(scratch.data(), scratch.size());
  } catch (const std::exception& e) {
    return CodedStatus(KVTIER_ENOMEM, absl::StrCat("cannot set up the scratch allocator: ", e.what()));
  }
  return s;
}

std::byte* RingSession::AllocScratch(size_t bytes) { return scratch_->Allocate(bytes); }
void RingSession::FreeScratch(std::byte* p) {
  if (p != nullptr) scratch_->Free(p);
}
uint64_t RingSession::ScratchOffset(const std::byte* p) const { return scratch_->Offset(p); }

absl::StatusOr<uint64_t> RingSession::Submit(ipc::RequestRecord record) {
  if (!broken_.ok()) return broken_;
  const uint64_t op = next_op_;
  Slot& slot = slots_[op & slots_mask_];
  if (slot.op != 0) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat(in_flight_, " operations are outstanding (the ring holds ",
                                                  slots_.size(), "); wait for or poll some first"));
  }
  record.op_id = op;
  if (!sq_.TryPush(record)) {
    return CodedStatus(KVTIER_EBUSY, "request ring is full; wait for or poll outstanding operations");
  }
  ++next_op_;
  slot = Slot{op, false, {}};
  ++in_flight_;
  ipc::SegmentHeader* h = segment_.header();
  ipc::RingDaemonDoorbell(h);
  return op;
}

void RingSession::Drain() {
  ipc::CompletionRecord c;
  ipc::PopResult r;
  while ((r = cq_.TryPop(&c)) == ipc::PopResult::kOk) {
    Slot& slot = slots_[c.op_id & slots_mask_];
    if (slot.op == c.op_id && !slot.done) {
      slot.done = true;
      slot.completion = c;
    }
  }
  if (r == ipc::PopResult::kCorrupt && broken_.ok()) {
    broken_ = CodedStatus(KVTIER_EPROTO, "completion ring is corrupt; re-attach");
  }
}

std::optional<ipc::CompletionRecord> RingSession::TryTake(uint64_t op) {
  Drain();
  Slot& slot = slots_[op & slots_mask_];
  if (slot.op != op || !slot.done) return std::nullopt;
  slot.op = 0;
  --in_flight_;
  return slot.completion;
}

bool RingSession::CheckAlive() {
  if (!broken_.ok()) return false;
  const uint32_t closed = segment_.header()->closed.load(std::memory_order_acquire);
  if (closed != 0) {
    broken_ = CodedStatus(
        KVTIER_ENOTCONN,
        closed == static_cast<uint32_t>(ipc::CloseReason::kProtocolError)
            ? "kvtierd closed this session after a malformed request; attach again"
            : "kvtierd closed this session (it is stopping, or an administrator closed it); attach again");
    return false;
  }
  pollfd p{socket_.get(), POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN))) {
    broken_ = CodedStatus(KVTIER_ENOTCONN,
                          "kvtierd went away (its socket closed); attach again when it is back");
    return false;
  }
  return true;
}

absl::StatusOr<ipc::ReceivedMessage> RingSession::Exchange(std::span<const std::byte> message,
                                                           std::span<const int> fds,
                                                           std::chrono::milliseconds timeout) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(ipc::SendMessage(socket_.get(), message, fds));
  pollfd p{socket_.get(), POLLIN | POLLRDHUP, 0};
  int n;
  do {
    n = poll(&p, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) return CodedStatus(KVTIER_ETIMEDOUT, "kvtierd did not answer on the session socket in time");
  ASSIGN_OR_RETURN(ipc::ReceivedMessage m,
                   ipc::ReceiveMessage(socket_.get(), ipc::kMaxKvMessage, ipc::kMaxKvRegions));
  if (m.eof) {
    broken_ = CodedStatus(KVTIER_ENOTCONN, "kvtierd went away (its socket closed); attach again when it is back");
    return broken_;
  }
  if (m.truncated) return CodedStatus(KVTIER_EPROTO, "kvtierd's answer on the session socket was truncated");
  return m;
}

absl::StatusOr<ipc::CompletionRecord> RingSession::WaitTake(uint64_t op, std::chrono::nanoseconds timeout) {
  Slot& slot = slots_[op & slots_mask_];
  if (slot.op != op) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("operation ", op, " is not outstanding"));
  }
  const uint64_t start = MonotonicNanos();
  const uint64_t limit = timeout.count() >= static_cast<int64_t>(UINT64_MAX / 2) || timeout.count() < 0
                             ? UINT64_MAX / 2
                             : static_cast<uint64_t>(timeout.count());
  const uint64_t spin_ns = uint64_t{spin_us_} * 1000;
  ipc::SegmentHeader* h = segment_.header();
  for (;;) {
    if (auto c = TryTake(op)) return *c;
    const uint64_t waited = MonotonicNanos() - start;
    if (!broken_.ok()) return broken_;
    if (waited >= limit) {
      return CodedStatus(KVTIER_ETIMEDOUT, absl::StrCat("operation ", op, " still in flight after ",
                                                        waited / 1000000, " ms"));
    }
    if (waited < spin_ns) {
      os::PollPause(waited);
      continue;
    }
    // Sleep in slices of at most 50 ms, so a dead daemon is noticed fast.
    const uint64_t slice = std::min<uint64_t>(limit - waited, 50'000'000);
    const uint32_t seen = h->cq_tail.load(std::memory_order_acquire);
    h->client_sleeping.store(1, std::memory_order_seq_cst);
    if (!cq_.HasPending()) os::FutexWait(&h->cq_tail, seen, std::chrono::nanoseconds(slice));
    h->client_sleeping.store(0, std::memory_order_relaxed);
    if (!cq_.HasPending() && !CheckAlive()) return broken_;
  }
}

}  // namespace kvtier::client_internal
