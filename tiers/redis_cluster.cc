// SPDX-License-Identifier: Apache-2.0
// RedisCluster (redis_cluster.h): the slot map, one thread and connection
// per node, redirects, retries and the map's refresh.
//
// Threads: each node's link thread owns its hiredis context, pipelines its
// queue and runs the callbacks of the replies it reads; one control thread
// refreshes the slot map and resubmits commands that wait to be tried again
// (TRYAGAIN, CLUSTERDOWN). Locks: a node's queue lock and the map lock are
// leaves (never held while taking another, nor while a callback runs).
#include "tiers/redis_cluster.h"

// hiredis 0.14's sds.h has no extern "C" of its own (hiredis.h includes it
// outside its block): declare its functions with C linkage first.
extern "C" {
#include <hiredis/sds.h>
}
#include <hiredis/hiredis.h>
#include <limits.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 on AVX2 / AVX-512 where the CPU has them: the same hashes, twice as fast
#endif
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <cerrno>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/mutex.h"
#include "core/units.h"
#include "tiers/redis_link.h"

namespace kvtier {

void RedisReplyFree::operator()(redisReply* r) const { freeReplyObject(r); }

namespace {

constexpr uint16_t kNoNode = UINT16_MAX;
constexpr size_t kMaxNodes = 1024;            // addresses the cluster may name
constexpr size_t kMaxPipelineBytes = 16 << 20;  // one round's commands, about
constexpr uint64_t kMinBackoffNs = 10'000'000, kMaxBackoffNs = 1'000'000'000;
constexpr uint64_t kRetryPauseNs = 20'000'000;      // TRYAGAIN, CLUSTERDOWN
constexpr uint64_t kMinRefreshGapNs = 100'000'000;  // between refreshes asked for

timeval ToTimeval(uint64_t ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

// Appends one bulk argument; returns where its bytes start in out.
size_t AppendBulk(std::string& out, std::initializer_list<absl::string_view> parts) {
  size_t n = 0;
  for (absl::string_view p : parts) n += p.size();
  absl::StrAppend(&out, "$", n, "\r\n");
  const size_t at = out.size();
  for (absl::string_view p : parts) out.append(p.data(), p.size());
  out.append("\r\n");
  return at;
}

// "host:port", with a port in 1..65535 and a host of printable characters.
bool ParseAddress(absl::string_view a, std::string* host, int* port) {
  const size_t colon = a.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 >= a.size() || colon > 255) return false;
  int p = 0;
  auto [ptr, ec] = std::from_chars(a.data() + colon + 1, a.data() + a.size(), p);
  if (ec != std::errc() || ptr != a.data() + a.size() || p < 1 || p > 65535) return false;
  for (char c : a.substr(0, colon)) {
    if (c <= ' ' || c > '~') return false;
  }
  *host = std::string(a.substr(0, colon));
  *port = p;
  return true;
}

// An error reply as a status; MOVED/ASK/TRYAGAIN/CLUSTERDOWN are handled before.
absl::Status ErrorStatus(absl::string_view msg, absl::string_view who) {
  const std::string text = absl::StrCat(who, ": ", msg.substr(0, 200));
  if (absl::StartsWith(msg, "NOPERM")) return absl::PermissionDeniedError(text);
  if (absl::StartsWith(msg, "NOAUTH") || absl::StartsWith(msg, "WRONGPASS")) return absl::UnauthenticatedError(text);
  if (absl::StartsWith(msg, "OOM")) return absl::ResourceExhaustedError(text);
  if (absl::StartsWith(msg, "LOADING") || absl::StartsWith(msg, "MASTERDOWN") || absl::StartsWith(msg, "READONLY")) {
    return absl::UnavailableError(text);
  }
  return absl::UnknownError(text);
}

// What the reply being read may still allocate (ReplyBudget): hiredis builds
// a reply's objects as its bytes arrive, so a bound on the bytes not yet
// parsed does not bound a reply of many small parts.
thread_local bool t_budget_on = false;
thread_local int64_t t_budget = 0;
bool Spend(uint64_t bytes) {
  if (!t_budget_on) return true;
  t_budget -= static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX / 2));
  return t_budget >= 0;
}
struct ReplyBudget {
  explicit ReplyBudget(uint64_t bytes) {
    t_budget_on = true;
    t_budget = static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX / 2));
  }
  ~ReplyBudget() { t_budget_on = false; }
};

// Reply objects as hiredis builds them, but bounded (BoundReplyObjects).
redisReply* NewReply(const redisReadTask* task, int type) {
  if (!Spend(sizeof(redisReply))) return nullptr;
  auto* r = static_cast<redisReply*>(calloc(1, sizeof(redisReply)));
  if (r == nullptr) return nullptr;
  r->type = type;
  if (task->parent != nullptr) {
    auto* parent = static_cast<redisReply*>(task->parent->obj);
    parent->element[task->idx] = r;
  }
  return r;
}
// The sink of the reply the node thread is reading now (SinkReplyInto).
thread_local const RedisCommand* t_sink = nullptr;

void* CreateString(const redisReadTask* task, char* str, size_t len) {
  const RedisCommand* sink = t_sink;
  size_t keep = len;
  if (sink != nullptr && task->parent == nullptr && task->type == REDIS_REPLY_STRING && !sink->sink().empty() &&
      len == sink->sink_keep() + sink->sink().size()) {
    keep = sink->sink_keep();
  }
  if (!Spend(keep + 1)) return nullptr;
  char* buf = static_cast<char*>(malloc(keep + 1));
  if (buf == nullptr) return nullptr;
  redisReply* r = NewReply(task, task->type);
  if (r == nullptr) {
    free(buf);
    return nullptr;
  }
  std::memcpy(buf, str, keep);
  buf[keep] = '\0';
  r->str = buf;
  r->len = keep;
  if (keep != len) {
    std::byte* dst = sink->sink().data();
    const char* src = str + keep;
    const size_t n = len - keep;
    if (uint64_t* digest = sink->sink_xxh3()) {
      // Copy and hash in 64 KiB pieces: the hash reads what was just written.
      XXH3_state_t st;
      XXH3_64bits_reset(&st);
      constexpr size_t kPiece = 64 << 10;
      for (size_t at = 0; at < n; at += kPiece) {
        const size_t m = std::min(kPiece, n - at);
        std::memcpy(dst + at, src + at, m);
        XXH3_64bits_update(&st, dst + at, m);
      }
      *digest = XXH3_64bits_digest(&st);
    } else {
      std::memcpy(dst, src, n);
    }
    r->integer = static_cast<long long>(len);  // SunkLength
  }
  return r;
}
void* CreateArray(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > kMaxReplyElements) return nullptr;  // the reader reports a protocol error
  if (!Spend(static_cast<uint64_t>(elements) * sizeof(redisReply*))) return nullptr;
  redisReply** el = nullptr;
  if (elements > 0) {
    el = static_cast<redisReply**>(calloc(static_cast<size_t>(elements), sizeof(redisReply*)));
    if (el == nullptr) return nullptr;
  }
  redisReply* r = NewReply(task, REDIS_REPLY_ARRAY);
  if (r == nullptr) {
    free(el);
    return nullptr;
  }
  r->element = el;
  r->elements = static_cast<size_t>(elements);
  return r;
}
void* CreateInteger(const redisReadTask* task, long long value) {
  redisReply* r = NewReply(task, REDIS_REPLY_INTEGER);
  if (r != nullptr) r->integer = value;
  return r;
}
void* CreateNil(const redisReadTask* task) { return NewReply(task, REDIS_REPLY_NIL); }
redisReplyObjectFunctions kBoundedReplies = {CreateString, CreateArray, CreateInteger, CreateNil, freeReplyObject};

// redisGetReply, with bounds on what one reply may buffer and allocate, and
// on how long it may take in all (timeout_ms).
int GetReplyBounded(RedisLink& link, void** reply, uint64_t max_bytes, uint64_t timeout_ms) {
  redisContext* c = link.ctx;
  const uint64_t deadline = MonotonicNanos() + timeout_ms * 1'000'000;
  ReplyBudget budget(max_bytes + (64 << 10));
  void* aux = nullptr;
  if (redisGetReplyFromReader(c, &aux) == REDIS_ERR) return REDIS_ERR;
  if (aux == nullptr) {
    if (!LinkFlush(link)) return REDIS_ERR;
    do {
      if (c->reader->len - c->reader->pos > max_bytes) {
        c->err = REDIS_ERR_PROTOCOL;
        std::snprintf(c->errstr, sizeof(c->errstr), "a reply larger than %llu bytes",
                      static_cast<unsigned long long>(max_bytes));
        return REDIS_ERR;
      }
      if (!LinkWaitReadable(link, deadline) || !LinkFill(link)) return REDIS_ERR;
      if (redisGetReplyFromReader(c, &aux) == REDIS_ERR) return REDIS_ERR;
    } while (aux == nullptr);
  }
  *reply = aux;
  return REDIS_OK;
}

// A command and its reply on a fresh connection (AUTH, CLUSTER SLOTS).
RedisReply CommandBounded(RedisLink& link, std::initializer_list<absl::string_view> args, uint64_t max_bytes,
                          uint64_t timeout_ms) {
  std::vector<const char*> argv;
  std::vector<size_t> len;
  for (absl::string_view a : args) {
    argv.push_back(a.data());
    len.push_back(a.size());
  }
  if (redisAppendCommandArgv(link.ctx, static_cast<int>(argv.size()), argv.data(), len.data()) != REDIS_OK) return nullptr;
  void* raw = nullptr;
  if (GetReplyBounded(link, &raw, max_bytes, timeout_ms) != REDIS_OK) return nullptr;
  return RedisReply(static_cast<redisReply*>(raw));
}

struct Op {
  RedisCommand cmd;
  RedisCluster::Callback done;
  uint64_t deadline_ns = 0;
  CancelToken cancel;
  uint32_t redirects = 0;
  bool asking = false;  // send ASKING first (an ASK redirect)
  bool probe = false;   // the control thread's PING of a node in backoff: not counted
};

}  // namespace

// --- RedisCommand

RedisCommand RedisCommand::Make(std::initializer_list<std::initializer_list<absl::string_view>> args, size_t key_index) {
  RedisCommand c;
  size_t bytes = 16;
  for (const auto& a : args) {
    for (absl::string_view p : a) bytes += p.size() + 2;
    bytes += 24;
  }
  c.wire_.reserve(bytes);
  absl::StrAppend(&c.wire_, "*", args.size(), "\r\n");
  size_t i = 0;
  for (const auto& a : args) {
    const size_t at = AppendBulk(c.wire_, a);
    size_t n = 0;
    for (absl::string_view p : a) n += p.size();
    c.args_.emplace_back(at, n);
    if (i++ == key_index) {
      for (absl::string_view p : a) c.key_.append(p.data(), p.size());
    }
  }
  return c;
}

RedisCommand RedisCommand::MakeList(std::span<const absl::string_view> args, size_t key_index) {
  RedisCommand c;
  size_t bytes = 16;
  for (absl::string_view a : args) bytes += a.size() + 26;
  c.wire_.reserve(bytes);
  absl::StrAppend(&c.wire_, "*", args.size(), "\r\n");
  for (size_t i = 0; i < args.size(); ++i) {
    c.args_.emplace_back(AppendBulk(c.wire_, {args[i]}), args[i].size());
    if (i == key_index) c.key_.assign(args[i].data(), args[i].size());
  }
  return c;
}

RedisCommand RedisCommand::Keyless(std::initializer_list<absl::string_view> args) {
  RedisCommand c;
  absl::StrAppend(&c.wire_, "*", args.size(), "\r\n");
  for (absl::string_view a : args) c.args_.emplace_back(AppendBulk(c.wire_, {a}), a.size());
  c.keyless_ = true;
  return c;
}

// --- decoders

void BoundReplyObjects(redisReader* reader) { reader->fn = &kBoundedReplies; }

uint64_t SunkLength(const redisReply& r) {
  return r.type == REDIS_REPLY_STRING && r.integer > 0 ? static_cast<uint64_t>(r.integer) : 0;
}

absl::StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply* r, absl::string_view asked_host) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY) return absl::InvalidArgumentError("CLUSTER SLOTS: not an array");
  // Each range: [start, end, [host, port, id, ...] (the primary), replicas...].
  std::vector<SlotRange> out;
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      return absl::InvalidArgumentError(absl::StrCat("CLUSTER SLOTS: range ", i, " is not [start, end, [host, port, ...]]"));
    }
    const long long start = e->element[0]->integer, end = e->element[1]->integer;
    const long long port = e->element[2]->element[1]->integer;
    absl::string_view host(e->element[2]->element[0]->str, e->element[2]->element[0]->len);
    if (host.empty()) host = asked_host;
    SlotRange range;
    if (start < 0 || end < start || end >= RedisCluster::kSlots || port < 1 || port > 65535 ||
        !ParseAddress(absl::StrCat(host, ":", port), &range.host, &range.port)) {
      return absl::InvalidArgumentError(absl::StrCat("CLUSTER SLOTS: range ", i, " is out of bounds"));
    }
    range.first = static_cast<uint16_t>(start);
    range.last = static_cast<uint16_t>(end);
    out.push_back(std::move(range));
  }
  return out;
}

bool ParseRedirect(absl::string_view msg, absl::string_view from_host, Redirect* out) {
  // "MOVED <slot> <host>:<port>" or "ASK ...".
  Redirect r;
  if (absl::StartsWith(msg, "MOVED ")) {
    msg.remove_prefix(6);
  } else if (absl::StartsWith(msg, "ASK ")) {
    msg.remove_prefix(4);
    r.ask = true;
  } else {
    return false;
  }
  const size_t sp = msg.find(' ');
  if (sp == absl::string_view::npos || sp == 0) return false;
  int slot = -1;
  auto [p, ec] = std::from_chars(msg.data(), msg.data() + sp, slot);
  if (ec != std::errc() || p != msg.data() + sp || slot < 0 || slot >= static_cast<int>(RedisCluster::kSlots)) {
    return false;
  }
  const absl::string_view addr = msg.substr(sp + 1);
  if (addr.empty()) return false;
  if (!ParseAddress(addr[0] == ':' ? absl::StrCat(from_host, addr) : std::string(addr), &r.host, &r.port)) return false;
  r.slot = static_cast<uint16_t>(slot);
  *out = std::move(r);
  return true;
}

// --- slots

uint16_t RedisCluster::KeySlot(absl::string_view key) {
  // A {hash tag}: the part between the first '{' and the next '}', if not empty.
  if (size_t open = key.find('{'); open != absl::string_view::npos) {
    if (size_t close = key.find('}', open + 1); close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  uint16_t crc = 0;  // CRC16-XMODEM (poly 0x1021, init 0), as the cluster spec says
  for (unsigned char ch : key) {
    crc ^= static_cast<uint16_t>(ch) << 8;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc % kSlots;
}

// --- the implementation

struct RedisCluster::Impl {
  struct Node;

  explicit Impl(const RedisClusterOptions& o) : opts(o) { slot_node.fill(kNoNode); }

  const RedisClusterOptions opts;
  std::vector<std::pair<std::string, int>> seeds;

  // Nodes are added (never removed) under map_mu; each lives until the end.
  mutable Mutex map_mu;
  std::vector<std::unique_ptr<Node>> nodes ABSL_GUARDED_BY(map_mu);
  std::map<std::string, uint16_t> node_by_address ABSL_GUARDED_BY(map_mu);
  std::array<uint16_t, kSlots> slot_node ABSL_GUARDED_BY(map_mu);
  uint64_t slots_covered ABSL_GUARDED_BY(map_mu) = 0;
  uint32_t next_any ABSL_GUARDED_BY(map_mu) = 0;
  std::condition_variable_any map_changed;

  // The control thread: refreshes and retries.
  Mutex control_mu;
  std::condition_variable_any control_cv;
  bool stopping ABSL_GUARDED_BY(control_mu) = false;
  bool refresh_asked ABSL_GUARDED_BY(control_mu) = true;  // the first map
  uint64_t last_refresh_ns ABSL_GUARDED_BY(control_mu) = 0;
  std::multimap<uint64_t, Op*> retries ABSL_GUARDED_BY(control_mu);  // by when
  std::thread control;

  std::atomic<uint64_t> commands{0}, moved{0}, ask{0}, tryagain{0}, clusterdown{0};
  std::atomic<uint64_t> unavailable{0}, deadline{0}, cancelled{0}, errors{0};
  std::atomic<uint64_t> refreshes{0}, refresh_failures{0};
  mutable std::atomic<uint64_t> auth_failures{0}, auth_reported_ns{0};
  std::atomic<bool> last_refresh_ok{false};
  std::atomic<bool> shutting_down{false};  // no node is started from now on

  Node* NodeAt(absl::string_view host, int port);  // finds or starts one (nullptr past kMaxNodes)
  void Route(Op* op);
  Node* NodeFor(const Op& op);  // by its key's slot (nullptr: none known, or shutting down)
  void Finish(Op* op, absl::StatusOr<RedisReply> r);
  void OnReply(Node& from, Op* op, RedisReply reply);
  void Retry(Op* op);
  void ControlLoop();
  bool Refresh();
  // PINGs each mapped node whose link is in backoff, so an idle link learns
  // its node is back (and the tier's health with it).
  void ProbeDownNodes();
  void AskRefresh();
  // A connection to host:port (over TLS when configured), authenticated;
  // an empty link (and *why) when not.
  RedisLink Connect(const std::string& host, int port, std::string* why) const;
  std::unique_ptr<RedisTls> tls;  // set by Create when opts.tls.enabled
};

struct RedisCluster::Impl::Node {
  Node(Impl* c, std::string h, int p) : cluster(c), host(std::move(h)), port(p), address(absl::StrCat(host, ":", p)) {
    thread = std::thread([this] { Run(); });
  }
  ~Node() {
    StopAndJoin();
    CloseLink(link);
  }
  // What is queued fails with Cancelled; the thread ends.
  void StopAndJoin() {
    {
      MutexLock l(&mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }

  void EnqueueAll(std::vector<Op*>& ops) {
    bool refused;
    {
      MutexLock l(&mu);
      refused = stop;
      if (!refused) queue.insert(queue.end(), ops.begin(), ops.end());
    }
    if (refused) {
      for (Op* op : ops) cluster->Finish(op, absl::CancelledError(absl::StrCat(cluster->opts.name, ": shutting down")));
      return;
    }
    cv.notify_one();
  }

  void Enqueue(Op* op) {
    bool refused;
    {
      MutexLock l(&mu);
      refused = stop;
      if (!refused) queue.push_back(op);
    }
    if (refused) {
      cluster->Finish(op, absl::CancelledError(absl::StrCat(cluster->opts.name, ": shutting down")));
      return;
    }
    cv.notify_one();
  }

  void Run();
  // Writes the commands (each after ASKING where it was redirected so)
  // straight from their wire buffers to the socket: no copy into hiredis's
  // output buffer. False when the connection broke.
  bool WriteAll(const std::vector<Op*>& ops);
  // Reads op's reply into pending_reply; false when the connection broke.
  bool ReadReply(Op* op);
  RedisReply pending_reply;
  // A reply of exactly the shape cmd's sink expects ($<keep + sink size>),
  // read past hiredis: its first line and what the reader already holds
  // come from the reader's buffer, the rest straight from the socket into
  // the sink (no copy in between, no 16 KiB reads). 1: *raw is the reply (as
  // SinkReplyInto says); 0: another reply, left to hiredis untouched; -1:
  // the connection broke (ctx->err says how).
  int ReadSunkReply(const RedisCommand& cmd, void** raw);
  // Whether ctx is usable now (connecting if the backoff allows).
  bool EnsureConnected(std::string* why);
  void Disconnect(const std::string& why);

  Impl* const cluster;
  const std::string host;
  const int port;
  const std::string address;

  Mutex mu;
  std::condition_variable_any cv;
  std::deque<Op*> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;

  // The link thread's alone.
  RedisLink link;
  uint64_t oversized_value = 0;  // set by ReadSunkReply: the op's value was this large
  uint64_t backoff_ns = 0, retry_at_ns = 0;
  std::string last_error;

  std::atomic<bool> connected{false};
  std::atomic<bool> in_backoff{false};
  std::atomic<uint64_t> sent{0}, failed{0}, connects{0};
  std::thread thread;
};

RedisLink RedisCluster::Impl::Connect(const std::string& host, int port, std::string* why) const {
  RedisLink link;
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, ToTimeval(opts.connect_timeout_ms));
  if (c == nullptr || c->err != 0) {
    *why = c == nullptr ? "out of memory" : std::string(c->errstr);
    if (c != nullptr) redisFree(c);
    return {};
  }
  link.ctx = c;
  if (redisSetTimeout(c, ToTimeval(opts.io_timeout_ms)) != REDIS_OK) {
    *why = "cannot set the socket timeout";
    CloseLink(link);
    return {};
  }
  BoundReplyObjects(c->reader);
  // The node proves itself before it hears a password.
  if (tls != nullptr && !tls->Handshake(link, host, why)) {
    CloseLink(link);
    return {};
  }
  if (!opts.password.empty() || !opts.user.empty()) {
    RedisReply r = opts.user.empty() ? CommandBounded(link, {"AUTH", opts.password}, 4096, opts.io_timeout_ms)
                                     : CommandBounded(link, {"AUTH", opts.user, opts.password}, 4096, opts.io_timeout_ms);
    if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
      // The server's words (WRONGPASS ...) name no secret; ours neither.
      *why = r == nullptr ? absl::StrCat("AUTH: ", c->errstr)
                          : absl::StrCat("AUTH as user \"", opts.user, "\": ", absl::string_view(r->str, r->len).substr(0, 120));
      if (r != nullptr) {
        // Refused, not lost: said (rate-limited) and counted, or a wrong
        // password would look like a cluster that is merely down.
        auth_failures.fetch_add(1, std::memory_order_relaxed);
        const uint64_t now = MonotonicNanos();
        uint64_t last = auth_reported_ns.load(std::memory_order_relaxed);
        if (opts.on_auth_failure && (last == 0 || now - last > 10'000'000'000ull) &&
            auth_reported_ns.compare_exchange_strong(last, now)) {
          opts.on_auth_failure(absl::StrCat("node ", host, ":", port, " refused ", *why));
        }
      }
      CloseLink(link);
      return {};
    }
  }
  return link;
}

bool RedisCluster::Impl::Node::EnsureConnected(std::string* why) {
  if (link.ctx != nullptr && link.ctx->err == 0) return true;
  if (link.ctx != nullptr) Disconnect(link.ctx->errstr);
  const uint64_t now = MonotonicNanos();
  if (now < retry_at_ns) {
    *why = absl::StrCat("node ", address, " is unreachable (", last_error, "); trying again shortly");
    return false;
  }
  std::string err;
  link = cluster->Connect(host, port, &err);
  if (link.ctx == nullptr) {
    last_error = err;
    backoff_ns = backoff_ns == 0 ? kMinBackoffNs : std::min(kMaxBackoffNs, backoff_ns * 2);
    retry_at_ns = now + backoff_ns;
    in_backoff.store(true, std::memory_order_relaxed);
    *why = absl::StrCat("node ", address, ": ", err);
    cluster->AskRefresh();  // a failover may have moved its slots
    return false;
  }
  backoff_ns = 0;
  retry_at_ns = 0;
  connects.fetch_add(1, std::memory_order_relaxed);
  connected.store(true, std::memory_order_relaxed);
  in_backoff.store(false, std::memory_order_relaxed);
  return true;
}

void RedisCluster::Impl::Node::Disconnect(const std::string& why) {
  CloseLink(link);
  last_error = why;
  connected.store(false, std::memory_order_relaxed);
  // The next command connects at once; a failed connect backs off.
  cluster->AskRefresh();
}

void RedisCluster::Impl::Node::Run() {
  // Commands sent and owed a reply, oldest first. New ones are written as
  // soon as they are queued, between replies, so the node always has the
  // next command while it sends a reply (a steady pipeline, not batches).
  std::deque<Op*> inflight;
  auto fail_inflight = [&](const std::string& err) {
    Disconnect(err);
    failed.fetch_add(inflight.size(), std::memory_order_relaxed);
    for (Op* op : inflight) {
      cluster->Finish(op, absl::UnavailableError(absl::StrCat(cluster->opts.name, ": node ", address, ": ", err)));
    }
    inflight.clear();
  };
  std::vector<Op*> batch;
  for (;;) {
    batch.clear();
    bool stopping;
    {
      MutexLock l(&mu);
      if (inflight.empty()) mu.Await(cv, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop || !queue.empty(); });
      stopping = stop;
      if (stop) {
        batch.assign(queue.begin(), queue.end());
        queue.clear();
      } else {
        size_t bytes = 0;
        while (!queue.empty() && inflight.size() + batch.size() < cluster->opts.max_pipeline &&
               (batch.empty() || bytes + queue.front()->cmd.wire().size() <= kMaxPipelineBytes)) {
          bytes += queue.front()->cmd.wire().size();
          batch.push_back(queue.front());
          queue.pop_front();
        }
      }
    }
    if (stopping) {
      batch.insert(batch.begin(), inflight.begin(), inflight.end());
      for (Op* op : batch) cluster->Finish(op, absl::CancelledError(absl::StrCat(cluster->opts.name, ": shutting down")));
      return;
    }
    // What may not be sent any more fails now.
    const uint64_t now = MonotonicNanos();
    std::vector<Op*> send;
    for (Op* op : batch) {
      if (op->cancel.cancelled()) {
        cluster->Finish(op, absl::CancelledError(absl::StrCat(cluster->opts.name, ": cancelled")));
      } else if (op->deadline_ns != 0 && now > op->deadline_ns) {
        cluster->Finish(op, absl::DeadlineExceededError(absl::StrCat(cluster->opts.name, ": deadline passed before ",
                                                                     address, " was asked")));
      } else {
        send.push_back(op);
      }
    }
    if (!send.empty()) {
      std::string why;
      if (inflight.empty() && !EnsureConnected(&why)) {
        for (Op* op : send) cluster->Finish(op, absl::UnavailableError(absl::StrCat(cluster->opts.name, ": ", why)));
        continue;
      }
      sent.fetch_add(send.size(), std::memory_order_relaxed);
      inflight.insert(inflight.end(), send.begin(), send.end());
      if (!WriteAll(send)) {
        // Nothing more comes on a connection that broke mid-write.
        fail_inflight(link.ctx->err != 0 ? std::string(link.ctx->errstr) : "write failed");
        continue;
      }
    }
    if (inflight.empty()) continue;
    Op* op = inflight.front();
    if (!ReadReply(op)) {
      if (oversized_value != 0) {
        inflight.pop_front();
        cluster->Finish(op, absl::DataLossError(absl::StrCat(cluster->opts.name, ": node ", address, " holds a value of ",
                                                             oversized_value, " bytes under this key, not a block")));
        oversized_value = 0;
      }
      fail_inflight(link.ctx->err != 0 ? std::string(link.ctx->errstr) : "no reply");
      continue;
    }
    inflight.pop_front();
    cluster->OnReply(*this, op, std::move(pending_reply));  // op is gone after
  }
}

int RedisCluster::Impl::Node::ReadSunkReply(const RedisCommand& cmd, void** raw) {
  const uint64_t deadline = MonotonicNanos() + cluster->opts.io_timeout_ms * 1'000'000;
  redisContext* ctx = link.ctx;
  redisReader* r = ctx->reader;
  constexpr size_t kMaxLine = 24;  // "$" and 20 digits and CRLF
  const char* line;
  const char* end;
  for (;;) {
    if (r->err != 0 || r->ridx != -1) return 0;  // hiredis is inside a reply: its own
    line = r->buf + r->pos;
    const size_t avail = r->len - r->pos;
    end = static_cast<const char*>(std::memchr(line, '\n', std::min(avail, kMaxLine)));
    if (end != nullptr) break;
    if (avail >= kMaxLine) return 0;
    if (!LinkWaitReadable(link, deadline) || !LinkFill(link)) return -1;
  }
  if (line[0] != '$' || end - line < 3 || end[-1] != '\r') return 0;
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(line + 1, end - 1, n);
  const size_t keep = cmd.sink_keep();
  const std::span<std::byte> dst = cmd.sink();
  if (ec == std::errc() && p == end - 1 && n != keep + dst.size() && n > cluster->opts.max_reply_bytes) {
    // A value larger than any block under a block's key: never the block,
    // and too large to read. The connection cannot go on past it (its bytes
    // are still coming); the op fails as a bad value, so its key is deleted
    // rather than breaking this connection on every read.
    oversized_value = n;
    ctx->err = REDIS_ERR_PROTOCOL;
    std::snprintf(ctx->errstr, sizeof(ctx->errstr), "a value of %llu bytes, larger than any block",
                  static_cast<unsigned long long>(n));
    return -1;
  }
  if (ec != std::errc() || p != end - 1 || n != keep + dst.size()) return 0;
  r->pos += static_cast<size_t>(end + 1 - line);
  // Bytes of the value: first what the reader holds, then the socket's.
  auto take = [&](char* to, size_t want) {
    const size_t held = std::min(want, r->len - r->pos);
    std::memcpy(to, r->buf + r->pos, held);
    r->pos += held;
    for (size_t got = held; got < want;) {
      if (!LinkWaitReadable(link, deadline)) return false;
      const ssize_t k = LinkRead(link, to + got, want - got);
      if (k < 0) return false;
      got += static_cast<size_t>(k);
    }
    return true;
  };
  char* head = static_cast<char*>(malloc(keep + 1));
  if (head == nullptr) return -1;
  head[keep] = '\0';
  bool ok = take(head, keep);
  SinkObserver* const observer = cmd.sink_observer();
  if (ok && observer != nullptr) observer->Head(absl::string_view(head, keep));
  // The payload in pieces, each hashed (and shown to the observer) while it
  // is in cache.
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  constexpr size_t kPiece = 256 << 10;
  for (size_t at = 0; ok && at < dst.size(); at += kPiece) {
    const size_t m = std::min(kPiece, dst.size() - at);
    ok = take(reinterpret_cast<char*>(dst.data() + at), m);
    if (ok && cmd.sink_xxh3() != nullptr) XXH3_64bits_update(&st, dst.data() + at, m);
    if (ok && observer != nullptr) observer->Piece(dst.subspan(at, m));
  }
  char crlf[2];
  ok = ok && take(crlf, 2);
  if (ok && (crlf[0] != '\r' || crlf[1] != '\n')) {
    ctx->err = REDIS_ERR_PROTOCOL;
    std::snprintf(ctx->errstr, sizeof(ctx->errstr), "a bulk reply without its CRLF");
    ok = false;
  }
  if (!ok) {
    free(head);
    return -1;
  }
  if (cmd.sink_xxh3() != nullptr) *cmd.sink_xxh3() = XXH3_64bits_digest(&st);
  // Drop what was consumed, as hiredis's own reader does after a reply: a run
  // of these reads would otherwise grow its buffer by every read's tail.
  if (r->pos >= 1024) {
    sdsrange(r->buf, static_cast<int>(r->pos), -1);
    r->pos = 0;
    r->len = sdslen(r->buf);
  }
  auto* reply = static_cast<redisReply*>(calloc(1, sizeof(redisReply)));
  if (reply == nullptr) {
    free(head);
    return -1;
  }
  reply->type = REDIS_REPLY_STRING;
  reply->str = head;
  reply->len = keep;
  reply->integer = static_cast<long long>(n);  // SunkLength
  *raw = reply;
  return 1;
}

bool RedisCluster::Impl::Node::ReadReply(Op* op) {
  void* raw = nullptr;
  if (op->asking) {
    if (GetReplyBounded(link, &raw, 4096, cluster->opts.io_timeout_ms) != REDIS_OK) return false;
    freeReplyObject(raw);  // +OK; a refusal shows in the command's own reply
    raw = nullptr;
    op->asking = false;
  }
  const int direct = op->cmd.sink().empty() ? 0 : ReadSunkReply(op->cmd, &raw);
  if (direct < 0) return false;
  if (direct == 0) {
    t_sink = &op->cmd;
    const int got = GetReplyBounded(link, &raw, cluster->opts.max_reply_bytes, cluster->opts.io_timeout_ms);
    t_sink = nullptr;
    if (got != REDIS_OK) return false;
  }
  pending_reply = RedisReply(static_cast<redisReply*>(raw));
  return true;
}

bool RedisCluster::Impl::Node::WriteAll(const std::vector<Op*>& ops) {
  static constexpr absl::string_view kAsking = "*1\r\n$6\r\nASKING\r\n";
  std::vector<iovec> iov;
  iov.reserve(ops.size() * 2);
  for (Op* op : ops) {
    if (op->asking) iov.push_back({const_cast<char*>(kAsking.data()), kAsking.size()});
    iov.push_back({const_cast<char*>(op->cmd.wire().data()), op->cmd.wire().size()});
  }
  return LinkWriteAll(link, iov.data(), static_cast<int>(iov.size()));
}

RedisCluster::Impl::Node* RedisCluster::Impl::NodeAt(absl::string_view host, int port) {
  const std::string address = absl::StrCat(host, ":", port);
  MutexLock l(&map_mu);
  if (auto it = node_by_address.find(address); it != node_by_address.end()) return nodes[it->second].get();
  if (nodes.size() >= kMaxNodes || shutting_down.load(std::memory_order_acquire)) return nullptr;
  nodes.push_back(std::make_unique<Node>(this, std::string(host), port));
  node_by_address[address] = static_cast<uint16_t>(nodes.size() - 1);
  return nodes.back().get();
}

void RedisCluster::Impl::Finish(Op* op, absl::StatusOr<RedisReply> r) {
  if (!r.ok() && !op->probe) {
    switch (r.status().code()) {
      case absl::StatusCode::kUnavailable: unavailable.fetch_add(1, std::memory_order_relaxed); break;
      case absl::StatusCode::kDeadlineExceeded: deadline.fetch_add(1, std::memory_order_relaxed); break;
      case absl::StatusCode::kCancelled: cancelled.fetch_add(1, std::memory_order_relaxed); break;
      default: errors.fetch_add(1, std::memory_order_relaxed); break;
    }
  }
  std::move(op->done)(std::move(r));
  delete op;
}

RedisCluster::Impl::Node* RedisCluster::Impl::NodeFor(const Op& op) {
  Node* node = nullptr;
  {
    MutexLock l(&map_mu);
    uint16_t idx = kNoNode;
    if (!op.cmd.keyless()) idx = slot_node[KeySlot(op.cmd.key())];
    if (idx == kNoNode && !nodes.empty()) idx = static_cast<uint16_t>(next_any++ % nodes.size());  // a redirect corrects it
    if (idx != kNoNode) node = nodes[idx].get();
  }
  if (node == nullptr && !seeds.empty()) node = NodeAt(seeds[0].first, seeds[0].second);
  return node;
}

void RedisCluster::Impl::Route(Op* op) {
  Node* node = NodeFor(*op);
  if (node == nullptr) {
    Finish(op, shutting_down.load(std::memory_order_acquire)
                   ? absl::CancelledError(absl::StrCat(opts.name, ": shutting down"))
                   : absl::UnavailableError(absl::StrCat(opts.name, ": no node known")));
    return;
  }
  node->Enqueue(op);
}

void RedisCluster::Impl::OnReply(Node& from, Op* op, RedisReply reply) {
  if (reply == nullptr) {
    Finish(op, absl::UnavailableError(absl::StrCat(opts.name, ": node ", from.address, ": empty reply")));
    return;
  }
  if (reply->type != REDIS_REPLY_ERROR) {
    Finish(op, std::move(reply));
    return;
  }
  const absl::string_view msg(reply->str, reply->len);
  Redirect redirect;
  const bool is_redirect = absl::StartsWith(msg, "MOVED ") || absl::StartsWith(msg, "ASK ");
  if (is_redirect) {
    if (!ParseRedirect(msg, from.host, &redirect)) {
      Finish(op, absl::UnavailableError(absl::StrCat(opts.name, ": node ", from.address, " sent a malformed redirect")));
      return;
    }
    const bool is_moved = !redirect.ask;
    const int slot = redirect.slot;
    const std::string& host = redirect.host;
    const int port = redirect.port;
    (is_moved ? moved : ask).fetch_add(1, std::memory_order_relaxed);
    if (++op->redirects > opts.max_redirects) {
      Finish(op, absl::UnavailableError(absl::StrCat(opts.name, ": more than ", opts.max_redirects,
                                                     " redirects for one command (slots moving)")));
      return;
    }
    Node* to = NodeAt(host, port);
    if (to == nullptr) {
      Finish(op, absl::UnavailableError(absl::StrCat(opts.name, ": no link to ", host, ":", port,
                                                     " (shutting down, or more than ", kMaxNodes, " nodes)")));
      return;
    }
    if (is_moved) {
      {
        MutexLock l(&map_mu);
        const uint16_t idx = node_by_address.at(to->address);
        if (slot_node[slot] == kNoNode) ++slots_covered;
        slot_node[slot] = idx;
      }
      AskRefresh();
    } else {
      op->asking = true;
    }
    to->Enqueue(op);
    return;
  }
  const bool is_tryagain = absl::StartsWith(msg, "TRYAGAIN"), is_down = absl::StartsWith(msg, "CLUSTERDOWN");
  if (is_tryagain || is_down) {
    (is_tryagain ? tryagain : clusterdown).fetch_add(1, std::memory_order_relaxed);
    if (is_down) AskRefresh();
    const uint64_t now = MonotonicNanos();
    if (op->deadline_ns != 0 && now + kRetryPauseNs > op->deadline_ns) {
      Finish(op, absl::UnavailableError(absl::StrCat(opts.name, ": ", msg.substr(0, 120))));
      return;
    }
    Retry(op);
    return;
  }
  Finish(op, ErrorStatus(msg, absl::StrCat(opts.name, ": node ", from.address)));
}

void RedisCluster::Impl::Retry(Op* op) {
  bool refused;
  {
    MutexLock l(&control_mu);
    refused = stopping;
    if (!refused) retries.emplace(MonotonicNanos() + kRetryPauseNs, op);
  }
  if (refused) {
    Finish(op, absl::CancelledError(absl::StrCat(opts.name, ": shutting down")));
    return;
  }
  control_cv.notify_all();
}

void RedisCluster::Impl::AskRefresh() {
  {
    MutexLock l(&control_mu);
    refresh_asked = true;
  }
  control_cv.notify_all();
}

bool RedisCluster::Impl::Refresh() {
  refreshes.fetch_add(1, std::memory_order_relaxed);
  // Ask the nodes we know (primaries of the current map first), then the seeds.
  std::vector<std::pair<std::string, int>> ask_of;
  {
    MutexLock l(&map_mu);
    std::vector<bool> mapped(nodes.size(), false);
    for (uint16_t idx : slot_node) {
      if (idx != kNoNode) mapped[idx] = true;
    }
    // Nodes that answered lately first (mapped ones before the rest), those
    // in backoff last: a refresh waits on each node it asks that is gone.
    for (int pass = 0; pass < 3; ++pass) {
      for (size_t i = 0; i < nodes.size(); ++i) {
        const bool down = nodes[i]->in_backoff.load(std::memory_order_relaxed);
        if ((pass == 0 && mapped[i] && !down) || (pass == 1 && !mapped[i] && !down) || (pass == 2 && down)) {
          ask_of.emplace_back(nodes[i]->host, nodes[i]->port);
        }
      }
    }
  }
  ask_of.insert(ask_of.end(), seeds.begin(), seeds.end());
  constexpr size_t kMaxAsked = 8;  // a refresh is bounded in time too
  for (size_t k = 0; k < ask_of.size() && k < kMaxAsked; ++k) {
    const auto& [host, port] = ask_of[k];
    std::string why;
    RedisLink link = Connect(host, port, &why);
    if (link.ctx == nullptr) continue;
    RedisReply r = CommandBounded(link, {"CLUSTER", "SLOTS"}, opts.max_reply_bytes, opts.io_timeout_ms);
    CloseLink(link);
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY) continue;
    absl::StatusOr<std::vector<SlotRange>> ranges = ParseClusterSlots(r.get(), host);
    // An empty map (a node reset, or cut off) would unmap every slot: ask the next.
    if (!ranges.ok() || ranges->empty()) continue;
    std::vector<std::pair<std::pair<int64_t, int64_t>, Node*>> owners;
    for (const SlotRange& range : *ranges) {
      Node* n = NodeAt(range.host, range.port);
      if (n != nullptr) owners.push_back({{range.first, range.last}, n});
    }
    {
      MutexLock l(&map_mu);
      slot_node.fill(kNoNode);
      slots_covered = 0;
      for (const auto& [range, n] : owners) {
        const uint16_t idx = node_by_address.at(n->address);
        for (int64_t s = range.first; s <= range.second; ++s) {
          if (slot_node[s] == kNoNode) ++slots_covered;
          slot_node[s] = idx;
        }
      }
    }
    map_changed.notify_all();
    last_refresh_ok.store(true, std::memory_order_relaxed);
    return true;
  }
  refresh_failures.fetch_add(1, std::memory_order_relaxed);
  last_refresh_ok.store(false, std::memory_order_relaxed);
  return false;
}

void RedisCluster::Impl::ProbeDownNodes() {
  std::vector<Node*> down;
  {
    MutexLock l(&map_mu);
    std::vector<bool> mapped(nodes.size(), false);
    for (uint16_t idx : slot_node) {
      if (idx != kNoNode) mapped[idx] = true;
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      if ((mapped[i] || slots_covered == 0) && nodes[i]->in_backoff.load(std::memory_order_relaxed)) {
        down.push_back(nodes[i].get());
      }
    }
  }
  for (Node* n : down) {
    auto* op = new Op{RedisCommand::Keyless({"PING"}), [](absl::StatusOr<RedisReply>) {},
                      MonotonicNanos() + opts.io_timeout_ms * 1'000'000};
    op->probe = true;
    n->Enqueue(op);
  }
}

void RedisCluster::Impl::ControlLoop() {
  for (;;) {
    std::vector<Op*> due;
    bool refresh = false;
    {
      MutexLock l(&control_mu);
      const auto wake = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        const uint64_t now = MonotonicNanos();
        return stopping || (refresh_asked && now >= last_refresh_ns + kMinRefreshGapNs) ||
               (!retries.empty() && retries.begin()->first <= now) ||
               now >= last_refresh_ns + opts.refresh_interval_ms * 1'000'000;
      };
      // Wake for what is due, or in 10 ms to look again (a refresh asked
      // for inside the gap, a retry's time).
      control_mu.AwaitFor(control_cv, std::chrono::milliseconds(10), wake);
      if (stopping) {
        for (auto& [when, op] : retries) due.push_back(op);
        retries.clear();
      } else {
        const uint64_t now = MonotonicNanos();
        while (!retries.empty() && retries.begin()->first <= now) {
          due.push_back(retries.begin()->second);
          retries.erase(retries.begin());
        }
        if ((refresh_asked && now >= last_refresh_ns + kMinRefreshGapNs) ||
            now >= last_refresh_ns + opts.refresh_interval_ms * 1'000'000) {
          refresh = true;
          refresh_asked = false;
          last_refresh_ns = now;
        }
      }
    }
    bool stop;
    {
      MutexLock l(&control_mu);
      stop = stopping;
    }
    if (stop) {
      for (Op* op : due) Finish(op, absl::CancelledError(absl::StrCat(opts.name, ": shutting down")));
      return;
    }
    if (refresh) {
      Refresh();
      ProbeDownNodes();
    }
    for (Op* op : due) Route(op);
  }
}

// --- RedisCluster

RedisCluster::RedisCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(const RedisClusterOptions& opts) {
  if (opts.seeds.empty()) return absl::InvalidArgumentError(absl::StrCat(opts.name, ": no seed nodes (host:port)"));
  if (opts.max_pipeline == 0) return absl::InvalidArgumentError(absl::StrCat(opts.name, ": max_pipeline is 0"));
  auto impl = std::make_unique<Impl>(opts);
  if (opts.tls.enabled) {
    absl::StatusOr<std::unique_ptr<RedisTls>> tls = RedisTls::Create(opts.tls);
    if (!tls.ok()) return absl::InvalidArgumentError(absl::StrCat(opts.name, ": ", tls.status().message()));
    impl->tls = *std::move(tls);
  }
  for (const std::string& s : opts.seeds) {
    std::string host;
    int port;
    if (!ParseAddress(s, &host, &port)) {
      return absl::InvalidArgumentError(absl::StrCat(opts.name, ": seed \"", s.substr(0, 80), "\" is not host:port"));
    }
    impl->seeds.emplace_back(host, port);
  }
  Impl* raw = impl.get();
  for (const auto& [host, port] : raw->seeds) raw->NodeAt(host, port);
  raw->control = std::thread([raw] { raw->ControlLoop(); });
  return std::unique_ptr<RedisCluster>(new RedisCluster(std::move(impl)));
}

RedisCluster::~RedisCluster() {
  impl_->shutting_down.store(true, std::memory_order_release);
  {
    MutexLock l(&impl_->control_mu);
    impl_->stopping = true;
  }
  impl_->control_cv.notify_all();
  impl_->control.join();
  // Each node fails what it still holds as it stops; a callback that
  // redirects to another node meets a stopped node or none (Cancelled).
  for (size_t i = 0;; ++i) {
    Impl::Node* n;
    {
      MutexLock l(&impl_->map_mu);
      if (i >= impl_->nodes.size()) break;
      n = impl_->nodes[i].get();
    }
    n->StopAndJoin();
  }
}

void RedisCluster::Submit(RedisCommand cmd, Callback done, uint64_t deadline_ns, CancelToken cancel) {
  impl_->commands.fetch_add(1, std::memory_order_relaxed);
  auto* op = new Op{std::move(cmd), std::move(done),
                    deadline_ns != 0 ? deadline_ns : MonotonicNanos() + impl_->opts.io_timeout_ms * 1'000'000,
                    std::move(cancel)};
  impl_->Route(op);
}

void RedisCluster::SubmitAll(std::vector<std::pair<RedisCommand, Callback>> cmds, uint64_t deadline_ns) {
  if (deadline_ns == 0) deadline_ns = MonotonicNanos() + impl_->opts.io_timeout_ms * 1'000'000;
  impl_->commands.fetch_add(cmds.size(), std::memory_order_relaxed);
  std::map<Impl::Node*, std::vector<Op*>> by_node;
  for (auto& [cmd, done] : cmds) {
    auto* op = new Op{std::move(cmd), std::move(done), deadline_ns};
    Impl::Node* node = impl_->NodeFor(*op);
    if (node == nullptr) {
      impl_->Route(op);  // fails it with the reason
      continue;
    }
    by_node[node].push_back(op);
  }
  for (auto& [node, ops] : by_node) node->EnqueueAll(ops);
}

absl::StatusOr<RedisReply> RedisCluster::Call(RedisCommand cmd, uint64_t timeout_ms) {
  Mutex mu;
  std::condition_variable_any cv;
  std::optional<absl::StatusOr<RedisReply>> out;
  Submit(
      std::move(cmd),
      [&](absl::StatusOr<RedisReply> r) {
        MutexLock l(&mu);
        out = std::move(r);
        cv.notify_all();
      },
      MonotonicNanos() + timeout_ms * 1'000'000);
  MutexLock l(&mu);
  mu.Await(cv, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return out.has_value(); });
  return std::move(*out);
}

void RedisCluster::RefreshSoon() { impl_->AskRefresh(); }

bool RedisCluster::WaitForMap(uint64_t timeout_ms) {
  MutexLock l(&impl_->map_mu);
  return impl_->map_mu.AwaitFor(impl_->map_changed, std::chrono::milliseconds(timeout_ms),
                                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return impl_->slots_covered == kSlots; });
}

RedisCluster::Stats RedisCluster::GetStats() const {
  Stats s;
  const Impl& i = *impl_;
  s.commands = i.commands.load(std::memory_order_relaxed);
  s.moved = i.moved.load(std::memory_order_relaxed);
  s.ask = i.ask.load(std::memory_order_relaxed);
  s.tryagain = i.tryagain.load(std::memory_order_relaxed);
  s.clusterdown = i.clusterdown.load(std::memory_order_relaxed);
  s.unavailable = i.unavailable.load(std::memory_order_relaxed);
  s.deadline = i.deadline.load(std::memory_order_relaxed);
  s.cancelled = i.cancelled.load(std::memory_order_relaxed);
  s.errors = i.errors.load(std::memory_order_relaxed);
  s.refreshes = i.refreshes.load(std::memory_order_relaxed);
  s.refresh_failures = i.refresh_failures.load(std::memory_order_relaxed);
  s.auth_failures = i.auth_failures.load(std::memory_order_relaxed);
  MutexLock l(&i.map_mu);
  s.slots_covered = i.slots_covered;
  std::vector<uint64_t> slots(i.nodes.size(), 0);
  for (uint16_t idx : i.slot_node) {
    if (idx != kNoNode) ++slots[idx];
  }
  for (size_t k = 0; k < i.nodes.size(); ++k) {
    const Impl::Node& n = *i.nodes[k];
    s.nodes.push_back({n.address, n.connected.load(std::memory_order_relaxed), slots[k],
                       n.sent.load(std::memory_order_relaxed), n.failed.load(std::memory_order_relaxed),
                       n.connects.load(std::memory_order_relaxed)});
  }
  return s;
}

TierHealth RedisCluster::Health() const {
  const Impl& i = *impl_;
  MutexLock l(&i.map_mu);
  if (i.slots_covered == 0 && !i.last_refresh_ok.load(std::memory_order_relaxed)) return TierHealth::kFailed;
  if (i.slots_covered < kSlots || !i.last_refresh_ok.load(std::memory_order_relaxed)) return TierHealth::kDegraded;
  std::vector<bool> mapped(i.nodes.size(), false);
  for (uint16_t idx : i.slot_node) {
    if (idx != kNoNode) mapped[idx] = true;
  }
  for (size_t k = 0; k < i.nodes.size(); ++k) {
    if (mapped[k] && i.nodes[k]->in_backoff.load(std::memory_order_relaxed)) return TierHealth::kDegraded;
  }
  return TierHealth::kHealthy;
}

}  // namespace kvtier
