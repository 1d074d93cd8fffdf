// rackhub-compression-bench: top-k compressed pushes and bounded staleness
// (docs/compression.md, docs/consistency.md) through one real rackhubd.
// Workers are threads of this process, one librackhub Client each (TCP by
// default: bench/compression_netns.sh runs the hub in another network
// namespace, where shared memory must not be used).
//
//   --scenario topk: W workers (2) push_pull one key per (size, variant) of
//     a synchronous tenant: dense, top-k 0.01 and top-k 0.001 (error
//     feedback on, --no-error-feedback to turn it off). --optimizer sgd (the
//     default): the keys use the tenant's SGD (lr 0.01), the reply is the
//     dense parameters. --optimizer sum-only: the keys are declared with the
//     sum-only optimizer (the Horovod-style local mode: the hub reduces, the
//     reply is the mean, or with --reduction sum the sum, of the workers'
//     gradients), and a top-k key's reply is sparse (every entry whose bits
//     are not +0.0) where that is smaller than the dense chunk. In --rounds
//     interleaved rounds (order reversed every other round) of --warmup
//     untimed and --iterations timed steps per variant. Each step starts on
//     a barrier of the workers; its time is the first worker's start to the
//     last worker's reply. Reported per variant, medians over rounds: bytes
//     per worker per step from the hub's counters (GetStats bytes_in: the
//     PUSH frames, headers included; bytes_out: what the hub wrote to the
//     tenant's connections), the same computed from the frame layout (40-byte
//     header per frame; a sparse chunk 4 + k * 8 bytes, k = ceil(ratio * n),
//     sent dense when that is not smaller; replies dense, except sum-only
//     top-k replies: 4 + 8 * nonzeros of the chunk's reply where that is
//     smaller, counted from the replies received), the bytes that
//     crossed --link-dev (its tx + rx counters: TCP/IP framing and the
//     admin calls included), step p50/p90, the time the PushPull call itself
//     takes (the top-k selection runs on the calling thread) and the ratios
//     to dense. Checks: every call succeeds; after every step all workers'
//     replies are bit-identical. SGD: the replies are finite (a stride of
//     elements), and a dense key's reply is the previous parameters - lr *
//     mean(gradients) (relative 1e-5, on the stride). Sum-only: every entry
//     is finite, a dense key's reply is the mean (sum) of the gradients
//     (relative 1e-5, every entry), and a top-k key's reply has at most
//     W * k nonzero entries in every chunk (the union of the workers'
//     top-k entries). The checks run between steps (outside the step
//     times, inside "bench CPU"; sum-only scans every reply entry).
//   --scenario staleness: 2 workers on a tenant per (--modes entry, round):
//     sync, bounded:S, async. Each step a worker "computes" (sleeps, or
//     spins with --compute busy) --compute-ms, the slowed one
//     --slow-factor times as long, then push_pulls a --st-bytes key. With
//     --slow-mode fixed rank 1 is always the slow one; with alternate the
//     slowdown moves between the ranks every --alternate-every steps (the
//     same mean for both: where bounded staleness pays). Reported after a
//     warm-up second over --seconds: iterations/s of rank 0 ("fast") and
//     rank 1, the job's pushes/s, and the largest lag a worker saw after a
//     PushPull: its iteration (KeyInfo.next_iteration) minus
//     KeyInfo.slowest_iteration (bounded/async; 0 in sync), and the lag
//     between the workers' own counters. A bounded lag above S fails the
//     bench (exit 1). KeyInfo.updates at the end must equal both workers'
//     pushes (bounded/async: every contribution is one update).
// Results: bench/results/compression-*.md.

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <barrier>
#include <cfloat>
#include <cinttypes>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/client/client.h"
#include "support/bench_util.h"

namespace {

namespace pb = rackhub::admin::v1;
namespace rc = rackhub::client;
using namespace rackhub::bench;

constexpr uint64_t kHeader = 40;  // net::kHeaderBytes
constexpr float kLr = 0.01f;

struct Options {
  std::string scenario = "topk";
  std::string dir = "/var/tmp/rackhub-compression-bench";
  std::string hub_netns;             // run rackhubd under `ip netns exec`
  std::string hub_host = "127.0.0.1";
  std::string link_dev;              // count its bytes (this namespace's /sys/class/net)
  std::string transport = "tcp";
  uint32_t lanes = 2;
  uint32_t workers = 2;
  // topk
  std::vector<std::string> sizes = {"64MiB"};
  std::vector<double> ratios = {0, 0.01, 0.001};
  bool error_feedback = true;
  std::string optimizer = "sgd";  // sgd | sum-only
  std::string reduction = "mean";  // mean | sum
  int iterations = 5;
  int warmup = 1;
  int rounds = 3;
  // staleness
  std::vector<std::string> modes = {"sync", "bounded:2", "async"};
  std::string st_bytes = "1MiB";
  double compute_ms = 20;
  double slow_factor = 2;
  std::string slow_mode = "fixed";
  int alternate_every = 2;
  std::string compute = "sleep";
  double seconds = 5;
  double warmup_seconds = 1;
};

uint64_t ParseSize(const std::string& s) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    Die("size '" + s + "' is not like 64MiB");
  }
  const std::string unit = s.substr(end);
  const std::map<std::string, double> units = {{"", 1},         {"B", 1},
                                               {"KiB", 1024.0}, {"MiB", 1048576.0},
                                               {"GiB", 1073741824.0}, {"kB", 1e3},
                                               {"MB", 1e6},     {"GB", 1e9}};
  const auto it = units.find(unit);
  if (it == units.end() || v <= 0) Die("size '" + s + "' is not like 64MiB");
  return static_cast<uint64_t>(v * it->second);
}

std::string Size(uint64_t b) {
  char buf[64];
  if (b % (1 << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " MiB", b >> 20);
  } else if (b % 1024 == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " KiB", b >> 10);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  }
  return buf;
}

std::string Bytes(double b) {
  char buf[64];
  if (b >= 0x1p30) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 0x1p30);
  } else if (b >= 0x1p20) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / 0x1p20);
  } else if (b >= 0x1p10) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 0x1p10);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

std::string VariantName(double ratio) {
  if (ratio == 0) return "dense";
  char buf[32];
  std::snprintf(buf, sizeof buf, "topk %g", ratio);
  return buf;
}

// ---- a rackhubd, optionally in another network namespace ----

std::string RandomHex() {
  unsigned char b[16] = {};
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(b), sizeof b);
  std::string out;
  char two[3];
  for (unsigned char c : b) {
    std::snprintf(two, sizeof two, "%02x", c);
    out += two;
  }
  return out;
}

class Hub {
 public:
  Hub(const std::string& bin, const Options& o, const std::string& name)
      : dir_(o.dir + "/" + name) {
    fs::create_directories(dir_);
    const std::string ready = dir_ + "/ready";
    log_ = dir_ + "/rackhubd.log";
    fs::remove(ready);
    std::vector<std::string> argv;
    if (!o.hub_netns.empty()) argv = {"ip", "netns", "exec", o.hub_netns};
    argv.insert(argv.end(),
                {bin, "--admin-listen", o.hub_host + ":0", "--data-listen", o.hub_host + ":0",
                 "--metrics-listen", "127.0.0.1:0", "--ready-file", ready, "--in-memory",
                 "--transport", "tcp", "--lanes", std::to_string(o.lanes), "--log-level",
                 "warn"});
    if (o.hub_host != "127.0.0.1") {  // beyond loopback the admin API needs a token
      token = RandomHex();
      std::ofstream(dir_ + "/admin.token") << token << "\n";
      argv.insert(argv.end(), {"--admin-token-file", dir_ + "/admin.token"});
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // `ip netns exec` execs the command in place: pid_ is the hub's.
    const int rc = posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) Die("cannot start " + std::string(args[0]) + ": " + std::strerror(rc));
    {
      std::lock_guard l(g_children_mu);
      g_children.push_back(pid_);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      std::istringstream in(ReadAll(ready));
      std::string what, addr;
      while (in >> what >> addr) {
        if (what == "admin") admin = addr;
        if (what == "data") data = addr;
      }
      if (!admin.empty() && !data.empty()) return;
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        Forget();
        Die("rackhubd exited at start-up:\n" + ReadAll(log_));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Die("rackhubd not ready in 60 s:\n" + ReadAll(log_));
  }
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;
  ~Hub() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
      Forget();
    }
  }

  pid_t pid() const { return pid_; }
  std::string admin, data, token;

  void AddAuth(grpc::ClientContext& ctx) const {
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  }

 private:
  void Forget() {
    std::lock_guard l(g_children_mu);
    std::erase(g_children, pid_);
    pid_ = -1;
  }
  std::string dir_, log_;
  pid_t pid_ = -1;
};

std::unique_ptr<grpc::ClientContext> Ctx(const Hub& hub, int seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  hub.AddAuth(*ctx);
  return ctx;
}

struct Mode {
  std::string name;  // "sync", "bounded:2", "async"
  pb::Consistency consistency = pb::SYNC;
  uint32_t staleness = 0;
};

Mode ParseMode(const std::string& s) {
  Mode m;
  m.name = s;
  if (s == "sync") return m;
  if (s == "async") {
    m.consistency = pb::ASYNC;
    return m;
  }
  if (s.rfind("bounded:", 0) == 0) {
    m.consistency = pb::BOUNDED;
    try {
      m.staleness = static_cast<uint32_t>(std::stoul(s.substr(8)));
    } catch (...) {
      Die("mode '" + s + "': expected bounded:S");
    }
    return m;
  }
  Die("mode '" + s + "': expected sync, bounded:S or async");
}

std::string CreateTenant(const Hub& hub, const std::string& name, uint32_t workers,
                         const Mode& mode, uint64_t quota) {
  auto stub = pb::TenantService::NewStub(
      grpc::CreateChannel(hub.admin, grpc::InsecureChannelCredentials()));
  pb::CreateTenantRequest req;
  req.set_name(name);
  req.set_workers_per_rack(workers);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(kLr);
  req.mutable_quotas()->set_max_parameter_bytes(quota);
  req.set_consistency(mode.consistency);
  req.set_staleness(mode.staleness);
  pb::CreateTenantResponse resp;
  if (auto s = stub->CreateTenant(Ctx(hub, 10).get(), req, &resp); !s.ok()) {
    Die("CreateTenant " + name + " (" + mode.name + "): " + s.error_message());
  }
  if (resp.tenant().consistency() != mode.consistency ||
      resp.tenant().staleness() != mode.staleness) {
    Die("CreateTenant " + name + ": the hub reports consistency " +
        std::to_string(resp.tenant().consistency()) + " staleness " +
        std::to_string(resp.tenant().staleness()) + ", asked " + mode.name);
  }
  return resp.token();
}

struct Stats {
  uint64_t bytes_in = 0, bytes_out = 0, pushes = 0, errors = 0;
};

Stats GetStats(const Hub& hub, const std::string& tenant) {
  static std::unique_ptr<pb::StatsService::Stub> stub;
  static std::string for_admin;
  if (!stub || for_admin != hub.admin) {
    stub = pb::StatsService::NewStub(
        grpc::CreateChannel(hub.admin, grpc::InsecureChannelCredentials()));
    for_admin = hub.admin;
  }
  pb::GetStatsRequest req;
  req.set_tenant(tenant);
  pb::GetStatsResponse resp;
  if (auto s = stub->GetStats(Ctx(hub, 10).get(), req, &resp); !s.ok()) {
    Die("GetStats: " + s.error_message());
  }
  Stats st;
  for (const auto& t : resp.tenants()) {
    st.bytes_in += t.bytes_in();
    st.bytes_out += t.bytes_out();
    st.pushes += t.pushes();
    st.errors += t.errors();
  }
  return st;
}

// tx + rx bytes of a network device (0 without one).
uint64_t LinkBytes(const std::string& dev) {
  if (dev.empty()) return 0;
  const std::string base = "/sys/class/net/" + dev + "/statistics/";
  const std::string tx = ReadAll(base + "tx_bytes"), rx = ReadAll(base + "rx_bytes");
  if (tx.empty() || rx.empty()) Die("no counters for --link-dev " + dev + " under " + base);
  return std::stoull(tx) + std::stoull(rx);
}

double CpuSeconds(pid_t pid) {
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(stat.substr(close + 2));
  std::vector<std::string> f;
  std::string x;
  while (in >> x) f.push_back(x);
  if (f.size() < 13) return 0;
  return (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
}
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

std::string LoadAverage() {
  std::istringstream in(ReadAll("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::unique_ptr<rc::Client> Connect(const Hub& hub, const Options& o, const std::string& tenant,
                                    const std::string& token, uint32_t rank) {
  rc::Options opt;
  opt.hub = hub.data;
  opt.tenant = tenant;
  opt.token = token;
  opt.rank = rank;
  opt.connect_timeout = std::chrono::seconds(30);
  opt.op_timeout = std::chrono::seconds(300);
  opt.shm = o.transport == "tcp" ? rc::Shm::kOff : o.transport == "shm" ? rc::Shm::kOn
                                                                        : rc::Shm::kAuto;
  rc::Error e;
  auto c = rc::Client::Connect(opt, &e);
  if (!c) Die(tenant + " rank " + std::to_string(rank) + ": connect: " + e.message);
  return c;
}

uint64_t NextRandom(uint64_t& s) {  // xorshift64*
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 2685821657736338717ull;
}

// ---- scenario topk ----

struct KeyRun {
  std::string name;
  uint64_t elements = 0;
  double ratio = 0;
  std::vector<rc::KeyId> ids;  // by worker
  // A stride of the last verified parameters (dense check); zeros at first.
  std::vector<float> sample;
};

struct StepTimes {
  std::vector<double> step_ms, call_ms;
  // Sum-only top-k: per verified step, the reply's frame bytes per worker
  // (from the layout and the nonzeros received) and its mean nonzeros per
  // chunk.
  std::vector<double> reply_bytes, nonzeros;
};

// As aggregation::TopKCount, of the float ratio the key keeps.
uint64_t TopKCount(double ratio, uint64_t n) {
  const double r = static_cast<float>(ratio);
  const double c = std::ceil(r * static_cast<double>(n) * (1.0 - 8 * DBL_EPSILON));
  return r >= 1.0 ? n : std::clamp<uint64_t>(static_cast<uint64_t>(c), 1, n);
}

// Frame bytes of one worker's push and reply of a key of `elements` fp32.
std::pair<uint64_t, uint64_t> AnalyticBytes(uint64_t elements, double ratio, uint32_t chunk) {
  uint64_t push = 0, reply = 0;
  for (uint64_t first = 0; first < elements; first += chunk) {
    const uint64_t n = std::min<uint64_t>(chunk, elements - first);
    uint64_t payload = n * 4;
    if (ratio > 0) {
      const uint64_t sparse = 4 + TopKCount(ratio, n) * 8;
      if (sparse < payload) payload = sparse;
    }
    push += kHeader + payload;
    reply += kHeader + n * 4;
  }
  return {push, reply};
}

void TopK(const std::string& bin, const Options& o) {
  Hub hub(bin, o, "topk");
  std::vector<uint64_t> sizes;
  for (const auto& s : o.sizes) sizes.push_back(ParseSize(s) / 4 * 4);
  uint64_t quota = 0;
  for (uint64_t b : sizes) quota += b * o.ratios.size() * 8;
  const std::string tenant = "topk";
  const std::string token = CreateTenant(hub, tenant, o.workers, Mode{"sync"}, quota + (64 << 20));
  const uint32_t W = o.workers;
  std::vector<std::unique_ptr<rc::Client>> clients(W);
  {
    std::vector<std::thread> ts;
    for (uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] { clients[w] = Connect(hub, o, tenant, token, w); });
    }
    for (auto& t : ts) t.join();
  }
  const uint32_t chunk = clients[0]->chunk_elements();
  const bool sum_only = o.optimizer == "sum-only";
  // The reply of a sum-only key: factor * the rank-order sum of the gradients.
  const float factor = o.reduction == "sum" ? 1.0f : 1.0f / static_cast<float>(W);
  std::printf("hub %s (data %s, %u lanes, chunks of %u elements); workers' transport: %s; "
              "optimizer %s (%s of the gradients%s); error feedback %s; load average %s\n",
              o.hub_netns.empty() ? "on this host" : ("in netns " + o.hub_netns).c_str(),
              hub.data.c_str(), clients[0]->lanes(), chunk, clients[0]->transport(),
              o.optimizer.c_str(), o.reduction.c_str(),
              sum_only ? "; top-k replies sparse where smaller" : ", lr 0.01; replies dense",
              o.error_feedback ? "on" : "off", LoadAverage().c_str());
  if (o.transport == "tcp" && std::string(clients[0]->transport()) != "tcp") {
    Die(std::string("asked for TCP, the client uses ") + clients[0]->transport());
  }

  // Keys, gradients (uniform in [-1, 1), per worker and size), replies.
  std::vector<KeyRun> keys;
  for (uint64_t b : sizes) {
    for (double r : o.ratios) {
      KeyRun k;
      k.elements = b / 4;
      k.ratio = r;
      char name[64];
      std::snprintf(name, sizeof name, "w%" PRIu64 "-r%g", b, r);
      k.name = name;
      for (uint32_t w = 0; w < W; ++w) {
        rc::KeyDecl d;
        d.name = k.name;
        d.elements = k.elements;
        d.topk_ratio = static_cast<float>(r);
        d.error_feedback = o.error_feedback;
        if (sum_only || o.reduction != "mean") {  // else the tenant's default: SGD, mean
          rc::OptimizerSpec spec;
          spec.type = o.optimizer;
          if (!sum_only) spec.learning_rate = kLr;
          spec.reduction = o.reduction;
          d.optimizer = spec;
        }
        rc::KeyId id{};
        if (auto e = clients[w]->DeclareKey(d, &id); !e.ok()) {
          Die("declare " + k.name + " (rank " + std::to_string(w) + "): " + e.message);
        }
        k.ids.push_back(id);
      }
      keys.push_back(std::move(k));
    }
  }
  std::map<uint64_t, std::vector<std::vector<float>>> grads, outs;  // elements -> [worker]
  for (uint64_t b : sizes) {
    const uint64_t n = b / 4;
    auto& g = grads[n];
    auto& out = outs[n];
    g.resize(W);
    out.resize(W);
    std::vector<std::thread> ts;
    for (uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] {
        g[w].resize(n);
        out[w].assign(n, 0.0f);
        uint64_t s = 0x9E3779B97F4A7C15ull * (w + 1) + n;
        for (auto& v : g[w]) {
          v = static_cast<float>(static_cast<double>(NextRandom(s) >> 11) * 0x1.0p-52 - 1.0);
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  const uint64_t stride = 4099;

  // Runs `steps` steps of key k on every worker; times and checks them.
  const auto run = [&](KeyRun& k, int steps, StepTimes* times) {
    auto& g = grads[k.elements];
    auto& out = outs[k.elements];
    std::vector<std::vector<Clock::time_point>> t0(W, std::vector<Clock::time_point>(steps)),
        t1 = t0;
    std::vector<std::vector<double>> call(W, std::vector<double>(steps));
    int verified = 0, gates = 0;
    if (k.sample.empty()) k.sample.assign((k.elements + stride - 1) / stride, 0.0f);
    // The completion of the gate before step i checks step i - 1's replies
    // (the last gate, after the loop, the last step's).
    const auto check = [&]() noexcept {
      if (gates++ == 0) return;  // the first gate: nothing pushed yet
      for (uint32_t w = 1; w < W; ++w) {
        if (std::memcmp(out[w].data(), out[0].data(), k.elements * 4) != 0) {
          Die(k.name + " step " + std::to_string(verified) + ": rank " + std::to_string(w) +
              "'s reply differs from rank 0's");
        }
      }
      if (sum_only) {
        // Every entry: finite; dense: factor * sum of the gradients; top-k: at
        // most W * k nonzeros per chunk (and the reply's frame bytes).
        uint64_t reply = 0, nonzeros = 0;
        for (uint64_t first = 0; first < k.elements; first += chunk) {
          const uint64_t n = std::min<uint64_t>(chunk, k.elements - first);
          uint64_t nz = 0;
          for (uint64_t i = first; i < first + n; ++i) {
            const float p = out[0][i];
            if (!std::isfinite(p)) Die(k.name + ": non-finite reply entry at " + std::to_string(i));
            uint32_t bits;
            std::memcpy(&bits, &p, 4);
            nz += bits != 0;
            if (k.ratio == 0) {
              float sum = g[0][i];
              for (uint32_t w = 1; w < W; ++w) sum += g[w][i];
              const double want = static_cast<double>(sum) * factor;
              if (std::abs(p - want) > 1e-6 + 1e-5 * std::abs(want)) {
                Die(k.name + ": reply entry " + std::to_string(i) + " is " + std::to_string(p) +
                    ", expected " + std::to_string(want) + " (" + o.reduction +
                    " of the gradients)");
              }
            }
          }
          // A chunk pushed sparse contributes at most k entries per worker.
          const uint64_t kc = k.ratio > 0 ? TopKCount(k.ratio, n) : n;
          const uint64_t kmax = 4 + 8 * kc < n * 4 ? std::min<uint64_t>(W * kc, n) : n;
          if (k.ratio > 0 && nz > kmax) {
            Die(k.name + " step " + std::to_string(verified) + ": chunk " +
                std::to_string(first / chunk) + " of the reply has " + std::to_string(nz) +
                " nonzero entries, more than workers x k = " + std::to_string(kmax));
          }
          nonzeros += nz;
          const uint64_t sparse = 4 + 8 * nz;  // SparsePayloadBytes, fp32
          reply += kHeader + (k.ratio > 0 && sparse < n * 4 ? sparse : n * 4);
        }
        if (times) {
          times->reply_bytes.push_back(static_cast<double>(reply));
          times->nonzeros.push_back(static_cast<double>(nonzeros) /
                                    static_cast<double>((k.elements + chunk - 1) / chunk));
        }
        ++verified;
        return;
      }
      for (uint64_t i = 0, j = 0; i < k.elements; i += stride, ++j) {
        const float p = out[0][i];
        if (!std::isfinite(p)) Die(k.name + ": non-finite parameter at " + std::to_string(i));
        if (k.ratio == 0) {
          double mean = 0;
          for (uint32_t w = 0; w < W; ++w) mean += g[w][i];
          if (o.reduction == "mean") mean /= W;
          const double want = k.sample[j] - kLr * mean;
          if (std::abs(p - want) > 1e-6 + 1e-5 * std::abs(want)) {
            Die(k.name + ": parameter " + std::to_string(i) + " is " + std::to_string(p) +
                ", expected " + std::to_string(want));
          }
        }
        k.sample[j] = p;
      }
      ++verified;
    };
    std::barrier gate(static_cast<std::ptrdiff_t>(W), check);
    std::vector<std::thread> ts;
    for (uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] {
        for (int i = 0; i < steps; ++i) {
          gate.arrive_and_wait();
          t0[w][i] = Clock::now();
          const rc::Ticket tk = clients[w]->PushPull(k.ids[w], g[w], out[w]);
          call[w][i] = Ms(Clock::now() - t0[w][i]);
          if (rc::Error e = clients[w]->Wait(tk); !e.ok()) {
            Die(k.name + " rank " + std::to_string(w) + " step " + std::to_string(i) + ": " +
                e.message);
          }
          t1[w][i] = Clock::now();
        }
        gate.arrive_and_wait();  // checks the last step
      });
    }
    for (auto& t : ts) t.join();
    if (verified != steps) Die(k.name + ": verified " + std::to_string(verified) + " steps");
    if (times) {
      for (int i = 0; i < steps; ++i) {
        Clock::time_point a = t0[0][i], b = t1[0][i];
        double c = 0;
        for (uint32_t w = 0; w < W; ++w) {
          a = std::min(a, t0[w][i]);
          b = std::max(b, t1[w][i]);
          c = std::max(c, call[w][i]);
        }
        times->step_ms.push_back(Ms(b - a));
        times->call_ms.push_back(c);
      }
    }
  };

  struct Row {
    std::vector<double> p50, p90, call, in, out, link, hub_cpu, bench_cpu;
    std::vector<double> areply, nonzeros;  // sum-only: means over the round's steps
  };
  std::map<std::pair<uint64_t, double>, Row> rows;
  double max_reply_diff = 0;  // sum-only: |hub bytes_out - analytic reply| per worker and step
  std::printf("%d rounds x %zu sizes x %zu variants; %d warm-up + %d timed steps each\n",
              o.rounds, sizes.size(), o.ratios.size(), o.warmup, o.iterations);
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (round % 2) std::reverse(order.begin(), order.end());
    for (size_t i : order) {
      KeyRun& k = keys[i];
      run(k, o.warmup, nullptr);
      const Stats s0 = GetStats(hub, tenant);
      const uint64_t l0 = LinkBytes(o.link_dev);
      const double h0 = CpuSeconds(hub.pid()), b0 = SelfCpuSeconds();
      StepTimes times;
      run(k, o.iterations, &times);
      const double h1 = CpuSeconds(hub.pid()), b1 = SelfCpuSeconds();
      const uint64_t l1 = LinkBytes(o.link_dev);
      const Stats s1 = GetStats(hub, tenant);
      if (s1.errors != s0.errors) Die(k.name + ": the hub counted errors");
      const double per = static_cast<double>(o.iterations) * W;
      Row& r = rows[{k.elements * 4, k.ratio}];
      r.p50.push_back(Percentile(times.step_ms, 0.5));
      r.p90.push_back(Percentile(times.step_ms, 0.9));
      r.call.push_back(Percentile(times.call_ms, 0.5));
      r.in.push_back(static_cast<double>(s1.bytes_in - s0.bytes_in) / per);
      r.out.push_back(static_cast<double>(s1.bytes_out - s0.bytes_out) / per);
      r.link.push_back(static_cast<double>(l1 - l0) / per);
      r.hub_cpu.push_back((h1 - h0) / o.iterations);
      r.bench_cpu.push_back((b1 - b0) / o.iterations);
      std::string nz;
      if (sum_only) {
        const auto mean = [](const std::vector<double>& v) {
          double t = 0;
          for (double x : v) t += x;
          return v.empty() ? NAN : t / static_cast<double>(v.size());
        };
        r.areply.push_back(mean(times.reply_bytes));
        r.nonzeros.push_back(mean(times.nonzeros));
        max_reply_diff = std::max(max_reply_diff, std::abs(r.out.back() - r.areply.back()));
        char buf[64];
        std::snprintf(buf, sizeof buf, "  reply nonzeros/chunk %.1f", r.nonzeros.back());
        nz = buf;
      }
      std::printf("round %d %-7s %-11s step p50 %8.1f ms p90 %8.1f ms  PushPull call %6.1f ms  "
                  "per worker and step: push %10s reply %10s%s%s%s\n",
                  round, Size(k.elements * 4).c_str(), VariantName(k.ratio).c_str(),
                  r.p50.back(), r.p90.back(), r.call.back(), Bytes(r.in.back()).c_str(),
                  Bytes(r.out.back()).c_str(), o.link_dev.empty() ? "" : "  link ",
                  o.link_dev.empty() ? "" : Bytes(r.link.back()).c_str(), nz.c_str());
      std::fflush(stdout);
    }
  }

  const std::string link_note =
      o.link_dev.empty() ? ""
                         : "; link = tx + rx of " + o.link_dev +
                               " (TCP/IP framing, ACKs and admin calls included)";
  std::printf("\nbytes: per worker per step; push = the hub's bytes_in counter (PUSH frames "
              "with headers), reply = its bytes_out counter (everything written to the tenant's "
              "connections), analytic = from the frame layout%s%s. Medians over rounds.\n\n",
              sum_only ? " (replies: from the nonzeros of the replies received)" : "",
              link_note.c_str());
  std::printf("| size | variant | push (hub) | reply (hub) | push + reply | vs dense | analytic "
              "push + reply |%s%s step p50 | step p90 | vs dense | PushPull call p50 | hub CPU "
              "s/step | bench CPU s/step | round p50s (ms) |\n",
              sum_only ? " reply nonzeros/chunk |" : "", o.link_dev.empty() ? "" : " link |");
  std::printf("|---|---|---:|---:|---:|---:|---:|%s%s---:|---:|---:|---:|---:|---:|---|\n",
              sum_only ? "---:|" : "", o.link_dev.empty() ? "" : "---:|");
  for (uint64_t b : sizes) {
    const Row* dense = rows.count({b, 0.0}) ? &rows[{b, 0.0}] : nullptr;
    for (double ratio : o.ratios) {
      const Row& r = rows[{b, ratio}];
      const auto [apush, areply] = AnalyticBytes(b / 4, ratio, chunk);
      const double total = Median(r.in) + Median(r.out);
      const double dtotal = dense ? Median(dense->in) + Median(dense->out) : NAN;
      std::string link;
      if (sum_only) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " %.1f |", Median(r.nonzeros));
        link = buf;
      }
      if (!o.link_dev.empty()) link += " " + Bytes(Median(r.link)) + " |";
      const double analytic =
          static_cast<double>(apush) + (sum_only ? Median(r.areply) : static_cast<double>(areply));
      std::string rounds;
      for (double v : r.p50) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.0f", rounds.empty() ? "" : " ", v);
        rounds += buf;
      }
      std::printf("| %s | %s | %s | %s | %s | %.3f | %s |%s %.1f ms | %.1f ms | %.3f | %.1f ms | "
                  "%.3f | %.3f | %s |\n",
                  Size(b).c_str(), VariantName(ratio).c_str(), Bytes(Median(r.in)).c_str(),
                  Bytes(Median(r.out)).c_str(), Bytes(total).c_str(), total / dtotal,
                  Bytes(analytic).c_str(), link.c_str(),
                  Median(r.p50), Median(r.p90), dense ? Median(r.p50) / Median(dense->p50) : NAN,
                  Median(r.call), Median(r.hub_cpu), Median(r.bench_cpu), rounds.c_str());
    }
  }
  if (sum_only) {
    std::printf("\nreply bytes, hub counter vs frame layout from the nonzeros received: largest "
                "difference %.1f B per worker and step\n",
                max_reply_diff);
    // Means over steps: equal up to rounding (printed as 0.0) or a failure.
    if (!(max_reply_diff < 0.05)) {
      std::fflush(stdout);
      Die("the hub's reply bytes differ from the frame layout of the nonzeros received");
    }
  }
  std::printf("\nchecks: every call succeeded, all workers' replies bit-identical after every "
              "step, %s: yes; load average at the end %s\n",
              sum_only ? ("every reply entry finite, dense replies = " + o.reduction +
                          " of the gradients (every entry), top-k replies at most " +
                          std::to_string(W) + " x k nonzeros per chunk")
                             .c_str()
                       : ("dense replies = previous - lr * " + o.reduction +
                          "(gradients) on a stride")
                             .c_str(),
              LoadAverage().c_str());
  for (auto& c : clients) c->Close();
}

// ---- scenario staleness ----

struct StalenessResult {
  double fast_its = 0, slow_its = 0, job_pushes = 0;
  uint64_t max_lag = 0, max_counter_lag = 0, updates = 0, pushes = 0;
  uint64_t fast_total = 0, slow_total = 0;
};

StalenessResult RunStaleness(const Hub& hub, const Options& o, const Mode& mode, int round) {
  const std::string tenant = "st-" + std::to_string(round) + "-" +
                             (mode.consistency == pb::BOUNDED ? "bounded" + std::to_string(mode.staleness)
                                                              : mode.name);
  const uint64_t bytes = ParseSize(o.st_bytes) / 4 * 4;
  const std::string token = CreateTenant(hub, tenant, 2, mode, bytes * 8 + (16 << 20));
  std::unique_ptr<rc::Client> clients[2];
  rc::KeyId ids[2]{};
  {
    std::thread t[2];
    for (uint32_t w = 0; w < 2; ++w) {
      t[w] = std::thread([&, w] {
        clients[w] = Connect(hub, o, tenant, token, w);
        rc::KeyDecl d;
        d.name = "w";
        d.elements = bytes / 4;
        if (auto e = clients[w]->DeclareKey(d, &ids[w]); !e.ok()) Die("declare: " + e.message);
      });
    }
    for (auto& x : t) x.join();
  }
  // Stopping (see CanExit): under mu, each worker's completed pushes and
  // whether a PushPull of it is in flight.
  std::mutex mu;
  uint64_t count[2] = {0, 0};
  bool inflight[2] = {false, false}, exited[2] = {false, false};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> max_lag[2] = {0, 0}, max_counter_lag[2] = {0, 0};
  const uint64_t s_eff = mode.consistency == pb::SYNC ? 0
                         : mode.consistency == pb::ASYNC ? UINT64_MAX / 2
                                                         : mode.staleness;
  // A worker may leave once the other cannot be left waiting for it: the
  // other has left, or has no PushPull in flight (it sees `exited` before
  // its next one), or that PushPull's iteration is within the bound of ours.
  const auto can_exit = [&](int me) {
    const int other = 1 - me;
    return exited[other] || !inflight[other] || count[other] + 1 <= count[me] + s_eff;
  };
  const double slow_ms = o.compute_ms * o.slow_factor;
  const auto compute_ms = [&](int rank, uint64_t step) {
    bool slow = rank == 1;
    if (o.slow_mode == "alternate") {
      slow = (step / static_cast<uint64_t>(o.alternate_every)) % 2 == static_cast<uint64_t>(rank);
    }
    return slow ? slow_ms : o.compute_ms;
  };
  std::thread threads[2];
  for (int w = 0; w < 2; ++w) {
    threads[w] = std::thread([&, w] {
      std::vector<float> grad(bytes / 4), out(bytes / 4);
      uint64_t s = 77 + w;
      for (auto& v : grad) v = static_cast<float>(static_cast<double>(NextRandom(s) >> 11) * 0x1.0p-53);
      for (uint64_t step = 0;; ++step) {
        const auto busy = std::chrono::duration<double, std::milli>(compute_ms(w, step));
        if (o.compute == "busy") {
          const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(busy);
          while (Clock::now() < end) {
          }
        } else {
          std::this_thread::sleep_for(busy);
        }
        {
          std::lock_guard l(mu);
          if (stop && can_exit(w)) {
            exited[w] = true;
            return;
          }
          inflight[w] = true;
        }
        if (rc::Error e = clients[w]->Wait(clients[w]->PushPull(ids[w], grad, out)); !e.ok()) {
          Die(mode.name + " rank " + std::to_string(w) + " step " + std::to_string(step) + ": " +
              e.message);
        }
        uint64_t mine, theirs;
        {
          std::lock_guard l(mu);
          inflight[w] = false;
          mine = ++count[w];
          theirs = count[1 - w];
        }
        const auto info = clients[w]->GetKeyInfo(ids[w]);
        if (!info) Die("GetKeyInfo failed");
        if (info->next_iteration != mine) {
          Die(mode.name + " rank " + std::to_string(w) + ": KeyInfo.next_iteration " +
              std::to_string(info->next_iteration) + " after " + std::to_string(mine) +
              " PushPulls");
        }
        if (!std::isfinite(out[0]) || !std::isfinite(out.back())) Die("non-finite parameters");
        if (mode.consistency != pb::SYNC) {
          if (info->slowest_iteration > mine) {
            Die(mode.name + ": slowest_iteration " + std::to_string(info->slowest_iteration) +
                " above this worker's iteration " + std::to_string(mine));
          }
          const uint64_t lag = mine - info->slowest_iteration;
          if (lag > max_lag[w]) max_lag[w] = lag;
          if (mode.consistency == pb::BOUNDED && lag > mode.staleness) {
            std::fprintf(stderr,
                         "\nBOUND VIOLATED: %s rank %d at iteration %" PRIu64
                         ", KeyInfo.slowest_iteration %" PRIu64 ": lag %" PRIu64 " > %u\n",
                         mode.name.c_str(), w, mine, info->slowest_iteration, lag,
                         mode.staleness);
            Die("staleness bound violated (" + mode.name + ")");
          }
        }
        if (mine > theirs && mine - theirs > max_counter_lag[w]) max_counter_lag[w] = mine - theirs;
      }
    });
  }
  const auto sample = [&] {
    std::lock_guard l(mu);
    return std::pair<uint64_t, uint64_t>{count[0], count[1]};
  };
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_seconds));
  const auto c0 = sample();
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) max_lag[i] = 0, max_counter_lag[i] = 0;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  const auto c1 = sample();
  const double secs = Ms(Clock::now() - t0) / 1000;
  StalenessResult r;
  r.max_lag = std::max(max_lag[0].load(), max_lag[1].load());
  r.max_counter_lag = std::max(max_counter_lag[0].load(), max_counter_lag[1].load());
  stop = true;
  for (auto& t : threads) t.join();
  r.fast_its = static_cast<double>(c1.first - c0.first) / secs;
  r.slow_its = static_cast<double>(c1.second - c0.second) / secs;
  r.job_pushes = r.fast_its + r.slow_its;
  r.fast_total = count[0];
  r.slow_total = count[1];
  // The hub's view at the end: a Pull reports the key's versions.
  std::vector<float> out(bytes / 4);
  if (auto e = clients[0]->Wait(clients[0]->Pull(ids[0], out)); !e.ok()) Die("Pull: " + e.message);
  const auto info = clients[0]->GetKeyInfo(ids[0]);
  r.updates = info ? info->updates : 0;
  r.pushes = GetStats(hub, tenant).pushes;
  if (mode.consistency != pb::SYNC && r.updates != count[0] + count[1]) {
    Die(mode.name + ": KeyInfo.updates " + std::to_string(r.updates) + " after " +
        std::to_string(count[0] + count[1]) + " pushes");
  }
  for (auto& c : clients) c->Close();
  return r;
}

void Staleness(const std::string& bin, const Options& o) {
  Hub hub(bin, o, "staleness");
  std::vector<Mode> modes;
  for (const auto& m : o.modes) modes.push_back(ParseMode(m));
  std::printf("2 workers, key %s (fp32, SGD), compute %.1f ms per step (%s), slowed %.1fx: %s; "
              "%.1f s measured after %.1f s, %d rounds; workers' transport %s; load average "
              "%s\n",
              Size(ParseSize(o.st_bytes)).c_str(), o.compute_ms, o.compute.c_str(),
              o.slow_factor,
              o.slow_mode == "fixed"
                  ? "rank 1 every step"
                  : ("rank 0 and rank 1 in turn, " + std::to_string(o.alternate_every) +
                     " steps each").c_str(),
              o.seconds, o.warmup_seconds, o.rounds, o.transport.c_str(),
              LoadAverage().c_str());
  std::map<std::string, std::vector<StalenessResult>> results;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<Mode> order = modes;
    if (round % 2) std::reverse(order.begin(), order.end());
    for (const Mode& m : order) {
      StalenessResult r = RunStaleness(hub, o, m, round);
      std::printf("round %d %-11s rank 0 %6.1f it/s  rank 1 %6.1f it/s  job %6.1f pushes/s  "
                  "max lag (KeyInfo) %3" PRIu64 "  (counters) %3" PRIu64 "  PushPulls %" PRIu64
                  "+%" PRIu64 ", hub chunk pushes %" PRIu64 ", KeyInfo.updates %" PRIu64 "\n",
                  round, m.name.c_str(), r.fast_its, r.slow_its, r.job_pushes, r.max_lag,
                  r.max_counter_lag, r.fast_total, r.slow_total, r.pushes, r.updates);
      std::fflush(stdout);
      results[m.name].push_back(r);
    }
  }
  const auto med = [&](const std::string& m, auto f) {
    std::vector<double> v;
    for (const auto& r : results[m]) v.push_back(f(r));
    return Median(v);
  };
  const double sync_job =
      results.count("sync") ? med("sync", [](const auto& r) { return r.job_pushes; }) : NAN;
  const double ideal_fast = 1000 / o.compute_ms, ideal_slow = 1000 / (o.compute_ms * o.slow_factor);
  std::printf("\n| mode | rank 0 it/s | rank 1 it/s | job pushes/s | job vs sync | max lag "
              "(KeyInfo) | max lag (counters) | bound |\n"
              "|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Mode& m : modes) {
    uint64_t lag = 0, clag = 0;
    for (const auto& r : results[m.name]) {
      lag = std::max(lag, r.max_lag);
      clag = std::max(clag, r.max_counter_lag);
    }
    const double job = med(m.name, [](const auto& r) { return r.job_pushes; });
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f | %s | %" PRIu64 " | %s |\n",
                m.name.c_str(), med(m.name, [](const auto& r) { return r.fast_its; }),
                med(m.name, [](const auto& r) { return r.slow_its; }), job, job / sync_job,
                m.consistency == pb::SYNC ? "n/a (0)" : std::to_string(lag).c_str(), clag,
                m.consistency == pb::BOUNDED ? ("<= " + std::to_string(m.staleness)).c_str()
                                             : m.consistency == pb::SYNC ? "0" : "none");
  }
  std::string mean_pace;
  if (o.slow_mode == "alternate") {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", %.1f it/s on average (each worker)",
                  2000 / (o.compute_ms * (1 + o.slow_factor)));
    mean_pace = buf;
  }
  std::printf("\ncompute alone: %.1f it/s (unslowed), %.1f it/s (slowed)%s; every bounded lag "
              "within its bound: yes; KeyInfo.updates = pushes of both workers "
              "(bounded/async): yes; load average at the end %s\n",
              ideal_fast, ideal_slow,
              mean_pace.c_str(), LoadAverage().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"rackhub-compression-bench: top-k compressed push_pull and bounded staleness "
               "through a real rackhubd"};
  app.add_option("--scenario", o.scenario, "topk | staleness")
      ->check(CLI::IsMember({"topk", "staleness"}));
  app.add_option("--dir", o.dir, "where the hubs' logs go");
  app.add_option("--hub-netns", o.hub_netns,
                 "start rackhubd under `ip netns exec NAME` (root; bench/compression_netns.sh)");
  app.add_option("--hub-host", o.hub_host,
                 "address the hub listens on (beyond 127.0.0.1 with a generated admin token)");
  app.add_option("--link-dev", o.link_dev,
                 "also count this device's tx + rx bytes (e.g. the veth to the hub)");
  app.add_option("--transport", o.transport, "workers' transport: tcp (forced) | auto | shm")
      ->check(CLI::IsMember({"tcp", "auto", "shm"}));
  app.add_option("--lanes", o.lanes, "hub lanes")->check(CLI::Range(1, 64));
  app.add_option("--workers", o.workers, "workers (topk)")->check(CLI::Range(1, 64));
  app.add_option("--sizes", o.sizes, "key sizes, fp32 bytes (topk), e.g. 16MiB 64MiB")
      ->delimiter(',');
  app.add_option("--ratios", o.ratios, "top-k ratios; 0 = dense (topk)")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("!--no-error-feedback", o.error_feedback, "top-k without error feedback");
  app.add_option("--optimizer", o.optimizer,
                 "the keys' optimizer (topk): sgd (lr 0.01, dense replies) | sum-only (the reply "
                 "is the reduced gradient; sparse for top-k keys where smaller)")
      ->check(CLI::IsMember({"sgd", "sum-only"}));
  app.add_option("--reduction", o.reduction, "mean | sum of the workers' gradients (topk)")
      ->check(CLI::IsMember({"mean", "sum"}));
  app.add_option("--iterations", o.iterations, "timed steps per variant and round (topk)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "untimed steps before them (topk)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--rounds", o.rounds, "interleaved rounds")->check(CLI::Range(1, 100));
  app.add_option("--modes", o.modes, "tenants' consistency (staleness): sync, bounded:S, async")
      ->delimiter(',');
  app.add_option("--st-bytes", o.st_bytes, "the key (staleness)");
  app.add_option("--compute-ms", o.compute_ms, "compute per step of the unslowed worker")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--slow-factor", o.slow_factor, "the slowed worker's compute / the other's")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--slow-mode", o.slow_mode,
                 "fixed: rank 1 is slowed every step; alternate: the ranks take turns")
      ->check(CLI::IsMember({"fixed", "alternate"}));
  app.add_option("--alternate-every", o.alternate_every, "steps per turn (alternate)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--compute", o.compute, "sleep | busy (spin)")
      ->check(CLI::IsMember({"sleep", "busy"}));
  app.add_option("--seconds", o.seconds, "measured seconds per mode and round (staleness)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--warmup-seconds", o.warmup_seconds, "unmeasured seconds before them (staleness)")
      ->check(CLI::Range(0.0, 600.0));
  CLI11_PARSE(app, argc, argv);
  if (o.ratios.empty() || o.sizes.empty() || o.modes.empty()) Die("empty list option");
  for (const auto& m : o.modes) ParseMode(m);
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string() + "/rackhubd";
  fs::create_directories(o.dir);
  if (o.scenario == "topk") TopK(bin, o);
  if (o.scenario == "staleness") Staleness(bin, o);
  return 0;
}
