// SPDX-License-Identifier: Apache-2.0
#include "ipc/session_segment.h"

#include <algorithm>
#include <bit>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "os/futex.h"

namespace kvtier::ipc {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct RegionLayout {
  uint64_t sq_offset, cq_offset, scratch_offset, total;
};

RegionLayout ComputeLayout(uint32_t sq, uint32_t cq, uint64_t scratch) {
  RegionLayout l;
  l.sq_offset = kSegmentHeaderBytes;
  l.cq_offset = RoundUp(l.sq_offset + uint64_t{sq} * sizeof(RequestRecord), kPage);
  l.scratch_offset = RoundUp(l.cq_offset + uint64_t{cq} * sizeof(CompletionRecord), kPage);
  l.total = RoundUp(l.scratch_offset + scratch, kPage);
  return l;
}

SegmentOptions Normalize(SegmentOptions o) {
  o.sq_entries = std::bit_ceil(std::max<uint32_t>(o.sq_entries, 2));
  o.cq_entries = std::bit_ceil(std::max<uint32_t>(o.cq_entries, 2));
  o.scratch_bytes = RoundUp(std::max<uint64_t>(o.scratch_bytes, kPage), kPage);
  return o;
}

}  // namespace

void RingDaemonDoorbell(SegmentHeader* h) {
  if (h->daemon_sleeping.load(std::memory_order_seq_cst) != 0 &&
      h->daemon_sleeping.exchange(0, std::memory_order_seq_cst) != 0) {
    os::FutexWakeAll(&h->daemon_sleeping);
  }
}

uint64_t SegmentBytes(const SegmentOptions& opts) {
  SegmentOptions o = Normalize(opts);
  return ComputeLayout(o.sq_entries, o.cq_entries, o.scratch_bytes).total;
}

absl::StatusOr<SessionSegment> SessionSegment::Create(uint64_t session_id,
                                                      const SegmentOptions& opts) {
  const SegmentOptions o = Normalize(opts);
  const RegionLayout l = ComputeLayout(o.sq_entries, o.cq_entries, o.scratch_bytes);
  SessionSegment seg;
  ASSIGN_OR_RETURN(seg.fd_, os::CreateSealedMemfd(absl::StrCat("kvtier-session-", session_id), l.total));
  ASSIGN_OR_RETURN(seg.region_, os::MappedRegion::Map(seg.fd_.get(), l.total));
  auto* h = new (seg.region_.data()) SegmentHeader{};
  h->abi_version = kAbiVersion;
  h->header_bytes = kSegmentHeaderBytes;
  h->segment_bytes = l.total;
  h->session_id = session_id;
  h->sq_offset = l.sq_offset;
  h->sq_entries = o.sq_entries;
  h->sq_record_bytes = sizeof(RequestRecord);
  h->cq_offset = l.cq_offset;
  h->cq_entries = o.cq_entries;
  h->cq_record_bytes = sizeof(CompletionRecord);
  h->scratch_offset = l.scratch_offset;
  h->scratch_bytes = l.total - l.scratch_offset;
  h->max_keys_per_op = o.max_keys_per_op;
  // The magic goes last. The client maps the segment only after receiving its
  // fd through the socket, which orders these writes before its reads.
  h->magic = kSegmentMagic;
  seg.TakeLayout();
  return seg;
}

absl::StatusOr<SessionSegment> SessionSegment::Open(UniqueFd fd) {
  ASSIGN_OR_RETURN(uint64_t size, os::FdSize(fd.get()));
  if (size < kSegmentHeaderBytes) {
    return CodedStatus(KVTIER_EPROTO, absl::StrCat("session segment is ", size,
                                                   " bytes, smaller than its header"));
  }
  SessionSegment seg;
  ASSIGN_OR_RETURN(seg.region_, os::MappedRegion::Map(fd.get(), size));
  seg.fd_ = std::move(fd);
  const SegmentHeader* h = seg.header();
  if (h->magic != kSegmentMagic) {
    return CodedStatus(KVTIER_EPROTO, "session segment has no kvtier magic: not a kvtierd segment");
  }
  if (h->abi_version != kAbiVersion) {
    return CodedStatus(KVTIER_EPROTONOSUPPORT,
                       absl::StrCat("session segment speaks ABI v", h->abi_version,
                                    ", this libkvtier speaks v", kAbiVersion,
                                    ": install matching libkvtier and kvtierd"));
  }
  const RegionLayout l = ComputeLayout(h->sq_entries, h->cq_entries, h->scratch_bytes);
  const bool pow2 = std::has_single_bit(h->sq_entries) && std::has_single_bit(h->cq_entries);
  if (!pow2 || h->segment_bytes != size || l.sq_offset != h->sq_offset ||
      l.cq_offset != h->cq_offset || l.scratch_offset != h->scratch_offset ||
      l.total != size || h->sq_record_bytes != sizeof(RequestRecord) ||
      h->cq_record_bytes != sizeof(CompletionRecord)) {
    return CodedStatus(KVTIER_EPROTO, "session segment layout is inconsistent");
  }
  seg.TakeLayout();
  return seg;
}

void SessionSegment::TakeLayout() {
  const SegmentHeader* h = header();
  layout_ = Layout{h->sq_offset,  h->cq_offset,  h->scratch_offset,   h->scratch_bytes,
                   h->sq_entries, h->cq_entries, h->max_keys_per_op};
}

RequestRecord* SessionSegment::sq_slots() const {
  return reinterpret_cast<RequestRecord*>(region_.data() + layout_.sq_offset);
}
CompletionRecord* SessionSegment::cq_slots() const {
  return reinterpret_cast<CompletionRecord*>(region_.data() + layout_.cq_offset);
}
std::span<std::byte> SessionSegment::scratch() const {
  return {region_.data() + layout_.scratch_offset, layout_.scratch_bytes};
}

RingProducer<RequestRecord> SessionSegment::ClientSq() const {
  SegmentHeader* h = header();
  return {sq_slots(), layout_.sq_entries, &h->sq_head, &h->sq_tail};
}
RingConsumer<CompletionRecord> SessionSegment::ClientCq() const {
  SegmentHeader* h = header();
  return {cq_slots(), layout_.cq_entries, &h->cq_head, &h->cq_tail};
}
RingConsumer<RequestRecord> SessionSegment::DaemonSq() const {
  SegmentHeader* h = header();
  return {sq_slots(), layout_.sq_entries, &h->sq_head, &h->sq_tail};
}
RingProducer<CompletionRecord> SessionSegment::DaemonCq() const {
  SegmentHeader* h = header();
  return {cq_slots(), layout_.cq_entries, &h->cq_head, &h->cq_tail};
}

}  // namespace kvtier::ipc
