// SPDX-License-Identifier: Apache-2.0
#include "core/block_key.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <bit>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

static_assert(std::endian::native == std::endian::little,
              "block keys hash tokens as little-endian u32; add byte swapping for big-endian hosts");

// The encoded input of one chain link.
void Encode(const BlockKey& parent, std::span<const uint32_t> tokens,
            std::span<const std::byte> extra, std::string* out) {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t e = static_cast<uint32_t>(extra.size());
  out->clear();
  out->reserve(32 + 8 + tokens.size_bytes() + extra.size());
  out->append(reinterpret_cast<const char*>(parent.bytes.data()), parent.bytes.size());
  out->append(reinterpret_cast<const char*>(&n), 4);
  out->append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  out->append(reinterpret_cast<const char*>(&e), 4);
  out->append(reinterpret_cast<const char*>(extra.data()), extra.size());
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

BlockKey Sha256Of(const void* data, size_t len) {
  // One context per thread, reused: EVP_MD_CTX_new per block costs more than
  // hashing a 16-token block.
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  BlockKey key;
  unsigned int out_len = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), data, len) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), key.bytes.data(), &out_len) != 1 || out_len != 32) {
    // Only an OpenSSL built without SHA-256 gets here; there is no safe key.
    throw std::runtime_error("OpenSSL SHA-256 failed");
  }
  return key;
}

}  // namespace

absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view name) {
  if (name == "sha256") return HashAlgorithm::kSha256;
  if (name == "xxh3-128" || name == "xxh3") return HashAlgorithm::kXxh3_128;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown hash algorithm \"", name, "\": use \"sha256\" or \"xxh3-128\""));
}

BlockKey NextBlockKey(HashAlgorithm algo, const BlockKey& parent,
                      std::span<const uint32_t> tokens, std::span<const std::byte> extra) {
  thread_local std::string buf;
  Encode(parent, tokens, extra, &buf);
  if (algo == HashAlgorithm::kXxh3_128) {
    XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    BlockKey key;
    std::memcpy(key.bytes.data(), c.digest, 16);
    return key;
  }
  return Sha256Of(buf.data(), buf.size());
}

std::vector<BlockKey> ChainBlockKeys(HashAlgorithm algo, std::span<const uint32_t> tokens,
                                     uint32_t block_tokens, const BlockKey* parent,
                                     std::span<const std::byte> extra) {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  const size_t n = tokens.size() / block_tokens;
  keys.reserve(n);
  BlockKey prev = parent ? *parent : BlockKey{};
  for (size_t i = 0; i < n; ++i) {
    prev = NextBlockKey(algo, prev, tokens.subspan(i * block_tokens, block_tokens), extra);
    keys.push_back(prev);
  }
  return keys;
}

BlockKey Sha256(std::span<const std::byte> data) { return Sha256Of(data.data(), data.size()); }

absl::StatusOr<BlockKey> ParseBlockKeyHex(absl::string_view hex) {
  if (hex.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("a block key is 64 hex digits, got ", hex.size(), " characters"));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("a block key must be hex digits only");
    }
  }
  std::string raw = absl::HexStringToBytes(hex);
  BlockKey key;
  std::memcpy(key.bytes.data(), raw.data(), 32);
  return key;
}

}  // namespace kvtier
