// SPDX-License-Identifier: Apache-2.0
// Block identity: chained block keys.
//
//   key_i = H(key_{i-1} || u32le(n_tokens) || tokens_i as u32le ||
//             u32le(extra_len) || extra)
//
// The first block's parent is 32 zero bytes. SHA-256 keeps all 256 bits;
// xxHash3-128 fills the first 16 bytes and leaves the rest zero, and is only
// allowed for a single trusted tenant. Length prefixes make the encoding
// unambiguous. These bytes are a compatibility contract: the fixed vectors in
// tests/core/block_key_test.cc must never change.
#ifndef KVTIER_CORE_BLOCK_KEY_H_
#define KVTIER_CORE_BLOCK_KEY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/types.h"

namespace kvtier {

// Parses "sha256" / "xxh3-128".
absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view name);

// One link of the chain.
BlockKey NextBlockKey(HashAlgorithm algo, const BlockKey& parent,
                      std::span<const uint32_t> tokens, std::span<const std::byte> extra = {});

// Keys of every full block of `tokens` (the partial tail is not cached).
//
//   std::vector<BlockKey> keys = ChainBlockKeys(HashAlgorithm::kSha256, tokens, 16);
std::vector<BlockKey> ChainBlockKeys(HashAlgorithm algo, std::span<const uint32_t> tokens,
                                     uint32_t block_tokens, const BlockKey* parent = nullptr,
                                     std::span<const std::byte> extra = {});

// SHA-256 of `data`.
BlockKey Sha256(std::span<const std::byte> data);

// Parses 64 hex digits.
absl::StatusOr<BlockKey> ParseBlockKeyHex(absl::string_view hex);

}  // namespace kvtier

#endif  // KVTIER_CORE_BLOCK_KEY_H_
