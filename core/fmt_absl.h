// SPDX-License-Identifier: Apache-2.0
// Lets spdlog/fmt print absl::string_view (Debian's Abseil does not alias it
// to std::string_view).
#ifndef KVTIER_CORE_FMT_ABSL_H_
#define KVTIER_CORE_FMT_ABSL_H_

#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Ctx>
  auto format(absl::string_view s, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

#endif  // KVTIER_CORE_FMT_ABSL_H_
