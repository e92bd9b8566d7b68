// SPDX-License-Identifier: Apache-2.0
// The attach handshake decoders: arbitrary bytes from a socket peer.
#include <cstring>

#include "ipc/attach.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/support/test_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  auto req = kvtier::ipc::DecodeAttachRequest(in);
  if (req.ok()) {
    // Whatever decodes re-encodes to the same bytes.
    std::vector<std::byte> again = kvtier::ipc::EncodeAttachRequest(*req);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
    (void)kvtier::ValidateDescriptor(req->ns);
  }
  // The reply, as a client reads the daemon's (or an impostor's): what
  // decodes re-encodes to the same bytes, strings within their bounds.
  auto rep = kvtier::ipc::DecodeAttachReply(in);
  if (rep.ok()) {
    std::vector<std::byte> again = kvtier::ipc::EncodeAttachReply(*rep);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
    if (rep->message.size() > 1024 || rep->tenant.size() > 256) __builtin_trap();
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  kvtier::ipc::AttachRequest r;
  r.ns = kvtier::testing::TestNamespace();
  r.client_name = "fuzz";
  auto a = kvtier::ipc::EncodeAttachRequest(r);
  kvtier::ipc::AttachReply rep;
  rep.tenant = "t";
  rep.message = "m";
  auto b = kvtier::ipc::EncodeAttachReply(rep);
  kvtier::ipc::AttachReply refused;
  refused.status = -1;
  refused.message = std::string(1024, 'x');
  refused.hash = kvtier::HashAlgorithm::kXxh3_128;
  refused.tenant = std::string(256, 't');
  auto c = kvtier::ipc::EncodeAttachReply(refused);
  auto s = [](const std::vector<std::byte>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size()); };
  return {s(a), s(b), s(c)};
}

long FuzzDefaultIterations() { return 50000; }
