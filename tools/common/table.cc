// SPDX-License-Identifier: Apache-2.0
#include "tools/common/table.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>

namespace kvtier::tools {

void Table::Print(std::ostream& out) const {
  std::vector<size_t> w(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  // Width and alignment are those of what is printed.
  std::vector<std::string> header;
  for (const std::string& c : header_) header.push_back(Printable(c));
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : rows_) {
    rows.emplace_back();
    for (const std::string& c : r) rows.back().push_back(Printable(c));
  }
  widen(header);
  for (const auto& r : rows) widen(r);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      // Plain numbers right-aligned; anything with words stays left.
      const bool right = !cell.empty() && cell.find_first_not_of("0123456789.-+e") == std::string::npos;
      const std::string pad(w[i] - cell.size(), ' ');
      s += right && &r != &header ? pad + cell : cell + pad;
      if (i + 1 < w.size()) s += "  ";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out << s << "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
}

std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
    const uint8_t c = b(0);
    if (c < 0x80) {
      out.push_back(c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c));
      ++i;
      continue;
    }
    // One UTF-8 sequence: its length, and whether it is well formed.
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xe0) == 0xc0) {
      n = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      n = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      n = 4, cp = c & 0x07, min = 0x10000;
    }
    bool ok = n != 0 && s.size() - i >= n;
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (b(k) & 0xc0) == 0x80;
      cp = (cp << 6) | (b(k) & 0x3f);
    }
    ok = ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      out.push_back('?');  // a stray byte: 0x9b alone is CSI to an 8-bit terminal
      ++i;
      continue;
    }
    const bool control = cp < 0xa0 || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
    if (control) {
      out.push_back('?');
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Duration(double s) {
  if (s < 1e-3) return Fixed(s * 1e6, 1) + " us";
  if (s < 1) return Fixed(s * 1e3, 1) + " ms";
  if (s < 120) return Fixed(s, 1) + " s";
  return Fixed(s / 60, 1) + " min";
}

}  // namespace kvtier::tools
