// SPDX-License-Identifier: Apache-2.0
// Overflow-checked arithmetic for numbers that come from a peer (a client's
// shared memory or socket message, a file, admin JSON). Every place where a
// peer's size, count, offset or stride becomes an address or a length goes
// through these: a result that does not fit is std::nullopt, never a
// wrapped-around value. docs/security.md states the rule.
#ifndef KVTIER_CORE_CHECKED_H_
#define KVTIER_CORE_CHECKED_H_

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace kvtier {

// a + b, or nullopt when it does not fit in T.
template <std::unsigned_integral T>
constexpr std::optional<T> CheckedAdd(T a, T b) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b, or nullopt when it does not fit in T.
template <std::unsigned_integral T>
constexpr std::optional<T> CheckedMul(T a, T b) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of every factor in 64 bits, or nullopt on overflow.
constexpr std::optional<uint64_t> CheckedProduct(std::initializer_list<uint64_t> factors) {
  uint64_t r = 1;
  for (uint64_t f : factors) {
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  }
  return r;
}

// True when the byte range [offset, offset + length) lies inside [0, size).
// Never overflows, whatever the three values are.
constexpr bool RangeWithin(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

// The bytes spanned by `count` equal items `stride` apart, the last `item`
// bytes long: (count - 1) * stride + item; 0 for no items; nullopt on
// overflow. The extent a paged cache's layer covers, for example.
constexpr std::optional<uint64_t> StridedExtent(uint64_t count, uint64_t stride, uint64_t item) {
  if (count == 0) return uint64_t{0};
  const std::optional<uint64_t> last = CheckedMul(count - 1, stride);
  if (!last) return std::nullopt;
  return CheckedAdd(*last, item);
}

// True when `s` is valid UTF-8 (no overlong forms, no surrogates, nothing
// above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// True when `s` is printable: valid UTF-8 with no C0/C1 control character
// and no DEL. What a peer's name must be before it reaches a log line, a
// JSON document or an operator's terminal.
bool IsPrintableUtf8(std::string_view s);

// The longest prefix of `s` of at most max_bytes that does not cut a UTF-8
// sequence in two.
std::string_view Utf8Prefix(std::string_view s, size_t max_bytes);

// `s` for a quoted logfmt value: backslash and double quote escaped (peer
// strings are already printable, so nothing else needs escaping).
std::string LogQuoted(std::string_view s);
// Other string views (absl::string_view is its own type in Debian's Abseil).
template <typename S>
  requires(!std::is_convertible_v<const S&, std::string_view> && requires(const S& v) {
    v.data();
    v.size();
  })
std::string LogQuoted(const S& s) {
  return LogQuoted(std::string_view(s.data(), s.size()));
}

// `s` with every byte that is not part of printable UTF-8 replaced by '?':
// for names this process makes up itself (its own /proc comm).
std::string PrintableOrReplaced(std::string_view s);

}  // namespace kvtier

#endif  // KVTIER_CORE_CHECKED_H_
