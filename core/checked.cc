// SPDX-License-Identifier: Apache-2.0
#include "core/checked.h"

namespace kvtier {
namespace {

// Decodes one code point at s[i]; returns its length, or 0 when the bytes
// there are not a well-formed UTF-8 sequence. *cp receives the code point.
size_t DecodeOne(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xe0) == 0xc0) {
    n = 2, v = c & 0x1f, min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3, v = c & 0x0f, min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = DecodeOne(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool IsPrintableUtf8(std::string_view s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = DecodeOne(s, i, &cp);
    if (n == 0 || cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) return false;
    // Bidirectional overrides and isolates reorder what a terminal shows.
    if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) return false;
    i += n;
  }
  return true;
}

std::string_view Utf8Prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  // Back off continuation bytes (10xxxxxx) to the start of their sequence.
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xc0) == 0x80) --n;
  return s.substr(0, n);
}

std::string LogQuoted(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string PrintableOrReplaced(std::string_view s) {
  std::string out;
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = DecodeOne(s, i, &cp);
    if (n == 0 || !IsPrintableUtf8(s.substr(i, n))) {
      out += '?';
      i += n == 0 ? 1 : n;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace kvtier
