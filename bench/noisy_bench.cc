// rackhub-noisy-bench: tenants sharing one real rackhubd (issue 12, figures;
// docs/architecture.md "Fair share of a lane"). Workers are threads of this
// process, one librackhub Client each, on loopback TCP. Every tenant is
// sum-only with reduction SUM and integer-valued gradients, so every reply
// is checked element by element against the exact sum (a wrong or mixed
// byte counts as an error).
//
//   --scenario noisy: tenant A (2 workers, a small key, paced by a think
//     time like a trainer's compute) runs alone, then while tenant B (4
//     workers, a large key, no think time) saturates the hub; A's push_pull
//     latency p50/p99 in both phases, on a hub with data.scheduler = fair and
//     one with fifo, in interleaved rounds (medians over rounds).
//   --scenario weights: two saturating tenants of equal shape with weights
//     1:1 and 1:W: each one's bytes/s and the ratio, against the weights.
//   --scenario soak: T tenants x N workers train flat out for M minutes:
//     errors (must be 0), iterations per tenant against the fair share
//     (mean), the hub's RSS every 10 s (flat?).
// --transport auto|shm|tcp picks the workers' transport (auto: shared memory).
// Results: bench/results/noisy-*.md.

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cinttypes>
#include <map>
#include <memory>
#include <numeric>
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

constexpr int kPatterns = 5;  // gradients repeat every 5 iterations
// --transport: shared memory (auto: when the hub offers it, i.e. always
// here) or TCP for every worker.
rc::Shm g_shm = rc::Shm::kAuto;

std::string CreateTenant(const std::string& admin, const std::string& name, uint32_t workers,
                         uint32_t weight) {
  auto stub = pb::TenantService::NewStub(
      grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::CreateTenantRequest req;
  req.set_name(name);
  req.set_workers_per_rack(workers);
  req.mutable_default_optimizer()->set_type(pb::SUM_ONLY);
  req.mutable_default_optimizer()->set_reduction(pb::SUM);
  req.mutable_quotas()->set_weight(weight);
  pb::CreateTenantResponse resp;
  if (auto s = stub->CreateTenant(&ctx, req, &resp); !s.ok()) {
    Die("CreateTenant " + name + ": " + s.error_message());
  }
  return resp.token();
}

// Gradient of `rank` at pattern p: element i = (rank + 1) * ((p + i) % 7 + 1).
float Grad(uint32_t rank, int p, uint64_t i) {
  return static_cast<float>((rank + 1) * ((static_cast<uint64_t>(p) + i) % 7 + 1));
}

// One worker of a tenant: a Client, one key, the gradients and the exact
// sums it must get back.
class Rank {
 public:
  Rank(const std::string& hub, const std::string& tenant, const std::string& token,
       uint32_t rank, uint32_t workers, uint64_t elements)
      : rank_(rank) {
    rc::Options o;
    o.hub = hub;
    o.tenant = tenant;
    o.token = token;
    o.rank = rank;
    o.connect_timeout = std::chrono::seconds(30);
    o.shm = g_shm;
    rc::Error e;
    client_ = rc::Client::Connect(o, &e);
    if (!client_) Die(tenant + " rank " + std::to_string(rank) + ": connect: " + e.message);
    rc::KeyDecl d;
    d.name = "w";
    d.elements = elements;
    if (auto err = client_->DeclareKey(d, &id_); !err.ok()) Die("declare: " + err.message);
    const float sum_ranks = static_cast<float>(workers * (workers + 1) / 2);
    for (int p = 0; p < kPatterns; ++p) {
      grads_[p].resize(elements);
      sums_[p].resize(elements);
      for (uint64_t i = 0; i < elements; ++i) {
        grads_[p][i] = Grad(rank, p, i);
        sums_[p][i] = sum_ranks * Grad(0, p, i);
      }
    }
    out_.resize(elements);
  }

  // One push_pull; returns its latency (ms), or a negative value on an error
  // (counted; the step is dropped and the parameters pulled again).
  double Step() {
    const int p = static_cast<int>(iteration_ % kPatterns);
    const auto t0 = Clock::now();
    rc::Error e = client_->Wait(client_->PushPull(id_, grads_[p], out_));
    const double ms = Ms(Clock::now() - t0);
    if (!e.ok()) {
      ++errors;
      last_error = e.message;
      client_->Wait(client_->Pull(id_, out_));
      return -1;
    }
    ++iteration_;
    if (std::memcmp(out_.data(), sums_[p].data(), out_.size() * sizeof(float)) != 0) {
      ++errors;
      last_error = "iteration " + std::to_string(iteration_) + ": wrong sum";
      return -1;
    }
    return ms;
  }

  uint64_t iterations() const { return iteration_; }
  std::atomic<uint64_t> errors{0};
  std::string last_error;

 private:
  uint32_t rank_;
  std::unique_ptr<rc::Client> client_;
  rc::KeyId id_{};
  std::vector<float> grads_[kPatterns], sums_[kPatterns], out_;
  uint64_t iteration_ = 0;
};

// A tenant's workers, each on its own thread while running.
class Tenant {
 public:
  Tenant(const HubProcess& hub, const std::string& name, uint32_t workers, uint64_t bytes,
         uint32_t weight = 1)
      : name_(name) {
    const std::string token = CreateTenant(hub.admin, name, workers, weight);
    std::vector<std::thread> connecting;
    ranks_.resize(workers);
    for (uint32_t r = 0; r < workers; ++r) {
      connecting.emplace_back([&, r] {
        ranks_[r] = std::make_unique<Rank>(hub.data, name, token, r, workers, bytes / 4);
      });
    }
    for (auto& t : connecting) t.join();
    bytes_ = bytes;
  }
  ~Tenant() { Stop(); }

  // Runs every worker until Stop(), `think` between steps; latencies of
  // rank 0 are recorded while `recording`.
  void Run(std::chrono::milliseconds think) {
    stop_at_ = UINT64_MAX;
    for (auto& r : ranks_) {
      threads_.emplace_back([this, rank = r.get(), think, first = r == ranks_.front()] {
        // Until Stop() names an iteration every rank reaches (synchronous
        // ranks are at most one apart): none leaves a peer's push waiting.
        while (rank->iterations() < stop_at_.load()) {
          const double ms = rank->Step();
          if (first && ms >= 0 && recording) {
            std::lock_guard l(mu_);
            latencies_.push_back(ms);
          }
          if (think.count() > 0) std::this_thread::sleep_for(think);
        }
      });
    }
  }
  void Stop() {
    uint64_t last = 0;
    for (auto& r : ranks_) last = std::max(last, r->iterations());
    stop_at_ = last + 1;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  std::vector<double> TakeLatencies() {
    std::lock_guard l(mu_);
    return std::exchange(latencies_, {});
  }
  uint64_t iterations() const { return ranks_[0]->iterations(); }
  uint64_t bytes() const { return bytes_; }
  uint64_t errors() const {
    uint64_t n = 0;
    for (auto& r : ranks_) n += r->errors;
    return n;
  }
  std::string last_error() const {
    for (auto& r : ranks_) {
      if (r->errors) return r->last_error;
    }
    return "";
  }
  const std::string& name() const { return name_; }
  std::atomic<bool> recording{false};

 private:
  std::string name_;
  uint64_t bytes_ = 0;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> stop_at_{UINT64_MAX};
  std::mutex mu_;
  std::vector<double> latencies_;
};

uint64_t RssMiB(pid_t pid) {
  std::istringstream in(ReadAll("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) / 1024;
  }
  return 0;
}

struct Options {
  std::string scenario = "noisy";
  std::string dir = "/var/tmp/rackhub-noisy-bench";
  int rounds = 3;
  int seconds = 6;
  uint64_t a_bytes = 1 << 20, b_bytes = 16 << 20;
  uint32_t a_workers = 2, b_workers = 4;
  int think_ms = 10;
  uint32_t weight = 3;
  uint32_t tenants = 8, workers = 4;
  uint64_t soak_bytes = 1 << 20;
  double minutes = 10;
};

void Noisy(const std::string& bin, const Options& o) {
  std::map<std::string, std::vector<double>> p50, p99;  // "fair alone" -> per round
  std::map<std::string, std::vector<double>> b_rate;
  uint64_t errors = 0;
  for (int round = 0; round < o.rounds; ++round) {
    const std::vector<std::string> order =
        round % 2 ? std::vector<std::string>{"fifo", "fair"} : std::vector<std::string>{"fair", "fifo"};
    for (const std::string& sched : order) {
      HubProcess hub(bin, o.dir + "/" + sched + std::to_string(round), "rackhubd",
                     {"--in-memory", "--lanes", "2", "--scheduler", sched});
      hub.Start();
      Tenant a(hub, "a", o.a_workers, o.a_bytes);
      Tenant b(hub, "b", o.b_workers, o.b_bytes);
      const auto phase = [&](const std::string& what, bool with_b) {
        if (with_b) b.Run(std::chrono::milliseconds(0));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // warm-up
        const uint64_t b0 = b.iterations();
        a.recording = true;
        const auto t0 = Clock::now();
        std::this_thread::sleep_for(std::chrono::seconds(o.seconds));
        a.recording = false;
        const double secs = Ms(Clock::now() - t0) / 1000;
        if (with_b) {
          b_rate[sched].push_back(static_cast<double>(b.iterations() - b0) / secs);
          b.Stop();
        }
        std::vector<double> lat = a.TakeLatencies();
        const std::string key = sched + (with_b ? " with B" : " alone");
        p50[key].push_back(Percentile(lat, 0.5));
        p99[key].push_back(Percentile(lat, 0.99));
        std::printf("round %d %-13s A: %5zu iterations, p50 %7.2f ms, p99 %7.2f ms%s\n", round,
                    key.c_str(), lat.size(), p50[key].back(), p99[key].back(),
                    with_b ? (", B " + std::to_string(b_rate[sched].back()) + " it/s").c_str()
                           : "");
        std::fflush(stdout);
      };
      a.Run(std::chrono::milliseconds(o.think_ms));
      phase("alone", false);
      phase("with B", true);
      a.Stop();
      errors += a.errors() + b.errors();
      if (a.errors() + b.errors()) {
        std::printf("errors: %s\n", (a.last_error() + " " + b.last_error()).c_str());
      }
    }
  }
  std::printf("\n| hub scheduler | A alone p50 | A alone p99 | A with B p50 | A with B p99 | "
              "p99 ratio | B it/s |\n|---|---|---|---|---|---|---|\n");
  for (const std::string sched : {"fair", "fifo"}) {
    const double a99 = Median(p99[sched + " alone"]), b99 = Median(p99[sched + " with B"]);
    std::printf("| %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f | %.1f |\n", sched.c_str(),
                Median(p50[sched + " alone"]), a99, Median(p50[sched + " with B"]), b99,
                b99 / a99, Median(b_rate[sched]));
  }
  std::printf("errors (wrong or failed replies): %" PRIu64 "\n", errors);
}

void Weights(const std::string& bin, const Options& o) {
  uint64_t errors = 0;
  std::printf("| weights (x:y) | x bytes/s | y bytes/s | y/x measured | y/x asked |\n"
              "|---|---|---|---|---|\n");
  for (int round = 0; round < o.rounds; ++round) {
    for (uint32_t w : {1u, o.weight}) {
      HubProcess hub(bin, o.dir + "/weights" + std::to_string(round) + "-" + std::to_string(w),
                     "rackhubd", {"--in-memory", "--lanes", "2", "--scheduler", "fair"});
      hub.Start();
      Tenant x(hub, "x", o.b_workers / 2, o.b_bytes, 1);
      Tenant y(hub, "y", o.b_workers / 2, o.b_bytes, w);
      x.Run(std::chrono::milliseconds(0));
      y.Run(std::chrono::milliseconds(0));
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const uint64_t x0 = x.iterations(), y0 = y.iterations();
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(o.seconds));
      const double secs = Ms(Clock::now() - t0) / 1000;
      const double xr = static_cast<double>(x.iterations() - x0) * x.bytes() / secs;
      const double yr = static_cast<double>(y.iterations() - y0) * y.bytes() / secs;
      x.Stop();
      y.Stop();
      errors += x.errors() + y.errors();
      std::printf("| 1:%u | %.1f MB/s | %.1f MB/s | %.2f | %u |\n", w, xr / 1e6, yr / 1e6, yr / xr,
                  w);
      std::fflush(stdout);
    }
  }
  std::printf("errors (wrong or failed replies): %" PRIu64 "\n", errors);
}

void Soak(const std::string& bin, const Options& o) {
  HubProcess hub(bin, o.dir + "/soak", "rackhubd",
                 {"--in-memory", "--lanes", "2", "--scheduler", "fair"});
  hub.Start();
  std::vector<std::unique_ptr<Tenant>> tenants;
  for (uint32_t t = 0; t < o.tenants; ++t) {
    tenants.push_back(
        std::make_unique<Tenant>(hub, "t" + std::to_string(t), o.workers, o.soak_bytes));
  }
  for (auto& t : tenants) t->Run(std::chrono::milliseconds(0));
  std::vector<uint64_t> rss;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(o.minutes * 60);
  while (Clock::now() < end) {
    rss.push_back(RssMiB(hub.pid()));
    std::printf("%6.0f s: hub RSS %" PRIu64 " MiB, iterations", Ms(Clock::now() - t0) / 1000,
                rss.back());
    for (auto& t : tenants) std::printf(" %" PRIu64, t->iterations());
    std::printf("\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(10));
  }
  for (auto& t : tenants) t->Stop();
  rss.push_back(RssMiB(hub.pid()));
  uint64_t errors = 0, total = 0;
  for (auto& t : tenants) {
    errors += t->errors();
    total += t->iterations();
  }
  const double fair = static_cast<double>(total) / tenants.size();
  double worst = 0;
  std::printf("\n| tenant | iterations | / fair share |\n|---|---|---|\n");
  for (auto& t : tenants) {
    const double share = static_cast<double>(t->iterations()) / fair;
    worst = std::max(worst, std::abs(share - 1));
    std::printf("| %s | %" PRIu64 " | %.3f |\n", t->name().c_str(), t->iterations(), share);
  }
  std::printf("\nminutes %.1f, tenants %u x %u workers, key %" PRIu64
              " bytes; errors %" PRIu64 "; worst deviation from the fair share %.1f %%; hub RSS "
              "first %" PRIu64 " MiB, last %" PRIu64 " MiB, max %" PRIu64 " MiB\n",
              o.minutes, o.tenants, o.workers, o.soak_bytes, errors, worst * 100, rss.front(),
              rss.back(), *std::max_element(rss.begin(), rss.end()));
  for (auto& t : tenants) {
    if (t->errors()) std::printf("%s: %s\n", t->name().c_str(), t->last_error().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"rackhub-noisy-bench: tenants sharing one rackhubd (fair vs fifo lanes)"};
  app.add_option("--scenario", o.scenario, "noisy | weights | soak")
      ->check(CLI::IsMember({"noisy", "weights", "soak"}));
  app.add_option("--dir", o.dir, "where the hubs' logs go");
  app.add_option("--rounds", o.rounds, "interleaved rounds (noisy, weights)")->check(CLI::Range(1, 100));
  app.add_option("--seconds", o.seconds, "measured seconds per phase")->check(CLI::Range(1, 3600));
  app.add_option("--a-bytes", o.a_bytes, "tenant A's key (noisy)");
  app.add_option("--b-bytes", o.b_bytes, "tenant B's key (noisy, weights)");
  app.add_option("--a-workers", o.a_workers, "tenant A's workers")->check(CLI::Range(1, 64));
  app.add_option("--b-workers", o.b_workers, "tenant B's workers")->check(CLI::Range(2, 64));
  app.add_option("--think-ms", o.think_ms, "A's compute time between steps")->check(CLI::Range(0, 10000));
  app.add_option("--weight", o.weight, "the second tenant's weight (weights)")->check(CLI::Range(1, 1000));
  app.add_option("--tenants", o.tenants, "tenants (soak)")->check(CLI::Range(1, 64));
  app.add_option("--workers", o.workers, "workers per tenant (soak)")->check(CLI::Range(1, 64));
  app.add_option("--soak-bytes", o.soak_bytes, "each soak tenant's key");
  app.add_option("--minutes", o.minutes, "soak duration")->check(CLI::Range(0.1, 1440.0));
  std::string transport = "auto";
  app.add_option("--transport", transport, "the workers' transport: auto (shared memory on this "
                 "host) | shm | tcp")->check(CLI::IsMember({"auto", "shm", "tcp"}));
  CLI11_PARSE(app, argc, argv);
  g_shm = transport == "tcp" ? rc::Shm::kOff : transport == "shm" ? rc::Shm::kOn : rc::Shm::kAuto;
  std::printf("workers' transport: %s\n", transport.c_str());
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string() + "/rackhubd";
  fs::create_directories(o.dir);
  if (o.scenario == "noisy") Noisy(bin, o);
  if (o.scenario == "weights") Weights(bin, o);
  if (o.scenario == "soak") Soak(bin, o);
  return 0;
}
