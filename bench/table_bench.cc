// rackhub-table-bench: row-sparse tables (embedding tables; issue 16, item 5;
// docs/architecture.md "Row-sparse tables") through one real rackhubd.
// Workers are threads of this process, one librackhub Client each (shared
// memory with the hub by default, --transport tcp for loopback TCP).
//
// Tables of R rows x 64 fp32 (default 1M and 10M rows), one key per (rows,
// optimizer): SGD and row-wise AdaGrad, random-initialized on the hub. Each
// step every worker calls PushPullRows(ids = its batch, grads = random
// values, want = its NEXT batch's ids (the prefetch), out) and waits. A batch
// is B draws (1k, 10k, 100k) from a Zipf distribution (exponent 1.05) over
// the table's rows, each worker its own draws with a fixed seed; duplicates
// are kept (the hub sums them). Zipf rank k is row (k * 2654435761 + 12345)
// mod R, so the hot rows are spread over the lanes' row ranges (rank order
// would put every hot row in lane 0's range).
//
// Reported per (rows, optimizer, batch), over --rounds interleaved rounds of
// N timed steps each (after warm-up steps): the median step (a step = the
// slowest worker's PushPullRows), the mean step (wall time / steps), the
// rows the hub applied per second per lane (distinct touched rows of all
// workers, on that lane's row range) and the row contributions per second
// per lane, the lanes' CPU time (GetStats lane busy_seconds) and rows per
// lane-CPU-second; the bytes on the wire per worker per step (computed from
// the frames: 40-byte header + 8-byte row prefix + 8 per id + 8 per wanted
// id + rows x dim x 4 per request; header + prefix + wanted rows x dim x 4
// per reply; one request per lane's row range) next to the hub's byte
// counters and against a dense push_pull of the same table (2 x rows x dim x
// 4 per worker). A dense key of 1M x 64 fp32 elements (256 MB) is push_pulled
// in the same rounds as the same-run baseline (10M x 64 dense, 2.56 GB each
// way per worker per step, is not run).
//
// Checks: every call must succeed (the bench stops at the first failure,
// naming it); reply rows are finite (a stride of every reply, every value of
// the last reply of each block); the hottest row, wanted by every worker in
// the same step, is bit-identical in their replies.
// Results: bench/results/tables-*.md.

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <barrier>
#include <cinttypes>
#include <map>
#include <memory>
#include <numeric>
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

constexpr uint64_t kHeader = 40;    // net::kHeaderBytes
constexpr uint64_t kPrefix = 8;     // net::kRowsPrefixBytes
constexpr uint64_t kMul = 2654435761ull;  // a prime above every table size here
constexpr uint64_t kAdd = 12345;

rc::Shm g_shm = rc::Shm::kAuto;

struct Options {
  std::string dir = "/var/tmp/rackhub-table-bench";
  uint32_t workers = 2;
  uint32_t lanes = 2;
  uint32_t dim = 64;
  std::vector<uint64_t> rows = {1000000, 10000000};
  std::vector<uint64_t> batches = {1000, 10000, 100000};
  std::vector<std::string> optimizers = {"sgd", "adagrad"};
  double zipf = 1.05;
  int rounds = 5;
  int warmup = 2;
  double step_rows = 500000;  // timed steps per block: max(min_steps, step_rows / batch)
  int min_steps = 10;
  int max_steps = 200;
  int pool = 16;              // distinct batches per worker and (rows, batch), cycled
  bool dense = true;
  uint64_t dense_rows = 1000000;
  int dense_steps = 3;
  std::string transport = "auto";
  std::string shm_ring_bytes = "auto";  // the hub's data.shm_ring_bytes; 0: its default
  uint64_t seed = 1;
  bool keep_dir = false;
};

// ---- admin API ----

std::unique_ptr<grpc::ClientContext> Ctx(int seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

std::string CreateTenant(const std::string& admin, uint32_t workers, uint64_t quota) {
  auto stub = pb::TenantService::NewStub(
      grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
  pb::CreateTenantRequest req;
  req.set_name("tables");
  req.set_workers_per_rack(workers);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(0.01);
  req.mutable_quotas()->set_max_parameter_bytes(quota);
  pb::CreateTenantResponse resp;
  if (auto s = stub->CreateTenant(Ctx(10).get(), req, &resp); !s.ok()) {
    Die("CreateTenant: " + s.error_message());
  }
  return resp.token();
}

struct Stats {
  std::vector<double> lane_busy;  // seconds, by lane
  uint64_t bytes_in = 0, bytes_out = 0, memory = 0, allocated = 0, errors = 0;
};

Stats GetStats(const std::string& admin) {
  static std::unique_ptr<pb::StatsService::Stub> stub;
  if (!stub) {
    stub = pb::StatsService::NewStub(
        grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
  }
  pb::GetStatsRequest req;
  req.set_tenant("tables");
  pb::GetStatsResponse resp;
  if (auto s = stub->GetStats(Ctx(10).get(), req, &resp); !s.ok()) {
    Die("GetStats: " + s.error_message());
  }
  Stats st;
  st.lane_busy.resize(resp.daemon().lanes());
  for (const auto& l : resp.daemon().lane_stats()) {
    if (l.lane() < st.lane_busy.size()) st.lane_busy[l.lane()] = l.busy_seconds();
  }
  for (const auto& t : resp.tenants()) {
    st.bytes_in += t.bytes_in();
    st.bytes_out += t.bytes_out();
    st.memory += t.memory_bytes();
    st.allocated += t.memory_bytes_allocated();
    st.errors += t.errors();
  }
  return st;
}

uint64_t RssMiB(pid_t pid) {
  std::istringstream in(ReadAll("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) / 1024;
  }
  return 0;
}

// CPU seconds (user, system) of a process (/proc/PID/stat) and of this one.
std::pair<double, double> ProcessCpu(pid_t pid) {
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return {0, 0};
  std::istringstream in(stat.substr(close + 2));
  std::vector<std::string> f;
  std::string x;
  while (in >> x) f.push_back(x);
  if (f.size() < 13) return {0, 0};
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {std::stod(f[11]) / tick, std::stod(f[12]) / tick};
}
std::pair<double, double> SelfCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return {sec(u.ru_utime), sec(u.ru_stime)};
}

// The machine's busy, idle and stolen CPU seconds so far (/proc/stat, all
// cores; idle includes iowait; steal: the hypervisor ran something else).
struct MachineTimes {
  double busy = 0, idle = 0, steal = 0;
};
MachineTimes MachineCpu() {
  std::istringstream in(ReadAll("/proc/stat"));
  std::string cpu;
  std::vector<double> v;
  in >> cpu;
  double x;
  while (v.size() < 8 && in >> x) v.push_back(x);
  if (cpu != "cpu" || v.size() < 8) return {};
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {(v[0] + v[1] + v[2] + v[5] + v[6]) / tick, (v[3] + v[4]) / tick, v[7] / tick};
}

std::string LoadAverage() {
  std::istringstream in(ReadAll("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string Count(uint64_t n) {
  if (n >= 1000000 && n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  if (n >= 1000 && n % 1000 == 0) return std::to_string(n / 1000) + "k";
  return std::to_string(n);
}

std::string Bytes(double b) {
  char buf[64];
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  } else if (b >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

// ---- Zipf batches ----

// P(rank k) ~ 1 / (k + 1)^s, k in [0, n): the normalized CDF.
std::vector<double> ZipfCdf(uint64_t n, double s) {
  std::vector<double> cdf(n);
  double sum = 0;
  for (uint64_t k = 0; k < n; ++k) {
    sum += std::pow(static_cast<double>(k + 1), -s);
    cdf[k] = sum;
  }
  for (double& c : cdf) c /= sum;
  return cdf;
}

uint64_t RowOfRank(uint64_t rank, uint64_t rows) { return (rank * kMul + kAdd) % rows; }

// The batches of one (rows, batch size): `pool` batches per worker, and
// per batch index what every worker's batches at that index touch together.
struct Pool {
  uint64_t rows = 0, batch = 0, per = 0;  // per: rows per chunk (lane row range)
  std::vector<std::vector<std::vector<uint64_t>>> ids;  // [worker][index] -> ids
  std::vector<std::vector<uint64_t>> distinct_by_chunk;  // [index][chunk]: union of workers
  double distinct_per_worker = 0;  // mean distinct rows of one worker's batch
  double distinct_union = 0;       // mean distinct rows of a step (all workers)
};

Pool MakePool(const std::vector<double>& cdf, uint64_t rows, uint64_t batch, uint32_t workers,
              uint32_t chunks, int size, uint64_t seed) {
  Pool p;
  p.rows = rows;
  p.batch = batch;
  p.per = rows / chunks + (rows % chunks != 0 ? 1 : 0);
  p.ids.assign(workers, {});
  std::vector<std::thread> gen;
  for (uint32_t w = 0; w < workers; ++w) {
    gen.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 1000003 + rows * 31 + batch * 7 + w);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      p.ids[w].resize(size);
      for (auto& b : p.ids[w]) {
        b.resize(batch);
        for (auto& id : b) {
          const uint64_t k = std::upper_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
          id = RowOfRank(std::min<uint64_t>(k, rows - 1), rows);
        }
      }
    });
  }
  for (auto& t : gen) t.join();
  p.distinct_by_chunk.assign(size, std::vector<uint64_t>(chunks, 0));
  double per_worker = 0, all = 0;
  for (int i = 0; i < size; ++i) {
    std::vector<uint64_t> u;
    for (uint32_t w = 0; w < workers; ++w) {
      std::vector<uint64_t> mine = p.ids[w][i];
      std::sort(mine.begin(), mine.end());
      mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
      per_worker += mine.size();
      u.insert(u.end(), mine.begin(), mine.end());
    }
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    all += u.size();
    for (uint64_t id : u) ++p.distinct_by_chunk[i][id / p.per];
  }
  p.distinct_per_worker = per_worker / (size * workers);
  p.distinct_union = all / size;
  return p;
}

// ---- workers ----

struct Config {
  std::string name;    // "1M x 64 sgd, 10k"
  std::string key;     // the table key's name
  const Pool* pool = nullptr;  // null: the dense key
  uint64_t rows = 0;
  std::string optimizer;
  int steps = 0;
};

uint64_t NextRandom(uint64_t& s) {  // xorshift64*
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 2685821657736338717ull;
}

class Rank {
 public:
  Rank(const std::string& hub, const std::string& token, uint32_t rank, const Options& o,
       const std::vector<rc::KeyDecl>& decls, uint64_t max_batch)
      : rank_(rank), dim_(o.dim) {
    rc::Options opt;
    opt.hub = hub;
    opt.tenant = "tables";
    opt.token = token;
    opt.rank = rank;
    opt.connect_timeout = std::chrono::seconds(30);
    opt.op_timeout = std::chrono::seconds(300);
    opt.shm = g_shm;
    rc::Error e;
    client_ = rc::Client::Connect(opt, &e);
    if (!client_) Die("rank " + std::to_string(rank) + ": connect: " + e.message);
    for (const rc::KeyDecl& d : decls) {
      rc::KeyId id{};
      if (auto err = client_->DeclareKey(d, &id); !err.ok()) {
        Die("rank " + std::to_string(rank) + ": declare '" + d.name + "': " + err.message);
      }
      keys_[d.name] = id;
    }
    uint64_t s = 0x9E3779B97F4A7C15ull * (rank + 1);
    grads_.resize(max_batch * dim_);
    for (float& g : grads_) g = static_cast<float>(NextRandom(s) >> 40) * 0x1p-24f * 2 - 1;
    out_.resize(max_batch * dim_);
    if (o.dense) {
      dense_grad_.resize(o.dense_rows * dim_);
      dense_out_.resize(o.dense_rows * dim_);
      for (size_t i = 0; i < dense_grad_.size(); ++i) {
        dense_grad_[i] = grads_[i % grads_.size()];
      }
    }
  }

  rc::Client& client() { return *client_; }
  const char* transport() const { return client_->transport(); }

  // Runs `n` steps of `c`; latencies (ms) into `lat` if not null. Dies at
  // the first failure. Returns when the last step's reply was in (before
  // its full check).
  Clock::time_point Run(const Config& c, int n, std::vector<double>* lat) {
    Clock::time_point done = Clock::now();
    const rc::KeyId key = keys_.at(c.key);
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      rc::Error e;
      uint64_t& step = steps_[c.key + (c.pool ? "/" + std::to_string(c.pool->batch) : "")];
      if (c.pool) {
        const auto& mine = c.pool->ids[rank_];
        const std::vector<uint64_t>& ids = mine[step % mine.size()];
        const std::vector<uint64_t>& want = mine[(step + 1) % mine.size()];
        e = client_->Wait(client_->PushPullRows(
            key, ids, std::span<const float>(grads_.data(), ids.size() * dim_), want,
            std::span<float>(out_.data(), want.size() * dim_)));
        last_want_ = &want;
      } else {
        e = client_->Wait(client_->PushPull(key, dense_grad_, dense_out_));
      }
      done = Clock::now();
      const double ms = Ms(done - t0);
      if (!e.ok()) {
        Die("rank " + std::to_string(rank_) + ", " + c.name + ", step " + std::to_string(step) +
            ": " + rc::ErrorCodeName(e.code) + "/" + rc::WireErrorName(e.wire) + ": " +
            e.message);
      }
      ++step;
      if (lat) lat->push_back(ms);
      // Reply rows finite: a stride here, every value at the block's end.
      const size_t values = c.pool ? last_want_->size() * dim_ : dense_out_.size();
      const float* out = c.pool ? out_.data() : dense_out_.data();
      const size_t stride = i + 1 == n ? 1 : 257;
      for (size_t j = (step * 13) % stride; j < values; j += stride) {
        if (!std::isfinite(out[j])) {
          Die("rank " + std::to_string(rank_) + ", " + c.name + ", step " +
              std::to_string(step) + ": reply value " + std::to_string(j) + " is not finite");
        }
      }
    }
    return done;
  }

  // The values of row `id` in the last reply (empty if it did not ask for it).
  std::vector<float> RowInLastReply(uint64_t id) const {
    if (!last_want_) return {};
    for (size_t i = 0; i < last_want_->size(); ++i) {
      if ((*last_want_)[i] == id) {
        return std::vector<float>(out_.begin() + i * dim_, out_.begin() + (i + 1) * dim_);
      }
    }
    return {};
  }

 private:
  uint32_t rank_;
  uint32_t dim_;
  std::unique_ptr<rc::Client> client_;
  std::map<std::string, rc::KeyId> keys_;
  std::map<std::string, uint64_t> steps_;  // steps done per "key/batch" (pool index)
  std::vector<float> grads_, out_, dense_grad_, dense_out_;
  const std::vector<uint64_t>* last_want_ = nullptr;
};

// ---- measurement ----

struct Block {  // one config in one round
  double p50_ms = 0, mean_ms = 0;
  std::vector<double> lane_busy_s;
  double bytes_in = 0, bytes_out = 0;  // hub counters, per worker per step
  double distinct = 0;                  // distinct rows applied, per step
  std::vector<double> distinct_by_lane; // per step
  // CPU seconds per step: the hub (user, system), this process (the
  // workers and their clients' I/O threads; user, system).
  double hub_user = 0, hub_sys = 0, bench_user = 0, bench_sys = 0;
  double machine_busy = 0, machine_idle = 0, machine_steal = 0;  // every core, per step
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool quick = false;
  CLI::App app{"rackhub-table-bench: row-sparse tables (PushPullRows, Zipf batches) through "
               "one rackhubd"};
  app.add_option("--dir", o.dir, "where the hub's state and log go");
  app.add_option("--workers", o.workers, "workers (threads, one Client each)")
      ->check(CLI::Range(1, 16));
  app.add_option("--lanes", o.lanes, "the hub's lanes")->check(CLI::Range(1, 64));
  app.add_option("--dim", o.dim, "row width (fp32 elements)")->check(CLI::Range(1, 4096));
  app.add_option("--rows", o.rows, "table sizes (rows)")->delimiter(',');
  app.add_option("--batches", o.batches, "Zipf draws per worker per step")->delimiter(',');
  app.add_option("--optimizers", o.optimizers, "sgd | adagrad | momentum | adam ...")
      ->delimiter(',');
  app.add_option("--zipf", o.zipf, "Zipf exponent")->check(CLI::Range(0.0, 5.0));
  app.add_option("--rounds", o.rounds, "interleaved rounds")->check(CLI::Range(1, 100));
  app.add_option("--warmup", o.warmup, "untimed steps per block")->check(CLI::Range(0, 1000));
  app.add_option("--step-rows", o.step_rows,
                 "timed steps per block: max(--min-steps, this / batch), at most --max-steps");
  app.add_option("--min-steps", o.min_steps)->check(CLI::Range(1, 100000));
  app.add_option("--max-steps", o.max_steps)->check(CLI::Range(1, 100000));
  app.add_option("--pool", o.pool, "batches per worker and (rows, batch), cycled")
      ->check(CLI::Range(2, 100000));
  app.add_option("--dense-rows", o.dense_rows, "rows of the dense baseline key (x dim)");
  app.add_option("--dense-steps", o.dense_steps, "timed dense steps per round")
      ->check(CLI::Range(1, 1000));
  bool no_dense = false;
  app.add_flag("--no-dense", no_dense, "skip the dense baseline");
  app.add_option("--transport", o.transport,
                 "the workers' transport: auto (shared memory on this host) | shm | tcp")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}));
  app.add_option("--shm-ring-bytes", o.shm_ring_bytes,
                 "the hub's data.shm_ring_bytes: auto (room for 4 frames of the largest batch, "
                 "at least the hub's default) | BYTES | 0 (the hub's default, 4 MiB: frames of "
                 "more than ~15k rows per lane do not fit)");
  app.add_option("--seed", o.seed, "seed of the batches");
  app.add_flag("--keep-dir", o.keep_dir, "keep --dir (the hub's log)");
  app.add_flag("--quick", quick,
               "smoke run: 1M rows, 1k and 10k batches, 2 rounds, few steps");
  CLI11_PARSE(app, argc, argv);
  o.dense = !no_dense;
  if (quick) {
    o.rows = {1000000};
    o.batches = {1000, 10000};
    o.rounds = 2;
    o.warmup = 1;
    o.step_rows = 20000;
    o.min_steps = 3;
    o.dense_steps = 1;
  }
  for (uint64_t r : o.rows) {
    if (r < 1) Die("--rows: must be >= 1");
  }
  g_shm = o.transport == "tcp" ? rc::Shm::kOff : o.transport == "shm" ? rc::Shm::kOn
                                                                       : rc::Shm::kAuto;
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string() + "/rackhubd";
  fs::remove_all(o.dir);
  fs::create_directories(o.dir);
  const auto bench_t0 = Clock::now();

  // Hub.
  // A PUSH_ROWS or ROWS frame must fit the shared-memory ring (a larger one
  // closes the connection), and the hub sizes rings for 4 of the tenant's
  // dense chunks only (32 KiB -> 4 MiB rings).
  uint64_t ring = 0;
  if (o.shm_ring_bytes == "auto") {
    uint64_t max_batch = 1;
    for (uint64_t b : o.batches) max_batch = std::max(max_batch, b);
    // One lane's request: header, prefix, ids, wanted ids and rows; the
    // Zipf rows spread evenly over the lanes (+25 %).
    const double frame = 64.0 + 8 + 1.25 * static_cast<double>(max_batch) / o.lanes *
                                        (16 + 4.0 * o.dim);
    const uint64_t need = (static_cast<uint64_t>(4 * frame) + (1 << 20) - 1) >> 20 << 20;
    if (need > (4u << 20)) ring = std::min<uint64_t>(need, 1u << 30);
  } else {
    ring = std::stoull(o.shm_ring_bytes);
    if (ring % 4096) Die("--shm-ring-bytes: must be a multiple of 4096");
  }
  std::vector<std::string> hub_args = {"--in-memory", "--lanes", std::to_string(o.lanes)};
  if (ring) {
    hub_args.push_back("--shm-ring-bytes");
    hub_args.push_back(std::to_string(ring));
  }
  HubProcess hub(bin, o.dir + "/hub", "rackhubd", hub_args);
  hub.Start();

  // Keys and the quota: tables (values + row-wise or per-element state),
  // the dense key (~(3 + W) x its fp32 bytes for SGD), 1 GiB of slack.
  std::vector<rc::KeyDecl> decls;
  uint64_t quota = 1ull << 30;
  for (uint64_t rows : o.rows) {
    for (const std::string& opt : o.optimizers) {
      rc::KeyDecl d;
      d.name = "t" + Count(rows) + "-" + opt;
      d.rows = rows;
      d.dim = o.dim;
      d.init = rc::Init::kRandom;
      d.init_scale = 0.01f;
      d.init_seed = 42;
      rc::OptimizerSpec spec;
      spec.type = opt;
      spec.learning_rate = 0.01;
      if (opt == "momentum" || opt == "nesterov") spec.momentum = 0.9;
      d.optimizer = spec;
      decls.push_back(d);
      quota += rows * o.dim * 4 * 3 + rows * 4;
    }
  }
  if (o.dense) {
    rc::KeyDecl d;
    d.name = "dense";
    d.elements = o.dense_rows * o.dim;
    rc::OptimizerSpec spec;
    spec.type = "sgd";
    spec.learning_rate = 0.01;
    d.optimizer = spec;
    decls.push_back(d);
    quota += d.elements * 4 * (4 + o.workers);
  }
  const std::string token = CreateTenant(hub.admin, o.workers, quota);

  // Batches.
  std::printf("rackhub-table-bench: %u workers, %u lanes, dim %u, Zipf %.2f, transport %s; "
              "load average %s\n",
              o.workers, o.lanes, o.dim, o.zipf, o.transport.c_str(), LoadAverage().c_str());
  std::fflush(stdout);
  uint64_t max_batch = 1;
  for (uint64_t b : o.batches) max_batch = std::max(max_batch, b);
  std::map<std::pair<uint64_t, uint64_t>, Pool> pools;  // (rows, batch)
  {
    const auto t0 = Clock::now();
    for (uint64_t rows : o.rows) {
      const std::vector<double> cdf = ZipfCdf(rows, o.zipf);
      const uint32_t chunks = static_cast<uint32_t>(std::min<uint64_t>(o.lanes, rows));
      for (uint64_t b : o.batches) {
        pools[{rows, b}] = MakePool(cdf, rows, b, o.workers, chunks, o.pool, o.seed);
      }
    }
    std::printf("batches drawn in %.1f s\n", Ms(Clock::now() - t0) / 1000);
    std::fflush(stdout);
  }

  // Workers.
  std::vector<std::unique_ptr<Rank>> ranks(o.workers);
  {
    std::vector<std::thread> connecting;
    for (uint32_t r = 0; r < o.workers; ++r) {
      connecting.emplace_back([&, r] {
        ranks[r] = std::make_unique<Rank>(hub.data, token, r, o, decls, max_batch);
      });
    }
    for (auto& t : connecting) t.join();
  }
  const uint32_t lanes = ranks[0]->client().lanes();
  std::printf("workers connected: transport %s, hub lanes %u, hub data.shm_ring_bytes %s\n",
              ranks[0]->transport(), lanes,
              ring ? std::to_string(ring).c_str() : "default (4 MiB)");
  std::fflush(stdout);

  // Configurations: per table (rows, optimizer) every batch size; then dense.
  std::vector<Config> configs;
  for (uint64_t rows : o.rows) {
    for (const std::string& opt : o.optimizers) {
      for (uint64_t b : o.batches) {
        Config c;
        c.rows = rows;
        c.optimizer = opt;
        c.key = "t" + Count(rows) + "-" + opt;
        c.pool = &pools.at({rows, b});
        c.name = Count(rows) + " x " + std::to_string(o.dim) + " " + opt + ", " + Count(b);
        c.steps = std::clamp(static_cast<int>(o.step_rows / static_cast<double>(b)), o.min_steps,
                             o.max_steps);
        configs.push_back(c);
      }
    }
  }
  if (o.dense) {
    Config c;
    c.rows = o.dense_rows;
    c.optimizer = "sgd";
    c.key = "dense";
    c.name = Count(o.dense_rows) + " x " + std::to_string(o.dim) + " dense push_pull";
    c.steps = o.dense_steps;
    configs.push_back(c);
  }
  std::vector<std::vector<Block>> results(configs.size());
  uint64_t mismatches = 0;
  std::map<std::string, uint64_t> counters;
  std::vector<uint64_t> reconnects(o.workers, 0);
  std::vector<std::string> transports;
  for (auto& r : ranks) transports.push_back(r->transport());
  uint64_t transport_changes = 0;

  const auto run_block = [&](size_t ci, bool first_round) {
    const Config& c = configs[ci];
    std::vector<std::vector<double>> lat(o.workers);
    std::vector<Clock::time_point> ends(o.workers);
    std::barrier sync(static_cast<std::ptrdiff_t>(o.workers) + 1);
    const int warm = first_round ? std::max(o.warmup, 1) : o.warmup;
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < o.workers; ++w) {
      threads.emplace_back([&, w] {
        ranks[w]->Run(c, warm, nullptr);
        sync.arrive_and_wait();
        sync.arrive_and_wait();
        ends[w] = ranks[w]->Run(c, c.steps, &lat[w]);
      });
    }
    sync.arrive_and_wait();
    const Stats s0 = GetStats(hub.admin);
    const auto hub0 = ProcessCpu(hub.pid());
    const auto self0 = SelfCpu();
    const auto m0 = MachineCpu();
    const auto t0 = Clock::now();
    sync.arrive_and_wait();
    for (auto& t : threads) t.join();
    const double wall = Ms(*std::max_element(ends.begin(), ends.end()) - t0);
    const auto hub1 = ProcessCpu(hub.pid());
    const auto self1 = SelfCpu();
    const auto m1 = MachineCpu();
    const Stats s1 = GetStats(hub.admin);
    Block b;
    b.hub_user = (hub1.first - hub0.first) / c.steps;
    b.hub_sys = (hub1.second - hub0.second) / c.steps;
    b.bench_user = (self1.first - self0.first) / c.steps;
    b.bench_sys = (self1.second - self0.second) / c.steps;
    b.machine_busy = (m1.busy - m0.busy) / c.steps;
    b.machine_idle = (m1.idle - m0.idle) / c.steps;
    b.machine_steal = (m1.steal - m0.steal) / c.steps;
    std::vector<double> step(c.steps, 0);
    for (uint32_t w = 0; w < o.workers; ++w) {
      for (int i = 0; i < c.steps; ++i) step[i] = std::max(step[i], lat[w][i]);
    }
    b.p50_ms = Median(step);
    b.mean_ms = wall / c.steps;
    b.lane_busy_s.resize(s1.lane_busy.size());
    for (size_t l = 0; l < s1.lane_busy.size(); ++l) {
      b.lane_busy_s[l] = s1.lane_busy[l] - s0.lane_busy[l];
    }
    const double per = static_cast<double>(c.steps) * o.workers;
    b.bytes_in = static_cast<double>(s1.bytes_in - s0.bytes_in) / per;
    b.bytes_out = static_cast<double>(s1.bytes_out - s0.bytes_out) / per;
    if (c.pool) {
      rc::KeyId key = *ranks[0]->client().FindKey(c.key);
      const uint64_t first_chunk = ranks[0]->client().GetKeyInfo(key)->first_chunk;
      b.distinct_by_lane.assign(lanes, 0);
      b.distinct = 0;
      // The block's timed steps used batch indices (counter + i) % pool,
      // counter = the steps done on this (key, batch) before them (every
      // worker keeps the same count).
      const uint64_t pool_size = c.pool->ids[0].size();
      const std::string ck = c.key + "/" + std::to_string(c.pool->batch);
      uint64_t& counter = counters[ck];  // (key/batch) -> steps done
      counter += static_cast<uint64_t>(warm);
      for (int i = 0; i < c.steps; ++i) {
        const auto& by_chunk = c.pool->distinct_by_chunk[(counter + i) % pool_size];
        for (size_t ch = 0; ch < by_chunk.size(); ++ch) {
          b.distinct_by_lane[(first_chunk + ch) % lanes] += by_chunk[ch];
          b.distinct += by_chunk[ch];
        }
      }
      counter += static_cast<uint64_t>(c.steps);
      b.distinct /= c.steps;
      for (double& d : b.distinct_by_lane) d /= c.steps;
      // The hottest row (Zipf rank 0) in the last replies: bit-identical.
      const uint64_t hot = RowOfRank(0, c.rows);
      std::vector<float> ref;
      for (uint32_t w = 0; w < o.workers; ++w) {
        std::vector<float> row = ranks[w]->RowInLastReply(hot);
        if (row.empty()) continue;
        if (ref.empty()) {
          ref = row;
        } else if (std::memcmp(ref.data(), row.data(), ref.size() * sizeof(float)) != 0) {
          ++mismatches;
          std::printf("MISMATCH: %s: row %" PRIu64 " differs between the workers' replies\n",
                      c.name.c_str(), hot);
        }
      }
    }
    for (uint32_t w = 0; w < o.workers; ++w) {
      rc::Client& cl = ranks[w]->client();
      if (cl.reconnects() != reconnects[w] || std::string(cl.transport()) != transports[w]) {
        std::printf("  WARNING: rank %u after %s: %" PRIu64 " reconnects so far (was %" PRIu64
                    "), transport %s (was %s)\n",
                    w, c.name.c_str(), cl.reconnects(), reconnects[w], cl.transport(),
                    transports[w].c_str());
        reconnects[w] = cl.reconnects();
        transports[w] = cl.transport();
        ++transport_changes;
      }
    }
    results[ci].push_back(b);
    std::printf("  %-34s p50 %9.3f ms  mean %9.3f ms  lanes busy", c.name.c_str(), b.p50_ms,
                b.mean_ms);
    for (double s : b.lane_busy_s) std::printf(" %5.1f%%", 100 * s / (wall / 1000));
    std::printf("  other processes %5.1f%% of a core\n",
                100 * std::max(0.0, b.machine_busy - b.hub_user - b.hub_sys - b.bench_user -
                                        b.bench_sys) / (b.mean_ms / 1000));
    std::fflush(stdout);
  };

  for (int round = 0; round < o.rounds; ++round) {
    std::printf("round %d\n", round);
    std::vector<size_t> order(configs.size());
    std::iota(order.begin(), order.end(), 0);
    if (round % 2) std::reverse(order.begin(), order.end());
    for (size_t ci : order) run_block(ci, round == 0);
    if (round == 0) {
      std::printf("  hub RSS %" PRIu64 " MiB\n", RssMiB(hub.pid()));
    }
  }
  const Stats end = GetStats(hub.admin);
  const uint64_t rss = RssMiB(hub.pid());

  // ---- report ----
  const double dense_mean = o.dense ? Median([&] {
    std::vector<double> v;
    for (const Block& b : results.back()) v.push_back(b.mean_ms);
    return v;
  }()) : NAN;
  std::printf("\n### Step time and hub rows/s (medians over %d rounds; %u workers, %u lanes)\n\n",
              o.rounds, o.workers, lanes);
  std::printf("| table | optimizer | draws/worker | distinct/worker | distinct/step | steps x "
              "rounds | step p50 | step mean | rows applied/s per lane | contributions/s per "
              "lane | lane CPU busy | rows per lane-CPU-s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const Config& c = configs[ci];
    if (!c.pool) continue;
    std::vector<double> p50, mean, rows_s, contrib_s, busy, per_cpu;
    for (const Block& b : results[ci]) {
      p50.push_back(b.p50_ms);
      mean.push_back(b.mean_ms);
      rows_s.push_back(b.distinct / lanes / (b.mean_ms / 1000));
      contrib_s.push_back(static_cast<double>(c.pool->batch) * o.workers / lanes /
                          (b.mean_ms / 1000));
      double cpu = 0;
      for (double s : b.lane_busy_s) cpu += s;
      busy.push_back(cpu / lanes / (b.mean_ms * c.steps / 1000));
      per_cpu.push_back(b.distinct * c.steps / cpu);
    }
    std::printf("| %s x %u | %s | %s | %.0f | %.0f | %d x %zu | %.2f ms | %.2f ms | %.3g | %.3g "
                "| %.0f %% | %.3g |\n",
                Count(c.rows).c_str(), o.dim, c.optimizer.c_str(), Count(c.pool->batch).c_str(),
                c.pool->distinct_per_worker, c.pool->distinct_union, c.steps, results[ci].size(),
                Median(p50), Median(mean), Median(rows_s), Median(contrib_s), 100 * Median(busy),
                Median(per_cpu));
  }
  std::printf("\n### Rows per lane (distinct rows applied per step, by lane, mean)\n\n"
              "| table | optimizer | draws/worker |");
  for (uint32_t l = 0; l < lanes; ++l) std::printf(" lane %u |", l);
  std::printf("\n|---|---|---|");
  for (uint32_t l = 0; l < lanes; ++l) std::printf("---|");
  std::printf("\n");
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const Config& c = configs[ci];
    if (!c.pool || c.optimizer != o.optimizers.front()) continue;
    std::printf("| %s x %u | %s | %s |", Count(c.rows).c_str(), o.dim, c.optimizer.c_str(),
                Count(c.pool->batch).c_str());
    for (uint32_t l = 0; l < lanes; ++l) {
      double sum = 0;
      for (const Block& b : results[ci]) sum += b.distinct_by_lane[l];
      std::printf(" %.0f |", sum / results[ci].size());
    }
    std::printf("\n");
  }
  std::printf("\n### Bytes on the wire per worker per step (request + reply)\n\n"
              "| table | draws/worker | computed | hub counters (in + out) | dense push_pull of "
              "the table | dense / sparse | sparse step vs measured dense step |\n"
              "|---|---|---|---|---|---|---|\n");
  std::map<std::pair<uint64_t, uint64_t>, bool> shown;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const Config& c = configs[ci];
    if (!c.pool || shown[{c.rows, c.pool->batch}]) continue;
    shown[{c.rows, c.pool->batch}] = true;
    const uint64_t chunks = std::min<uint64_t>(lanes, c.rows);
    const double row_bytes = 4.0 * o.dim;
    const double b = static_cast<double>(c.pool->batch);
    const double req = chunks * (kHeader + kPrefix) + b * (8 + 8 + row_bytes);
    const double rep = chunks * (kHeader + kPrefix) + b * row_bytes;
    std::vector<double> measured;
    for (const Block& bl : results[ci]) measured.push_back(bl.bytes_in + bl.bytes_out);
    const double dense = 2.0 * c.rows * o.dim * 4;
    std::vector<double> mean;
    for (const Block& bl : results[ci]) mean.push_back(bl.mean_ms);
    std::string vs = "-";
    if (o.dense && c.rows == o.dense_rows) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "1 : %.0f", dense_mean / Median(mean));
      vs = buf;
    } else if (o.dense) {  // dense time scaled by bytes from the measured one: an estimate
      char buf[96];
      std::snprintf(buf, sizeof buf, "~1 : %.0f (dense estimated)",
                    dense_mean * static_cast<double>(c.rows) / o.dense_rows / Median(mean));
      vs = buf;
    }
    std::printf("| %s x %u | %s | %s (%s + %s) | %s | %s | %.0f | %s |\n", Count(c.rows).c_str(),
                o.dim, Count(c.pool->batch).c_str(), Bytes(req + rep).c_str(), Bytes(req).c_str(),
                Bytes(rep).c_str(), Bytes(Median(measured)).c_str(), Bytes(dense).c_str(),
                dense / (req + rep), vs.c_str());
  }
  if (o.dense) {
    const size_t ci = configs.size() - 1;
    std::vector<double> p50, mean, measured;
    for (const Block& b : results[ci]) {
      p50.push_back(b.p50_ms);
      mean.push_back(b.mean_ms);
      measured.push_back(b.bytes_in + b.bytes_out);
    }
    const double bytes = 2.0 * o.dense_rows * o.dim * 4;
    std::printf("\n### Dense baseline: %s (%s fp32, SGD)\n\n"
                "| steps x rounds | step p50 | step mean | bytes/worker/step computed | hub "
                "counters | GB/s per worker |\n|---|---|---|---|---|---|\n"
                "| %d x %zu | %.1f ms | %.1f ms | %s | %s | %.2f |\n",
                configs[ci].name.c_str(), Bytes(bytes / 2).c_str(), configs[ci].steps,
                results[ci].size(), Median(p50), Median(mean), Bytes(bytes).c_str(),
                Bytes(Median(measured)).c_str(), bytes / 2 / (Median(mean) / 1000) / 1e9);
    for (uint64_t rows : o.rows) {
      if (rows != o.dense_rows) {
        std::printf("(%s x %u dense: not run, %s each way per worker per step)\n",
                    Count(rows).c_str(), o.dim, Bytes(4.0 * rows * o.dim).c_str());
      }
    }
  }
  std::printf("\n### CPU per step (ms; medians over rounds; %u cores = %.0f ms of CPU per ms "
              "of wall)\n\n| configuration | step mean | hub lanes | hub user | hub sys | "
              "workers + clients user | workers + clients sys | other processes | steal | idle |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n",
              std::thread::hardware_concurrency(),
              static_cast<double>(std::thread::hardware_concurrency()));
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    std::vector<double> mean, lane, hu, hs, bu, bs, other, steal, idle;
    for (const Block& b : results[ci]) {
      mean.push_back(b.mean_ms);
      double l = 0;
      for (double x : b.lane_busy_s) l += x;
      lane.push_back(1000 * l / configs[ci].steps);
      hu.push_back(1000 * b.hub_user);
      hs.push_back(1000 * b.hub_sys);
      bu.push_back(1000 * b.bench_user);
      bs.push_back(1000 * b.bench_sys);
      other.push_back(std::max(0.0, 1000 * (b.machine_busy - b.hub_user - b.hub_sys -
                                            b.bench_user - b.bench_sys)));
      steal.push_back(1000 * b.machine_steal);
      idle.push_back(1000 * b.machine_idle);
    }
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                configs[ci].name.c_str(), Median(mean), Median(lane), Median(hu), Median(hs),
                Median(bu), Median(bs), Median(other), Median(steal), Median(idle));
  }
  std::printf("\nper-round step medians (ms):\n");
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    std::printf("  %-34s", configs[ci].name.c_str());
    for (const Block& b : results[ci]) std::printf(" %9.3f", b.p50_ms);
    std::printf("\n");
  }
  std::printf("\nhub: RSS %" PRIu64 " MiB at the end; tenant memory reserved %s, allocated %s; "
              "tenant errors %" PRIu64 "\n",
              rss, Bytes(static_cast<double>(end.memory)).c_str(),
              Bytes(static_cast<double>(end.allocated)).c_str(), end.errors);
  std::printf("checks: every call succeeded; reply rows finite; hottest row identical across "
              "workers: %s\n",
              mismatches ? ("NO (" + std::to_string(mismatches) + " mismatches)").c_str() : "yes");
  if (transport_changes) {
    std::printf("WARNING: %" PRIu64 " reconnects / transport changes during the run (above)\n",
                transport_changes);
  }
  std::printf("load average at the end: %s\n", LoadAverage().c_str());
  std::printf("total %.0f s\n", Ms(Clock::now() - bench_t0) / 1000);
  for (auto& r : ranks) r->client().Close();
  hub.Stop(SIGKILL);
  if (!o.keep_dir) fs::remove_all(o.dir);
  return mismatches ? 1 : 0;
}
