// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/workload.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/block_key.h"
#include "core/status.h"
#include "tools/common/trace.h"

namespace kvtier::tools {

absl::StatusOr<Workload> LoadMooncakeTrace(const std::string& path, uint32_t block_tokens, size_t limit) {
  if (block_tokens == 0) return absl::InvalidArgumentError("block_tokens must be positive");
  // TraceReader bounds each line (length, tokens, hash_ids, timestamp):
  // a hostile trace is an error naming its line.
  ASSIGN_OR_RETURN(TraceReader trace, TraceReader::Open(path));
  Workload w;
  w.block_tokens = block_tokens;
  TraceRecord t;
  while (limit == 0 || w.requests.size() < limit) {
    ASSIGN_OR_RETURN(bool more, trace.Next(&t));
    if (!more) break;
    if (!t.has_hash_ids) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", trace.line(), ": no \"hash_ids\" list"));
    }
    Request r;
    r.arrival_ms = t.timestamp_ms;
    r.prompt_tokens = t.input_length;
    r.stream = static_cast<uint32_t>(w.requests.size());
    const size_t full = std::min<size_t>(t.hash_ids.size(), r.prompt_tokens / block_tokens);
    r.keys.reserve(full);
    for (size_t i = 0; i < full; ++i) {
      std::string buf = "mooncake-block";
      const uint64_t v = t.hash_ids[i];
      buf.append(reinterpret_cast<const char*>(&v), sizeof(v));
      r.keys.push_back(Sha256(std::as_bytes(std::span(buf.data(), buf.size()))));
    }
    w.requests.push_back(std::move(r));
  }
  if (w.requests.empty()) return absl::InvalidArgumentError(absl::StrCat("trace ", path, " has no requests"));
  w.description = absl::StrCat("trace ", path, " (", w.requests.size(), " requests, ", block_tokens,
                               "-token blocks)");
  return w;
}

Workload SyntheticChat(const ChatOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto text = [&](uint32_t n) {
    std::vector<uint32_t> t(n);
    for (auto& x : t) x = static_cast<uint32_t>(rng() % 128000);
    return t;
  };
  auto spread = [&](uint32_t mean) { return std::max<uint32_t>(1, mean / 2 + static_cast<uint32_t>(rng() % (mean + 1))); };
  std::vector<std::vector<uint32_t>> systems;
  for (uint32_t i = 0; i < std::max<uint32_t>(o.system_prompts, 1); ++i) systems.push_back(text(o.system_prompt_tokens));

  // Each conversation's history grows turn by turn.
  std::vector<std::vector<uint32_t>> history(o.conversations);
  std::vector<std::vector<Request>> per_conv(o.conversations);
  for (uint32_t c = 0; c < o.conversations; ++c) {
    history[c] = systems[c % systems.size()];
    for (uint32_t t = 0; t < o.turns; ++t) {
      std::vector<uint32_t> user = text(spread(o.user_tokens));
      history[c].insert(history[c].end(), user.begin(), user.end());
      Request r;
      r.stream = c;
      r.tokens = history[c];
      r.prompt_tokens = r.tokens.size();
      per_conv[c].push_back(std::move(r));
      std::vector<uint32_t> reply = text(spread(o.reply_tokens));
      history[c].insert(history[c].end(), reply.begin(), reply.end());
    }
  }
  // Interleave: at each step a random conversation with turns left speaks.
  Workload w;
  w.block_tokens = o.block_tokens;
  std::vector<uint32_t> next(o.conversations, 0);
  std::vector<uint32_t> live;
  for (uint32_t c = 0; c < o.conversations; ++c) live.push_back(c);
  uint64_t clock_ms = 0;
  while (!live.empty()) {
    const size_t pick = rng() % live.size();
    const uint32_t c = live[pick];
    Request r = std::move(per_conv[c][next[c]++]);
    r.arrival_ms = clock_ms;
    clock_ms += 50;
    w.requests.push_back(std::move(r));
    if (next[c] == o.turns) {
      live[pick] = live.back();
      live.pop_back();
    }
  }
  w.description = absl::StrCat("synthetic multi-turn chat (", o.conversations, " conversations x ", o.turns,
                               " turns, ", o.system_prompts, " shared system prompts, ", o.block_tokens,
                               "-token blocks)");
  return w;
}

}  // namespace kvtier::tools
