// SPDX-License-Identifier: Apache-2.0
// Sealed values for shared tiers: what a tier that other nodes, other
// tenants or a cluster administrator can write (the remote tier today, a
// shared file system later) puts around a block so that nobody without the
// tenant's key can forge one.
//
// Each value is authenticated with AES-256-GCM under a per-tenant key (not
// the tier's password: whoever can write the key in the store still cannot
// make a value that opens). The header the tier writes (block identity,
// tenant, length) is the additional data; the payload is either encrypted
// (`encrypt`: unreadable at rest) or authenticated as additional data too
// (GMAC: stored in clear, still unforgeable). Every value gets a fresh
// random 96-bit nonce and names the key that sealed it by id, so keys
// rotate: the current key seals, earlier ones still open what they sealed.
//
// Thread-safe: Seal and Open may run on any thread at once.
#ifndef KVTIER_TIERS_VALUE_SEAL_H_
#define KVTIER_TIERS_VALUE_SEAL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier {

struct SealKey {
  std::array<uint8_t, 32> bytes{};
  uint32_t id = 0;  // derived from the bytes (KeyIdOf): names the key in each value
};

// A key from its text form: 64 hex digits (32 random bytes, as
// `openssl rand -hex 32` writes them). InvalidArgument otherwise; the error
// never quotes the text.
absl::StatusOr<SealKey> ParseSealKey(absl::string_view hex);
// A key file's text: one key a line, the current one first, then earlier
// ones still accepted on reads (rotation). Blank lines and lines that start
// with '#' are skipped.
absl::StatusOr<std::vector<SealKey>> ParseSealKeys(absl::string_view text);

// What Seal writes beside the value and Open reads back: the tier keeps it
// in the value's header.
struct SealFields {
  uint32_t key_id = 0;
  bool encrypted = false;
  std::array<uint8_t, 12> nonce{};
  std::array<uint8_t, 16> tag{};
};

// An opening in progress, for a payload that arrives in pieces (a value
// read from a socket): the tag is checked at Finish. Not thread-safe; one
// per value.
class SealStream {
 public:
  ~SealStream();
  SealStream(const SealStream&) = delete;
  SealStream& operator=(const SealStream&) = delete;
  // The next piece of the payload, decrypted in place when it was encrypted.
  // False on an OpenSSL failure (Finish then says DataLoss).
  bool Update(std::span<std::byte> piece);
  // OK when every piece together is what the key sealed; DataLoss otherwise.
  absl::Status Finish();

 private:
  friend class ValueSealer;
  SealStream(void* ctx, bool crypt, const std::array<uint8_t, 16>& tag) : ctx_(ctx), crypt_(crypt), tag_(tag) {}
  void* ctx_;  // EVP_CIPHER_CTX
  const bool crypt_;
  const std::array<uint8_t, 16> tag_;
  bool failed_ = false;
};

class ValueSealer {
 public:
  // keys[0] seals; every key opens. InvalidArgument with no key or two keys
  // with one id.
  static absl::StatusOr<std::unique_ptr<ValueSealer>> Create(std::vector<SealKey> keys, bool encrypt);

  // Seals `payload` (encrypting it in place when encrypt is on) under the
  // current key, with `aad` (the header, its seal fields zeroed) bound in.
  absl::StatusOr<SealFields> Seal(absl::string_view aad, std::span<std::byte> payload) const;
  // Whether `payload` is what the key named in `f` sealed with `aad`; when it
  // was encrypted, decrypts it in place. DataLoss for a value that does not
  // open (forged, altered, another block's or tenant's, sealed by a key not
  // configured): the caller must not serve the payload then.
  absl::Status Open(const SealFields& f, absl::string_view aad, std::span<std::byte> payload) const;
  // The same, for a payload that arrives in pieces. DataLoss at once for a
  // key this tenant does not have.
  absl::StatusOr<std::unique_ptr<SealStream>> StartOpen(const SealFields& f, absl::string_view aad) const;

  bool encrypt() const { return encrypt_; }
  uint32_t current_key_id() const { return keys_.front().id; }

 private:
  ValueSealer(std::vector<SealKey> keys, bool encrypt) : keys_(std::move(keys)), encrypt_(encrypt) {}
  const std::vector<SealKey> keys_;
  const bool encrypt_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_VALUE_SEAL_H_
