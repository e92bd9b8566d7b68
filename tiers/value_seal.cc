// SPDX-License-Identifier: Apache-2.0
// ValueSealer (value_seal.h): AES-256-GCM from OpenSSL's EVP interface.
#include "tiers/value_seal.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <climits>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"

namespace kvtier {

namespace {

// Bound into every value's authenticated data: a value sealed for another
// purpose, or with its encrypted flag flipped, does not open.
constexpr absl::string_view kDomain = "kvtier sealed value v1";
constexpr size_t kChunk = size_t{1} << 30;  // EVP takes int lengths

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

uint32_t KeyIdOf(const std::array<uint8_t, 32>& key) {
  static constexpr absl::string_view kIdDomain = "kvtier seal key id v1";
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
  EVP_DigestUpdate(md, kIdDomain.data(), kIdDomain.size());
  EVP_DigestUpdate(md, key.data(), key.size());
  EVP_DigestFinal_ex(md, digest, &n);
  EVP_MD_CTX_free(md);
  uint32_t id;
  std::memcpy(&id, digest, sizeof(id));
  return id;
}

bool Update(EVP_CIPHER_CTX* ctx, bool seal, unsigned char* out, const unsigned char* in, size_t n) {
  for (size_t at = 0; at < n; at += kChunk) {
    const int m = static_cast<int>(std::min(kChunk, n - at));
    int got = 0;
    const int ok = seal ? EVP_EncryptUpdate(ctx, out == nullptr ? nullptr : out + at, &got, in + at, m)
                        : EVP_DecryptUpdate(ctx, out == nullptr ? nullptr : out + at, &got, in + at, m);
    if (ok != 1) return false;
  }
  return true;
}

// Feeds the domain, the flag and `aad` (all authenticated only).
bool FeedHeader(EVP_CIPHER_CTX* ctx, bool seal, bool crypt, absl::string_view aad) {
  const unsigned char flag = crypt ? 1 : 0;
  return Update(ctx, seal, nullptr, reinterpret_cast<const unsigned char*>(kDomain.data()), kDomain.size()) &&
         Update(ctx, seal, nullptr, &flag, 1) &&
         Update(ctx, seal, nullptr, reinterpret_cast<const unsigned char*>(aad.data()), aad.size());
}

// Feeds a piece of the payload: en/decrypted in place when `crypt`, else
// authenticated only.
bool FeedPayload(EVP_CIPHER_CTX* ctx, bool seal, bool crypt, std::span<std::byte> payload) {
  auto* p = reinterpret_cast<unsigned char*>(payload.data());
  return Update(ctx, seal, crypt ? p : nullptr, p, payload.size());
}

}  // namespace

absl::StatusOr<SealKey> ParseSealKey(absl::string_view hex) {
  hex = absl::StripAsciiWhitespace(hex);
  SealKey k;
  if (hex.size() != 2 * k.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a key is 64 hex digits (32 random bytes: openssl rand -hex 32), not ", hex.size(), " characters"));
  }
  for (size_t i = 0; i < k.bytes.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("a key is 64 hex digits; this one has other characters");
    k.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  bool all_same = true;
  for (uint8_t b : k.bytes) all_same = all_same && b == k.bytes[0];
  if (all_same) return absl::InvalidArgumentError("a key of one repeated byte is not a key: openssl rand -hex 32");
  k.id = KeyIdOf(k.bytes);
  return k;
}

absl::StatusOr<std::vector<SealKey>> ParseSealKeys(absl::string_view text) {
  std::vector<SealKey> keys;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    absl::StatusOr<SealKey> k = ParseSealKey(line);
    if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", k.status().message()));
    for (const SealKey& other : keys) {
      if (other.id == k->id) return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": the same key twice"));
    }
    keys.push_back(*k);
  }
  if (keys.empty()) return absl::InvalidArgumentError("no key (one line of 64 hex digits: openssl rand -hex 32)");
  return keys;
}

absl::StatusOr<std::unique_ptr<ValueSealer>> ValueSealer::Create(std::vector<SealKey> keys, bool encrypt) {
  if (keys.empty()) return absl::InvalidArgumentError("a sealer needs a key");
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (keys[i].id == keys[j].id) return absl::InvalidArgumentError("two keys with one id");
    }
  }
  return std::unique_ptr<ValueSealer>(new ValueSealer(std::move(keys), encrypt));
}

absl::StatusOr<SealFields> ValueSealer::Seal(absl::string_view aad, std::span<std::byte> payload) const {
  SealFields f;
  f.key_id = keys_.front().id;
  f.encrypted = encrypt_;
  if (RAND_bytes(f.nonce.data(), static_cast<int>(f.nonce.size())) != 1) {
    return absl::InternalError("OpenSSL's random generator failed: cannot seal a value");
  }
  Ctx ctx(EVP_CIPHER_CTX_new());
  unsigned char tail[32];  // GCM writes nothing here
  int n = 0;
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, keys_.front().bytes.data(), f.nonce.data()) != 1 ||
      !FeedHeader(ctx.get(), true, encrypt_, aad) || !FeedPayload(ctx.get(), true, encrypt_, payload) ||
      EVP_EncryptFinal_ex(ctx.get(), tail, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(f.tag.size()), f.tag.data()) != 1) {
    return absl::InternalError("AES-GCM failed in OpenSSL: cannot seal a value");
  }
  return f;
}

absl::StatusOr<std::unique_ptr<SealStream>> ValueSealer::StartOpen(const SealFields& f, absl::string_view aad) const {
  const SealKey* key = nullptr;
  for (const SealKey& k : keys_) {
    if (k.id == f.key_id) key = &k;
  }
  if (key == nullptr) {
    return absl::DataLossError(absl::StrCat("sealed by a key this tenant does not have (key id ", f.key_id,
                                            "; configured ", keys_.size(), ")"));
  }
  Ctx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key->bytes.data(), f.nonce.data()) != 1 ||
      !FeedHeader(ctx.get(), false, f.encrypted, aad)) {
    return absl::DataLossError("AES-GCM failed in OpenSSL while opening a value");
  }
  return std::unique_ptr<SealStream>(new SealStream(ctx.release(), f.encrypted, f.tag));
}

SealStream::~SealStream() { EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_)); }

bool SealStream::Update(std::span<std::byte> piece) {
  if (!failed_ && !FeedPayload(static_cast<EVP_CIPHER_CTX*>(ctx_), false, crypt_, piece)) failed_ = true;
  return !failed_;
}

absl::Status SealStream::Finish() {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  unsigned char tail[32];  // GCM writes nothing here
  int n = 0;
  if (failed_ || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag_.size()),
                                     const_cast<uint8_t*>(tag_.data())) != 1) {
    return absl::DataLossError("AES-GCM failed in OpenSSL while opening a value");
  }
  if (EVP_DecryptFinal_ex(ctx, tail, &n) != 1) {
    return absl::DataLossError("the value's seal does not match (forged, altered, or another block's)");
  }
  return absl::OkStatus();
}

absl::Status ValueSealer::Open(const SealFields& f, absl::string_view aad, std::span<std::byte> payload) const {
  ASSIGN_OR_RETURN(std::unique_ptr<SealStream> stream, StartOpen(f, aad));
  stream->Update(payload);
  return stream->Finish();
}

}  // namespace kvtier
