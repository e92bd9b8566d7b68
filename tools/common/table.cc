#include "tools/common/table.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace kvtier::tools {

void Table::Print(std::ostream& out) const {
  std::vector<size_t> w(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      // Plain numbers right-aligned; anything with words stays left.
      const bool right = !cell.empty() && cell.find_first_not_of("0123456789.-+e") == std::string::npos;
      const std::string pad(w[i] - cell.size(), ' ');
      s += right && &r != &header_ ? pad + cell : cell + pad;
      if (i + 1 < w.size()) s += "  ";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out << s << "\n";
  };
  line(header_);
  for (const auto& r : rows_) line(r);
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
