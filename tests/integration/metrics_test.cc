// Operating a hub (issue: an operable service) against a real rackhubd:
// /metrics read directly and scraped by Debian's real Prometheus server,
// whose HTTP API must report the tenant's iteration rate; metrics beyond
// loopback need the admin token; `rackhubctl top --once --json` and
// `rackhubctl stalls` name a deliberately late rank; straggler errors name
// the key and the missing rank.
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <regex>
#include <thread>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "http_get.h"
#include "raw_hub_test.h"

namespace rackhub::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kPrometheus = "/usr/bin/prometheus";

// The value of the first sample of `name` whose labels contain `labels`
// ("" matches any), or -1.
double Sample(const std::string& text, const std::string& name, const std::string& labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const auto rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;  // a longer name
    if (!labels.empty() && rest.find(labels) == std::string::npos) continue;
    return std::stod(rest.substr(rest.rfind(' ') + 1));
  }
  return -1;
}

// Trains tenant `name` (2 workers, one 1024-float chunk, one lane) until
// `stop`: rank 1 pushes `late` after rank 0 every iteration. Counts
// iterations into *done; stops early on a wrong reply (a test failure).
void TrainWithLateRank(const std::string& data, const std::string& name,
                       const std::string& token, uint32_t key_id, std::chrono::milliseconds late,
                       const std::atomic<bool>& stop, std::atomic<int>* done) {
  Worker r0(data), r1(data);
  r0.Hello(name, token, 0, 0);
  r1.Hello(name, token, 1, 0);
  for (uint64_t it = 0; !stop.load(); ++it) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = r0.handle();
    h.key = key_id;
    h.dtype = net::DType::kFp32;
    h.iteration = it;
    r0.Send(h, Floats(std::vector<float>(1024, 1.0f)));
    std::this_thread::sleep_for(late);
    r1.Send(h, Floats(std::vector<float>(1024, 2.0f)));
    for (Worker* w : {&r0, &r1}) {
      const auto f = w->Receive();
      if (!f || f->h.opcode != Opcode::kParams || f->h.iteration != it + 1) {
        ADD_FAILURE() << "iteration " << it << ": " << Describe(f);
        return;
      }
    }
    ++*done;
  }
  for (Worker* w : {&r0, &r1}) {
    FrameHeader bye;
    bye.opcode = Opcode::kBye;
    bye.tenant = w->handle();
    w->Send(bye);
  }
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// Prometheus' own web port (it cannot report a port 0): reserved, outside the
// kernel's ephemeral range (tests/support/etcd_cluster.h).
int FreeTcpPort() { return FreeLoopbackPort(); }

class MetricsTest : public RawHubTest {};

TEST_F(MetricsTest, ScrapeShowsCountersHistogramsAndLanes) {
  Start({"--lanes", "1", "--no-pin-lanes"});
  ASSERT_FALSE(hub_->metrics_address().empty()) << "the ready file names the metrics address";
  const std::string token = CreateTenant("t", 2, 4096);
  const pb::Key key = CreateKey("t", "w", 1024);
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  std::thread train([&] {
    TrainWithLateRank(hub_->data_address(), "t", token, key.id(), 20ms, stop, &done);
  });
  while (done.load() < 5) std::this_thread::sleep_for(10ms);
  stop = true;
  train.join();

  // The lanes handle the BYEs asynchronously: scrape until both workers are
  // gone (at most 10 s), then every figure below is final.
  HttpResponse r;
  for (int i = 0; i < 200; ++i) {
    r = HttpGet(hub_->metrics_address(), "/metrics");
    if (r.status == 200 && Sample(r.body, "rackhub_workers_connected", "tenant=\"t\"") == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(r.status, 200) << r.headers;
  const std::string& m = r.body;
  EXPECT_GE(Sample(m, "rackhub_iterations_total", "tenant=\"t\""), 5) << m;
  EXPECT_GE(Sample(m, "rackhub_pushes_total", "tenant=\"t\""), 10) << m;
  EXPECT_GE(Sample(m, "rackhub_received_bytes_total", "tenant=\"t\""), 10 * (4096 + 40)) << m;
  EXPECT_GT(Sample(m, "rackhub_sent_bytes_total", "tenant=\"t\""), 0) << m;
  EXPECT_EQ(Sample(m, "rackhub_workers_connected", "tenant=\"t\""), 0) << "both said BYE\n" << m;
  EXPECT_EQ(Sample(m, "rackhub_workers_lost_total", "tenant=\"t\""), 0) << m;
  EXPECT_EQ(Sample(m, "rackhub_update_latency_seconds_count", "tenant=\"t\""),
            Sample(m, "rackhub_iterations_total", "tenant=\"t\""))
      << "one chunk: one update per iteration\n" << m;
  // Rank 1 pushed 20 ms after rank 0 every time: its lateness is about
  // 20 ms (a lane descheduled when rank 0's push arrived could shorten one
  // by a few ms on a loaded machine: at most one may fall below 8 ms),
  // rank 0's is 0.
  const std::string r1 = "tenant=\"t\",rack=\"0\",rank=\"1\"";
  const double late_count = Sample(m, "rackhub_rank_lateness_seconds_count", r1);
  EXPECT_GE(late_count, 5) << m;
  EXPECT_LE(Sample(m, "rackhub_rank_lateness_seconds_bucket", r1 + ",le=\"0.008192\""), 1) << m;
  EXPECT_GE(Sample(m, "rackhub_rank_lateness_seconds_bucket", r1 + ",le=\"+Inf\""), late_count)
      << m;
  EXPECT_GE(Sample(m, "rackhub_rank_lateness_seconds_sum", r1), late_count * 0.015) << m;
  EXPECT_GE(Sample(m, "rackhub_rank_lateness_seconds_bucket",
                   "tenant=\"t\",rack=\"0\",rank=\"0\",le=\"1.6e-05\""),
            5)
      << m;
  EXPECT_GE(Sample(m, "rackhub_lane_busy_seconds_total", "lane=\"0\""), 0) << m;
  EXPECT_EQ(Sample(m, "rackhub_build_info", ""), 1) << m;
  EXPECT_GT(Sample(m, "rackhub_tenant_memory_bytes", "tenant=\"t\""), 4096) << m;

  // An ERROR is counted by code: a push of a stale iteration.
  Worker w(hub_->data_address());
  w.Hello("t", token, 0, 0);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = w.handle();
  h.key = key.id();
  h.dtype = net::DType::kFp32;
  h.iteration = 0;
  w.Send(h, Floats(std::vector<float>(1024, 1.0f)));
  const auto e = w.Receive();
  ASSERT_TRUE(e && e->h.opcode == Opcode::kError) << Describe(e);
  EXPECT_NE(Describe(e).find("BAD_ITERATION"), std::string::npos) << Describe(e);
  const std::string after = HttpGet(hub_->metrics_address(), "/metrics").body;
  EXPECT_EQ(Sample(after, "rackhub_errors_total", "tenant=\"t\",code=\"BAD_ITERATION\""), 1)
      << after;
}

// Debian's Prometheus scrapes the hub while rackhub-bench trains through it
// (each run a new tenant "bench-PID", every iteration verified bit for bit);
// its HTTP API answers a query for the bench tenant's iteration rate with a
// positive rate.
TEST_F(MetricsTest, RealPrometheusReportsTheIterationRate) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " is not installed (deploy/bootstrap.sh installs it)";
  }
  Start({"--lanes", "1", "--no-pin-lanes"});
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};  // bench runs that passed
  std::string bench_failure;
  std::thread train([&] {
    while (!stop.load()) {
      const CommandResult r = RunCommand(
          {BinPath("rackhub-bench"), "--hub", hub_->data_address(), "--admin",
           hub_->admin_address(), "--workers", "2", "--bytes", "1MiB", "--keys", "1",
           "--iterations", "300", "--warmup", "0"},
          "", 120s);
      if (r.exit_code != 0) {
        bench_failure = r.out + r.err;
        return;
      }
      ++done;
    }
  });

  const std::string dir = MakeTempDir();
  WriteFile(dir + "/prometheus.yml",
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: rackhub\n    static_configs:\n"
            "      - targets: ['" + hub_->metrics_address() + "']\n");
  // A free port can be taken before Prometheus binds it (the bench's own
  // connections use ephemeral ports): Prometheus then exits; try another.
  std::string web;
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; ++attempt) {
    web = "127.0.0.1:" + std::to_string(FreeTcpPort());
    pid = fork();
    if (pid == 0) {
      const int fd = open((dir + "/prometheus.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string config = "--config.file=" + dir + "/prometheus.yml";
      const std::string storage = "--storage.tsdb.path=" + dir + "/data";
      const std::string listen = "--web.listen-address=" + web;
      execl(kPrometheus, kPrometheus, config.c_str(), storage.c_str(), listen.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 30 && pid > 0; ++i) {  // 3 s: listening, or gone
      std::this_thread::sleep_for(100ms);
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) pid = -1;
      else if (HttpGet(web, "/-/ready").status == 200) break;
    }
  }
  ASSERT_GT(pid, 0);
  double rate = -1;
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  while (std::chrono::steady_clock::now() < deadline && rate <= 0) {
    std::this_thread::sleep_for(500ms);
    const HttpResponse q =
        HttpGet(web, "/api/v1/query?query=" +
                         UrlEncode("sum(rate(rackhub_iterations_total{tenant=~\"bench-.*\"}[10s]))"));
    last = std::to_string(q.status) + " " + q.body;
    static const std::regex value(R"re("value":\[[0-9.e+]+,"([0-9.e+-]+)"\])re");
    std::smatch match;
    if (q.status == 200 && std::regex_search(q.body, match, value)) rate = std::stod(match[1]);
  }
  // Every query of the Grafana dashboard (deploy/) is valid PromQL that
  // Prometheus evaluates against these metrics.
  const std::string dashboard = ReadFile(std::string(RACKHUB_SOURCE_DIR) + "/deploy/grafana-rackhub.json");
  static const std::regex expr_re(R"re("expr": "((?:[^"\\]|\\.)*)")re");
  int queries = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), expr_re);
       it != std::sregex_iterator(); ++it) {
    std::string expr = std::regex_replace((*it)[1].str(), std::regex(R"(\\")"), "\"");
    expr = std::regex_replace(expr, std::regex(R"(\$tenant)"), ".*");
    const HttpResponse q = HttpGet(web, "/api/v1/query?query=" + UrlEncode(expr));
    EXPECT_EQ(q.status, 200) << expr << "\n" << q.body;
    EXPECT_NE(q.body.find("\"status\":\"success\""), std::string::npos) << expr << "\n" << q.body;
    ++queries;
  }
  EXPECT_GE(queries, 10) << "the dashboard's queries were found";
  stop = true;
  train.join();
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  // Positive, not above some floor: how many iterations a second the bench
  // makes depends on the machine and its load (a floor of 1/s failed under
  // tests/stress.sh with 0.12/s), which is the benchmarks' business.
  EXPECT_GT(rate, 0.0) << "Prometheus's answer: " << last << "\nits log:\n"
                       << ReadFile(dir + "/prometheus.log");
  EXPECT_GE(done.load(), 1) << "rackhub-bench runs that passed";
  EXPECT_EQ(bench_failure, "") << "rackhub-bench failed";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Beyond loopback /metrics needs the admin (or read-only) token as the basic
// auth password; without a token the daemon refuses to start.
TEST(MetricsAuthTest, BeyondLoopbackScrapesAuthenticate) {
  auto refused = RunCommand({BinPath("rackhubd"), "--in-memory", "--admin-listen", "127.0.0.1:0",
                             "--data-listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"},
                            "", 10s);
  EXPECT_EQ(refused.exit_code, 78) << refused.err;
  EXPECT_NE(refused.err.find("metrics.listen: refusing to serve /metrics on 0.0.0.0:0 beyond "
                             "loopback without authentication"),
            std::string::npos)
      << refused.err;

  const std::string dir = MakeTempDir();
  WriteFile(dir + "/admin.token", "s3cret-admin\n");
  WriteFile(dir + "/ro.token", "s3cret-ro\n");
  DaemonProcess hub({"--in-memory", "--metrics-listen", "0.0.0.0:0", "--admin-token-file",
                     dir + "/admin.token", "--admin-readonly-token-file", dir + "/ro.token"});
  ASSERT_TRUE(hub.started());
  const std::string port = hub.metrics_address().substr(hub.metrics_address().rfind(':'));
  const std::string at = "127.0.0.1" + port;
  EXPECT_EQ(HttpGet(at, "/metrics").status, 401);
  EXPECT_EQ(HttpGet(at, "/metrics", "prometheus:wrong").status, 401);
  EXPECT_EQ(HttpGet(at, "/metrics", "prometheus:s3cret-admi").status, 401);
  const HttpResponse ok = HttpGet(at, "/metrics", "prometheus:s3cret-admin");
  EXPECT_EQ(ok.status, 200);
  EXPECT_NE(ok.body.find("rackhub_build_info"), std::string::npos);
  EXPECT_EQ(HttpGet(at, "/metrics", "anyone:s3cret-ro").status, 200);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(MetricsAuthTest, BusyMetricsPortFailsStartup) {
  DaemonProcess first({"--in-memory"});
  ASSERT_TRUE(first.started());
  auto r = RunCommand({BinPath("rackhubd"), "--in-memory", "--admin-listen", "127.0.0.1:0",
                       "--data-listen", "127.0.0.1:0", "--metrics-listen",
                       first.metrics_address()},
                      "", 10s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("metrics.listen: cannot listen on " + first.metrics_address()),
            std::string::npos)
      << r.err;
}

// A rank that pushes late every step is named by `top --once --json`; one
// that stops pushing is listed by `stalls` as missing, and the straggler
// error names the key and the rank.
TEST_F(MetricsTest, TopAndStallsNameTheLateRank) {
  Start({"--lanes", "1", "--no-pin-lanes", "--straggler-timeout-ms", "4000"});
  const std::string token = CreateTenant("slow", 2, 4096);
  const pb::Key key = CreateKey("slow", "w", 1024);
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  std::thread train([&] {
    TrainWithLateRank(hub_->data_address(), "slow", token, key.id(), 30ms, stop, &done);
  });
  while (done.load() < 3) std::this_thread::sleep_for(10ms);
  const CommandResult top =
      RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(), "--json", "top",
                  "--once", "--interval", "1"});
  stop = true;
  train.join();
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_NE(top.out.find("\"name\": \"slow\""), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("\"slowest_rank\": {\"rack\": 0, \"rank\": 1,"), std::string::npos)
      << top.out;
  EXPECT_NE(top.out.find("\"lanes\": [{\"lane\": 0"), std::string::npos) << top.out;
  const std::regex rate(R"re("iterations_per_second": ([0-9.e+]+))re");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(top.out, match, rate)) << top.out;
  EXPECT_GT(std::stod(match[1]), 5.0) << "about 30 iterations/s with a 30 ms late rank";

  // Rank 0 pushes the next iteration; rank 1 stays connected and silent.
  Worker r0(hub_->data_address()), r1(hub_->data_address());
  r0.Hello("slow", token, 0, 0);
  r1.Hello("slow", token, 1, 0);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = r0.handle();
  h.key = key.id();
  h.dtype = net::DType::kFp32;
  h.iteration = static_cast<uint64_t>(done.load());
  r0.Send(h, Floats(std::vector<float>(1024, 1.0f)));
  std::this_thread::sleep_for(600ms);
  const CommandResult stalls =
      RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(), "stalls", "slow",
                  "--min-wait", "0.5"});
  ASSERT_EQ(stalls.exit_code, 0) << stalls.err;
  EXPECT_NE(stalls.out.find("MISSING"), std::string::npos) << stalls.out;
  const std::regex row("slow +w +0 +" + std::to_string(done.load() + 1) +
                       " +0 +0 +[0-9.]+ s +0 +1\\n");
  EXPECT_TRUE(std::regex_search(stalls.out, row)) << stalls.out;
  const CommandResult json = RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(),
                                         "--json", "stalls", "--min-wait", "0.5"});
  EXPECT_TRUE(std::regex_search(json.out, std::regex(R"re("missing_ranks": \[\s*1\s*\])re")))
      << json.out;
  const CommandResult none =
      RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(), "stalls", "slow",
                  "--min-wait", "30"});
  EXPECT_NE(none.out.find("no update has waited 30000 ms or longer"), std::string::npos)
      << none.out;

  // The straggler timeout (4 s) fails rank 0's push naming rank 1 and the key.
  const auto err = r0.Receive(6s);
  ASSERT_TRUE(err && err->h.opcode == Opcode::kError) << Describe(err);
  EXPECT_NE(err->payload.find("straggler: rank(s) 1 did not push within 4000 ms "
                              "(data.straggler_timeout_ms) to key 'w' chunk 0"),
            std::string::npos)
      << err->payload;
  EXPECT_EQ(Stats("slow").stragglers(), 1u);
}

}  // namespace
}  // namespace rackhub::testing
