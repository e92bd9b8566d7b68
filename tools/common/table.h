// SPDX-License-Identifier: Apache-2.0
// Human-readable aligned tables for the tools' default output.
#ifndef KVTIER_TOOLS_COMMON_TABLE_H_
#define KVTIER_TOOLS_COMMON_TABLE_H_

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::tools {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  // Columns padded to their widest cell; plain numbers right-aligned. Cells
  // go through Printable(): they often hold a peer's strings.
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// `s` safe for a terminal: every C0 control byte (< 0x20), DEL, C1 control
// (U+0080..U+009F, which some terminals obey as ESC sequences), bidi
// override or isolate, and every byte that is not part of valid UTF-8
// becomes '?'. For strings a daemon or a file supplies (client names, model
// ids) on their way to a human's terminal.
std::string Printable(std::string_view s);

// "0.532", "12.5 ms", and similar small formatting helpers.
std::string Fixed(double v, int digits);
std::string Duration(double seconds);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_TABLE_H_
