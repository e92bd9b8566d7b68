// SPDX-License-Identifier: Apache-2.0
// kvtierctl's side of the admin protocol: the answer line whatever listens
// on the admin socket sends (ipc::DecodeAdminResponse, the decoding half of
// AdminCall), and the bounded JSON parser under it (core/bounded_json.h).
//  - An answer is accepted only as an object with "ok": true, nested at
//    most kMaxJsonDepth deep; it dumps and decodes back to the same value.
//  - Refusals are DataLoss (unreadable) or FailedPrecondition (ok: false).
//  - ParseBoundedJson agrees with nlohmann's unbounded parser on every
//    document within the bound and refuses, as too deep, every one past it.
#include <vector>

#include "core/bounded_json.h"
#include "ipc/admin_client.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

// Levels of containers (a scalar: 0, [] : 1), without recursion.
int Depth(const nlohmann::json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> stack{{&root, 0}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *j) stack.push_back({&child, d + 1});
  }
  return deepest;
}

// Levels of containers the text opens, counting values a later duplicate
// key replaced (they are gone from the parsed value, but were nested in the
// text, and the bound is on the text's nesting).
int TextDepth(std::string_view text) {
  int deepest = 0;
  auto seen = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) {
      deepest = std::max(deepest, depth + 1);
    }
    return true;
  };
  const nlohmann::json parsed = nlohmann::json::parse(text, seen, /*allow_exceptions=*/false);
  (void)parsed;  // only the depths it saw matter
  return deepest;
}

void CheckBounded(std::string_view text, int max_depth) {
  absl::StatusOr<nlohmann::json> bounded = kvtier::ParseBoundedJson(text, max_depth);
  // nlohmann's own parser keeps its stack on the heap; only what touches
  // the result recursively (==, dump) must stay within the bound, so compare
  // only values within it.
  const nlohmann::json full = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (full.is_discarded()) {
    if (bounded.ok()) __builtin_trap();
    return;
  }
  if (TextDepth(text) <= max_depth) {
    if (!bounded.ok() || *bounded != full) __builtin_trap();
  } else {
    if (bounded.ok() || bounded.status().message().find("nested deeper") == std::string_view::npos) __builtin_trap();
  }
  if (bounded.ok() && Depth(*bounded) > max_depth) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nlohmann::json> r = kvtier::ipc::DecodeAdminResponse(line);
  if (r.ok()) {
    if (!r->is_object() || !r->contains("ok") || !(*r)["ok"].is_boolean() || !(*r)["ok"].get<bool>()) {
      __builtin_trap();
    }
    if (Depth(*r) > kvtier::kMaxJsonDepth) __builtin_trap();
    // What was accepted survives kvtierctl --json (dump) and a re-read.
    const std::string again = r->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    absl::StatusOr<nlohmann::json> r2 = kvtier::ipc::DecodeAdminResponse(again);
    if (!r2.ok() || *r2 != *r) __builtin_trap();
  } else if (!absl::IsDataLoss(r.status()) && !absl::IsFailedPrecondition(r.status())) {
    __builtin_trap();
  }
  CheckBounded(line, kvtier::kMaxJsonDepth);
  CheckBounded(line, 3);  // the trace reader's bound is 4
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds = {
      R"({"ok":true})",
      R"({"ok":false,"error":"no tenant \"x\""})",
      R"({"ok":false,"error":7})",
      R"({"ok":"yes"})",
      R"({"ok":true,"blocks":[{"key":"00ff","tiers":["host","nvme"],"depth":null,"pins":0,"tokens":16}],"limit":100})",
      // A duplicate key whose first value nests past a bound the second does
      // not: the bound is on the text, so it is refused (a fuzz find).
      R"({"ok":true,"blocks":[{"key":"00ff","depth":["host","nvme"],"depth":null,"pins":0}],"limit":100})",
      R"({"ok":true,"stats":{"hit_rate":0.25,"big":18446744073709551615,"neg":-9223372036854775808,"f":-0.0,"e":1e308}})",
      R"({"ok":true,"s":"\u0000\ud83d\ude00\"\\\/\b\f\n\r\t"})",
      R"([{"ok":true}])",
      R"({"ok":true,"a":[[[[[[[[]]]]]]]]})",
      R"({"ok":true,"dup":1,"dup":2})",
      "{\"ok\":true}  ",
      "",
      "\xef\xbb\xbf{\"ok\":true}",
  };
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  seeds.push_back(R"({"ok":true,"x":)" + deep + "}");
  std::string at_bound;  // exactly kMaxJsonDepth levels: accepted
  for (int i = 1; i < kvtier::kMaxJsonDepth; ++i) at_bound += "[";
  at_bound += std::string(kvtier::kMaxJsonDepth - 1, ']');
  seeds.push_back(R"({"ok":true,"x":)" + at_bound + "}");
  return seeds;
}

long FuzzDefaultIterations() { return 1000; }  // the deterministic driver is a smoke test; libFuzzer does the volume
