// SPDX-License-Identifier: Apache-2.0
#include "core/units.h"

#include <time.h>

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier {
namespace {

struct Suffix {
  absl::string_view name;
  double factor;
};

absl::StatusOr<uint64_t> ParseWithSuffixes(absl::string_view text, absl::string_view what,
                                            std::initializer_list<Suffix> suffixes,
                                            absl::string_view hint) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  absl::string_view num = t.substr(0, i);
  absl::string_view suf = absl::StripAsciiWhitespace(t.substr(i));
  double value = 0;
  if (num.empty() || !absl::SimpleAtod(num, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read \"", text, "\" as ", what, " (", hint, ")"));
  }
  double factor = 0;
  for (const Suffix& s : suffixes) {
    if (absl::EqualsIgnoreCase(suf, s.name)) factor = s.factor;
  }
  if (factor == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown unit \"", suf, "\" in \"", text, "\" (", hint, ")"));
  }
  const double total = std::round(value * factor);
  if (total >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is too large"));
  }
  return static_cast<uint64_t>(total);
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  constexpr double K = 1024.0;
  return ParseWithSuffixes(text, "a byte size",
                           {{"", 1}, {"B", 1}, {"KiB", K}, {"MiB", K * K}, {"GiB", K * K * K},
                            {"TiB", K * K * K * K}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
                            {"TB", 1e12}},
                           "write e.g. 4096, 64MiB or 1.5GiB");
}

absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  return ParseWithSuffixes(text, "a count", {{"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}},
                           "write e.g. 4096, 500K or 3M");
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr absl::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.2f %s", v, kUnits[u]);
}

uint64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace kvtier
