// SPDX-License-Identifier: Apache-2.0
// The request trace reader (tools/common/trace.h): a Mooncake JSONL file is
// whatever its author wrote. Through a memfd, read as kvtierctl capacity and
// kvtier-replay read it:
//  - every record is within the documented bounds;
//  - reading stops: at most one record per line, line() never past the
//    lines there are;
//  - an error is InvalidArgument "path:line: why" and ends the reading;
//  - a record written back as a canonical JSON line reads as the same record.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_target.h"
#include "tools/common/trace.h"

namespace {

using kvtier::tools::TraceReader;
using kvtier::tools::TraceRecord;

struct File {
  int fd;
  std::string path;
  explicit File(const char* name) : fd(memfd_create(name, MFD_CLOEXEC)), path(absl::StrCat("/proc/self/fd/", fd)) {
    if (fd < 0) std::abort();
  }
  void Set(const char* data, size_t size) const {
    if (ftruncate(fd, 0) != 0) std::abort();
    size_t off = 0;
    while (off < size) {
      const ssize_t n = pwrite(fd, data + off, size - off, static_cast<off_t>(off));
      if (n <= 0) std::abort();
      off += static_cast<size_t>(n);
    }
  }
};

std::string Canonical(const TraceRecord& r) {
  nlohmann::json j{{"timestamp", r.timestamp_ms}, {"input_length", r.input_length}};
  if (r.has_hash_ids) j["hash_ids"] = r.hash_ids;
  return j.dump() + "\n";
}

void CheckBounds(const TraceRecord& r) {
  if (r.input_length > kvtier::tools::kMaxTraceInputTokens || r.hash_ids.size() > kvtier::tools::kMaxTraceHashIds ||
      r.timestamp_ms > kvtier::tools::kMaxTraceTimestampMs || (!r.has_hash_ids && !r.hash_ids.empty())) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const File input("trace_fuzz"), again("trace_fuzz_again");
  input.Set(reinterpret_cast<const char*>(data), size);
  const size_t lines = static_cast<size_t>(std::count(data, data + size, '\n')) + 1;
  absl::StatusOr<TraceReader> reader = TraceReader::Open(input.path);
  if (!reader.ok()) __builtin_trap();
  size_t records = 0;
  for (;;) {
    TraceRecord r;
    absl::StatusOr<bool> next = reader->Next(&r);
    if (reader->line() > lines) __builtin_trap();
    if (!next.ok()) {
      const std::string want = absl::StrCat(input.path, ":", reader->line(), ": ");
      if (!absl::IsInvalidArgument(next.status()) || !absl::StartsWith(next.status().message(), want) ||
          next.status().message().size() <= want.size()) {
        __builtin_trap();
      }
      break;
    }
    if (!*next) break;
    if (++records > lines) __builtin_trap();
    CheckBounds(r);
    // Round trip through the canonical form.
    const std::string line = Canonical(r);
    again.Set(line.data(), line.size());
    absl::StatusOr<TraceReader> r2 = TraceReader::Open(again.path);
    TraceRecord back;
    if (!r2.ok()) __builtin_trap();
    absl::StatusOr<bool> n2 = r2->Next(&back);
    if (!n2.ok() || !*n2 || back.timestamp_ms != r.timestamp_ms || back.input_length != r.input_length ||
        back.has_hash_ids != r.has_hash_ids || back.hash_ids != r.hash_ids) {
      __builtin_trap();
    }
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds = {
      // The Mooncake format, as in its conversation trace.
      "{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, 48, 49, 50, 51, "
      "52, 53, 54, 55, 56, 57, 2353, 2354]}\n"
      "{\"timestamp\": 27482, \"input_length\": 6472, \"output_length\": 26, \"hash_ids\": [46, 47, 48, 49, 50, 51, "
      "52, 53, 54, 55, 56, 57, 2366]}\n",
      "{\"input_length\": 512}\n\n   \t\r\n{\"input_length\": 0, \"hash_ids\": []}",
      "{\"timestamp\": 1.5e3, \"input_length\": 33554432, \"hash_ids\": [18446744073709551615]}\r\n",
      "{\"timestamp\": 2592000000, \"input_length\": 1}\n{\"timestamp\": 2592000001, \"input_length\": 1}\n",
      "{\"timestamp\": -1, \"input_length\": 1}\n",
      "{\"timestamp\": null, \"input_length\": 33554433}\n",
      "{\"input_length\": \"100\"}\n",
      "{\"input_length\": 5, \"hash_ids\": [1, -2]}\n",
      "{\"input_length\": 5, \"hash_ids\": {\"a\": 1}}\n",
      "{\"input_length\": 5, \"hash_ids\": [[[[[1]]]]]}\n",
      "[1, 2]\n",
      "{\"hash_ids\": [1]}\n",
      "not json\n",
      "",
      "\n\n\n",
  };
  // Past the documented bounds: one line over 1 MiB, one over 65536 ids.
  seeds.push_back("{\"input_length\": 1, \"pad\": \"" + std::string(1u << 20, 'x') + "\"}\n");
  std::string ids = "{\"input_length\": 1, \"hash_ids\": [0";
  for (size_t i = 0; i < kvtier::tools::kMaxTraceHashIds; ++i) ids += ",1";
  seeds.push_back(ids + "]}\n");
  return seeds;
}

long FuzzDefaultIterations() { return 1500; }  // the deterministic driver is a smoke test; libFuzzer does the volume
