// SPDX-License-Identifier: Apache-2.0
#include "tools/kvtierctl/capacity.h"

#include <sys/stat.h>

#include <ostream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/units.h"
#include "daemon/lower_kinds.h"
#include "tools/common/table.h"
#include "tools/common/trace.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kTraceBlockTokens = 512;  // the Mooncake trace's hash_ids

std::string GiB(uint64_t bytes) { return absl::StrFormat("%.3f GiB", double(bytes) / double(1ull << 30)); }

absl::StatusOr<ModelProfile> ReadModel(const CapacityInput& in) {
  return ModelProfile::FromHfConfigFile(in.model_path, /*kv_only=*/true, in.dtype);
}

// Sequence lengths (input_length) and distinct prefix blocks of a trace.
absl::Status ReadTrace(const std::string& path, std::vector<uint64_t>* seqs, uint64_t* distinct) {
  ASSIGN_OR_RETURN(TraceReader trace, TraceReader::Open(path));
  absl::flat_hash_set<uint64_t> ids;
  TraceRecord r;
  for (;;) {
    ASSIGN_OR_RETURN(bool more, trace.Next(&r));
    if (!more) break;
    seqs->push_back(r.input_length);
    ids.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  if (seqs->empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": the trace holds no requests"));
  *distinct = ids.size();
  return absl::OkStatus();
}

absl::StatusOr<Config> ReadConfig(const std::string& given, std::string* source) {
  const std::string path = given.empty() ? "/etc/kvtier/kvtierd.toml" : given;
  absl::StatusOr<Config> c = LoadConfigFile(path);
  if (c.ok()) {
    *source = path;
    return c;
  }
  if (absl::IsNotFound(c.status()) && given.empty()) {
    *source = "kvtierd's embedded defaults";
    return DefaultConfig();
  }
  return c.status();
}

}  // namespace

absl::StatusOr<CapacityPlan> PlanCapacity(const CapacityInput& in) {
  if (in.block_tokens == 0) return absl::InvalidArgumentError("--block-tokens must be at least 1");
  if (in.seqs.empty() == in.trace_path.empty()) {
    return absl::InvalidArgumentError("give the sequence lengths with --seq (one or more), or a trace with --trace");
  }
  CapacityPlan p;
  ASSIGN_OR_RETURN(p.model, ReadModel(in));
  std::vector<uint64_t> seqs = in.seqs;
  if (!in.trace_path.empty()) RETURN_IF_ERROR(ReadTrace(in.trace_path, &seqs, &p.distinct_trace_blocks));
  ASSIGN_OR_RETURN(Config config, ReadConfig(in.config_path, &p.config_source));

  // Every product below comes from files (the model's config, the trace,
  // kvtierd's config): checked, so a hostile one is refused instead of
  // wrapping (a block of 0 bytes was a division by zero).
  auto too_big = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(what, " does not fit in 64 bits"));
  };
  p.bytes_per_token = p.model.KvBytesPerToken();  // checked by FromHfConfig
  p.block_tokens = in.block_tokens;
  const std::optional<uint64_t> block_bytes = CheckedMul<uint64_t>(p.bytes_per_token, in.block_tokens);
  if (!block_bytes) return too_big(absl::StrCat(in.model_path, ": a block of ", in.block_tokens, " tokens"));
  p.block_bytes = *block_bytes;
  p.sequences = seqs.size();
  for (uint64_t s : seqs) {
    const std::optional<uint64_t> sum = CheckedAdd(p.logical_tokens, s);
    if (!sum) return too_big("the sum of the sequence lengths");
    p.logical_tokens = *sum;
  }
  const std::optional<uint64_t> logical = CheckedMul(p.logical_tokens, p.bytes_per_token);
  if (!logical) return too_big(absl::StrCat(in.model_path, ": the logical KV cache of those sequences, in bytes,"));
  p.logical_bytes = *logical;
  const std::optional<uint64_t> working_set =
      CheckedProduct({p.distinct_trace_blocks, kTraceBlockTokens, p.bytes_per_token});
  if (!working_set) return too_big(absl::StrCat(in.trace_path, ": the trace's working set, in bytes,"));
  p.trace_working_set_bytes = *working_set;

  // What each tier can hold, summed over the tenants that have their own.
  uint64_t host = 0;
  for (const TenantConfig& t : config.tenants) {
    const std::optional<uint64_t> sum = CheckedAdd(host, t.host_bytes != 0 ? t.host_bytes : config.host_capacity);
    if (!sum) return too_big(absl::StrCat(p.config_source, ": the tenants' host capacity"));
    host = *sum;
  }
  if (config.tenants.empty()) host = config.host_capacity;
  const uint64_t tenants = std::max<uint64_t>(1, config.tenants.size());
  const std::optional<uint64_t> gpu = CheckedMul(config.gpu_capacity, tenants);
  if (!gpu) return too_big(absl::StrCat(p.config_source, ": the tenants' GPU capacity"));
  auto add = [&](std::string name, std::string kind, uint64_t capacity_bytes, uint64_t blocks) {
    TierPlan t{.tier = std::move(name), .kind = std::move(kind), .capacity_bytes = capacity_bytes, .blocks = blocks};
    t.tokens = t.blocks * in.block_tokens;
    t.share_of_logical = p.logical_tokens == 0 ? 0 : double(t.tokens) / double(p.logical_tokens);
    p.tiers.push_back(std::move(t));
  };
  add("gpu", "gpu", *gpu, *gpu / p.block_bytes);
  add("host", "host", host, host / p.block_bytes);
  // The lower tiers in chain order, each by its name, as its kind counts
  // what fits (NVMe: whole segments, a header sector a slot; fs: a header
  // a file).
  for (const Config::LowerEntry& e : config.LowerChain()) {
    const LowerTierKind* k = FindLowerTierKind(e.kind);
    if (k == nullptr || k->fit == nullptr) continue;
    const LowerTierKind::Fit fit = k->fit(config.OptionsOf(e), p.block_bytes);
    add(e.name, e.kind, fit.capacity_bytes, fit.blocks);
  }
  return p;
}

void PrintCapacity(const CapacityPlan& p, std::ostream& out) {
  const ModelProfile& m = p.model;
  out << "model " << m.name << ": " << m.layers << " layers, " << m.kv_heads << " KV heads x " << m.head_dim
      << " head_dim, " << m.dtype << " (" << m.dtype_bytes << " bytes)\n"
      << "bytes per token: " << p.bytes_per_token << " (" << FormatBytes(p.bytes_per_token) << ") = 2 x "
      << m.layers << " layers x " << m.kv_heads << " KV heads x " << m.head_dim << " head_dim x " << m.dtype_bytes
      << " bytes\n"
      << "logical KV cache: " << GiB(p.logical_bytes) << " for " << p.sequences << " sequence"
      << (p.sequences == 1 ? "" : "s") << " (" << p.logical_tokens << " tokens)\n";
  if (p.distinct_trace_blocks != 0) {
    out << "trace working set: " << p.distinct_trace_blocks << " distinct " << kTraceBlockTokens
        << "-token prefix blocks = " << GiB(p.trace_working_set_bytes)
        << " (what holding every reusable prefix takes)\n";
  }
  out << "\ntiers of " << p.config_source << ", in " << p.block_tokens << "-token blocks of "
      << FormatBytes(p.block_bytes) << ":\n";
  Table t({"TIER", "KIND", "CAPACITY", "BLOCKS", "TOKENS", "OF THE SEQUENCES"});
  for (const TierPlan& tp : p.tiers) {
    t.AddRow({tp.tier, tp.kind, tp.capacity_bytes == 0 ? "off" : FormatBytes(tp.capacity_bytes), absl::StrCat(tp.blocks),
              absl::StrCat(tp.tokens), tp.capacity_bytes == 0 ? "-" : Fixed(100.0 * tp.share_of_logical, 1) + "%"});
  }
  t.Print(out);
}

nlohmann::json CapacityJson(const CapacityPlan& p) {
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierPlan& t : p.tiers) {
    tiers.push_back({{"tier", t.tier},
                     {"kind", t.kind},
                     {"capacity_bytes", t.capacity_bytes},
                     {"blocks", t.blocks},
                     {"tokens", t.tokens},
                     {"share_of_logical", t.share_of_logical}});
  }
  nlohmann::json j = {{"model",
                       {{"config", p.model.name},
                        {"layers", p.model.layers},
                        {"kv_heads", p.model.kv_heads},
                        {"head_dim", p.model.head_dim},
                        {"dtype", p.model.dtype},
                        {"dtype_bytes", p.model.dtype_bytes}}},
                      {"bytes_per_token", p.bytes_per_token},
                      {"block_tokens", p.block_tokens},
                      {"block_bytes", p.block_bytes},
                      {"sequences", p.sequences},
                      {"logical_tokens", p.logical_tokens},
                      {"logical_bytes", p.logical_bytes},
                      {"logical_gib", double(p.logical_bytes) / double(1ull << 30)},
                      {"config_source", p.config_source},
                      {"tiers", tiers}};
  if (p.distinct_trace_blocks != 0) {
    j["trace_distinct_blocks"] = p.distinct_trace_blocks;
    j["trace_working_set_bytes"] = p.trace_working_set_bytes;
  }
  return j;
}

}  // namespace kvtier::tools
