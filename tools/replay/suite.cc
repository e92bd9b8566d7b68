// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/suite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/block_key.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kBlockTokens = 512;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A run of text: `tokens` tokens that only prompts quoting this segment
// contain. A prompt is a list of segments.
struct Seg {
  uint64_t id;
  uint32_t tokens;
};

struct Event {
  uint64_t arrival_ms;
  uint32_t stream;
  std::vector<Seg> prompt;
};

// Keys of a prompt's full blocks: block i's key chains its parent's with the
// pieces of segments it covers, so prompts share block i exactly when they
// share their first (i + 1) * 512 tokens.
Request ToRequest(const Event& e, uint64_t tag) {
  Request r;
  r.arrival_ms = e.arrival_ms;
  r.stream = e.stream;
  uint64_t total = 0;
  for (const Seg& s : e.prompt) total += s.tokens;
  r.prompt_tokens = total;
  uint64_t h1 = Mix(tag), h2 = Mix(tag ^ 0x5bd1e995);
  size_t seg = 0;
  uint32_t off = 0;  // tokens of e.prompt[seg] already in earlier blocks
  for (uint64_t b = 0; b < total / kBlockTokens; ++b) {
    uint32_t need = kBlockTokens;
    while (need > 0) {
      const Seg& s = e.prompt[seg];
      const uint32_t take = std::min(need, s.tokens - off);
      const uint64_t piece = Mix(s.id) ^ (uint64_t{off} << 32 | take);
      h1 = Mix(h1 ^ piece);
      h2 = Mix(h2 + piece * 0x9e3779b97f4a7c15ull);
      need -= take;
      off += take;
      if (off == s.tokens) {
        ++seg;
        off = 0;
      }
    }
    BlockKey k;
    std::memcpy(k.bytes.data(), &h1, 8);
    std::memcpy(k.bytes.data() + 8, &h2, 8);
    std::memcpy(k.bytes.data() + 16, &tag, 8);
    r.keys.push_back(k);
  }
  return r;
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint32_t Uniform(uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_); }
  double Real() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  // exp(uniform(log lo, log hi)): lengths spread over orders of magnitude.
  uint32_t LogUniform(uint32_t lo, uint32_t hi) {
    return static_cast<uint32_t>(std::exp(std::log(double(lo)) + Real() * (std::log(double(hi)) - std::log(double(lo)))));
  }
  // 1 + a geometric count with this mean of extra items, at most cap.
  uint32_t Count(double mean_extra, uint32_t cap) {
    const uint32_t n = 1 + std::geometric_distribution<uint32_t>(1.0 / (1.0 + mean_extra))(rng_);
    return std::min(n, cap);
  }
  // Ranks 0..n-1 with probability ~ 1 / (rank + 1)^s.
  uint32_t Zipf(const std::vector<double>& cdf) {
    return static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), Real() * cdf.back()) - cdf.begin());
  }
  static std::vector<double> ZipfCdf(uint32_t n, double s) {
    std::vector<double> c(n);
    double acc = 0;
    for (uint32_t i = 0; i < n; ++i) c[i] = acc += 1.0 / std::pow(double(i + 1), s);
    return c;
  }
  Seg Fresh(uint32_t tokens) { return Seg{++next_id_, std::max<uint32_t>(tokens, 1)}; }

 private:
  std::mt19937_64 rng_;
  uint64_t next_id_ = 0;
};

constexpr uint64_t kHourMs = 3600 * 1000;

// Multi-turn sessions: prompt t = base + turns 1..t (each a fresh segment),
// next turn after a gap; start times uniform over the hour.
struct SessionShape {
  uint32_t sessions;
  double mean_extra_turns;
  uint32_t max_turns;
  uint32_t turn_lo, turn_hi;     // tokens a turn adds (user text and reply)
  uint32_t gap_lo_s, gap_hi_s;   // seconds between turns
  double long_gap_share = 0;     // turns that wait long_gap_s instead
  uint32_t long_gap_lo_s = 0, long_gap_hi_s = 0;
};
void AddSessions(Gen& g, const SessionShape& s, uint32_t& stream, std::vector<Event>& out,
                 const std::function<std::vector<Seg>(Gen&)>& base) {
  for (uint32_t i = 0; i < s.sessions; ++i) {
    std::vector<Seg> prompt = base(g);
    uint64_t t = static_cast<uint64_t>(g.Real() * double(kHourMs));
    const uint32_t turns = g.Count(s.mean_extra_turns, s.max_turns);
    const uint32_t id = stream++;
    for (uint32_t k = 0; k < turns; ++k) {
      prompt.push_back(g.Fresh(g.Uniform(s.turn_lo, s.turn_hi)));
      out.push_back(Event{t, id, prompt});
      const bool long_gap = s.long_gap_share > 0 && g.Real() < s.long_gap_share;
      t += 1000ull * (long_gap ? g.Uniform(s.long_gap_lo_s, s.long_gap_hi_s) : g.Uniform(s.gap_lo_s, s.gap_hi_s));
    }
  }
}

Workload Finish(std::vector<Event> events, const std::string& name, uint64_t seed, const std::string& params) {
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.arrival_ms < b.arrival_ms; });
  Workload w;
  w.block_tokens = kBlockTokens;
  const uint64_t tag = Mix(std::hash<std::string>{}(name)) ^ seed;
  for (const Event& e : events) w.requests.push_back(ToRequest(e, tag));
  w.description = absl::StrCat("suite workload ", name, " (seed ", seed, "; ", w.requests.size(), " requests, ",
                               kBlockTokens, "-token blocks; ", params, ")");
  return w;
}

const char kAgentParams[] =
    "16 tool prefixes of 6K-24K tokens, Zipf 1.0; 3000 sessions over 1 h, each a 300-2000-token task and "
    "1+geometric(5) steps (at most 40) of 500-4000 tokens, 2-30 s apart (10%: 60-300 s)";
Workload Agent(uint64_t seed) {
  Gen g(seed);
  std::vector<Seg> apps;
  for (int i = 0; i < 16; ++i) apps.push_back(g.Fresh(g.Uniform(6000, 24000)));
  const std::vector<double> pop = Gen::ZipfCdf(16, 1.0);
  std::vector<Event> ev;
  uint32_t stream = 0;
  AddSessions(g, {3000, 5, 40, 500, 4000, 2, 30, 0.1, 60, 300}, stream, ev, [&](Gen& gg) {
    return std::vector<Seg>{apps[gg.Zipf(pop)], gg.Fresh(gg.Uniform(300, 2000))};
  });
  return Finish(std::move(ev), "agent", seed, kAgentParams);
}

const char kDocQaParams[] =
    "12000 questions over 1 h; 4 system prompts of 1.5K tokens; 55% ask about one of 300 documents (Zipf 0.8), "
    "45% about a document read once; documents 4K-48K tokens (log-uniform); questions 30-300 tokens";
Workload DocQa(uint64_t seed) {
  Gen g(seed);
  std::vector<Seg> sys, docs;
  for (int i = 0; i < 4; ++i) sys.push_back(g.Fresh(1536));
  for (int i = 0; i < 300; ++i) docs.push_back(g.Fresh(g.LogUniform(4000, 48000)));
  const std::vector<double> pop = Gen::ZipfCdf(300, 0.8);
  std::vector<Event> ev;
  for (uint32_t i = 0; i < 12000; ++i) {
    const uint64_t t = static_cast<uint64_t>(g.Real() * double(kHourMs));
    const Seg doc = g.Real() < 0.55 ? docs[g.Zipf(pop)] : g.Fresh(g.LogUniform(4000, 48000));
    ev.push_back(Event{t, i, {sys[g.Uniform(0, 3)], doc, g.Fresh(g.Uniform(30, 300))}});
  }
  return Finish(std::move(ev), "docqa", seed, kDocQaParams);
}

const char kScanParams[] =
    "1500 conversations over 1 h behind 3 system prompts of 2K tokens, 1+geometric(4) turns of 300-1400 tokens, "
    "20-240 s apart; every 10 min a batch of 150 one-off documents of 16K-64K tokens within 60 s";
Workload Scan(uint64_t seed) {
  Gen g(seed);
  std::vector<Seg> sys;
  for (int i = 0; i < 3; ++i) sys.push_back(g.Fresh(2048));
  std::vector<Event> ev;
  uint32_t stream = 0;
  AddSessions(g, {1500, 4, 30, 300, 1400, 20, 240}, stream, ev,
              [&](Gen& gg) { return std::vector<Seg>{sys[gg.Uniform(0, 2)]}; });
  for (uint64_t start = 5 * 60 * 1000; start < kHourMs; start += 10 * 60 * 1000) {
    for (int i = 0; i < 150; ++i) {
      ev.push_back(Event{start + g.Uniform(0, 60000), stream++, {g.Fresh(g.Uniform(16000, 64000))}});
    }
  }
  return Finish(std::move(ev), "scan", seed, kScanParams);
}

const char kTenantsParams[] =
    "copilot: 400 sessions, a 2K-8K-token context, 1+geometric(20) turns of 100-600 tokens 5-20 s apart; "
    "support: 1200 conversations behind one 2K system prompt, 1+geometric(3) turns of 1K-2K tokens 120-600 s "
    "apart; classify: 6000 requests, one 4K prompt and 500-3000 tokens of input; interleaved over 1 h";
Workload Tenants(uint64_t seed) {
  Gen g(seed);
  std::vector<Event> ev;
  uint32_t stream = 0;
  AddSessions(g, {400, 20, 80, 100, 600, 5, 20}, stream, ev,
              [&](Gen& gg) { return std::vector<Seg>{gg.Fresh(gg.Uniform(2000, 8000))}; });
  const Seg support = g.Fresh(2048), classify = g.Fresh(4096);
  AddSessions(g, {1200, 3, 20, 1000, 2000, 120, 600}, stream, ev,
              [&](Gen&) { return std::vector<Seg>{support}; });
  for (int i = 0; i < 6000; ++i) {
    ev.push_back(Event{static_cast<uint64_t>(g.Real() * double(kHourMs)), stream++,
                       {classify, g.Fresh(g.Uniform(500, 3000))}});
  }
  return Finish(std::move(ev), "tenants", seed, kTenantsParams);
}

const char kChatParams[] =
    "the built-in chat: 1500 conversations x 8 turns, 3 system prompts of 1024 tokens, 80-240-token user "
    "turns and 160-480-token replies, a random live conversation every 50 ms";
Workload Chat(uint64_t seed) {
  ChatOptions o;
  o.conversations = 1500;
  o.turns = 8;
  o.block_tokens = kBlockTokens;
  o.seed = seed;
  Workload w = SyntheticChat(o);
  for (Request& r : w.requests) {
    r.keys = ChainBlockKeys(HashAlgorithm::kSha256, r.tokens, w.block_tokens);
    std::vector<uint32_t>().swap(r.tokens);
  }
  w.description = absl::StrCat("suite workload chat (seed ", seed, "; ", w.requests.size(), " requests, ",
                               kBlockTokens, "-token blocks; ", kChatParams, ")");
  return w;
}

}  // namespace

const std::vector<SuiteWorkloadInfo>& SuiteWorkloads() {
  static const std::vector<SuiteWorkloadInfo> kAll = {
      {"chat", "multi-turn chat: every turn extends its conversation", kChatParams},
      {"agent", "agent / tool loops: long shared tool prefixes, short steps seconds apart", kAgentParams},
      {"docqa", "document QA: a few popular long documents, many read once", kDocQaParams},
      {"scan", "chat with bursts of long one-off batch documents", kScanParams},
      {"tenants", "three tenants interleaved: short gaps, long gaps, one-shot", kTenantsParams},
  };
  return kAll;
}

absl::StatusOr<Workload> MakeSuiteWorkload(const std::string& name, uint64_t seed) {
  if (name == "chat") return Chat(seed);
  if (name == "agent") return Agent(seed);
  if (name == "docqa") return DocQa(seed);
  if (name == "scan") return Scan(seed);
  if (name == "tenants") return Tenants(seed);
  std::vector<std::string> names;
  for (const auto& w : SuiteWorkloads()) names.push_back(w.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown suite workload \"", name, "\"; known: ", absl::StrJoin(names, ", ")));
}

}  // namespace kvtier::tools
