// SPDX-License-Identifier: Apache-2.0
// Parsing JSON that comes from outside (a file, a daemon's answer) with a
// bound on nesting. nlohmann's parser keeps its stack on the heap, but
// copying, comparing and dump()ing a value recurse once per level: a
// document a million levels deep parses, then overflows the stack in
// whatever touches it next. The parse callback sees each container's depth,
// so nothing deeper than the bound is ever built.
//
// Header-only: include it only from targets that link nlohmann_json.
#ifndef KVTIER_CORE_BOUNDED_JSON_H_
#define KVTIER_CORE_BOUNDED_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvtier {

// Deeper than any config.json, trace record or admin answer kvtier reads.
inline constexpr int kMaxJsonDepth = 64;

// The document, or InvalidArgument saying what is wrong with it ("not valid
// JSON", "nested deeper than 64 levels"); the caller names the source.
// Never throws.
inline absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, int max_depth = kMaxJsonDepth) {
  bool too_deep = false;
  // Depth is that of the container being opened (0: the top level).
  // Returning false discards it without building its contents.
  auto bound = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= max_depth) {
      too_deep = true;
      return false;
    }
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(text, bound, /*allow_exceptions=*/false);
  if (too_deep) return absl::InvalidArgumentError(absl::StrCat("nested deeper than ", max_depth, " levels"));
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return j;
}

}  // namespace kvtier

#endif  // KVTIER_CORE_BOUNDED_JSON_H_
