// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/replayer.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/units.h"
#include "kvtier/client.h"
#include "tools/common/payload.h"
#include "tools/common/table.h"

namespace kvtier::tools {
namespace {

struct Progress {
  std::atomic<uint64_t> done{0}, blocks_requested{0}, blocks_hit{0}, bytes_stored{0};
};

// One engine session: its requests in arrival order.
class SessionWorker {
 public:
  SessionWorker(const ReplayOptions& opts, std::string socket, std::vector<Request*> requests, Progress* progress,
                uint64_t start_ns)
      : opts_(opts), socket_(std::move(socket)), requests_(std::move(requests)), progress_(progress),
        start_ns_(start_ns) {}

  void Run() {
    AttachOptions ao;
    ao.socket_path = socket_;
    ao.ns = opts_.ns;
    ao.client_name = "kvtier-replay";
    auto client = Client::Attach(ao);
    if (!client.ok()) {
      result_.error = client.status().ToString();
      progress_->done += requests_.size();
      return;
    }
    client_ = std::move(*client);
    for (size_t i = 0; i < requests_.size(); ++i) {
      Request* r = requests_[i];
      if (opts_.speed > 0) {
        const uint64_t due = start_ns_ + static_cast<uint64_t>(static_cast<double>(r->arrival_ms) * 1e6 / opts_.speed);
        const uint64_t now = MonotonicNanos();
        if (due > now) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
      }
      if (r->keys.empty() && !r->tokens.empty()) r->keys = client_->ComputeKeys(r->tokens);
      if (!One(*r)) {
        // This session ends here: its requests left count as done, or the
        // replay would wait for them for ever.
        progress_->done += requests_.size() - i;
        return;
      }
      progress_->done += 1;
    }
  }

  ReplayResult& result() { return result_; }

 private:
  // Fails (false, error set) on anything but a full tier.
  bool Fail(const Status& s) {
    result_.error = s.ToString();
    return false;
  }

  bool One(const Request& r) {
    const uint64_t t_req = MonotonicNanos();
    const std::span<const BlockKey> keys(r.keys);
    ++result_.requests;
    result_.prompt_tokens += r.prompt_tokens;
    result_.blocks_requested += keys.size();
    progress_->blocks_requested += keys.size();
    uint32_t hit = 0;
    if (!keys.empty()) {
      // The scheduler's probe (no side effects), then the committed lookup.
      auto probe = client_->Lookup(keys);
      if (!probe.ok()) return Fail(probe.status());
      uint64_t t0 = MonotonicNanos();
      auto found = client_->Lookup(keys, {.lease = true});
      result_.lookup.Add(MonotonicNanos() - t0);
      if (!found.ok()) return Fail(found.status());
      hit = found->hit_blocks;
      for (uint32_t i = 0; i < hit; ++i) {
        // Below host memory (NVMe, or a shared tier), or in it.
        (found->tiers[i] == TierKind::kHost || found->tiers[i] == TierKind::kGpu ? result_.blocks_hit_host
                                                                                 : result_.blocks_hit_lower)++;
      }
      uint32_t loaded = 0;
      if (hit > 0) {
        t0 = MonotonicNanos();
        auto views = client_->Load(found->lease, keys.first(hit));
        if (!views.ok()) return Fail(views.status());
        // A block that could not come back is recomputed like a miss.
        loaded = static_cast<uint32_t>(views->size());
        result_.load_failures += hit - loaded;
        // An engine copies the blocks into its KV cache; we check them.
        for (uint32_t i = 0; i < loaded; ++i) {
          const BlockView& v = (*views)[i];
          if (v.size != client_->block_bytes() || !VerifyPayload(keys[i], {v.data, v.size})) ++result_.verify_failures;
        }
        result_.load.Add(MonotonicNanos() - t0);
        result_.blocks_loaded += loaded;
        result_.bytes_loaded += uint64_t{loaded} * client_->block_bytes();
        if (Status s = client_->Release(found->lease); !s.ok()) return Fail(s);
        if (loaded > 0) ++result_.requests_with_hit;
      }
      result_.blocks_hit += loaded;
      progress_->blocks_hit += loaded;
      hit = loaded;
    }
    // Prefill computed the rest; offload it.
    if (hit < keys.size()) {
      const uint64_t t0 = MonotonicNanos();
      auto ticket = client_->StoreBegin(keys.subspan(hit));
      if (!ticket.ok()) {
        if (ticket.status().code() != ErrorCode::kNoSpace) return Fail(ticket.status());
        ++result_.store_refused;
        if (result_.store_refused_reason.empty()) result_.store_refused_reason = ticket.status().message();
      } else {
        for (size_t i = 0; i < ticket->slots.size(); ++i) {
          const StoreSlot& s = ticket->slots[i];
          if (s.needed) FillPayload(keys[hit + i], {s.data, s.size});
        }
        if (Status s = client_->StoreCommit(*ticket); !s.ok()) return Fail(s);
        result_.store.Add(MonotonicNanos() - t0);
        result_.blocks_stored += ticket->needed;
        result_.bytes_stored += uint64_t{ticket->needed} * client_->block_bytes();
        progress_->bytes_stored += uint64_t{ticket->needed} * client_->block_bytes();
      }
    }
    result_.request.Add(MonotonicNanos() - t_req);
    return true;
  }

  const ReplayOptions& opts_;
  std::string socket_;
  std::vector<Request*> requests_;
  Progress* progress_;
  uint64_t start_ns_;
  std::unique_ptr<Client> client_;
  ReplayResult result_;
};

void DrawProgress(const Progress& p, uint64_t total, uint64_t start_ns, bool final) {
  const uint64_t done = p.done.load();
  const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(frac * width);
  const uint64_t req = p.blocks_requested.load();
  const double hit = req ? static_cast<double>(p.blocks_hit.load()) / static_cast<double>(req) : 0;
  const double secs = static_cast<double>(MonotonicNanos() - start_ns) / 1e9;
  std::fprintf(stderr, "\r[%s%s] %llu/%llu requests  hit %.3f  stored %s  %s   ", std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total), hit, FormatBytes(p.bytes_stored.load()).c_str(),
               Duration(secs).c_str());
  if (final) std::fprintf(stderr, "\n");
}

}  // namespace

double ReplayResult::token_hit_rate() const {
  return blocks_requested ? static_cast<double>(blocks_hit) / static_cast<double>(blocks_requested) : 0;
}
double ReplayResult::request_hit_rate() const {
  return requests ? static_cast<double>(requests_with_hit) / static_cast<double>(requests) : 0;
}
double ReplayResult::reused_token_ratio() const {
  return prompt_tokens ? static_cast<double>(blocks_hit * block_tokens) / static_cast<double>(prompt_tokens) : 0;
}

nlohmann::json ReplayResult::ToJson() {
  nlohmann::json daemons = nlohmann::json::array();
  for (const PerSocket& p : per_socket) {
    daemons.push_back({{"socket", p.socket},
                       {"requests", p.requests},
                       {"blocks_requested", p.blocks_requested},
                       {"blocks_hit", p.blocks_hit},
                       {"token_hit_rate", p.blocks_requested ? double(p.blocks_hit) / double(p.blocks_requested) : 0.0}});
  }
  return nlohmann::json{{"requests", requests},
                        {"daemons", daemons},
                        {"prompt_tokens", prompt_tokens},
                        {"blocks_requested", blocks_requested},
                        {"blocks_hit", blocks_hit},
                        {"host_hit_blocks", blocks_hit_host},
                        {"lower_hit_blocks", blocks_hit_lower},
                        {"load_failures", load_failures},
                        {"token_hit_rate", token_hit_rate()},
                        {"request_hit_rate", request_hit_rate()},
                        {"reused_token_ratio", reused_token_ratio()},
                        {"blocks_stored", blocks_stored},
                        {"bytes_stored", bytes_stored},
                        {"blocks_loaded", blocks_loaded},
                        {"bytes_loaded", bytes_loaded},
                        {"verify_failures", verify_failures},
                        {"store_refused", store_refused},
                        {"store_refused_reason", store_refused_reason},
                        {"elapsed_s", elapsed_s},
                        {"lookup_p50_us", lookup.PercentileUs(50)},
                        {"lookup_p99_us", lookup.PercentileUs(99)},
                        {"load_p50_us", load.PercentileUs(50)},
                        {"load_p99_us", load.PercentileUs(99)},
                        {"store_p50_us", store.PercentileUs(50)},
                        {"store_p99_us", store.PercentileUs(99)},
                        {"request_p50_us", request.PercentileUs(50)},
                        {"request_p99_us", request.PercentileUs(99)},
                        {"error", error}};
}

ReplayResult Replay(Workload& workload, const ReplayOptions& opts) {
  const uint32_t n = std::max<uint32_t>(opts.sessions, 1);
  std::vector<std::vector<Request*>> split(n);
  for (Request& r : workload.requests) split[r.stream % n].push_back(&r);
  Progress progress;
  const uint64_t start = MonotonicNanos();
  std::vector<std::unique_ptr<SessionWorker>> workers;
  const std::vector<std::string> sockets = opts.socket_paths.empty() ? std::vector<std::string>{""} : opts.socket_paths;
  for (uint32_t i = 0; i < n; ++i) {
    workers.push_back(std::make_unique<SessionWorker>(opts, sockets[i % sockets.size()], split[i], &progress, start));
  }
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w] { w->Run(); });
  const bool tty = opts.progress && isatty(2);
  const uint64_t total = workload.requests.size();
  uint64_t last_tenth = 0;
  while (progress.done.load() < total) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (tty) {
      DrawProgress(progress, total, start, false);
    } else if (opts.progress) {
      const uint64_t tenth = progress.done.load() * 10 / std::max<uint64_t>(total, 1);
      if (tenth > last_tenth && tenth < 10) {
        last_tenth = tenth;
        DrawProgress(progress, total, start, true);
      }
    }
  }
  for (auto& t : threads) t.join();
  if (opts.progress) DrawProgress(progress, total, start, true);

  ReplayResult out;
  out.block_tokens = workload.block_tokens;
  out.elapsed_s = static_cast<double>(MonotonicNanos() - start) / 1e9;
  for (const std::string& s : sockets) out.per_socket.push_back({.socket = s});
  for (size_t i = 0; i < workers.size(); ++i) {
    ReplayResult& r = workers[i]->result();
    ReplayResult::PerSocket& ps = out.per_socket[i % sockets.size()];
    ps.requests += r.requests;
    ps.blocks_requested += r.blocks_requested;
    ps.blocks_hit += r.blocks_hit;
    out.requests += r.requests;
    out.prompt_tokens += r.prompt_tokens;
    out.blocks_requested += r.blocks_requested;
    out.blocks_hit += r.blocks_hit;
    out.blocks_hit_host += r.blocks_hit_host;
    out.blocks_hit_lower += r.blocks_hit_lower;
    out.load_failures += r.load_failures;
    out.requests_with_hit += r.requests_with_hit;
    out.blocks_stored += r.blocks_stored;
    out.bytes_stored += r.bytes_stored;
    out.blocks_loaded += r.blocks_loaded;
    out.bytes_loaded += r.bytes_loaded;
    out.verify_failures += r.verify_failures;
    out.store_refused += r.store_refused;
    if (out.store_refused_reason.empty()) out.store_refused_reason = r.store_refused_reason;
    out.lookup.Merge(r.lookup);
    out.load.Merge(r.load);
    out.store.Merge(r.store);
    out.request.Merge(r.request);
    if (out.error.empty()) out.error = r.error;
  }
  return out;
}

}  // namespace kvtier::tools
