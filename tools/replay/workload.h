// SPDX-License-Identifier: Apache-2.0
// What kvtier-replay sends: requests with their cacheable block keys.
//
// Two sources: a trace in the Mooncake JSONL format (one object per line with
// timestamp, input_length, output_length and hash_ids of 512-token blocks,
// already chained), or a built-in synthetic multi-turn chat whose prompts are
// real token sequences (keys computed with the daemon's hash).
#ifndef KVTIER_TOOLS_REPLAY_WORKLOAD_H_
#define KVTIER_TOOLS_REPLAY_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/types.h"

namespace kvtier::tools {

struct Request {
  uint64_t arrival_ms = 0;
  uint64_t prompt_tokens = 0;   // input length, partial last block included
  uint32_t stream = 0;          // conversation (requests of one stream run in order)
  std::vector<uint32_t> tokens; // synthetic only: the prompt
  std::vector<BlockKey> keys;   // full blocks only
};

struct Workload {
  std::string description;
  uint32_t block_tokens = 0;
  std::vector<Request> requests;
};

// Reads a Mooncake-format trace. Keys are SHA-256("mooncake-block" || id),
// one per full block: min(len(hash_ids), input_length / block_tokens).
// limit 0 reads everything. The file is untrusted: each line is bounded
// (tools/common/trace.h, kTraceLimitsText), and a bad one is InvalidArgument
// naming it (path:line); NotFound when the file cannot be read.
absl::StatusOr<Workload> LoadMooncakeTrace(const std::string& path, uint32_t block_tokens, size_t limit);

struct ChatOptions {
  uint32_t conversations = 48;
  uint32_t turns = 6;
  uint32_t system_prompts = 3;       // shared by all conversations
  uint32_t system_prompt_tokens = 1024;
  uint32_t user_tokens = 160;        // per turn, with some spread
  uint32_t reply_tokens = 320;
  uint32_t block_tokens = 64;
  uint64_t seed = 1;
};
// Conversations whose turn t's prompt is the system prompt plus every earlier
// turn: later turns reuse earlier ones, and everybody reuses the system
// prompt. Requests interleave across conversations; keys are left empty for
// the caller to compute with the daemon's hash.
Workload SyntheticChat(const ChatOptions& opts);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_WORKLOAD_H_
