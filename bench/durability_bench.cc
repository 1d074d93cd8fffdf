// rackhub-durability-bench: what durability costs a training job, measured
// with a real rackhubd (docs/durability.md, issue 11):
//
//  (b) iteration time of a training loop on a hub that checkpoints the tenant
//      every N iterations (or every S seconds) against the same loop on a hub
//      with checkpoints off. One hub per configuration, each with its own state
//      directory and a tenant of `--mib` MiB of fp32 Adam parameters (so the
//      checkpoint holds 3x that: parameters, m, v) trained by 2 workers
//      (threads of this process, one librackhub Client each). Rounds are
//      interleaved: round r runs --iterations iterations on every hub in turn
//      (rotated order), so a noisy machine moves every configuration. An
//      iteration is timed as in rackhub-bench: from the moment the last
//      worker started it (the workers meet at a barrier first) until the last
//      worker has its result. Between runs the bench waits until the hub that
//      just ran is quiet (no CPU used for 250 ms, no checkpoint being
//      written), so a checkpoint never spills into another configuration's
//      run. Checkpoint sizes, counts and copy/write times are read from the
//      hubs' logs ("checkpoint: tenant ... wrote ...").
//
//  (c) hub restart -> first completed iteration: a tenant of --restart-mib MiB
//      of Adam parameters trained continuously by 2 workers; per trial the hub
//      is killed (SIGKILL mid-iteration, after a checkpoint taken through the
//      admin API while training went on; or SIGTERM mid-iteration, which
//      checkpoints on the way down), optionally the checkpoint files' pages
//      are dropped from the page cache ("cold", as after a reboot; "warm":
//      left, as after a process crash), and the hub is started again on the
//      same state directory and ports. The clients reconnect by themselves.
//      Measured from the restart's exec: the "starting" log line, the
//      restore (read + verify + install into the lanes: the "lanes started"
//      and "resumed ... in N ms" log lines), the ready file (listeners bound,
//      admin API up), every client reconnected (Client::reconnects()), and
//      the first iteration completed on every worker (after the
//      resynchronization a rollback needs: kRolledBack -> Pull -> PushPull).
//      Each round also measures the disk's cold sequential read speed with a
//      plain file of the checkpoint's size in the state directory (the
//      workers paused): bytes / that speed is the disk-speed bound of the
//      restore.
//
// Results: bench/results/durability-*.md. Workers are threads (the client is
// thread-safe; each has its own I/O thread), the hubs child processes.

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/client/client.h"
#include "support/bench_util.h"

namespace {

namespace fs = std::filesystem;
namespace pb = rackhub::admin::v1;
namespace rc = rackhub::client;
using Clock = std::chrono::steady_clock;
using namespace rackhub::bench;

// ---- the hub's log ----

struct LogLine {
  double wall_ms = 0;  // the line's timestamp (local time, ms) as Unix ms
  std::string text;    // after the timestamp
};

// Lines of a rackhubd log ("%Y-%m-%dT%H:%M:%S.%e level text").
std::vector<LogLine> ReadLog(const std::string& path) {
  std::vector<LogLine> out;
  std::istringstream in(ReadAll(path));
  std::string line;
  while (std::getline(in, line)) {
    std::tm tm{};
    int ms = 0;
    if (std::sscanf(line.c_str(), "%d-%d-%dT%d:%d:%d.%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                    &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
      continue;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_isdst = -1;
    const auto sp = line.find(' ');
    out.push_back({static_cast<double>(std::mktime(&tm)) * 1000.0 + ms,
                   sp == std::string::npos ? "" : line.substr(sp + 1)});
  }
  return out;
}

const LogLine* FindLine(const std::vector<LogLine>& log, const std::string& needle) {
  for (const LogLine& l : log) {
    if (l.text.find(needle) != std::string::npos) return &l;
  }
  return nullptr;
}

// "checkpoint: tenant 't' wrote ckpt-...rhc (...; 192.0 MiB; copy 12 ms, write 345 ms)"
struct CheckpointWrite {
  double end_wall_ms = 0, mib = 0, copy_ms = 0, write_ms = 0;
  double start_wall_ms() const { return end_wall_ms - copy_ms - write_ms; }
};
std::vector<CheckpointWrite> CheckpointWrites(const std::vector<LogLine>& log) {
  static const std::regex re(
      R"(wrote \S+ \(.*; ([0-9.]+) MiB; copy ([0-9]+) ms, write ([0-9]+) ms\))");
  std::vector<CheckpointWrite> out;
  for (const LogLine& l : log) {
    std::smatch m;
    if (l.text.find("checkpoint: tenant") == std::string::npos ||
        !std::regex_search(l.text, m, re)) {
      continue;
    }
    out.push_back({l.wall_ms, std::stod(m[1]), std::stod(m[2]), std::stod(m[3])});
  }
  return out;
}

// ---- admin API ----

std::unique_ptr<grpc::ClientContext> Ctx(int seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& admin) {
  return grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
}

// A tenant of 2 workers whose keys default to Adam; returns its token.
std::string CreateTenant(const std::string& admin, const std::string& name, uint64_t bytes) {
  auto stub = pb::TenantService::NewStub(Channel(admin));
  pb::CreateTenantRequest req;
  req.set_name(name);
  req.set_workers_per_rack(2);
  req.mutable_default_optimizer()->set_type(pb::ADAM);
  req.mutable_default_optimizer()->set_learning_rate(1e-3);
  // The quota counts hub memory: Adam with 2 workers holds ~6.1x the fp32
  // parameters (docs/architecture.md, Memory a key holds).
  req.mutable_quotas()->set_max_parameter_bytes(bytes * 8 + (64ull << 20));
  pb::CreateTenantResponse resp;
  if (auto s = stub->CreateTenant(Ctx(10).get(), req, &resp); !s.ok()) {
    Die("create tenant " + name + " on " + admin + ": " + s.error_message());
  }
  return resp.token();
}

pb::Checkpoint CreateCheckpoint(const std::string& admin, const std::string& tenant) {
  auto stub = pb::CheckpointService::NewStub(Channel(admin));
  pb::CreateCheckpointRequest req;
  req.set_tenant(tenant);
  req.set_timeout_ms(60000);
  pb::Checkpoint out;
  if (auto s = stub->CreateCheckpoint(Ctx(120).get(), req, &out); !s.ok()) {
    Die("checkpoint " + tenant + ": " + s.error_message());
  }
  return out;
}

std::vector<pb::Checkpoint> ListCheckpoints(const std::string& admin, const std::string& tenant) {
  auto stub = pb::CheckpointService::NewStub(Channel(admin));
  pb::ListCheckpointsRequest req;
  req.set_tenant(tenant);
  pb::ListCheckpointsResponse resp;
  if (auto s = stub->ListCheckpoints(Ctx(10).get(), req, &resp); !s.ok()) {
    Die("list checkpoints of " + tenant + ": " + s.error_message());
  }
  return {resp.checkpoints().begin(), resp.checkpoints().end()};
}

// ---- a worker: one Client, `keys` fp32 keys, fixed gradients ----

class Worker {
 public:
  Worker(const std::string& hub, const std::string& tenant, const std::string& token, uint32_t rank,
         uint32_t keys, uint64_t bytes)
      : rank_(rank) {
    rc::Options o;
    o.hub = hub;
    o.tenant = tenant;
    o.token = token;
    o.rank = rank;
    o.connect_timeout = std::chrono::seconds(30);
    rc::Error e;
    client_ = rc::Client::Connect(o, &e);
    if (!client_) Die("worker " + std::to_string(rank) + ": connect: " + e.message);
    const uint64_t per_key = bytes / 4 / keys;
    for (uint32_t k = 0; k < keys; ++k) {
      rc::KeyDecl d;
      d.name = "w" + std::to_string(k);
      d.elements = per_key;
      rc::KeyId id;
      if (auto err = client_->DeclareKey(d, &id); !err.ok()) Die("declare: " + err.message);
      ids_.push_back(id);
      grads_.emplace_back(per_key);
      outs_.emplace_back(per_key);
      uint32_t x = 2463534242u + rank * 7919u + k;
      for (float& g : grads_.back()) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        g = (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 1e-3f;
      }
    }
  }

  // One iteration: PushPull of every key. 1: every key completed. 0: the
  // hub rolled back or failed the step (kRolledBack, kServer: WORKER_LOST,
  // BAD_ITERATION, ...): the failed keys were Pulled, as a trainer does, and
  // the step is dropped. Any other error is fatal for the benchmark.
  int Step() {
    std::vector<rc::Ticket> t(ids_.size());
    for (size_t k = 0; k < ids_.size(); ++k) t[k] = client_->PushPull(ids_[k], grads_[k], outs_[k]);
    std::vector<size_t> resync;
    for (size_t k = 0; k < ids_.size(); ++k) {
      const rc::Error e = client_->Wait(t[k]);
      if (e.ok()) continue;
      Note(e);
      if (e.code != rc::ErrorCode::kRolledBack && e.code != rc::ErrorCode::kServer) {
        Die("worker " + std::to_string(rank_) + ": push_pull: " + e.message);
      }
      resync.push_back(k);
    }
    for (size_t k : resync) {
      const rc::Error e = client_->Wait(client_->Pull(ids_[k], outs_[k]));
      if (!e.ok()) Note(e);
    }
    return resync.empty() ? 1 : 0;
  }

  uint64_t reconnects() const { return client_->reconnects(); }
  std::string TakeNotes() {
    std::lock_guard l(mu_);
    std::string out;
    for (const auto& [what, n] : notes_)
      out += (out.empty() ? "" : ", ") + what + " x" + std::to_string(n);
    notes_.clear();
    return out;
  }

 private:
  void Note(const rc::Error& e) {
    std::string what = rc::ErrorCodeName(e.code);
    if (e.code == rc::ErrorCode::kServer)
      what += std::string("/") + rackhub::client::WireErrorName(e.wire);
    std::lock_guard l(mu_);
    ++notes_[what];
  }

  uint32_t rank_;
  std::unique_ptr<rc::Client> client_;
  std::vector<rc::KeyId> ids_;
  std::vector<std::vector<float>> grads_, outs_;
  std::mutex mu_;
  std::map<std::string, int> notes_;
};

// ---- disk ----

void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Plain sequential write (8 MiB writes + fdatasync) and cold read of a file
// of `bytes`; GB/s (1e9 bytes/s) of each.
std::pair<double, double> DiskSpeed(const std::string& path, uint64_t bytes) {
  std::vector<char> buf(8 << 20, 'r');
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - done));
    if (n <= 0) Die("write " + path + ": " + std::strerror(errno));
    done += static_cast<uint64_t>(n);
  }
  ::fdatasync(fd);
  ::close(fd);
  const double w = bytes / 1e6 / Ms(Clock::now() - t0);
  DropCache(path);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  const double r = bytes / 1e6 / Ms(Clock::now() - t0);
  fs::remove(path);
  return {w, r};
}

void DropCheckpointCaches(const std::string& state_dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(state_dir + "/checkpoints", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) DropCache(it->path().string());
  }
}

// ---- (b) iteration time with periodic checkpoints ----

struct IterConfig {
  std::string label;
  std::vector<std::string> flags;
  std::unique_ptr<HubProcess> hub;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<double> iteration_ms;  // every timed iteration of every round
  std::vector<double> round_median, round_mean;
  std::vector<std::pair<double, double>> windows;  // wall ms of each timed run
  // Per timed run, per iteration: wall-clock start and end (ms) and time.
  struct Iter {
    double start, end, ms;
  };
  std::vector<std::vector<Iter>> runs;
  uint64_t iterations = 0;  // all, warm-up included
};

IterConfig MakeConfig(const std::string& spec) {
  IterConfig c;
  if (spec == "off") {
    c.label = "off";
    c.flags = {"--checkpoint-every-iterations", "0", "--checkpoint-every-seconds", "0"};
  } else if (!spec.empty() && spec.back() == 's') {
    c.label = "every " + spec.substr(0, spec.size() - 1) + " s";
    c.flags = {"--checkpoint-every-iterations", "0", "--checkpoint-every-seconds",
               spec.substr(0, spec.size() - 1)};
  } else {
    c.label = "N=" + spec;
    c.flags = {"--checkpoint-every-iterations", spec, "--checkpoint-every-seconds", "0"};
  }
  return c;
}

// Runs `iterations` iterations with the workers meeting at a barrier before
// each; returns each iteration's time (last start to last end, ms) and the
// run's wall-clock window.
std::vector<double> RunIterations(IterConfig& c, uint32_t iterations,
                                  std::pair<double, double>* window,
                                  std::vector<IterConfig::Iter>* walls = nullptr) {
  const size_t w = c.workers.size();
  std::vector<std::vector<Clock::time_point>> start(w, std::vector<Clock::time_point>(iterations)),
      end = start;
  std::barrier sync(static_cast<std::ptrdiff_t>(w));
  const double wall0 = WallMs();
  const auto steady0 = Clock::now();
  std::vector<std::thread> threads;
  for (size_t r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      for (uint32_t i = 0; i < iterations; ++i) {
        sync.arrive_and_wait();
        start[r][i] = Clock::now();
        if (c.workers[r]->Step() != 1) {
          Die(c.label + ": an iteration failed: " + c.workers[r]->TakeNotes());
        }
        end[r][i] = Clock::now();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> ms(iterations);
  Clock::time_point first{}, last{};
  for (uint32_t i = 0; i < iterations; ++i) {
    Clock::time_point s{}, e{};
    for (size_t r = 0; r < w; ++r) s = std::max(s, start[r][i]), e = std::max(e, end[r][i]);
    ms[i] = Ms(e - s);
    if (walls) walls->push_back({wall0 + Ms(s - steady0), wall0 + Ms(e - steady0), ms[i]});
    if (i == 0) first = s;
    last = e;
  }
  *window = {wall0 + Ms(first - steady0), wall0 + Ms(last - steady0)};
  c.iterations += iterations;
  return ms;
}

void PartIterations(const std::string& bin, const std::string& dir, std::vector<std::string> specs,
                    uint64_t bytes, uint32_t keys, uint32_t iterations, uint32_t warmup,
                    uint32_t rounds) {
  std::vector<IterConfig> configs;
  for (const auto& s : specs) configs.push_back(MakeConfig(s));
  for (size_t i = 0; i < configs.size(); ++i) {
    IterConfig& c = configs[i];
    c.hub =
        std::make_unique<HubProcess>(bin, dir + "/iter-" + std::to_string(i), "rackhubd", c.flags);
    c.hub->Start();
    const std::string token = CreateTenant(c.hub->admin, "train", bytes);
    for (uint32_t r = 0; r < 2; ++r) {
      c.workers.push_back(std::make_unique<Worker>(c.hub->data, "train", token, r, keys, bytes));
    }
    std::pair<double, double> ignored;
    RunIterations(c, warmup, &ignored);
    c.hub->WaitQuiet();
  }
  for (uint32_t round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < configs.size(); ++j) {
      IterConfig& c = configs[(j + round) % configs.size()];
      std::pair<double, double> window;
      c.runs.emplace_back();
      const std::vector<double> ms = RunIterations(c, iterations, &window, &c.runs.back());
      c.hub->WaitQuiet();
      c.windows.push_back(window);
      c.iteration_ms.insert(c.iteration_ms.end(), ms.begin(), ms.end());
      c.round_median.push_back(Median(ms));
      c.round_mean.push_back((window.second - window.first) / iterations);
      std::fprintf(stderr, "(b) round %u, %-10s median %7.1f ms, mean %7.1f ms, max %7.1f ms\n",
                   round + 1, c.label.c_str(), c.round_median.back(), c.round_mean.back(), Max(ms));
    }
  }
  const double base_median = Median(configs[0].round_median);
  const double base_mean = Median(configs[0].round_mean);
  std::printf("\n## (b) iteration time, checkpoints every N iterations vs off\n\n");
  std::printf(
      "2 workers, %u fp32 keys, %.0f MiB of Adam parameters (checkpoint: params + m + v), "
      "%u iterations x %u interleaved rounds per configuration (after %u warm-up)\n\n",
      keys, bytes / 1048576.0, iterations, rounds, warmup);
  std::printf(
      "| checkpoints | median iteration | ratio | mean iteration (wall / iterations) | "
      "ratio | p90 | max | checkpoints written (started in timed runs / all) | failed | "
      "iterations (all) | size | copy (median) | write (median) | iterations overlapping a "
      "checkpoint, per checkpoint | extra time per checkpoint (within runs) | overhead "
      "from it |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (IterConfig& c : configs) {
    const auto writes = CheckpointWrites(ReadLog(c.hub->log_path()));
    size_t in_runs = 0;
    std::vector<double> copy, write, mib;
    for (const CheckpointWrite& w : writes) {
      copy.push_back(w.copy_ms);
      write.push_back(w.write_ms);
      mib.push_back(w.mib);
      for (const auto& [a, b] : c.windows) {
        if (w.start_wall_ms() >= a - 1 && w.start_wall_ms() <= b) ++in_runs;
      }
    }
    size_t failed = 0;
    for (const LogLine& l : ReadLog(c.hub->log_path())) {
      failed += l.text.find("periodic checkpoint") != std::string::npos &&
                l.text.find("failed") != std::string::npos;
    }
    const double med = Median(c.round_median), mean = Median(c.round_mean);
    // Training time one checkpoint costs, measured within each run (so
    // drift of the machine between rounds cancels): the iterations that
    // overlap a checkpoint (from the start of its copy to the end of its
    // write) minus the median of the run's other iterations, summed, over
    // the checkpoints started in the timed runs.
    double excess = 0;
    size_t overlapping = 0;
    for (const auto& run : c.runs) {
      std::vector<double> clean;
      std::vector<double> hit;
      for (const IterConfig::Iter& it : run) {
        const bool during =
            std::any_of(writes.begin(), writes.end(), [&](const CheckpointWrite& w) {
              return it.start < w.end_wall_ms + 1 && it.end > w.start_wall_ms() - 1;
            });
        (during ? hit : clean).push_back(it.ms);
      }
      if (clean.empty()) continue;
      const double base = Median(clean);
      for (double ms : hit) excess += ms - base;
      overlapping += hit.size();
    }
    char per[32] = "-", hits[32] = "-", over[64] = "-";
    if (in_runs > 0) {
      const double per_ckpt = excess / static_cast<double>(in_runs);
      std::snprintf(per, sizeof per, "%.0f ms", per_ckpt);
      std::snprintf(hits, sizeof hits, "%.1f",
                    static_cast<double>(overlapping) / static_cast<double>(in_runs));
      // Checkpoints per timed iteration, as this configuration ran.
      const double rate = static_cast<double>(in_runs) / (static_cast<double>(iterations) * rounds);
      std::snprintf(over, sizeof over, "%.1f %%", 100.0 * per_ckpt * rate / base_median);
    }
    char size[64] = "-", cp[32] = "-", wr[32] = "-";
    if (!writes.empty()) {
      std::snprintf(size, sizeof size, "%.1f MiB", Median(mib));
      std::snprintf(cp, sizeof cp, "%.0f ms", Median(copy));
      std::snprintf(wr, sizeof wr, "%.0f ms", Median(write));
    }
    std::printf(
        "| %s | %.1f ms | %.2f | %.1f ms | %.2f | %.1f ms | %.1f ms | %zu / %zu | %zu | %" PRIu64
        " | %s | %s | %s | %s | %s | %s |\n",
        c.label.c_str(), med, med / base_median, mean, mean / base_mean,
        Percentile(c.iteration_ms, 0.9), Max(c.iteration_ms), in_runs, writes.size(), failed,
        c.iterations, size, cp, wr, hits, per, over);
  }
  std::printf("\nper round (median / mean ms):\n");
  for (const IterConfig& c : configs) {
    std::printf("  %-10s", c.label.c_str());
    for (size_t r = 0; r < c.round_median.size(); ++r) {
      std::printf("  %.1f / %.1f", c.round_median[r], c.round_mean[r]);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  for (IterConfig& c : configs) {
    c.workers.clear();
    c.hub.reset();
  }
}

// ---- (c) restart -> first completed iteration ----

struct Trainer {
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false}, pause{false};
  std::atomic<int> paused{0};
  std::vector<std::atomic<uint64_t>> completed;  // iterations completed per worker
  std::mutex mu;
  std::vector<std::vector<Clock::time_point>> done_at;  // per worker

  explicit Trainer(size_t w) : completed(w), done_at(w) {}

  void Start() {
    for (size_t r = 0; r < workers.size(); ++r) {
      threads.emplace_back([this, r] {
        while (!stop) {
          if (pause) {
            ++paused;
            while (pause && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            --paused;
            continue;
          }
          if (workers[r]->Step() == 1) {
            std::lock_guard l(mu);
            done_at[r].push_back(Clock::now());
            ++completed[r];
          }
        }
      });
    }
  }
  void Pause() {
    pause = true;
    while (paused < static_cast<int>(workers.size()))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void Resume() { pause = false; }
  void Stop() {
    stop = true;
    for (auto& t : threads) t.join();
  }
  // Waits until every worker completed `n` more iterations than `since`.
  void WaitCompleted(const std::vector<uint64_t>& since, uint64_t n) {
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (size_t r = 0; r < workers.size(); ++r) {
      while (completed[r] < since[r] + n) {
        if (Clock::now() > deadline) Die("(c) training does not progress");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  std::vector<uint64_t> Counts() const {
    std::vector<uint64_t> v;
    for (const auto& c : completed) v.push_back(c.load());
    return v;
  }
};

struct RestartTrial {
  std::string kind;                // kill9-cold, kill9-warm, sigterm-cold, sigterm-warm
  double stop_ms = 0;              // signal -> the old process exited
  double down_ms = 0;              // signal -> the new one is ready (clients cannot connect)
  double exec_to_starting = NAN;   // exec -> "rackhubd ... starting"
  double starting_to_lanes = NAN;  // -> "lanes started" (registry opened, lanes up)
  double read_ms = NAN;            // -> start of the install: reading + verifying the checkpoint
  double install_ms = NAN;         // "resumed ... in N ms": into the lanes
  double resumed_to_ready = NAN;   // -> ready file (listeners bound)
  double exec_to_ready = NAN;
  double ready_to_reconnected = NAN;  // -> the last client reconnected
  double reconnected_to_first = NAN;  // -> first iteration completed on every worker
  double exec_to_first = NAN;         // the total
  double restore_bytes = 0;           // the checkpoint file read at start-up
  double create_ms = NAN;             // kill9 trials: CreateCheckpoint while training
  std::string seen;                   // errors the workers handled
};

void PartRestart(const std::string& bin, const std::string& dir, uint64_t bytes, uint32_t keys,
                 uint32_t rounds, const std::vector<std::string>& kinds) {
  HubProcess hub(bin, dir + "/restart", "rackhubd",
                 {"--checkpoint-every-iterations", "0", "--checkpoint-every-seconds", "0",
                  "--checkpoint-keep", "2"});
  hub.Start();
  const std::string token = CreateTenant(hub.admin, "train", bytes);
  Trainer trainer(2);
  for (uint32_t r = 0; r < 2; ++r) {
    trainer.workers.push_back(std::make_unique<Worker>(hub.data, "train", token, r, keys, bytes));
  }
  trainer.Start();
  std::vector<RestartTrial> trials;
  std::vector<double> disk_read, disk_write;
  uint64_t ckpt_bytes = 0;
  for (uint32_t round = 0; round < rounds; ++round) {
    for (const std::string& kind : kinds) {
      RestartTrial t;
      t.kind = kind;
      const bool sigkill = kind.rfind("kill9", 0) == 0;
      const bool cold = kind.find("cold") != std::string::npos;
      trainer.WaitCompleted(trainer.Counts(), 1);
      if (sigkill) {
        // A checkpoint while training goes on, then one more iteration, then
        // the crash 100 ms into the next one: the restart rolls back. A warm
        // trial restores the newest checkpoint again, the one the previous
        // restart has just read (or written: SIGTERM), so it is in the page
        // cache; a new one is made only if there is none.
        if (cold || ListCheckpoints(hub.admin, "train").empty()) {
          const auto c0 = Clock::now();
          const pb::Checkpoint ck = CreateCheckpoint(hub.admin, "train");
          t.create_ms = Ms(Clock::now() - c0);
          ckpt_bytes = ck.bytes();
        }
        trainer.WaitCompleted(trainer.Counts(), 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto signalled = Clock::now();
      t.stop_ms = hub.Stop(sigkill ? SIGKILL : SIGTERM);
      if (cold) DropCheckpointCaches(hub.state_dir());
      for (auto& w : trainer.workers) w->TakeNotes();
      const std::vector<uint64_t> before = trainer.Counts();
      std::vector<uint64_t> reconnects_before;
      for (auto& w : trainer.workers) reconnects_before.push_back(w->reconnects());
      hub.Start();
      const Clock::time_point exec = hub.exec_at;
      t.exec_to_ready = Ms(hub.ready_at - exec);
      t.down_ms = Ms(hub.ready_at - signalled);
      std::vector<Clock::time_point> reconnected(2), first(2);
      const auto deadline = Clock::now() + std::chrono::seconds(120);
      for (bool all = false; !all;) {
        if (Clock::now() > deadline) Die("(c) no iteration completed within 120 s of the restart");
        all = true;
        for (size_t r = 0; r < 2; ++r) {
          if (reconnected[r] == Clock::time_point{} &&
              trainer.workers[r]->reconnects() > reconnects_before[r]) {
            reconnected[r] = Clock::now();
          }
          if (first[r] == Clock::time_point{} && trainer.completed[r] > before[r]) {
            std::lock_guard l(trainer.mu);
            first[r] = trainer.done_at[r][before[r]];
            if (reconnected[r] == Clock::time_point{}) reconnected[r] = first[r];
          }
          all = all && first[r] != Clock::time_point{};
        }
        if (!all) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      const auto last_reconnect = std::max(reconnected[0], reconnected[1]);
      const auto last_first = std::max(first[0], first[1]);
      t.ready_to_reconnected = Ms(last_reconnect - hub.ready_at);
      t.reconnected_to_first = Ms(last_first - last_reconnect);
      t.exec_to_first = Ms(last_first - exec);
      for (size_t r = 0; r < 2; ++r) {
        const std::string n = trainer.workers[r]->TakeNotes();
        t.seen += (r ? "; " : "") + std::string("w") + std::to_string(r) + ": " +
                  (n.empty() ? "none" : n);
      }
      const auto log = ReadLog(hub.log_path());
      const LogLine* starting = FindLine(log, " starting");
      const LogLine* lanes = FindLine(log, "lanes started");
      const LogLine* resumed = FindLine(log, "resumed from");
      if (starting) t.exec_to_starting = starting->wall_ms - hub.exec_wall_ms;
      if (starting && lanes) t.starting_to_lanes = lanes->wall_ms - starting->wall_ms;
      if (resumed) {
        std::smatch m;
        static const std::regex in_ms(R"( in ([0-9]+) ms)");
        if (std::regex_search(resumed->text, m, in_ms)) t.install_ms = std::stod(m[1]);
        if (lanes) t.read_ms = resumed->wall_ms - t.install_ms - lanes->wall_ms;
        t.resumed_to_ready = hub.exec_wall_ms + t.exec_to_ready - resumed->wall_ms;
      } else {
        Die("(c) the restarted hub did not resume the tenant from a checkpoint:\n" +
            ReadAll(hub.log_path()));
      }
      const auto list = ListCheckpoints(hub.admin, "train");
      // The newest at start-up (SIGTERM: the shutdown checkpoint).
      if (!list.empty()) t.restore_bytes = static_cast<double>(list.front().bytes());
      if (ckpt_bytes == 0) ckpt_bytes = static_cast<uint64_t>(t.restore_bytes);
      std::fprintf(stderr,
                   "(c) round %u, %-12s stop %6.0f | exec->starting %4.0f, ->lanes %4.0f, read "
                   "%5.0f, install %4.0f, ->ready %4.0f (exec->ready %5.0f) | ->reconnected %5.0f "
                   "| ->first iteration %5.0f | total %6.0f ms | checkpoint before %5.0f ms | %s\n",
                   round + 1, kind.c_str(), t.stop_ms, t.exec_to_starting, t.starting_to_lanes,
                   t.read_ms, t.install_ms, t.resumed_to_ready, t.exec_to_ready,
                   t.ready_to_reconnected, t.reconnected_to_first, t.exec_to_first, t.create_ms,
                   t.seen.c_str());
      trials.push_back(t);
    }
    // The disk's own speed, with the workers paused.
    trainer.Pause();
    const auto [w, r] = DiskSpeed(hub.state_dir() + "/disk-speed.bin", ckpt_bytes);
    trainer.Resume();
    disk_write.push_back(w);
    disk_read.push_back(r);
    std::fprintf(stderr, "(c) round %u, disk (%.0f MiB): write %.2f GB/s, cold read %.2f GB/s\n",
                 round + 1, ckpt_bytes / 1048576.0, w, r);
  }
  trainer.Stop();
  // Steady-state iteration time: worker 0's intervals between completed
  // iterations (the few spanning a restart or a disk measurement are
  // outliers the median ignores).
  std::vector<double> steady;
  for (size_t i = 1; i < trainer.done_at[0].size(); ++i) {
    steady.push_back(Ms(trainer.done_at[0][i] - trainer.done_at[0][i - 1]));
  }
  std::vector<double> create;
  for (const RestartTrial& t : trials) {
    if (!std::isnan(t.create_ms)) create.push_back(t.create_ms);
  }
  const double read_gbps = Median(disk_read);
  const double bound_ms = ckpt_bytes / 1e6 / read_gbps;
  std::printf("\n## (c) hub restart -> first completed iteration\n\n");
  std::printf(
      "2 workers, %u fp32 keys, %.0f MiB of Adam parameters; checkpoint file %.1f MiB; "
      "%u rounds; disk (same directory, plain file of the checkpoint's size, workers "
      "paused): cold sequential read %.2f GB/s, write+fdatasync %.2f GB/s (medians) -> "
      "read bound %.0f ms; steady-state iteration (median) %.0f ms; CreateCheckpoint while "
      "training (median) %.0f ms\n\n",
      keys, bytes / 1048576.0, ckpt_bytes / 1048576.0, rounds, read_gbps, Median(disk_write),
      bound_ms, Median(steady), Median(create));
  std::printf(
      "| trial | old hub stop | signal -> new hub ready | exec -> log start | -> lanes up | "
      "checkpoint read+verify | "
      "install | -> ready | exec -> ready | ready -> clients reconnected | -> first "
      "iteration on all workers | **exec -> first iteration** | read+verify+install / disk "
      "bound |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& kind : kinds) {
    std::vector<double> f[12];
    for (const RestartTrial& t : trials) {
      if (t.kind != kind) continue;
      const double v[12] = {t.stop_ms,
                            t.exec_to_starting,
                            t.starting_to_lanes,
                            t.read_ms,
                            t.install_ms,
                            t.resumed_to_ready,
                            t.exec_to_ready,
                            t.ready_to_reconnected,
                            t.reconnected_to_first,
                            t.exec_to_first,
                            (t.read_ms + t.install_ms) / bound_ms,
                            t.down_ms};
      for (int i = 0; i < 12; ++i) f[i].push_back(v[i]);
    }
    std::printf(
        "| %s | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f ms | "
        "%.0f "
        "ms | %.0f ms | **%.0f ms** | %.2f |\n",
        kind.c_str(), Median(f[0]), Median(f[11]), Median(f[1]), Median(f[2]), Median(f[3]),
        Median(f[4]), Median(f[5]), Median(f[6]), Median(f[7]), Median(f[8]), Median(f[9]),
        Median(f[10]));
  }
  std::printf(
      "\n(medians over rounds; 'old hub stop' = signal -> exit of the old process, not "
      "part of the total; SIGTERM includes the shutdown checkpoint)\n");
  std::printf("\nper trial (exec -> first iteration, ms; what the workers handled):\n");
  for (const RestartTrial& t : trials) {
    std::printf("  %-12s %6.0f  read %5.0f  install %4.0f  ready->reconnected %5.0f  %s\n",
                t.kind.c_str(), t.exec_to_first, t.read_ms, t.install_ms, t.ready_to_reconnected,
                t.seen.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "rackhub-durability-bench: iteration time with periodic checkpoints, and hub "
      "restart -> first completed iteration"};
  std::string dir = "/var/tmp/rackhub-durability-bench";
  std::string parts = "b,c";
  std::vector<std::string> configs = {"off", "50", "10", "1s"};
  uint64_t mib = 64, restart_mib = 256;
  uint32_t keys = 4, iterations = 40, warmup = 3, rounds = 4, restart_rounds = 3;
  std::vector<std::string> kinds = {"kill9-cold", "kill9-warm", "sigterm-cold"};
  bool keep = false;
  app.add_option("--dir", dir,
                 "working directory (hubs' state, logs; created, removed at the end)");
  app.add_option("--parts", parts, "b (iteration time with checkpoints), c (restart), or b,c");
  app.add_option("--configs", configs,
                 "(b) checkpoint settings, the first is the baseline: off | N (every N "
                 "iterations) | Ss (every S seconds)")
      ->delimiter(',');
  app.add_option("--mib", mib, "(b) fp32 parameter MiB of the tenant");
  app.add_option("--keys", keys, "keys the parameters are split into")->check(CLI::PositiveNumber);
  app.add_option("--iterations", iterations, "(b) timed iterations per run")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "(b) untimed iterations per configuration first");
  app.add_option("--rounds", rounds, "(b) interleaved rounds")->check(CLI::PositiveNumber);
  app.add_option("--restart-mib", restart_mib, "(c) fp32 parameter MiB of the tenant");
  app.add_option("--restart-rounds", restart_rounds, "(c) rounds of the trials")
      ->check(CLI::PositiveNumber);
  app.add_option("--restart-trials", kinds,
                 "(c) trials per round: kill9-cold, kill9-warm, sigterm-cold, sigterm-warm")
      ->delimiter(',');
  app.add_flag("--keep-dir", keep, "keep --dir (logs, checkpoints) at the end");
  CLI11_PARSE(app, argc, argv);
  if (configs.empty() || configs[0] != "off") {
    std::fprintf(stderr, "--configs: the first must be 'off' (the baseline)\n");
    return 2;
  }

  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string() + "/rackhubd";
  if (fs::exists(dir)) fs::remove_all(dir);
  fs::create_directories(dir);
  const auto t0 = Clock::now();
  if (parts.find('b') != std::string::npos) {
    PartIterations(bin, dir, configs, mib << 20, keys, iterations, warmup, rounds);
  }
  if (parts.find('c') != std::string::npos) {
    PartRestart(bin, dir, restart_mib << 20, keys, restart_rounds, kinds);
  }
  std::printf("\n(whole run: %.0f s; directory %s)\n", Ms(Clock::now() - t0) / 1000, dir.c_str());
  if (!keep) fs::remove_all(dir);
  return 0;
}
