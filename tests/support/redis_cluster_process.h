// SPDX-License-Identifier: Apache-2.0
// A real Redis Cluster for a test: scripts/redis-cluster starts Debian's
// redis-server nodes on free loopback ports in a temporary folder, with one
// ACL user per tenant, and stops them by PID when the test ends.
#ifndef KVTIER_TESTS_SUPPORT_REDIS_CLUSTER_PROCESS_H_
#define KVTIER_TESTS_SUPPORT_REDIS_CLUSTER_PROCESS_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tiers/redis_cluster.h"
#include "tiers/value_seal.h"
#include "tools/common/daemon_process.h"

namespace kvtier::testing {

class RedisClusterProcess {
 public:
  // Empty when redis-server is not installed (the test then skips).
  static std::unique_ptr<RedisClusterProcess> Start(const std::vector<std::string>& tenants,
                                                    const std::string& extra = "") {
    if (std::system("command -v redis-server >/dev/null 2>&1") != 0) return nullptr;
    auto c = std::unique_ptr<RedisClusterProcess>(new RedisClusterProcess());
    // --owner: the nodes stop when this test process exits, even by abort.
    std::string cmd = absl::StrCat(Script(), " start ", c->dir_.path(), " --owner ", getpid(), " ", extra);
    for (const std::string& t : tenants) absl::StrAppend(&cmd, " --tenant ", t);
    if (!c->Run(cmd + " >/dev/null")) return nullptr;
    std::ifstream env(absl::StrCat(c->dir_.path(), "/cluster.env"));
    std::string line;
    while (std::getline(env, line)) {
      if (line.rfind("SEEDS=", 0) == 0) c->seeds_ = absl::StrSplit(line.substr(6), ',');
      if (line == "TLS=1") c->tls_.enabled = true;
      if (line.rfind("TLS_CA_FILE=", 0) == 0) c->tls_.ca_file = line.substr(12);
      if (line.rfind("TLS_CERT_FILE=", 0) == 0) c->tls_.cert_file = line.substr(14);
      if (line.rfind("TLS_KEY_FILE=", 0) == 0) c->tls_.key_file = line.substr(13);
    }
    c->admin_pass_ = ReadLine(absl::StrCat(c->dir_.path(), "/admin.pass"));
    // Each tenant's sealing key: kvtierd's secret, not the cluster's.
    if (!c->Run(absl::StrCat("umask 077; mkdir -p ", c->dir_.path(), "/keys")) ) return nullptr;
    for (const std::string& t : tenants) {
      if (!c->Run(absl::StrCat("umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' >", c->key_file(t)))) return nullptr;
    }
    c->up_ = !c->seeds_.empty();
    return c->up_ ? std::move(c) : nullptr;
  }
  ~RedisClusterProcess() {
    if (up_) Run(absl::StrCat(Script(), " stop ", dir_.path(), " >/dev/null"));
  }

  const std::vector<std::string>& seeds() const { return seeds_; }
  std::string password(const std::string& tenant) const {
    return ReadLine(absl::StrCat(dir_.path(), "/tenants/", tenant, ".pass"));
  }
  std::string user(const std::string& tenant) const { return "kvtier-" + tenant; }
  const std::string& dir() const { return dir_.path(); }

  bool Kill(int node) { return Run(absl::StrCat(Script(), " kill ", dir_.path(), " ", node, " >/dev/null")); }
  bool Stop() { return Run(absl::StrCat(Script(), " stop ", dir_.path(), " >/dev/null")); }
  bool Restart() { return Run(absl::StrCat(Script(), " restart ", dir_.path(), " >/dev/null")); }
  // True once every running primary's replicas have copied all it wrote:
  // what a test waits for before it kills a primary and expects its blocks
  // to survive the failover.
  bool ReplicasSynced() { return Run(absl::StrCat(Script(), " synced ", dir_.path(), " >/dev/null 2>&1")); }

  // redis-cli's output for `args` against seed `node`, as `tenant`'s ACL
  // user (the admin when empty). The password goes through stdin
  // (--askpass), never the command line: other local users read those.
  std::string Cli(const std::string& args, size_t node = 0, const std::string& tenant = "") const {
    const std::string& seed = seeds_.at(node);
    const size_t colon = seed.rfind(':');
    const std::string pass_file = tenant.empty() ? absl::StrCat(dir_.path(), "/admin.pass")
                                                 : absl::StrCat(dir_.path(), "/tenants/", tenant, ".pass");
    const std::string cmd =
        absl::StrCat("redis-cli ", TlsArgs(), "-h ", seed.substr(0, colon), " -p ", seed.substr(colon + 1), " --user ",
                     tenant.empty() ? "kvtier-admin" : user(tenant), " --askpass ", args, " <", pass_file, " 2>&1");
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      pclose(p);
    }
    // --askpass prompts on stdout ("Please input password: ").
    if (out.rfind("Please input password: ", 0) == 0) out.erase(0, 23);
    return out;
  }
  // A file of keys that seal tenant's values (64 hex digits, mode 0600),
  // made at Start; and the keys.
  std::string key_file(const std::string& tenant) const { return absl::StrCat(dir_.path(), "/keys/", tenant, ".key"); }
  std::vector<SealKey> keys(const std::string& tenant) const {
    absl::StatusOr<std::vector<SealKey>> k = ParseSealKeys(ReadLine(key_file(tenant)));
    return k.ok() ? *k : std::vector<SealKey>{};
  }
  const std::string& admin_password() const { return admin_pass_; }
  // With --tls: the CA and the client certificate the nodes require.
  const RedisTlsOptions& tls() const { return tls_; }
  std::string TlsArgs() const {
    return tls_.enabled ? absl::StrCat("--tls --cacert ", tls_.ca_file, " --cert ", tls_.cert_file, " --key ",
                                       tls_.key_file, " ")
                        : "";
  }

 private:
  RedisClusterProcess() = default;
  static std::string Script() { return KVTIER_SOURCE_DIR "/scripts/redis-cluster"; }
  static std::string ReadLine(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
  }
  static bool Run(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

  tools::TempDir dir_;
  std::vector<std::string> seeds_;
  std::string admin_pass_;
  RedisTlsOptions tls_;
  bool up_ = false;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_REDIS_CLUSTER_PROCESS_H_
