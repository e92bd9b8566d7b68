// SPDX-License-Identifier: Apache-2.0
#include "tools/common/trace.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/bounded_json.h"

namespace kvtier::tools {

absl::StatusOr<TraceReader> TraceReader::Open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the trace ", path));
  return TraceReader(path, std::move(in));
}

absl::Status TraceReader::Bad(absl::string_view why) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_, ": ", why));
}

absl::StatusOr<bool> TraceReader::Next(TraceRecord* r) {
  for (;;) {
    // std::getline would hold a line of any length: a file of gigabytes
    // without a newline was read whole into memory. Stop one byte past the
    // bound instead.
    text_.clear();
    std::streambuf* sb = in_.rdbuf();
    bool ended = false;
    for (;;) {
      const int c = sb->sbumpc();
      if (c == std::char_traits<char>::eof()) {
        ended = true;
        break;
      }
      if (c == '\n') break;
      if (text_.size() == kMaxTraceLineBytes) {
        ++line_;
        return Bad(absl::StrCat("a line longer than ", kMaxTraceLineBytes >> 20, " MiB"));
      }
      text_.push_back(static_cast<char>(c));
    }
    if (ended && text_.empty()) return false;
    ++line_;
    if (text_.find_first_not_of(" \t\r") != std::string::npos) break;
    if (ended) return false;
  }
  absl::StatusOr<nlohmann::json> parsed = ParseBoundedJson(text_, /*max_depth=*/4);
  if (!parsed.ok()) return Bad(absl::StrCat("not a trace record: ", parsed.status().message()));
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return Bad("not a trace record (a JSON object with \"input_length\" and \"hash_ids\")");
  *r = TraceRecord{};

  const auto len = j.find("input_length");
  if (len == j.end()) return Bad("no \"input_length\"");
  // nlohmann reads every non-negative integer as unsigned: -5, 1.5 and
  // "100" are not.
  if (!len->is_number_unsigned() || len->get<uint64_t>() > kMaxTraceInputTokens) {
    return Bad(absl::StrCat("\"input_length\" must be an integer from 0 to ", kMaxTraceInputTokens, " tokens"));
  }
  r->input_length = len->get<uint64_t>();

  // A timestamp far away (or a negative one read as unsigned) made a timed
  // replay sleep for ever.
  if (const auto ts = j.find("timestamp"); ts != j.end() && !ts->is_null()) {
    const bool ok = ts->is_number_unsigned() ? ts->get<uint64_t>() <= kMaxTraceTimestampMs
                    : ts->is_number_float() ? ts->get<double>() >= 0 &&
                                                  ts->get<double>() <= double(kMaxTraceTimestampMs)
                                            : false;
    if (!ok) {
      return Bad(absl::StrCat("\"timestamp\" must be a number of milliseconds from 0 to ", kMaxTraceTimestampMs));
    }
    r->timestamp_ms = ts->is_number_unsigned() ? ts->get<uint64_t>() : static_cast<uint64_t>(ts->get<double>());
  }

  if (const auto ids = j.find("hash_ids"); ids != j.end()) {
    if (!ids->is_array()) return Bad("\"hash_ids\" must be a list of non-negative integers");
    if (ids->size() > kMaxTraceHashIds) {
      return Bad(absl::StrCat("more than ", kMaxTraceHashIds, " hash_ids"));
    }
    r->has_hash_ids = true;
    r->hash_ids.reserve(ids->size());
    for (const nlohmann::json& id : *ids) {
      if (!id.is_number_unsigned()) return Bad("\"hash_ids\" must be a list of non-negative integers");
      r->hash_ids.push_back(id.get<uint64_t>());
    }
  }
  return true;
}

}  // namespace kvtier::tools
