// SPDX-License-Identifier: Apache-2.0
// An out-of-tree C++ engine built with find_package(kvtier CONFIG) or
// pkg-config: the C++ API's round trip, every byte checked.
// Usage: consumer_cxx SOCKET
#include <kvtier/client.h>

#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer_cxx SOCKET\n");
    return 2;
  }
  kvtier::AttachOptions o;
  o.socket_path = argv[1];
  o.ns.model_id = "consumer/cxx";
  o.ns.kv_dtype = "f16";
  o.ns.kv_layout = "layer_major";
  o.ns.block_tokens = 16;
  o.ns.block_bytes = 4096;
  auto client = kvtier::Client::Attach(o);
  if (!client.ok()) {
    std::fprintf(stderr, "attach: %s\n", client.status().message().c_str());
    return 1;
  }
  kvtier::Client& c = **client;
  std::vector<uint32_t> tokens(80);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i * 11 + 1;
  const std::vector<kvtier::BlockKey> keys = c.ComputeKeys(tokens);
  std::vector<std::vector<std::byte>> data(keys.size(), std::vector<std::byte>(c.block_bytes()));
  std::vector<std::span<const std::byte>> src;
  for (size_t b = 0; b < data.size(); ++b) {
    for (size_t i = 0; i < data[b].size(); ++i) data[b][i] = std::byte(b * 13 + i);
    src.emplace_back(data[b]);
  }
  auto stored = c.Store(keys, src);
  if (!stored.ok() || *stored != keys.size()) {
    std::fprintf(stderr, "store failed\n");
    return 1;
  }
  kvtier::LookupOptions lo;
  lo.lease = true;
  auto hit = c.Lookup(keys, lo);
  if (!hit.ok() || hit->hit_blocks != keys.size()) {
    std::fprintf(stderr, "lookup failed\n");
    return 1;
  }
  auto views = c.Load(hit->lease, keys);
  if (!views.ok() || views->size() != keys.size()) {
    std::fprintf(stderr, "load failed\n");
    return 1;
  }
  for (size_t b = 0; b < keys.size(); ++b) {
    if ((*views)[b].size != data[b].size() ||
        std::memcmp((*views)[b].data, data[b].data(), data[b].size()) != 0) {
      std::fprintf(stderr, "block %zu came back different\n", b);
      return 1;
    }
  }
  (void)c.Release(hit->lease);
  // Leave the daemon as found, so the next build of this consumer stores anew.
  auto removed = c.InvalidateNamespace();
  if (!removed.ok() || *removed != keys.size()) {
    std::fprintf(stderr, "invalidate failed\n");
    return 1;
  }
  std::printf("c++ consumer: %zu blocks stored and loaded back byte-exactly\n", keys.size());
  return 0;
}
