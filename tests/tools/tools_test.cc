// SPDX-License-Identifier: Apache-2.0
// The tools as a user runs them: real binaries against a real kvtierd,
// checking what they print and how they exit.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "core/unique_fd.h"
#include "ipc/unix_socket.h"
#include "nlohmann/json.hpp"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using Output = testing::CommandOutput;
using testing::RunCommand;

std::string Tool(const std::string& name) {
  const char* dir = std::getenv("KVTIER_BUILD_DIR");
  return std::string(dir ? dir : ".") + "/tools/" + name;
}

TEST(ToolsTest, KvtierctlStatusInBothForms) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start().ok());
  const std::string ctl = Tool("kvtierctl") + " --socket " + d.admin_socket_path();
  Output human = RunCommand(ctl + " status");
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("TIER"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("host"), std::string::npos);
  EXPECT_NE(human.out.find("default"), std::string::npos);
  EXPECT_NE(human.out.find("missed"), std::string::npos);
  // The cost model's fit (the prior until engines report) and the decisions.
  EXPECT_NE(human.out.find("cost model default (Llama-3.1-8B shape): prefill 300.0 TFLOP/s (prior"),
            std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("decisions: hits loaded from local lower tiers 0, reported recompute 0"), std::string::npos);
  EXPECT_NE(human.out.find("EVICTING BY"), std::string::npos);
  Output js = RunCommand(ctl + " --json status");
  ASSERT_EQ(js.exit_code, 0);
  nlohmann::json j = nlohmann::json::parse(js.out);
  EXPECT_TRUE(j["sessions"].is_array());
  EXPECT_TRUE(j["tenants"].is_array());
  ASSERT_EQ(j["tiers"].size(), 1u);
  EXPECT_EQ(j["tiers"][0]["tier"], "host");
  EXPECT_TRUE(j["stats"].contains("hit_rate"));
  EXPECT_TRUE(j["stats"].contains("reused_token_ratio"));
  EXPECT_EQ(j["cost_model"]["prefill_reports"], 0);
  EXPECT_EQ(j["tiers"][0]["policy"], "adaptive");
  // --json and --socket after the subcommand, as the docs write them, down
  // to a nested one; the same answer as before it.
  const std::string sock = " --socket " + d.admin_socket_path();
  for (const std::string& cmd : {Tool("kvtierctl") + " status --json" + sock, Tool("kvtierctl") + " tiers --json" + sock,
                                 Tool("kvtierctl") + " config show --json" + sock,
                                 Tool("kvtierctl") + " top --json -n 1" + sock}) {
    Output after = RunCommand(cmd);
    ASSERT_EQ(after.exit_code, 0) << cmd << "\n" << after.out;
    EXPECT_TRUE(nlohmann::json::parse(after.out, nullptr, false).is_object()) << cmd << "\n" << after.out;
  }
  EXPECT_TRUE(nlohmann::json::parse(RunCommand(Tool("kvtierctl") + " status" + sock + " --json").out)["stats"]
                  .contains("hit_rate"));
  d.Stop();
  EXPECT_EQ(RunCommand(ctl + " status 2>/dev/null").exit_code, 1) << "unreachable daemon: exit 1";
  EXPECT_EQ(RunCommand(Tool("kvtierctl") + " frobnicate 2>/dev/null").exit_code, 2) << "usage error";
}

std::string WriteFile(const std::string& name, const std::string& text) {
  // A folder of this process's, removed when it exits: nothing is left in /tmp.
  static const testing::TempDir dir;
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The issue's example: 32 layers, hidden 4096, 32 heads, fp16, sequences of
// 4096 and 2048 tokens: 3 GiB with 32 KV heads, 0.75 GiB with 8.
TEST(ToolsTest, CapacityPlannerGivesBytesPerTokenAndTheLogicalCache) {
  const std::string ctl = Tool("kvtierctl");
  const std::string mha = WriteFile(
      "mha.json", R"({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "torch_dtype": "float16"})");
  const std::string gqa = WriteFile("gqa.json", R"({"num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "dtype": "float16"})");
  Output a = RunCommand(ctl + " capacity --model " + mha + " --seq 4096 --seq 2048 --config /nonexistent 2>&1");
  EXPECT_EQ(a.exit_code, 4) << "a kvtierd config that was named must exist: " << a.out;
  a = RunCommand(ctl + " capacity --model " + mha + " --seq 4096 --seq 2048");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_NE(a.out.find("3.000 GiB"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("bytes per token: 524288"), std::string::npos) << a.out;
  Output b = RunCommand(ctl + " capacity --model " + gqa + " --seq 4096 --seq 2048");
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_NE(b.out.find("0.750 GiB"), std::string::npos) << b.out;

  // Tiers of a given config: 64 MiB host, 1 GiB GPU, no NVMe, 2 MiB blocks
  // (16 tokens x 128 KiB per token with 8 KV heads).
  const std::string toml = WriteFile("kvtierd.toml", "[tiers.host]\ncapacity = \"64MiB\"\n[tiers.gpu]\n"
                                                     "capacity = \"1GiB\"\n[tiers.nvme]\ncapacity = 0\n");
  Output js = RunCommand(ctl + " --json capacity -m " + gqa + " --seq 4096 --seq 2048 -c " + toml);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  nlohmann::json j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["bytes_per_token"], 131072);
  EXPECT_EQ(j["logical_bytes"], 6144ull * 131072);
  EXPECT_DOUBLE_EQ(j["logical_gib"].get<double>(), 0.75);
  std::map<std::string, uint64_t> tokens;
  for (const auto& t : j["tiers"]) tokens[t["tier"]] = t["tokens"];
  EXPECT_EQ(tokens["host"], 512u);   // 32 blocks of 2 MiB
  EXPECT_EQ(tokens["gpu"], 8192u);   // 512 blocks
  EXPECT_FALSE(tokens.contains("nvme")) << "capacity 0: no NVMe tier in the chain, no row";
  // NVMe as the tier cuts it: 150 MiB over 2 directories in 16 MiB
  // segments is 8 segments of 7 slots of 2 MiB (a header sector each): 56
  // blocks, not 75 (the planner once counted capacity / block size).
  const std::string nvme = WriteFile("nvme.toml", "[tiers.nvme]\ndirs = [\"/a\", \"/b\"]\ncapacity = \"150MiB\"\n"
                                                  "segment_bytes = \"16MiB\"\n");
  js = RunCommand(ctl + " --json capacity -m " + gqa + " --seq 4096 -c " + nvme);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const nlohmann::json planned = nlohmann::json::parse(js.out);  // kept: the loop must not outlive it
  for (const auto& t : planned["tiers"]) {
    if (t["tier"] == "nvme") {
      EXPECT_EQ(t["blocks"], 56u) << t.dump();
    }
  }

  // The chain's tiers in order, each by its name and kind, as the kind
  // counts what fits: a file of the fs tier is a 104-byte header and the
  // block, so 150 MiB holds 74 blocks of 2 MiB, not 75.
  const std::string chain = WriteFile(
      "chain.toml",
      "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/a\"\ncapacity = \"150MiB\"\n"
      "[[tiers.lower]]\nkind = \"fs\"\nname = \"archive\"\ndir = \"/b\"\ncapacity = \"20MiB\"\n");
  js = RunCommand(ctl + " --json capacity -m " + gqa + " --seq 4096 -c " + chain);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const nlohmann::json lowered = nlohmann::json::parse(js.out);
  std::vector<std::string> rows;
  for (const auto& t : lowered["tiers"]) rows.push_back(t["tier"].get<std::string>() + ":" + t["kind"].get<std::string>());
  EXPECT_EQ(rows, (std::vector<std::string>{"gpu:gpu", "host:host", "fs:fs", "archive:fs"})) << lowered.dump();
  EXPECT_EQ(lowered["tiers"][2]["blocks"], 74u) << lowered.dump();
  EXPECT_EQ(lowered["tiers"][3]["blocks"], 9u) << lowered.dump();
  EXPECT_EQ(lowered["tiers"][3]["capacity_bytes"], 20ull << 20);
  Output table = RunCommand(ctl + " capacity -m " + gqa + " --seq 4096 -c " + chain);
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("archive"), std::string::npos) << table.out;

  // A trace: its prompt lengths, and the distinct prefix blocks it reuses.
  const std::string trace = WriteFile("trace.jsonl",
                                      "{\"input_length\": 1024, \"hash_ids\": [0, 1]}\n"
                                      "{\"input_length\": 1536, \"hash_ids\": [0, 1, 2]}\n");
  js = RunCommand(ctl + " --json capacity -m " + gqa + " --trace " + trace);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["logical_tokens"], 2560);
  EXPECT_EQ(j["trace_distinct_blocks"], 3);
  EXPECT_EQ(j["trace_working_set_bytes"], 3ull * 512 * 131072);
}

TEST(ToolsTest, CapacityPlannerNamesWhatIsMissing) {
  const std::string ctl = Tool("kvtierctl");
  const std::string no_heads =
      WriteFile("no_heads.json", R"({"num_hidden_layers": 32, "hidden_size": 4096, "torch_dtype": "float16"})");
  Output o = RunCommand(ctl + " capacity -m " + no_heads + " --seq 100 2>&1");
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_NE(o.out.find("num_attention_heads"), std::string::npos) << o.out;
  const std::string no_dtype =
      WriteFile("no_dtype.json", R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})");
  o = RunCommand(ctl + " capacity -m " + no_dtype + " --seq 100 2>&1");
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_NE(o.out.find("torch_dtype"), std::string::npos) << o.out;
  o = RunCommand(ctl + " --json capacity -m " + no_dtype + " --seq 100 --dtype bfloat16");
  ASSERT_EQ(o.exit_code, 0) << "--dtype supplies it";
  EXPECT_EQ(nlohmann::json::parse(o.out)["bytes_per_token"], 2 * 2 * 4 * 16 * 2);
  o = RunCommand(ctl + " capacity -m " + no_dtype + " --seq 100 --dtype float13 2>&1");
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_NE(o.out.find("float13"), std::string::npos) << o.out;
  EXPECT_EQ(RunCommand(ctl + " capacity -m " + no_dtype + " 2>/dev/null").exit_code, 2) << "no sequences: usage";
  EXPECT_EQ(RunCommand(ctl + " capacity -m /nonexistent.json --seq 1 2>/dev/null").exit_code, 4);
  const std::string bad_trace = WriteFile("bad.jsonl", "{\"input_length\": 5}\nnot json\n");
  o = RunCommand(ctl + " capacity -m " + no_dtype + " --dtype float16 --trace " + bad_trace + " 2>&1");
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_NE(o.out.find("bad.jsonl:2"), std::string::npos) << "the line at fault: " << o.out;
}

// Whatever a model's config.json or a trace holds, `kvtierctl capacity`
// exits 4 with one line naming the file and the field; before, a product of
// dimensions that wrapped to 0 was a division by zero (SIGFPE) and a wrong
// type was an uncaught exception.
TEST(ToolsTest, CapacityPlannerRefusesHostileInputWithExit4) {
  testing::TempDir dir;
  const std::string ctl = Tool("kvtierctl");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.File(name), std::ios::binary) << text;
    return dir.File(name);
  };
  const std::string base = R"("num_hidden_layers": 2, "hidden_size": 64, "torch_dtype": "float16")";
  const std::vector<std::pair<std::string, std::string>> models = {  // text, what the message names
      {"{" + base + R"(, "num_attention_heads": 0})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 4, "num_key_value_heads": 0})", "num_key_value_heads"},
      {"{" + base + R"(, "num_attention_heads": -4})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": "4"})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": [4]})", "num_attention_heads"},
      {"{" + base + R"(, "num_attention_heads": 4, "head_dim": 1e999})", "not valid JSON"},
      {"{" + base + R"(, "num_attention_heads": 4, "head_dim": 18446744073709551616})", "head_dim"},
      {R"({"num_hidden_layers": 16777216, "hidden_size": 16777216, "num_attention_heads": 16777216,
          "head_dim": 16777216, "torch_dtype": "float32"})", "64 bits"},
      {R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "torch_dtype": 2})", "torch_dtype"},
      {"[]", "not a JSON object"},
      {"NaN", "not valid JSON"},
      {R"({"text_config": {"x": )" + std::string(200000, '[') + std::string(200000, ']') + "}}", "nested deeper"},
  };
  for (const auto& [text, field] : models) {
    for (const char* dtype : {"", " --dtype bfloat16"}) {
      if (field == "torch_dtype" && *dtype != '\0') continue;  // --dtype replaces it
      Output o = RunCommand(ctl + " capacity -m " + write("model.json", text) + dtype + " --seq 100 2>&1");
      EXPECT_EQ(o.exit_code, 4) << text.substr(0, 200) << dtype << ": " << o.out;
      EXPECT_NE(o.out.find(field), std::string::npos) << text.substr(0, 200) << ": " << o.out;
      EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << "one line: " << o.out;
    }
  }
  // Dimensions that fit, but whose blocks do not: --block-tokens times the
  // bytes per token (2^61) passes 64 bits.
  const std::string big = write("big.json", R"({"num_hidden_layers": 16777216, "hidden_size": 16777216,
      "num_attention_heads": 16777216, "head_dim": 16777216, "num_key_value_heads": 4096, "torch_dtype": "int8"})");
  Output o = RunCommand(ctl + " capacity -m " + big + " --seq 1 --block-tokens 16 2>&1");
  EXPECT_EQ(o.exit_code, 4) << o.out;
  EXPECT_NE(o.out.find("64 bits"), std::string::npos) << o.out;

  const std::string model = write("ok.json", "{" + base + R"(, "num_attention_heads": 4})");
  const std::vector<std::pair<std::string, std::string>> traces = {
      {"{\"input_length\": -5}\n", "trace.jsonl:1: \"input_length\""},
      {"{\"input_length\": \"5\"}\n", "trace.jsonl:1: \"input_length\""},
      {"{\"input_length\": 5, \"hash_ids\": 7}\n", "trace.jsonl:1: \"hash_ids\""},
      {"{\"input_length\": 5, \"hash_ids\": [\"a\"]}\n", "trace.jsonl:1: \"hash_ids\""},
      {"{\"input_length\": 5, \"timestamp\": \"noon\"}\n", "trace.jsonl:1: \"timestamp\""},
      {"{\"input_length\": 5}\n{\"input_length\": 18446744073709551615}\n", "trace.jsonl:2: \"input_length\""},
      {"{\"input_length\": 5}\n{\"input_len", "trace.jsonl:2: not a trace record"},
      {std::string("\x00\xff\xfe\x1b[2J\n", 7), "trace.jsonl:1: not a trace record"},
      {"{\"input_length\": 5, \"hash_ids\": [" + std::string(300000, '1') + "]}\n", "trace.jsonl:1: "},
      {"{\"input_length\": 5, \"x\": " + std::string(100000, '[') + "\n", "trace.jsonl:1: not a trace record"},
  };
  for (const auto& [text, what] : traces) {
    o = RunCommand(ctl + " capacity -m " + model + " --trace " + write("trace.jsonl", text) + " 2>&1");
    EXPECT_EQ(o.exit_code, 4) << text.substr(0, 100) << ": " << o.out;
    EXPECT_NE(o.out.find(what), std::string::npos) << text.substr(0, 100) << ": " << o.out;
    EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << "one line: " << o.out;
  }
  // Lengths each in range whose sum is not: 1024 requests of 2^25 tokens,
  // 2^35 tokens of 2^30 bytes, pass 64 bits (they wrapped before).
  std::string many;
  for (int i = 0; i < 1024; ++i) many += "{\"input_length\": 33554432}\n";
  const std::string huge = write("huge.json", R"({"num_hidden_layers": 16777216, "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "torch_dtype": "int8"})");
  o = RunCommand(ctl + " capacity -m " + huge + " --trace " + write("many.jsonl", many) + " 2>&1");
  EXPECT_EQ(o.exit_code, 4) << o.out;
  EXPECT_NE(o.out.find("64 bits"), std::string::npos) << o.out;
  // A line past 1 MiB is refused without being held whole.
  std::ofstream(dir.File("long.jsonl")) << "{\"input_length\": 5, \"pad\": \"" << std::string(2 << 20, 'x') << "\"}\n";
  o = RunCommand(ctl + " capacity -m " + model + " --trace " + dir.File("long.jsonl") + " 2>&1");
  EXPECT_EQ(o.exit_code, 4) << o.out.substr(0, 200);
  EXPECT_NE(o.out.find("long.jsonl:1: a line longer than 1 MiB"), std::string::npos) << o.out.substr(0, 200);
}

// A fake kvtierd: answers every admin connection with the same bytes.
class FakeAdmin {
 public:
  explicit FakeAdmin(const std::string& path) : path_(path) {
    auto fd = ipc::ListenUnix(path, SOCK_STREAM, 0600);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (fd.ok()) listen_ = std::move(*fd);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeAdmin() {
    shutdown(listen_.get(), SHUT_RDWR);  // accept() returns
    thread_.join();
  }
  void Answer(std::string a) {
    std::lock_guard<std::mutex> l(mu_);
    answer_ = std::move(a);
  }
  // A JSON text written over several lines for the reader, as one line.
  void AnswerLine(std::string a) {
    std::replace(a.begin(), a.end(), '\n', ' ');
    Answer(a + "\n");
  }
  const std::string& path() const { return path_; }

 private:
  void Serve() {
    for (;;) {
      const int c = accept(listen_.get(), nullptr, nullptr);
      if (c < 0) {
        if (errno == EINTR) continue;
        return;
      }
      char buf[4096];
      std::string req;
      while (req.find('\n') == std::string::npos) {
        const ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        req.append(buf, size_t(n));
      }
      std::string a;
      {
        std::lock_guard<std::mutex> l(mu_);
        a = answer_;
      }
      for (size_t off = 0; off < a.size();) {
        const ssize_t n = send(c, a.data() + off, a.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;  // kvtierctl stopped reading
        off += size_t(n);
      }
      close(c);
    }
  }
  std::string path_;
  UniqueFd listen_;
  std::mutex mu_;
  std::string answer_;
  std::thread thread_;
};

// Whatever listens on the admin socket, kvtierctl exits 0, 3 or 4 with a
// message: never an uncaught exception (a wrong type read with get<>, a
// missing key read with operator[]), a stack overflow or an endless read;
// and no terminal control sequence from the daemon's strings reaches the
// terminal.
TEST(ToolsTest, KvtierctlSurvivesAHostileDaemon) {
  testing::TempDir dir;
  FakeAdmin fake(dir.File("admin.sock"));
  const std::string ctl = Tool("kvtierctl") + " --socket " + fake.path();
  const std::vector<std::string> commands = {"status", "tiers", "sessions", "tenants", "top -n 1 -i 0.05",
                                             "blocks ls", "blocks inspect " + std::string(64, 'a'), "evict --tenant a", "flush",
                                             "drain", "config show"};
  // Answers that are not an admin response at all: exit 3, with why.
  const std::vector<std::pair<std::string, std::string>> unreadable = {
      {"not json\n", "not valid JSON"},
      {"[1, 2]\n", "not a JSON object"},
      {"{\"ok\": \"yes\"}\n", "\"ok\""},
      {"{\"ok\": 1}\n", "\"ok\""},
      {"{\"ok\": true, \"config\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}\n", "nested deeper"},
      {std::string(17u << 20, 'x'), "longer than 16 MiB"},
  };
  for (const auto& [answer, why] : unreadable) {
    fake.Answer(answer);
    for (const std::string& cmd : {std::string("status"), std::string("config show")}) {
      Output o = RunCommand(ctl + " " + cmd + " 2>&1");
      EXPECT_EQ(o.exit_code, 3) << cmd << " <- " << answer.substr(0, 60) << ": " << o.out.substr(0, 300);
      EXPECT_NE(o.out.find(why), std::string::npos) << cmd << " <- " << answer.substr(0, 60) << ": " << o.out;
    }
  }
  // A refusal whose error is not a string.
  fake.Answer("{\"ok\": false, \"error\": {\"x\": 1}}\n");
  EXPECT_EQ(RunCommand(ctl + " status 2>/dev/null").exit_code, 3);

  // Objects of the wrong shape: every field missing, or of another type.
  // The printers show "-" (or 0) where a field cannot be read.
  const std::string wrong = R"({"ok": true, "version": 7, "pid": "x", "uptime_s": "long", "device": [1],
      "tiers": [5, {"tier": 3, "capacity_bytes": "lots", "used_bytes": -1, "policies": 2}, [], "host"],
      "tenants": {"name": "a"}, "sessions": [1, {"id": "s", "client": 5, "model": null}],
      "cost_model": [], "stats": {"hit_rate": "high", "lookups": {"n": 1}}, "blocks": [7, {"key": 5,
      "tiers": "host", "moving": "yes"}], "config": {"a": {"b": [1, {"c": 2}]}}, "failed": "none",
      "timed_out": 1, "evicted": [], "tenant": 4, "journal": 5})";
  for (const std::string& answer : {std::string("{\"ok\": true}"), wrong,
                                    std::string(R"({"ok": true, "tiers": 5, "tenants": 5, "sessions": 5,
                                        "stats": 5, "cost_model": 5, "blocks": 5, "config": 5})")}) {
    fake.AnswerLine(answer);
    for (const std::string& cmd : commands) {
      for (const std::string form : {"", " --json"}) {
        Output o = RunCommand(ctl + form + " " + cmd + " 2>&1");
        EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 3)
            << cmd << form << " <- " << answer << ": exit " << o.exit_code << ": " << o.out;
        EXPECT_EQ(o.out.find("terminate"), std::string::npos) << cmd << form << ": " << o.out;
      }
    }
  }
  // flush: blocks that landed after the budget were written (exit 0);
  // a failed block, or a journal not durable, is exit 3.
  fake.AnswerLine(R"({"ok": true, "written": 5, "already_on_nvme": 1, "failed": 0, "timed_out": true,
      "landed_late": 2, "sync_ms": 40.5, "journal": "durable"})");
  Output late = RunCommand(ctl + " flush 2>&1");
  EXPECT_EQ(late.exit_code, 0) << late.out;
  EXPECT_NE(late.out.find("wrote 5 blocks to NVMe (1 were there already, 0 failed, timed out, 2 landed after the "
                          "budget); journal durable"),
            std::string::npos)
      << late.out;
  fake.AnswerLine(R"({"ok": true, "written": 5, "failed": 1, "timed_out": true, "journal": "durable"})");
  EXPECT_EQ(RunCommand(ctl + " flush 2>&1").exit_code, 3);
  fake.AnswerLine(R"({"ok": true, "written": 5, "failed": 0, "timed_out": false, "journal": "fdatasync: EIO"})");
  EXPECT_EQ(RunCommand(ctl + " flush 2>&1").exit_code, 3);

  fake.AnswerLine(wrong);
  Output o = RunCommand(ctl + " status 2>&1");
  EXPECT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("kvtierd 7  pid x  up "), std::string::npos) << o.out;

  // Control characters in a client name, a model id, a tenant: '?' in the
  // tables (C0, DEL, C1 as UTF-8 and as a stray byte), kept escaped in --json.
  const std::string evil = "e\\u001b]0;pwned\\u0007v\\u007fi\\u009bl\\u202e";
  fake.AnswerLine(R"({"ok": true, "version": "1\u001b[2J", "tiers": [{"tier": "host\u001b[31m", "health": "ok"}],
      "tenants": [{"name": ")" + evil + R"("}], "sessions": [{"id": 1, "client": ")" + evil + R"(", "model": ")" +
              evil + R"("}], "blocks": [{"key": ")" + evil + R"(", "tenant": ")" + evil + R"("}],
      "config": {")" + evil + R"(": ")" + evil + R"("}, "tenant": ")" + evil + R"("})");
  for (const std::string& cmd : commands) {
    o = RunCommand(ctl + " " + cmd + " 2>&1");
    const std::string shown = cmd == "top -n 1 -i 0.05" ? o.out.substr(o.out.find("\033[2J") + 4) : o.out;
    for (size_t i = 0; i < shown.size(); ++i) {
      const uint8_t c = static_cast<uint8_t>(shown[i]);
      const bool control = (c < 0x20 && c != '\n') || c == 0x7f ||
                           (c == 0xc2 && i + 1 < shown.size() && uint8_t(shown[i + 1]) >= 0x80 &&
                            uint8_t(shown[i + 1]) < 0xa0);
      ASSERT_FALSE(control) << cmd << ": byte " << int(c) << " at " << i << " of " << shown;
    }
    EXPECT_EQ(shown.find("\xe2\x80\xae"), std::string::npos) << cmd << ": a bidi override: " << shown;
  }
  o = RunCommand(ctl + " sessions");
  EXPECT_NE(o.out.find("e?]0;pwned?v?i?l?"), std::string::npos) << o.out;
  o = RunCommand(ctl + " --json sessions");
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(o.out)["sessions"][0]["client"], "e\x1b]0;pwned\x07v\x7fi\xc2\x9bl\xe2\x80\xae");
}

// Every kvtierctl command against a live daemon, in both output forms.
TEST(ToolsTest, KvtierctlCommandsInBothForms) {
  testing::TempDir data;
  testing::DaemonProcess d("[tiers.nvme]\ndirs = [\"" + data.File("nvme") +
                           "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n"
                           "[[tenants]]\nname = \"team\"\nuids = [" + std::to_string(getuid()) +
                           "]\nsalt = \"do-not-show-me\"\nhost_tokens = 100000\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_EQ(RunCommand(Tool("kvtier-replay") + " --socket " + d.socket_path() +
                       " --conversations 2 --turns 2 --sessions 1 --block-bytes 16KiB > /dev/null")
                .exit_code,
            0);
  const std::string ctl = Tool("kvtierctl") + " --socket " + d.admin_socket_path();
  auto json_of = [&](const std::string& args) {
    Output o = RunCommand(ctl + " --json " + args);
    EXPECT_EQ(o.exit_code, 0) << args << ": " << o.out;
    return nlohmann::json::parse(o.out, nullptr, false);
  };
  auto human = [&](const std::string& args) {
    Output o = RunCommand(ctl + " " + args);
    EXPECT_EQ(o.exit_code, 0) << args << ": " << o.out;
    return o.out;
  };

  nlohmann::json status = json_of("status");
  const uint64_t indexed = status["indexed_blocks"];
  ASSERT_GT(indexed, 0u);
  EXPECT_NE(human("sessions").find("no sessions attached"), std::string::npos);
  EXPECT_TRUE(json_of("sessions")["sessions"].is_array());
  EXPECT_NE(human("tenants").find("team"), std::string::npos);
  EXPECT_EQ(json_of("tenants")["tenants"][0]["name"], "team");
  EXPECT_NE(human("tiers").find("nvme tier"), std::string::npos);

  nlohmann::json ls = json_of("blocks ls --limit 5");
  ASSERT_EQ(ls["blocks"].size(), 5u);
  EXPECT_EQ(ls["indexed_blocks"], indexed);
  const std::string key = ls["blocks"][0]["key"];
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(ls["blocks"][0]["tenant"], "team");
  EXPECT_EQ(ls["blocks"][0]["tiers"][0], "host");
  EXPECT_EQ(ls["blocks"][0]["bytes"], 16384);
  EXPECT_NE(human("blocks ls --tenant team").find(key), std::string::npos) << "the whole key, as inspect takes it";
  EXPECT_EQ(json_of("blocks inspect " + key)["key"], key);
  EXPECT_NE(human("blocks inspect " + key).find(key), std::string::npos);
  EXPECT_EQ(RunCommand(ctl + " blocks inspect " + std::string(64, '0') + " 2>/dev/null").exit_code, 3) << "no such block";
  // A key that is not one is a usage error, said before kvtierd is asked.
  Output short_key = RunCommand(ctl + " blocks inspect " + key.substr(0, 16) + " 2>&1");
  EXPECT_EQ(short_key.exit_code, 2) << short_key.out;
  EXPECT_NE(short_key.out.find("64 hex digits"), std::string::npos) << short_key.out;
  EXPECT_EQ(RunCommand(ctl + " blocks inspect " + std::string(63, '0') + "x 2>/dev/null").exit_code, 2);
  EXPECT_EQ(RunCommand(ctl + " blocks ls --tenant nobody 2>/dev/null").exit_code, 3);

  nlohmann::json config = json_of("config show");
  EXPECT_EQ(config["tenants"][0]["salt"], "<set>");
  EXPECT_EQ(config["tenants"][0]["host_tokens"], 100000);
  const std::string shown = human("config show");
  EXPECT_NE(shown.find("tiers.nvme.capacity = 67108864"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("do-not-show-me"), std::string::npos) << "salts are never shown";

  // top: on a terminal, frames refresh in place; into a pipe they follow
  // one another without screen escapes; --json prints one object per frame.
  const std::string frames = human("top -n 2 -i 0.1");
  EXPECT_EQ(frames.find("\033"), std::string::npos) << "no screen escapes without a terminal";
  EXPECT_NE(frames.find("hit rate ["), std::string::npos);
  EXPECT_NE(frames.find("%"), std::string::npos);
  Output on_tty = RunCommand("script -qec '" + ctl + " top -n 2 -i 0.1' /dev/null");
  if (on_tty.exit_code == 0) {
    EXPECT_NE(on_tty.out.find("\033[H\033[2J"), std::string::npos) << "a terminal refreshes in place";
  }
  Output top_json = RunCommand(ctl + " --json top -n 2 -i 0.1");
  ASSERT_EQ(top_json.exit_code, 0);
  EXPECT_EQ(std::count(top_json.out.begin(), top_json.out.end(), '\n'), 2);

  // flush writes every host-only block to NVMe; evict then empties host memory.
  nlohmann::json flushed = json_of("flush");
  EXPECT_EQ(flushed["written"].get<uint64_t>() + flushed["already_on_nvme"].get<uint64_t>(), indexed);
  EXPECT_EQ(flushed["failed"], 0);
  EXPECT_EQ(flushed["journal"], "durable");
  EXPECT_NE(human("flush").find("wrote 0 blocks to NVMe (" + std::to_string(indexed) + " were there already"),
            std::string::npos);
  nlohmann::json evicted = json_of("evict --tenant team");
  EXPECT_EQ(evicted["evicted"], indexed);
  status = json_of("status");
  EXPECT_EQ(status["tiers"][0]["blocks"], 0) << "host memory is empty";
  EXPECT_EQ(status["tiers"][1]["blocks"], indexed) << "every block is on NVMe";
  EXPECT_EQ(RunCommand(ctl + " evict --tenant nobody 2>/dev/null").exit_code, 3);

  // drain: answered, then the daemon drains and exits 0.
  EXPECT_NE(human("drain").find("draining"), std::string::npos);
  const int st = d.WaitExit(std::chrono::seconds(10));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(RunCommand(ctl + " status 2>/dev/null").exit_code, 1) << "gone: unreachable";
}

// The admin socket is owner and group only: another user is refused by the
// socket's mode, and by the daemon itself if the mode is loosened.
TEST(ToolsTest, TheAdminSocketRefusesAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run kvtierctl as another user";
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start().ok());
  ASSERT_EQ(chmod(d.dir().c_str(), 0755), 0);  // let the other user reach the socket's folder
  // A copy the other user can run: the build tree may sit in a folder only
  // its owner can enter (a clone under `mktemp -d`). kvtierctl links only
  // system libraries.
  const std::string ctl = d.dir() + "/kvtierctl";
  std::filesystem::copy_file(Tool("kvtierctl"), ctl);
  ASSERT_EQ(chmod(ctl.c_str(), 0755), 0);
  auto as_nobody = [&]() {
    const pid_t pid = fork();
    if (pid == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(90);
      const std::string cmd = ctl + " --socket " + d.admin_socket_path() + " status >/dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      _exit(91);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  EXPECT_EQ(as_nobody(), 1) << "mode 0660: connect is refused";
  ASSERT_EQ(chmod(d.admin_socket_path().c_str(), 0666), 0);
  EXPECT_EQ(as_nobody(), 3) << "mode loosened: the daemon refuses by credentials";
  EXPECT_NE(d.Log().find("event=admin_refused uid=65534"), std::string::npos) << d.Log();
}

// Request 1: 3 full blocks (+10 tokens); request 2 shares blocks 1, 2;
// request 3 repeats request 1 exactly; hash_ids beyond the full blocks (the
// partial tail) are never cached. Returns the file's path.
std::string HandMadeTrace(const testing::TempDir& dir) {
  const std::string trace = dir.File("t.jsonl");
  std::ofstream f(trace);
  f << R"({"timestamp": 0, "input_length": 1546, "output_length": 5, "hash_ids": [1, 2, 3, 99]})" << "\n";
  f << R"({"timestamp": 10, "input_length": 2048, "output_length": 5, "hash_ids": [1, 2, 4, 5]})" << "\n";
  f << R"({"timestamp": 20, "input_length": 1546, "output_length": 5, "hash_ids": [1, 2, 3, 99]})" << "\n";
  return trace;
}

TEST(ToolsTest, ReplayOfAHandMadeTraceGivesTheHandComputedRates) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start().ok());
  testing::TempDir dir;
  const std::string trace = HandMadeTrace(dir);
  Output o = RunCommand(Tool("kvtier-replay") + " --socket " + d.socket_path() + " --trace " + trace +
                 " --block-bytes 8KiB --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["requests"], 3);
  EXPECT_EQ(j["blocks_requested"], 3 + 4 + 3);
  EXPECT_EQ(j["blocks_hit"], 0 + 2 + 3);
  EXPECT_DOUBLE_EQ(j["token_hit_rate"].get<double>(), 5.0 / 10.0);
  EXPECT_DOUBLE_EQ(j["request_hit_rate"].get<double>(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(j["reused_token_ratio"].get<double>(), 5.0 * 512 / (1546 + 2048 + 1546));
  EXPECT_EQ(j["blocks_stored"], 3 + 2);
  EXPECT_EQ(j["bytes_loaded"], 5 * 8192);
  EXPECT_EQ(j["verify_failures"], 0);
  // The daemon agrees.
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["stats"]["blocks_hit"], 5);
  EXPECT_EQ((*s)["stats"]["blocks_missed"], 5);
  EXPECT_EQ((*s)["stats"]["lookups"], 3);
}

// Two daemons, no shared tier: requests go round-robin (request i to daemon
// i mod 2) and each daemon sees only its own, so the hand-made trace's
// request 2 misses on daemon B what request 1 stored on daemon A.
TEST(ToolsTest, ReplayOverTwoDaemonsSpreadsRequestsRoundRobin) {
  testing::DaemonProcess a, b;
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  testing::TempDir dir;
  const std::string trace = HandMadeTrace(dir);
  const std::string replay = Tool("kvtier-replay") + " --socket " + a.socket_path() + " --socket " + b.socket_path() +
                             " --trace " + trace + " --block-bytes 8KiB";
  Output o = RunCommand(replay + " --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["requests"], 3);
  EXPECT_EQ(j["blocks_hit"], 3) << "one daemon alone would hit 5";
  ASSERT_EQ(j["daemons"].size(), 2u);
  EXPECT_EQ(j["daemons"][0]["socket"], a.socket_path());
  EXPECT_EQ(j["daemons"][0]["requests"], 2);
  EXPECT_EQ(j["daemons"][0]["blocks_requested"], 6);
  EXPECT_EQ(j["daemons"][0]["blocks_hit"], 3);
  EXPECT_EQ(j["daemons"][1]["requests"], 1);
  EXPECT_EQ(j["daemons"][1]["blocks_requested"], 4);
  EXPECT_EQ(j["daemons"][1]["blocks_hit"], 0);
  EXPECT_EQ(j["verify_failures"], 0);
  // Each daemon saw only its own share.
  auto sa = a.Status(), sb = b.Status();
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ((*sa)["stats"]["lookups"], 2);
  EXPECT_EQ((*sa)["stats"]["blocks_hit"], 3);
  EXPECT_EQ((*sb)["stats"]["lookups"], 1);
  EXPECT_EQ((*sb)["stats"]["blocks_hit"], 0);

  // The table has a row per daemon; sessions that do not spread evenly are
  // refused.
  o = RunCommand(replay + " --model other");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("per daemon"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(b.socket_path()), std::string::npos) << o.out;
  o = RunCommand(replay + " --sessions 3 2>&1");
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_NE(o.out.find("multiple of 2"), std::string::npos) << o.out;
}

TEST(ToolsTest, ReplayWithHostAndNvmeReportsHitsPerTier) {
  testing::TempDir dir;
  // 16 host slots of 64 KiB; an NVMe tier behind them.
  testing::DaemonProcess d("[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + dir.File("nvme") +
                           "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string trace = dir.File("t.jsonl");
  {
    std::ofstream f(trace);
    auto line = [&](int first) {
      f << R"({"timestamp": 0, "input_length": 4096, "hash_ids": [)";
      for (int i = 0; i < 8; ++i) f << (i ? ", " : "") << first + i;
      f << "]}\n";
    };
    line(100);  // 8 blocks
    line(200);  // 8 more: host full
    line(300);  // 8 more: the first 8 are demoted to NVMe
    line(100);  // the first prompt again: all 8 come back from NVMe
  }
  Output o = RunCommand(Tool("kvtier-replay") + " --socket " + d.socket_path() + " --trace " + trace +
                        " --block-bytes 64KiB --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["blocks_hit"], 8);
  EXPECT_EQ(j["lower_hit_blocks"], 8);
  EXPECT_EQ(j["host_hit_blocks"], 0);
  EXPECT_EQ(j["load_failures"], 0);
  EXPECT_EQ(j["verify_failures"], 0);
  EXPECT_DOUBLE_EQ(j["token_hit_rate"].get<double>(), 8.0 / 32.0);
  auto s = d.Status();
  ASSERT_TRUE(s.ok()) << s.status() << "\n" << d.Log();
  EXPECT_EQ((*s)["stats"]["blocks_hit_local"], 8);
  // kvtierctl tiers shows the NVMe tier in both forms.
  const std::string ctl = Tool("kvtierctl") + " --socket " + d.admin_socket_path();
  Output human = RunCommand(ctl + " tiers");
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("nvme tier (lane 0, kind nvme):"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("checksum_failures"), std::string::npos);
  EXPECT_NE(human.out.find("journal.commits"), std::string::npos);
  nlohmann::json tiers = nlohmann::json::parse(RunCommand(ctl + " --json tiers").out);
  ASSERT_EQ(tiers["tiers"].size(), 2u);
  EXPECT_EQ(tiers["tiers"][1]["tier"], "nvme");
  EXPECT_GT(tiers["tiers"][1]["bytes_written"].get<int>(), 0);
}

TEST(ToolsTest, SimulateComparesPoliciesSideBySideWithoutADaemon) {
  // The synthetic chat: 48 conversations x 6 turns, 64-token blocks.
  Output o = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=20K,200K --infinite --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(o.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 21u) << "9 policies and the hold optimum x 2 capacities + infinite";
  int defaults = 0;
  for (const auto& r : rows) {
    for (const char* field : {"policy", "default", "capacity_tokens", "token_hit_rate", "request_hit_rate",
                              "reused_token_ratio", "prefill_seconds_saved", "ttft_p50_s", "ttft_p95_s"}) {
      EXPECT_TRUE(r.contains(field)) << field << " missing in " << r.dump();
    }
    defaults += r["default"].get<bool>();
  }
  EXPECT_EQ(defaults, 2) << "one default row per capacity";
  EXPECT_EQ(rows[0]["policy"], "lru");
  EXPECT_EQ(rows[2]["policy"], "s3fifo-deep");
  EXPECT_EQ(rows[4]["policy"], "arc");
  EXPECT_EQ(rows[5]["policy"], "arc-cutoff");
  EXPECT_EQ(rows[6]["policy"], "adaptive");
  EXPECT_TRUE(rows[6]["default"].get<bool>()) << "the daemon's default policy is marked";
  EXPECT_EQ(rows[7]["policy"], "holds");
  EXPECT_FALSE(rows[7]["evictions"].is_null()) << "holds is a policy the daemon runs: it has its counters";
  EXPECT_EQ(rows[8]["policy"], "hold-optimum");
  EXPECT_TRUE(rows[8]["ttft_p50_s"].is_null()) << "the hold optimum has hit counts, no times";
  EXPECT_TRUE(rows[8]["evictions"].is_null());
  EXPECT_GT(rows[8]["blocks_hit"].get<uint64_t>(), 0u);
  EXPECT_EQ(rows[9]["policy"], "belady");
  EXPECT_EQ(rows[20]["policy"], "infinite");
  auto hit = [&](int c, int k) { return rows[10 * c + k]["token_hit_rate"].get<double>(); };
  for (int c = 0; c < 2; ++c) {
    const double belady = hit(c, 9);
    for (int k = 0; k < 8; ++k) EXPECT_GE(belady, hit(c, k)) << k;
    EXPECT_LE(belady, rows[20]["token_hit_rate"].get<double>() + 1e-12);
    // The default adapts: about as good as the better of LRU and S3-FIFO.
    // (288 requests are fewer than its warm-up, 2,000: it keeps its first
    // expert, at 20K tokens 0.949x of LRU; suite_test holds it to 0.98x on
    // workloads of thousands of requests.)
    EXPECT_GE(hit(c, 6), (c == 0 ? 0.94 : 0.98) * std::max(hit(c, 0), hit(c, 1))) << "capacity " << c;
  }
  // More room never hurts Belady or the hold optimum.
  EXPECT_GE(hit(1, 9), hit(0, 9));
  EXPECT_GE(hit(1, 8), hit(0, 8));
  EXPECT_GT(rows[20]["token_hit_rate"].get<double>(), 0.3) << "later turns reuse earlier ones";

  Output human = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=200K");
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("VS BELADY"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("adaptive (default)"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("hold-optimum: the most a policy could hit"), std::string::npos) << human.out;

  // Host and NVMe: NVMe hits show up per tier.
  Output two = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=20K --tier nvme=1M --policies lru --json");
  // With an NVMe tier the default rows leave the host-only bound out.
  Output two_all = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=20K --tier nvme=1M --json");
  ASSERT_EQ(two_all.exit_code, 0) << two_all.out;
  EXPECT_EQ(two_all.out.find("hold-optimum"), std::string::npos);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  nlohmann::json t = nlohmann::json::parse(two.out);
  EXPECT_EQ(t["capacity_tokens"]["nvme"], 1000000) << "1M tokens: 15,625 blocks of 64";
  EXPECT_GT(t["token_hit_rate_nvme"].get<double>(), 0);
  EXPECT_GT(t["token_hit_rate"].get<double>(), rows[0]["token_hit_rate"].get<double>());

  for (const char* bad : {"--tier disk=3M", "--tier nvme=3M", "--tier host=lots", "--tier host=10",
                          "--tier host=1M --gpus 0", "--tier host=1M --model-config /nonexistent",
                          "--tier host=1M --tier nvme=2M --policies hold-optimum",
                          "--tier host=1M --tier nvme=2M --policies hold-oracle", ""}) {
    Output b = RunCommand(Tool("kvtier-replay") + " --simulate " + bad);
    EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.out;
  }
}

// --suite: every policy on generated workloads, one row per workload and
// capacity, JSON rows naming their workload; the NVMe admission gate turns
// away evictions of blocks asked for once.
TEST(ToolsTest, SimulateSuiteRunsEveryPolicyOnEveryWorkload) {
  Output o = RunCommand(Tool("kvtier-replay") + " --simulate --suite --workloads agent,docqa --tier host=1M -q");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("DEFAULT / BEST"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("DEFAULT / HOLD OPTIMUM"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("agent"), std::string::npos);
  EXPECT_NE(o.out.find("docqa"), std::string::npos);
  EXPECT_NE(o.out.find("Zipf"), std::string::npos) << "the workloads' parameters are printed";
  Output j = RunCommand(Tool("kvtier-replay") + " --simulate --suite --workloads docqa --tier host=1M --tier nvme=10M "
                        "--policies lru,adaptive --nvme-admit-uses 2 --json");
  ASSERT_EQ(j.exit_code, 0) << j.out;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(j.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r["workload"], "docqa");
    EXPECT_GT(r["demotions_refused"].get<uint64_t>(), 0u) << "documents read once are not written to NVMe";
    EXPECT_GT(r["demotions"].get<uint64_t>(), 0u) << "popular documents are";
    EXPECT_TRUE(r.contains("nvme_write_amplification"));
  }
  for (const char* bad : {"--simulate --suite --infinite", "--simulate --suite --workloads nosuch", "--suite",
                          "--simulate --suite --workloads conversation", "--simulate --workloads agent",
                          "--simulate --suite --tier host=1M --tier remote=10M --nodes 2",
                          "--simulate --tier host=1M --nvme-admit-uses 2",
                          "--simulate --tier host=1M --tier nvme=2M --nvme-admit-uses 16",
                          "--simulate --tier host=1M --tier nvme=2M --nvme-admit-uses 0",
                          "--simulate --tier host=1M --shadow-blocks 0"}) {
    Output b = RunCommand(Tool("kvtier-replay") + " " + bad);
    EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.out;
  }
}

// N simulated nodes, local tiers alone and pooled over a shared remote tier.
TEST(ToolsTest, SimulateNodesComparesLocalAndPooledPerRouting) {
  // The synthetic chat; each node holds 8,000 tokens (125 blocks) of host memory.
  Output o = RunCommand(Tool("kvtier-replay") +
                        " --simulate --tier host=8K --tier remote=1M --nodes 2,4 --write-policy committed --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(o.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 6u) << "2 node counts x 3 routings";
  for (const auto& r : rows) {
    const double local = r["local"]["token_hit_rate"], pooled = r["pooled"]["token_hit_rate"];
    EXPECT_FALSE(r["local"]["pooled"].get<bool>());
    EXPECT_TRUE(r["pooled"]["pooled"].get<bool>());
    EXPECT_EQ(r["local"]["token_hit_rate_remote"], 0.0);
    EXPECT_GT(pooled, local) << r.dump() << ": every block goes up, and conversations outgrow a node";
    EXPECT_GT(r["pooled"]["bytes_written_remote"].get<double>(), 0);
    EXPECT_EQ(r["pooled"]["requests"], 288) << "48 conversations x 6 turns";
  }
  EXPECT_EQ(rows[0]["routing"], "round-robin");
  EXPECT_EQ(rows[4]["nodes"], 4);
  // A conversation on one node (affinity) reuses more locally than turns
  // spread round-robin.
  EXPECT_GT(rows[1]["local"]["token_hit_rate"].get<double>(), rows[0]["local"]["token_hit_rate"].get<double>());

  Output human = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=8K --tier remote=1M --nodes 2");
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("TOKEN HIT LOCAL"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("affinity"), std::string::npos) << human.out;
  for (const char* bad : {"--nodes 2 --tier host=2K", "--nodes 0 --tier host=2K --tier remote=1M",
                          "--nodes 2 --tier host=2K --tier remote=1M --routing random",
                          "--nodes 2 --tier host=2K --tier remote=1M --write-policy always",
                          "--tier host=2K --tier remote=1M", "--nodes 2 --tier host=2K,4K --tier remote=1M"}) {
    Output b = RunCommand(Tool("kvtier-replay") + " --simulate " + bad + " 2>/dev/null");
    EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.out;
  }
}

TEST(ToolsTest, ReplayRefusesAMalformedTraceNamingTheLine) {
  testing::TempDir dir;
  const std::string trace = dir.File("bad.jsonl");
  std::ofstream(trace) << R"({"timestamp": 0, "input_length": 600, "hash_ids": [1]})" << "\n{oops\n";
  Output o = RunCommand(Tool("kvtier-replay") + " --trace " + trace + " 2>&1");
  EXPECT_EQ(o.exit_code, 4) << "a bad input file";
  EXPECT_NE(o.out.find("bad.jsonl:2"), std::string::npos) << o.out;
}

// Whatever a trace holds, kvtier-replay exits 4 naming the line: never a
// crash (a string timestamp was an uncaught exception), a giant allocation
// (a line of gigabytes was read whole) or an endless wait (a negative
// timestamp read as 2^64 - 5 ms, slept on with --speed).
TEST(ToolsTest, ReplayRefusesHostileTracesWithExit4) {
  testing::TempDir dir;
  const std::string ok = R"({"timestamp": 0, "input_length": 600, "hash_ids": [1]})";
  const std::vector<std::pair<std::string, std::string>> traces = {
      {ok + "\n{\"timestamp\": \"noon\", \"input_length\": 600, \"hash_ids\": [1]}\n", "t.jsonl:2: \"timestamp\""},
      {ok + "\n{\"timestamp\": -5, \"input_length\": 600, \"hash_ids\": [1]}\n", "t.jsonl:2: \"timestamp\""},
      {ok + "\n{\"timestamp\": 1e300, \"input_length\": 600, \"hash_ids\": [1]}\n", "t.jsonl:2: \"timestamp\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": 1099511627776, \"hash_ids\": [1]}\n",
       "t.jsonl:2: \"input_length\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": -1, \"hash_ids\": [1]}\n", "t.jsonl:2: \"input_length\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": [600], \"hash_ids\": [1]}\n", "t.jsonl:2: \"input_length\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": 600}\n", "t.jsonl:2: no \"hash_ids\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": {\"a\": 1}}\n", "t.jsonl:2: \"hash_ids\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": [1, \"2\"]}\n", "t.jsonl:2: \"hash_ids\""},
      {ok + "\n{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": [1, -2]}\n", "t.jsonl:2: \"hash_ids\""},
      {ok + "\n{\"timestamp\": 0, \"input_le", "t.jsonl:2: not a trace record"},
      {ok + "\n" + std::string("\x7f" "ELF\x02\x01\x00\xff\xfe\x1b[2J", 13) + "\n", "t.jsonl:2: not a trace record"},
      {ok + "\n{\"x\": " + std::string(100000, '[') + "\n", "t.jsonl:2: not a trace record"},
  };
  for (const auto& [text, what] : traces) {
    std::ofstream(dir.File("t.jsonl"), std::ios::binary) << text;
    for (const char* mode : {" --simulate --tier host=1M", " --speed 1 --socket /nonexistent"}) {
      Output o = RunCommand(Tool("kvtier-replay") + mode + " --trace " + dir.File("t.jsonl") + " 2>&1");
      EXPECT_EQ(o.exit_code, 4) << text.substr(0, 120) << mode << ": " << o.out;
      EXPECT_NE(o.out.find(what), std::string::npos) << text.substr(0, 120) << ": " << o.out;
    }
  }
  // Too many hash_ids for one line, within 1 MiB.
  {
    std::ofstream f(dir.File("t.jsonl"));
    f << "{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": [0";
    for (int i = 0; i < 70000; ++i) f << ",1";
    f << "]}\n";
  }
  Output o = RunCommand(Tool("kvtier-replay") + " --simulate --tier host=1M --trace " + dir.File("t.jsonl") + " 2>&1");
  EXPECT_EQ(o.exit_code, 4) << o.out;
  EXPECT_NE(o.out.find("t.jsonl:1: more than 65536 hash_ids"), std::string::npos) << o.out;
  // A line of 64 MiB without a newline: refused at 1 MiB, not held whole.
  {
    std::ofstream f(dir.File("t.jsonl"));
    const std::string chunk(1 << 20, ' ');
    f << "{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": [1]";
    for (int i = 0; i < 64; ++i) f << chunk;
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const std::string vm_limit;  // sanitizers reserve terabytes of address space: no ulimit -v there
#else
  const std::string vm_limit = "ulimit -v 1000000; ";
#endif
  o = RunCommand(vm_limit + Tool("kvtier-replay") + " --simulate --tier host=1M --trace " + dir.File("t.jsonl") +
                 " 2>&1");
  EXPECT_EQ(o.exit_code, 4) << o.out.substr(0, 300);
  EXPECT_NE(o.out.find("t.jsonl:1: a line longer than 1 MiB"), std::string::npos) << o.out.substr(0, 300);
  // The bounds are documented where the option is.
  o = RunCommand(Tool("kvtier-replay") + " --help");
  EXPECT_NE(o.out.find("at most 1 MiB"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("4 the trace"), std::string::npos) << o.out;
}

// A session that fails part-way (here: the daemon drains and stops while
// the replay runs) ends the replay with its error; before, the failed
// session's remaining requests were never counted and kvtier-replay waited
// for them for ever.
TEST(ToolsTest, ReplayEndsWithTheErrorWhenASessionFailsPartWay) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start().ok());
  std::thread stopper([&] {
    // Once both sessions are at work.
    for (int i = 0; i < 3000; ++i) {
      auto st = d.Status();
      if (st.ok() && (*st)["sessions"].size() == 2 && (*st)["stats"]["stores"].get<int>() > 20) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    RunCommand(Tool("kvtierctl") + " --socket " + d.admin_socket_path() + " drain >/dev/null 2>&1");
  });
  // `timeout` turns a hang into exit 124.
  Output o = RunCommand("timeout 60 " + Tool("kvtier-replay") + " --socket " + d.socket_path() +
                        " --conversations 2000 --turns 8 --sessions 2 --block-bytes 16KiB --json -q");
  stopper.join();
  EXPECT_EQ(o.exit_code, 1) << "124: kvtier-replay hung; output: " << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << o.out;
  EXPECT_NE(j["error"].get<std::string>(), "");
  EXPECT_LT(j["requests"].get<int>(), 16000) << "it stopped early";
}

// --check-config checks that the disk can hold the NVMe tier (it said
// "config OK" to a capacity the start then failed on).
TEST(ToolsTest, CheckConfigRefusesAnNvmeCapacityTheDiskCannotHold) {
  testing::TempDir dir;
  const char* build = std::getenv("KVTIER_BUILD_DIR");
  const std::string kvtierd = std::string(build ? build : ".") + "/daemon/kvtierd";
  auto write = [&](const std::string& capacity) {
    std::ofstream(dir.File("k.toml")) << "[daemon]\nrun_dir = \"" << dir.path() << "\"\n[tiers.nvme]\ndirs = [\""
                                      << dir.File("nvme") << "\"]\ncapacity = \"" << capacity
                                      << "\"\nsegment_bytes = \"4GiB\"\n";
  };
  write("64TiB");
  Output o = RunCommand(kvtierd + " --config " + dir.File("k.toml") + " --check-config 2>&1");
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_NE(o.out.find("free"), std::string::npos) << o.out;
  EXPECT_FALSE(std::filesystem::exists(dir.File("nvme") + "/kvtier-slab.kvt")) << "a check allocates nothing";
  // A capacity that fits: only where the disk has room for it (a nearly
  // full build machine said "needs 4.02 GiB more" here, rightly).
  std::error_code ec;
  const std::filesystem::space_info space = std::filesystem::space(dir.path(), ec);
  if (ec || space.available < (4ull << 30) + (512ull << 20)) {
    GTEST_SKIP() << "the temp folder's file system has under 4.5 GiB free: the 'fits' half needs 4 GiB";
  }
  write("4GiB");
  o = RunCommand(kvtierd + " --config " + dir.File("k.toml") + " --check-config 2>&1");
  EXPECT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("config OK"), std::string::npos) << o.out;
}

// A store refused because the prompt is larger than the arena says so (it
// was labelled "tier full of pinned blocks").
TEST(ToolsTest, ReplayGivesTheDaemonsReasonForARefusedStore) {
  testing::DaemonProcess d("[tiers.host]\ncapacity = \"1MiB\"\n");
  ASSERT_TRUE(d.Start().ok());
  Output o = RunCommand(Tool("kvtier-replay") + " --socket " + d.socket_path() +
                        " --conversations 4 --turns 4 --block-bytes 256KiB --json -q");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out);
  ASSERT_GT(j["store_refused"].get<int>(), 0) << o.out;
  EXPECT_NE(j["store_refused_reason"].get<std::string>().find("do not fit"), std::string::npos) << o.out;
}

TEST(ToolsTest, ReplayOfTheSyntheticChatReusesEarlierTurnsAndVerifiesEveryByte) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start().ok());
  Output o = RunCommand(Tool("kvtier-replay") + " --socket " + d.socket_path() +
                 " --conversations 6 --turns 4 --sessions 2 --block-bytes 16KiB --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["requests"], 24);
  EXPECT_EQ(j["verify_failures"], 0);
  EXPECT_GT(j["blocks_loaded"].get<int>(), 0);
  // Turns 2..4 of each conversation run after their previous turn stored its
  // prefix (one session serves a conversation, in order), so nearly all of
  // those 18 hit. Not all: the system prompt all conversations share may
  // still be being written by the other session when a turn looks it up (its
  // own store skipped those blocks as already in the making), and then that
  // turn misses at block 0; a CI run under load saw 17. First turns may also
  // hit the shared system prompt, depending on timing.
  EXPECT_GE(j["request_hit_rate"].get<double>(), 15.0 / 24.0);
  EXPECT_GT(j["token_hit_rate"].get<double>(), 0.5);
  EXPECT_EQ(j["error"], "");
}

TEST(ToolsTest, BenchPrintsOneJsonObjectPerMetric) {
  Output o = RunCommand(Tool("kvtier-bench") + " ipc --quick --json --kvtierd " +
                 std::string(std::getenv("KVTIERD_BIN") ? std::getenv("KVTIERD_BIN") : "kvtierd"));
  // Debug and sanitizer builds may miss the speed target (exit 1); the format
  // must hold either way.
  ASSERT_TRUE(o.exit_code == 0 || o.exit_code == 1) << o.out;
  std::istringstream lines(o.out);
  std::string line;
  int metrics = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    nlohmann::json m = nlohmann::json::parse(line);
    for (const char* k : {"suite", "metric", "value", "baseline_name", "baseline", "unit", "speedup"}) {
      EXPECT_TRUE(m.contains(k)) << k << " missing in " << line;
    }
    EXPECT_EQ(m["suite"], "ipc");
    EXPECT_GT(m["value"].get<double>(), 0);
    EXPECT_GT(m["baseline"].get<double>(), 0);
    EXPECT_NEAR(m["speedup"].get<double>(), m["baseline"].get<double>() / m["value"].get<double>(),
                m["speedup"].get<double>() * 0.5)
        << "speedup is a ratio against the baseline of the same run";
    ++metrics;
  }
  EXPECT_GE(metrics, 2);
  EXPECT_EQ(RunCommand(Tool("kvtier-bench") + " nosuchsuite 2>/dev/null").exit_code, 2);

  // Store latency with background reclaim against the same daemon without it.
  Output r = RunCommand(Tool("kvtier-bench") + " reclaim --quick --json --kvtierd " +
                        std::string(std::getenv("KVTIERD_BIN") ? std::getenv("KVTIERD_BIN") : "kvtierd"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream rl(r.out);
  int reclaim = 0;
  while (std::getline(rl, line)) {
    if (line.empty()) continue;
    nlohmann::json m = nlohmann::json::parse(line);
    EXPECT_EQ(m["suite"], "reclaim");
    EXPECT_EQ(m["baseline_name"], "reclaim_off");
    EXPECT_GT(m["value"].get<double>(), 0);
    EXPECT_GT(m["baseline"].get<double>(), 0);
    ++reclaim;
  }
  EXPECT_EQ(reclaim, 2);

  // The gpu suite's code on the host-simulated device: every figure, each a
  // ratio against a baseline of the same run.
  Output g = RunCommand(Tool("kvtier-bench") + " gpu --device sim --quick --json");
  ASSERT_EQ(g.exit_code, 0) << g.out;
  std::istringstream gl(g.out);
  std::set<std::string> gpu_metrics;
  while (std::getline(gl, line)) {
    if (line.empty()) continue;
    nlohmann::json m = nlohmann::json::parse(line);
    EXPECT_EQ(m["suite"], "gpu");
    EXPECT_GT(m["value"].get<double>(), 0) << line;
    EXPECT_GT(m["baseline"].get<double>(), 0) << line;
    gpu_metrics.insert(m["metric"].get<std::string>());
  }
  EXPECT_EQ(gpu_metrics, (std::set<std::string>{"host_to_device_GBps", "device_to_host_GBps", "gather_GBps",
                                                "scatter_GBps", "gather_fp8_GBps_read", "checksum_GBps",
                                                "layerwise_first_layer_ms"}));
  // The engine suite: TTFT per tier against no cache, the reused prefix and
  // the exactness check in each figure's note.
  // It is the example engine's own binary; kvtier-bench points there.
  EXPECT_EQ(RunCommand(Tool("kvtier-bench") + " engine 2>/dev/null").exit_code, 2);
  const char* build = std::getenv("KVTIER_BUILD_DIR");
  Output e = RunCommand(std::string(build ? build : ".") + "/examples/tiny-engine/tiny-engine-bench engine --quick " +
                        "--json --kvtierd " +
                        std::string(std::getenv("KVTIERD_BIN") ? std::getenv("KVTIERD_BIN") : "kvtierd"));
  ASSERT_EQ(e.exit_code, 0) << e.out;
  std::istringstream el(e.out);
  std::set<std::string> engine_metrics;
  while (std::getline(el, line)) {
    if (line.empty()) continue;
    nlohmann::json m = nlohmann::json::parse(line);
    EXPECT_EQ(m["suite"], "engine");
    EXPECT_EQ(m["baseline_name"], "no_cache");
    EXPECT_GT(m["value"].get<double>(), 0) << line;
    EXPECT_GT(m["baseline"].get<double>(), 0) << line;
    EXPECT_NE(m["note"].get<std::string>().find("448 of 512 tokens reused"), std::string::npos) << line;
    EXPECT_NE(m["note"].get<std::string>().find("bit-identical"), std::string::npos) << line;
    engine_metrics.insert(m["metric"].get<std::string>());
  }
  EXPECT_EQ(engine_metrics, (std::set<std::string>{"ttft_host", "ttft_nvme", "ttft_gpu_sim"}));
  // On CUDA it runs only where a device answers; elsewhere it says so and exits 77.
  const int cuda_rc = RunCommand(Tool("kvtier-bench") + " gpu --quick --json 2>/dev/null").exit_code;
  EXPECT_TRUE(cuda_rc == 77 || cuda_rc == 0 || cuda_rc == 1) << cuda_rc;
}

}  // namespace
}  // namespace kvtier
