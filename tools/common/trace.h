// SPDX-License-Identifier: Apache-2.0
// Reading a request trace in the Mooncake JSONL format: one object per line
// with timestamp (ms), input_length (tokens) and hash_ids (one id per
// 512-token prefix block, already chained). kvtierctl capacity and
// kvtier-replay read the same files the same way.
//
// The file is untrusted input: every line is bounded before it is held or
// parsed, so a hostile file is an error naming its line, never a crash, a
// hang or a giant allocation.
#ifndef KVTIER_TOOLS_COMMON_TRACE_H_
#define KVTIER_TOOLS_COMMON_TRACE_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::tools {

// What one line may ask for. Real traces are far below: the Mooncake
// conversation trace's longest line is 2 KiB, its longest prompt 126K
// tokens (247 hash_ids), its last timestamp one hour in.
inline constexpr size_t kMaxTraceLineBytes = 1u << 20;           // 1 MiB
inline constexpr uint64_t kMaxTraceInputTokens = uint64_t{1} << 25;  // 32Mi tokens
inline constexpr size_t kMaxTraceHashIds = 1u << 16;              // 65536 blocks = 32Mi tokens of 512
inline constexpr uint64_t kMaxTraceTimestampMs = uint64_t{30} * 24 * 3600 * 1000;  // 30 days
// The same, in words, for --help and error messages.
inline constexpr const char* kTraceLimitsText =
    "one JSON object a line, at most 1 MiB; input_length at most 33554432 tokens, at most 65536 hash_ids, "
    "timestamp at most 30 days in ms";

struct TraceRecord {
  uint64_t timestamp_ms = 0;   // 0 when absent
  uint64_t input_length = 0;
  bool has_hash_ids = false;
  std::vector<uint64_t> hash_ids;
};

class TraceReader {
 public:
  // NotFound when the file cannot be opened.
  static absl::StatusOr<TraceReader> Open(const std::string& path);

  // The next record (blank lines are skipped): true, or false at the end.
  // InvalidArgument "path:line: what is wrong" for a line that is not a
  // record within the bounds above.
  absl::StatusOr<bool> Next(TraceRecord* r);
  size_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  TraceReader(std::string path, std::ifstream in) : path_(std::move(path)), in_(std::move(in)) {}
  absl::Status Bad(absl::string_view why) const;

  std::string path_;
  std::ifstream in_;
  size_t line_ = 0;
  std::string text_;
};

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_TRACE_H_
