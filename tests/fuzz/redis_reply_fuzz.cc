// SPDX-License-Identifier: Apache-2.0
// What a Redis node sends is a peer's bytes. The input is raw RESP, parsed
// by hiredis's reader as the cluster client's connections do, then:
//  - ParseClusterSlots accepts only ranges inside the 16384 slots owned by
//    a host:port it could connect to, and says why otherwise;
//  - ParseRedirect accepts only MOVED/ASK with a slot below 16384 and an
//    address; every accepted redirect's slot and port are in range;
//  - an announced array longer than kMaxReplyElements is a protocol error,
//    not an allocation of whatever size a peer names;
//  - CheckRemoteValue accepts the bytes as a block only when they are the
//    header and payload of exactly that block, sealed with the key (the
//    seeds hold one that is).
#include <hiredis/hiredis.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_target.h"
#include "tiers/redis_cluster.h"
#include "tiers/remote_tier.h"

#include <xxhash.h>

namespace {

kvtier::BlockMeta TheBlock() {
  kvtier::BlockMeta m;
  m.ns.bytes.fill(7);
  m.key.bytes.fill(9);
  m.payload_bytes = 16;
  m.tenant_hash = 0x1234;
  return m;
}

const kvtier::ValueSealer& Sealer() {
  static const std::unique_ptr<kvtier::ValueSealer> sealer = [] {
    auto k = kvtier::ParseSealKey("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    return *kvtier::ValueSealer::Create({*k}, false);
  }();
  return *sealer;
}

std::string ValueOf(const kvtier::BlockMeta& m, const std::string& payload) {
  return *kvtier::MakeRemoteValue(m, {reinterpret_cast<const std::byte*>(payload.data()), payload.size()}, Sealer());
}

void Check(bool ok, const char* what) {
  if (!ok) {
    __builtin_trap();
  }
  (void)what;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  // As a stored value.
  const kvtier::BlockMeta m = TheBlock();
  const absl::Status v = kvtier::CheckRemoteValue(in, m, &Sealer());
  if (v.ok()) {
    Check(size == sizeof(kvtier::RemoteValueHeader) + m.payload_bytes, "an accepted value has the block's length");
    // Only a seeded value opens: the fuzzer cannot find a tag for bytes of its own.
    Check(in.substr(sizeof(kvtier::RemoteValueHeader)) == "0123456789abcdef", "and is the sealed payload");
  } else {
    Check(absl::IsDataLoss(v), "a refused value is DataLoss");
  }
  // As replies.
  redisReader* reader = redisReaderCreate();
  if (reader == nullptr) return 0;
  kvtier::BoundReplyObjects(reader);  // as the cluster's connections are
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK) {
    for (int n = 0; n < 16; ++n) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader, &raw) != REDIS_OK || raw == nullptr) break;
      kvtier::RedisReply reply(static_cast<redisReply*>(raw));
      absl::StatusOr<std::vector<kvtier::SlotRange>> ranges = kvtier::ParseClusterSlots(reply.get(), "127.0.0.1");
      if (ranges.ok()) {
        for (const kvtier::SlotRange& r : *ranges) {
          Check(r.first <= r.last && r.last < kvtier::RedisCluster::kSlots, "ranges inside the slots");
          Check(r.port >= 1 && r.port <= 65535 && !r.host.empty(), "owned by an address");
        }
      }
      if (reply->type == REDIS_REPLY_ERROR || reply->type == REDIS_REPLY_STATUS) {
        kvtier::Redirect redirect;
        if (kvtier::ParseRedirect(absl::string_view(reply->str, reply->len), "10.0.0.1", &redirect)) {
          Check(redirect.slot < kvtier::RedisCluster::kSlots, "a redirect's slot is a slot");
          Check(redirect.port >= 1 && redirect.port <= 65535 && !redirect.host.empty(), "to an address");
        }
      }
    }
  }
  redisReaderFree(reader);
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  const kvtier::BlockMeta m = TheBlock();
  const std::string good = ValueOf(m, "0123456789abcdef");
  std::string flipped = good;
  flipped.back() ^= 1;
  return {
      good,
      flipped,
      good.substr(0, 50),
      "*3\r\n*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nabcd\r\n"
      "*3\r\n:5461\r\n:10922\r\n*2\r\n$0\r\n\r\n:7001\r\n"
      "*4\r\n:10923\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7002\r\n*2\r\n$9\r\n127.0.0.1\r\n:7005\r\n",
      "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n",  // past the last slot
      "*1\r\n*3\r\n:9\r\n:3\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n",      // end before start
      "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$9\r\n127.0.0.1\r\n:70000\r\n",     // no such port
      "-MOVED 3999 127.0.0.1:6381\r\n",
      "-ASK 3999 :6381\r\n",
      "-MOVED 99999 127.0.0.1:6381\r\n",
      "-MOVED 12 127.0.0.1:0\r\n",
      "-MOVED 12\r\n",
      "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
      "$5\r\nhello\r\n+OK\r\n:1\r\n_\r\n",
      "*-1\r\n*2\r\n*1\r\n*0\r\n$-1\r\n",
      "*638196381\r\n-ASK 3999 :6381\r\n",  // once a 5 GB allocation in hiredis's own reply builder
      "*-7\r\n",
  };
}

long FuzzDefaultIterations() { return 2000; }  // the deterministic driver is a smoke test; libFuzzer does the volume
