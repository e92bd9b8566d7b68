// The attach handshake decoders: arbitrary bytes from a socket peer.
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
  (void)kvtier::ipc::DecodeAttachReply(in);
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
  return {std::string(reinterpret_cast<const char*>(a.data()), a.size()),
          std::string(reinterpret_cast<const char*>(b.data()), b.size())};
}

long FuzzDefaultIterations() { return 50000; }
