#include "tools/kvtierctl/capacity.h"

#include <sys/stat.h>

#include <fstream>
#include <ostream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/units.h"
#include "tools/common/table.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kTraceBlockTokens = 512;  // the Mooncake trace's hash_ids

std::string GiB(uint64_t bytes) { return absl::StrFormat("%.3f GiB", double(bytes) / double(1ull << 30)); }

absl::StatusOr<ModelProfile> ReadModel(const CapacityInput& in) {
  std::ifstream f(in.model_path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the model config ", in.model_path));
  std::stringstream ss;
  ss << f.rdbuf();
  if (in.dtype.empty()) return ModelProfile::FromHfConfig(ss.str(), in.model_path, /*kv_only=*/true);
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(in.model_path, ": not a JSON object"));
  }
  nlohmann::json& target = j.contains("text_config") && j["text_config"].is_object() && !j.contains("num_hidden_layers")
                               ? j["text_config"]
                               : j;
  target["torch_dtype"] = in.dtype;
  return ModelProfile::FromHfConfig(j.dump(), in.model_path, /*kv_only=*/true);
}

// Sequence lengths (input_length) and distinct prefix blocks of a trace.
absl::Status ReadTrace(const std::string& path, std::vector<uint64_t>* seqs, uint64_t* distinct) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the trace ", path));
  absl::flat_hash_set<int64_t> ids;
  std::string line;
  for (uint64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("input_length") ||
        !j["input_length"].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": not a trace record (an object with a non-negative \"input_length\")"));
    }
    seqs->push_back(j["input_length"].get<uint64_t>());
    if (j.contains("hash_ids") && j["hash_ids"].is_array()) {
      for (const auto& id : j["hash_ids"]) {
        if (id.is_number_integer()) ids.insert(id.get<int64_t>());
      }
    }
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

  p.bytes_per_token = p.model.KvBytesPerToken();
  p.block_tokens = in.block_tokens;
  p.block_bytes = p.bytes_per_token * in.block_tokens;
  p.sequences = seqs.size();
  for (uint64_t s : seqs) p.logical_tokens += s;
  p.logical_bytes = p.logical_tokens * p.bytes_per_token;

  // What each tier can hold, summed over the tenants that have their own.
  uint64_t host = 0;
  for (const TenantConfig& t : config.tenants) host += t.host_bytes != 0 ? t.host_bytes : config.host_capacity;
  if (config.tenants.empty()) host = config.host_capacity;
  const uint64_t tenants = std::max<uint64_t>(1, config.tenants.size());
  const std::pair<const char*, uint64_t> tiers[] = {
      {"gpu", config.gpu_capacity * tenants}, {"host", host}, {"nvme", config.nvme_capacity}};
  for (const auto& [name, bytes] : tiers) {
    TierPlan t;
    t.tier = name;
    t.capacity_bytes = bytes;
    t.blocks = bytes / p.block_bytes;
    t.tokens = t.blocks * in.block_tokens;
    t.share_of_logical = p.logical_tokens == 0 ? 0 : double(t.tokens) / double(p.logical_tokens);
    p.tiers.push_back(t);
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
    const uint64_t tokens = p.distinct_trace_blocks * kTraceBlockTokens;
    out << "trace working set: " << p.distinct_trace_blocks << " distinct " << kTraceBlockTokens
        << "-token prefix blocks = " << GiB(tokens * p.bytes_per_token)
        << " (what holding every reusable prefix takes)\n";
  }
  out << "\ntiers of " << p.config_source << ", in " << p.block_tokens << "-token blocks of "
      << FormatBytes(p.block_bytes) << ":\n";
  Table t({"TIER", "CAPACITY", "BLOCKS", "TOKENS", "OF THE SEQUENCES"});
  for (const TierPlan& tp : p.tiers) {
    t.AddRow({tp.tier, tp.capacity_bytes == 0 ? "off" : FormatBytes(tp.capacity_bytes), absl::StrCat(tp.blocks),
              absl::StrCat(tp.tokens), tp.capacity_bytes == 0 ? "-" : Fixed(100.0 * tp.share_of_logical, 1) + "%"});
  }
  t.Print(out);
}

nlohmann::json CapacityJson(const CapacityPlan& p) {
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierPlan& t : p.tiers) {
    tiers.push_back({{"tier", t.tier},
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
    j["trace_working_set_bytes"] = p.distinct_trace_blocks * kTraceBlockTokens * p.bytes_per_token;
  }
  return j;
}

}  // namespace kvtier::tools
