// One control plane for many hubs (docs/cluster.md), with a real etcd on
// loopback and real rackhubd processes: the registry lives in etcd
// (registry.backend = "etcd") and the hubs find each other there
// (topology.racks_from = "etcd").
//   - etcd unreachable at start-up: a clear error, the hub does not start;
//   - one `rackhubctl tenant create` on one hub of three makes the tenant
//     usable on all; workers of every rack declaring keys in different
//     orders get one layout, and train bit-identically to one flat hub;
//   - concurrent creates through two hubs: compare-and-swap gives every key
//     its own chunks and exactly one of two equal creates wins;
//   - etcd lost while training: admin mutations are refused with a clear
//     UNAVAILABLE, training goes on, mutations work again when etcd is back;
//   - 3 etcd members: one stopped changes nothing, two stopped refuse
//     mutations while the data plane keeps training;
//   - a hub that stops answering loses its lease: the other hub fails its
//     pending work naming the rack, and takes it back when it returns;
//   - two hubs claiming one rack, or racks that never come: clear errors.
#include <signal.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "raw_client.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::BinPath;
using testing::ChildProcess;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::EtcdCluster;
using testing::FreeLoopbackPort;
using testing::MakeTempDir;
using testing::RawClient;
using testing::ReadFile;
using testing::RunCommand;
using testing::WriteFile;
using namespace std::chrono_literals;

std::string Describe(const CommandResult& r) {
  return "exit=" + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "--- stderr:\n" +
         r.err;
}

CommandResult Ctl(const std::string& admin, std::vector<std::string> args) {
  args.insert(args.begin(), {BinPath("rackhubctl"), "--admin", admin});
  return RunCommand(args, "", 30s);
}

// The value of the first "label: value" line.
std::string Field(const std::string& out, const std::string& label) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(label + ":");
    if (at != std::string::npos) {
      std::string v = line.substr(at + label.size() + 1);
      v.erase(0, v.find_first_not_of(' '));
      return v;
    }
  }
  return "";
}

// The hubs of one cluster: rack i's hub registers itself in etcd and waits
// for the others; all are started first, then waited for.
class Cluster {
 public:
  Cluster(const std::string& endpoints, int racks, std::vector<std::string> extra = {},
          bool wait = true)
      : endpoints_(endpoints), racks_(racks) {
    prefix_ = "/rackhub-test-" + std::to_string(getpid()) + "-" +
              std::to_string(FreeLoopbackPort()) + "/";
    secret_ = MakeTempDir() + "/hub.secret";
    WriteFile(secret_, std::string(48, 's') + "\n");
    extra_ = std::move(extra);
    for (int r = 0; r < racks; ++r) interhub_.push_back(FreeLoopbackPort());
    for (int r = 0; r < racks; ++r) {
      hubs_.push_back(std::make_unique<DaemonProcess>(Args(r), false));
    }
    if (wait) {
      for (auto& h : hubs_) h->WaitReady();
    }
  }
  std::vector<std::string> Args(int rack) const {
    std::vector<std::string> a = {"--in-memory",       "--lanes",         "1",
                                  "--registry",        "etcd",            "--etcd-endpoints",
                                  endpoints_,          "--etcd-prefix",   prefix_,
                                  "--etcd-timeout-ms", "1500",            "--lease-ttl-s",
                                  "2",                 "--racks-from",    "etcd",
                                  "--rack-count",      std::to_string(racks_), "--rack",
                                  std::to_string(rack), "--interhub",
                                  "127.0.0.1:" + std::to_string(interhub_[rack]),
                                  "--hub-secret-file", secret_,
                                  "--straggler-timeout-ms", "20000"};
    a.insert(a.end(), extra_.begin(), extra_.end());
    return a;
  }
  DaemonProcess& hub(int r) { return *hubs_[r]; }
  bool started() const {
    return std::all_of(hubs_.begin(), hubs_.end(), [](const auto& h) { return h->started(); });
  }
  const std::string& prefix() const { return prefix_; }
  const std::string& secret() const { return secret_; }
  uint16_t interhub_port(int rack) const { return interhub_[rack]; }

 private:
  std::string endpoints_;
  int racks_;
  std::string prefix_, secret_;
  std::vector<std::string> extra_;
  std::vector<uint16_t> interhub_;
  std::vector<std::unique_ptr<DaemonProcess>> hubs_;
};

// A training worker process (rackhub-test-worker): declares `keys` in
// order, runs `iterations` of PushPull and writes the parameters after each.
struct Worker {
  Worker(const std::string& hub, const std::string& token, uint32_t rack, uint32_t rank,
         const std::vector<std::string>& keys, int iterations, int sleep_max_ms = 0) {
    out = MakeTempDir() + "/worker.out";
    std::vector<std::string> argv = {BinPath("rackhub-test-worker"), "--hub", hub, "--tenant",
                                     "job", "--token", token, "--rank", std::to_string(rank),
                                     "--rack", std::to_string(rack), "--out", out, "--iterations",
                                     std::to_string(iterations), "--dump-all",
                                     "--sleep-max-ms", std::to_string(sleep_max_ms)};
    for (const auto& k : keys) argv.insert(argv.end(), {"--key", k});
    process = std::make_unique<ChildProcess>(argv, out + ".log");
  }
  int Wait() { return process->Wait(120s); }
  // "iter K NAME" -> "HEX..." for every iteration, "init NAME" -> "HEX..."
  // for the initial values of each from_client key.
  std::map<std::string, std::string> Iterations() const {
    std::map<std::string, std::string> m;
    std::istringstream in(ReadFile(out));
    for (std::string line; std::getline(in, line);) {
      std::istringstream l(line);
      std::string what, k, name;
      l >> what >> k >> name;
      std::string rest;
      if (what == "init") {  // "init NAME HEX...": a from_client key's values
        std::getline(l, rest);
        m["init " + k] = name + rest;
        continue;
      }
      if (what != "iter") continue;
      std::getline(l, rest);
      m["iter " + k + " " + name] = rest;
    }
    return m;
  }

  std::string Text() const { return ReadFile(out) + ReadFile(out + ".log"); }
  std::string out;
  std::unique_ptr<ChildProcess> process;
};

std::unique_ptr<pb::KeyService::Stub> Keys(const std::string& admin) {
  return pb::KeyService::NewStub(grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
}

// (name -> "id first_chunk chunk_count") of a tenant's keys on one hub.
std::map<std::string, std::string> Layout(const std::string& admin, const std::string& tenant) {
  grpc::ClientContext ctx;
  pb::ListKeysRequest req;
  req.set_tenant(tenant);
  pb::ListKeysResponse resp;
  EXPECT_TRUE(Keys(admin)->ListKeys(&ctx, req, &resp).ok());
  std::map<std::string, std::string> m;
  for (const auto& k : resp.keys()) {
    m[k.name()] = std::to_string(k.id()) + " " + std::to_string(k.first_chunk()) + " " +
                  std::to_string(k.chunk_count());
  }
  return m;
}

// Creates tenant "job" through rackhubctl on `admin`; returns its token.
std::string CreateJob(const std::string& admin, int workers) {
  const CommandResult r =
      Ctl(admin, {"tenant", "create", "job", "--workers", std::to_string(workers),
                  "--chunk-bytes", "4096", "--optimizer", "momentum", "--lr", "0.1",
                  "--momentum", "0.9"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  const std::string token = Field(r.out, "data-plane token");
  EXPECT_FALSE(token.empty()) << r.out;
  return token;
}

TEST(ClusterTest, EtcdUnreachableAtStartIsAClearError) {
  const std::string etcd = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = RunCommand(
      {BinPath("rackhubd"), "--in-memory", "--admin-listen", "127.0.0.1:0", "--data-listen",
       "127.0.0.1:0", "--no-metrics", "--registry", "etcd", "--etcd-endpoints", etcd,
       "--etcd-timeout-ms", "500"},
      "", 30s);
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  const std::string log = r.out + r.err;
  EXPECT_NE(log.find("registry.etcd"), std::string::npos) << log;
  EXPECT_NE(log.find(etcd), std::string::npos) << "the message names the endpoint:\n" << log;
  // And the configuration is checked before anything is reached.
  const CommandResult bad = RunCommand({BinPath("rackhubd"), "--check-config", "--in-memory",
                                        "--registry", "etcd"});
  EXPECT_EQ(bad.exit_code, 78) << Describe(bad);
  EXPECT_NE((bad.out + bad.err).find("registry.etcd_endpoints: required"), std::string::npos)
      << Describe(bad);
}

TEST(ClusterTest, OneCreateServesEveryHubAndKeysGetOneLayoutAndTheSameBits) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 3);
  ASSERT_TRUE(cluster.started());
  // One create, on the hub of rack 1.
  const std::string token = CreateJob(cluster.hub(1).admin_address(), 2);
  for (int r : {0, 2}) {
    const CommandResult g = Ctl(cluster.hub(r).admin_address(), {"tenant", "get", "job"});
    EXPECT_EQ(g.exit_code, 0) << "rack " << r << ": " << Describe(g);
    EXPECT_EQ(Field(g.out, "workers per rack"), "2") << g.out;
  }
  // Each rack's workers declare the keys in another order, all at once.
  // p and q start from rank 0 of rack 0's values (from_client): every hub
  // gets them through the chunks' homes.
  const std::vector<std::vector<std::string>> orders = {
      {"a,3000,fp32,zeros", "p,4100,fp32,client", "b,5000,fp32,zeros", "c,700,fp32,zeros",
       "i,2500,fp16,zeros", "q,3300,fp16,client"},
      {"c,700,fp32,zeros", "q,3300,fp16,client", "i,2500,fp16,zeros", "b,5000,fp32,zeros",
       "a,3000,fp32,zeros", "p,4100,fp32,client"},
      {"q,3300,fp16,client", "i,2500,fp16,zeros", "b,5000,fp32,zeros", "p,4100,fp32,client",
       "c,700,fp32,zeros", "a,3000,fp32,zeros"}};
  constexpr int kIterations = 5;
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t rack = 0; rack < 3; ++rack) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      workers.push_back(std::make_unique<Worker>(cluster.hub(rack).data_address(), token, rack,
                                                 rank, orders[rack], kIterations));
    }
  }
  bool all_done = true;
  for (auto& w : workers) {
    const int code = w->Wait();
    EXPECT_EQ(code, 0) << w->Text().substr(0, 2000);
    all_done = all_done && code == 0;
  }
  ASSERT_TRUE(all_done) << cluster.hub(0).Log() << cluster.hub(1).Log() << cluster.hub(2).Log();
  // One layout on every hub.
  const auto layout = Layout(cluster.hub(0).admin_address(), "job");
  EXPECT_EQ(layout.size(), 6u);
  for (int r : {1, 2}) EXPECT_EQ(Layout(cluster.hub(r).admin_address(), "job"), layout);
  std::set<uint64_t> chunks;
  for (const auto& [name, l] : layout) {
    std::istringstream in(l);
    uint64_t id, first, count;
    in >> id >> first >> count;
    for (uint64_t c = first; c < first + count; ++c) {
      EXPECT_TRUE(chunks.insert(c).second) << "chunk " << c << " given twice";
    }
  }
  // Every worker saw the same parameters at every iteration...
  const auto seen = workers[0]->Iterations();
  EXPECT_EQ(seen.size(), 6u * kIterations + 2);
  ASSERT_EQ(seen.count("init p"), 1u);
  ASSERT_EQ(seen.count("init q"), 1u);
  // The values rank 0 of rack 0 supplied (rackhub-test-worker's
  // InitialValue(i)): exact for the fp32 key, fp16-rounded for q.
  for (const char* k : {"init p", "init q"}) {
    std::istringstream in(seen.at(k));
    uint32_t bits = 0;
    uint64_t i = 0;
    for (; in >> std::hex >> bits; ++i) {
      float v;
      std::memcpy(&v, &bits, 4);
      const float want = static_cast<float>(static_cast<int64_t>(i % 17) - 8) * 0.125f +
                         0.003f * static_cast<float>(i % 5);
      if (k[5] == 'p') {
        ASSERT_EQ(v, want) << k << " element " << i;
      } else {
        ASSERT_NEAR(v, want, 1e-3) << k << " element " << i;
      }
    }
    EXPECT_EQ(i, k[5] == 'p' ? 4100u : 3300u) << k;
  }
  for (auto& w : workers) EXPECT_EQ(w->Iterations(), seen);

  // ... and the same as one flat hub serving all three racks (no etcd).
  const std::string racks = "127.0.0.1:0=127.0.0.1:" + std::to_string(FreeLoopbackPort()) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(FreeLoopbackPort()) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(FreeLoopbackPort());
  DaemonProcess flat({"--in-memory", "--lanes", "1", "--racks", racks, "--rack", "0",
                      "--topology-mode", "flat", "--hub-secret-file", cluster.secret()});
  ASSERT_TRUE(flat.started());
  const std::string flat_token = CreateJob(flat.admin_address(), 2);
  std::vector<std::unique_ptr<Worker>> reference;
  for (uint32_t rack = 0; rack < 3; ++rack) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      reference.push_back(std::make_unique<Worker>(flat.data_address(), flat_token, rack, rank,
                                                   orders[0], kIterations));
    }
  }
  for (auto& w : reference) ASSERT_EQ(w->Wait(), 0) << w->Text();
  EXPECT_EQ(reference[0]->Iterations(), seen)
      << "three hubs through etcd and one flat hub must give the same bits";
}

TEST(ClusterTest, ConcurrentCreatesThroughTwoHubsNeverShareChunks) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  // Two equal tenant creates at once: exactly one wins.
  std::vector<CommandResult> results(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        results[r] = Ctl(cluster.hub(r).admin_address(),
                         {"tenant", "create", "job", "--workers", "1", "--chunk-bytes", "4096"});
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_EQ((results[0].exit_code == 0) + (results[1].exit_code == 0), 1)
      << Describe(results[0]) << Describe(results[1]);
  for (const auto& r : results) {
    if (r.exit_code != 0) {
      EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
    }
  }
  // 2 x 12 key creates at once, half of them the same names on both hubs.
  std::vector<grpc::Status> statuses(24);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 24; ++i) {
      threads.emplace_back([&, i] {
        const int hub = i % 2;
        grpc::ClientContext ctx;
        pb::CreateKeyRequest req;
        req.set_tenant("job");
        req.set_name(i < 12 ? "shared" + std::to_string(i / 2) : "own" + std::to_string(i));
        req.set_elements(1000 + 1000 * (i % 5));
        pb::Key k;
        statuses[i] = Keys(cluster.hub(hub).admin_address())->CreateKey(&ctx, req, &k);
      });
    }
    for (auto& t : threads) t.join();
  }
  int created = 0, existed = 0;
  for (const auto& s : statuses) {
    if (s.ok()) {
      ++created;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
      ++existed;
    }
  }
  EXPECT_EQ(created, 18);
  EXPECT_EQ(existed, 6);
  const auto layout = Layout(cluster.hub(0).admin_address(), "job");
  EXPECT_EQ(layout.size(), 18u);
  EXPECT_EQ(Layout(cluster.hub(1).admin_address(), "job"), layout);
  std::set<uint64_t> chunks, ids;
  for (const auto& [name, l] : layout) {
    std::istringstream in(l);
    uint64_t id, first, count;
    in >> id >> first >> count;
    EXPECT_TRUE(ids.insert(id).second) << "id " << id << " given twice";
    for (uint64_t c = first; c < first + count; ++c) {
      EXPECT_TRUE(chunks.insert(c).second) << "chunk " << c << " given twice";
    }
  }
  // A delete through one hub is seen by the other.
  EXPECT_EQ(Ctl(cluster.hub(1).admin_address(), {"key", "delete", "job", "own12"}).exit_code, 0);
  EXPECT_EQ(Layout(cluster.hub(0).admin_address(), "job").count("own12"), 0u);
  EXPECT_EQ(Ctl(cluster.hub(0).admin_address(), {"tenant", "delete", "job"}).exit_code, 0);
  EXPECT_NE(Ctl(cluster.hub(1).admin_address(), {"tenant", "get", "job"}).exit_code, 0);
}

// Waits until a mutation through `admin` succeeds again (etcd back).
bool MutationsWork(const std::string& admin, const std::string& name,
                   std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Ctl(admin, {"tenant", "create", name, "--workers", "1"}).exit_code == 0) return true;
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

void ExpectRefusedForEtcd(const std::string& admin) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = Ctl(admin, {"tenant", "create", "refused", "--workers", "1"});
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.err.find("UNAVAILABLE: rackhubd: "), std::string::npos)
      << "the daemon answers and names etcd, not 'cannot reach rackhubd':\n" << Describe(r);
  EXPECT_NE(r.err.find("etcd"), std::string::npos) << Describe(r);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << "bounded by the etcd timeout";
  // Reads are served from what the hub knows.
  EXPECT_EQ(Ctl(admin, {"tenant", "get", "job"}).exit_code, 0);
}

TEST(ClusterTest, EtcdLostLaterRefusesMutationsWhileTrainingContinues) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  const std::string token = CreateJob(cluster.hub(0).admin_address(), 1);
  const std::vector<std::string> keys = {"w,6000,fp32,zeros"};
  Worker w0(cluster.hub(0).data_address(), token, 0, 0, keys, 40, 40);
  Worker w1(cluster.hub(1).data_address(), token, 1, 0, keys, 40, 40);
  // Training is under way, then etcd goes away.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (w0.Iterations().size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(w0.Iterations().size(), 3u) << w0.Text();
  etcd.Stop(0);
  ExpectRefusedForEtcd(cluster.hub(1).admin_address());
  ASSERT_EQ(w0.Wait(), 0) << w0.Text();
  ASSERT_EQ(w1.Wait(), 0) << w1.Text();
  EXPECT_EQ(w0.Iterations().size(), 40u);
  EXPECT_EQ(w0.Iterations(), w1.Iterations());
  // etcd back (same data): mutations work again, on both hubs.
  ASSERT_TRUE(etcd.Start(0));
  EXPECT_TRUE(MutationsWork(cluster.hub(1).admin_address(), "after", 20s))
      << cluster.hub(1).Log();
  const auto seen = std::chrono::steady_clock::now() + 10s;
  while (Ctl(cluster.hub(0).admin_address(), {"tenant", "get", "after"}).exit_code != 0 &&
         std::chrono::steady_clock::now() < seen) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(Ctl(cluster.hub(0).admin_address(), {"tenant", "get", "after"}).exit_code, 0)
      << "hub 0's watch picks up changes once etcd is back";
}

TEST(ClusterTest, ThreeMembersSurviveOneLossAndRefuseMutationsWithoutQuorum) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  const std::string token = CreateJob(cluster.hub(0).admin_address(), 1);
  // One member down: everything keeps working (after a re-election).
  etcd.Stop(0);
  EXPECT_TRUE(MutationsWork(cluster.hub(0).admin_address(), "one-down", 20s))
      << cluster.hub(0).Log();
  EXPECT_EQ(Ctl(cluster.hub(1).admin_address(), {"key", "create", "job", "w", "--elements",
                                                 "6000"})
                .exit_code,
            0);
  const std::vector<std::string> keys = {"w,6000,fp32,zeros"};
  Worker w0(cluster.hub(0).data_address(), token, 0, 0, keys, 40, 40);
  Worker w1(cluster.hub(1).data_address(), token, 1, 0, keys, 40, 40);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (w1.Iterations().size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(w1.Iterations().size(), 3u) << w1.Text();
  // Two down: no quorum. Mutations fail with UNAVAILABLE; training goes on.
  etcd.Stop(1);
  ExpectRefusedForEtcd(cluster.hub(0).admin_address());
  ASSERT_EQ(w0.Wait(), 0) << w0.Text();
  ASSERT_EQ(w1.Wait(), 0) << w1.Text();
  EXPECT_EQ(w0.Iterations().size(), 40u);
  EXPECT_EQ(w0.Iterations(), w1.Iterations());
  // Quorum back: mutations work again.
  ASSERT_TRUE(etcd.Start(1));
  EXPECT_TRUE(MutationsWork(cluster.hub(1).admin_address(), "quorum-back", 30s))
      << cluster.hub(1).Log() << etcd.Logs();
}

TEST(ClusterTest, AHubThatStopsAnsweringLosesItsLeaseAndItsRackIsFailedByName) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  const std::string token = CreateJob(cluster.hub(0).admin_address(), 2);
  ASSERT_EQ(Ctl(cluster.hub(0).admin_address(),
                {"key", "create", "job", "w", "--elements", "2048"})
                .exit_code,
            0);
  RawClient w0(cluster.hub(0).data_address()), w1(cluster.hub(0).data_address());
  const auto welcome = w0.Hello("job", token, 0, 0);
  ASSERT_NE(welcome.tenant_handle(), 0u);
  ASSERT_NE(w1.Hello("job", token, 1, 0).tenant_handle(), 0u);
  // Rack 1's hub freezes: its TCP links stay open, only its lease tells.
  ASSERT_EQ(kill(cluster.hub(1).pid(), SIGSTOP), 0);
  net::FrameHeader push;
  push.opcode = net::Opcode::kPush;
  push.tenant = welcome.tenant_handle();
  push.key = welcome.keys(0).id();
  push.chunk = 1;  // with one lane, chunk 1's home is rack 1
  push.dtype = net::DType::kFp32;
  const std::string grad(1024 * 4, '\0');
  const auto start = std::chrono::steady_clock::now();
  w0.Send(push, grad);
  w1.Send(push, grad);
  testing::ExpectError(w0.Receive(15s), net::WireError::kWorkerLost, "rack 1", false);
  testing::ExpectError(w1.Receive(15s), net::WireError::kWorkerLost, "rack 1", false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 12s)
      << "noticed through the lease (ttl 2 s), well before the straggler timeout (20 s)";
  EXPECT_NE(cluster.hub(0).Log().find("the hub of rack 1 left etcd"), std::string::npos)
      << cluster.hub(0).Log();
  // It comes back: registers again; hub 0 takes the rack back.
  ASSERT_EQ(kill(cluster.hub(1).pid(), SIGCONT), 0);
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (cluster.hub(0).Log().find("the hub of rack 1 is back") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(cluster.hub(0).Log().find("the hub of rack 1 is back"), std::string::npos)
      << cluster.hub(0).Log() << cluster.hub(1).Log();
}

// Kills every TCP connection to `port` on loopback (ss -K: the kernel's
// SOCK_DESTROY); the number killed, -1 if ss cannot do it here.
int KillConnections(uint16_t port) {
  const CommandResult r = RunCommand(
      {"/usr/bin/ss", "-K", "-t", "-n", "dst", "127.0.0.1:" + std::to_string(port)});
  if (r.exit_code != 0) return -1;
  int killed = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.find("ESTAB") != std::string::npos) ++killed;
  }
  return killed;
}

// Hub links cut again and again while two racks train. A cut between
// cross-rack updates is absorbed: frames wait for the link, which comes back
// on its own. A cut during one fails that update with WORKER_LOST naming the
// rack (the hubs do not realign a chunk across racks: docs/cluster.md). So
// each worker either finishes, and then bit for bit as the undisturbed run,
// or stops on WORKER_LOST naming the rack; never a hang, never other bits.
TEST(ClusterTest, HubLinkCutsNeverHangOrChangeTheBits) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  const std::vector<std::string> keys = {"w,9000,fp32,zeros", "v,1500,fp32,zeros"};
  constexpr int kIterations = 60;
  // The undisturbed run first.
  const std::string clean_token = CreateJob(cluster.hub(1).admin_address(), 1);
  Worker c0(cluster.hub(0).data_address(), clean_token, 0, 0, keys, kIterations);
  Worker c1(cluster.hub(1).data_address(), clean_token, 1, 0, keys, kIterations);
  ASSERT_EQ(c0.Wait(), 0) << c0.Text();
  ASSERT_EQ(c1.Wait(), 0) << c1.Text();
  const auto clean = c0.Iterations();
  ASSERT_EQ(clean.size(), 2u * kIterations);
  ASSERT_EQ(Ctl(cluster.hub(1).admin_address(), {"tenant", "delete", "job"}).exit_code, 0);

  const std::string token = CreateJob(cluster.hub(0).admin_address(), 1);
  Worker w0(cluster.hub(0).data_address(), token, 0, 0, keys, kIterations, 30);
  Worker w1(cluster.hub(1).data_address(), token, 1, 0, keys, kIterations, 30);
  int cuts = 0;
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(300ms);
    for (int r = 0; r < 2; ++r) {
      const int killed = KillConnections(cluster.interhub_port(r));
      if (killed < 0) GTEST_SKIP() << "ss -K cannot destroy sockets here (needs CAP_NET_ADMIN)";
      cuts += killed;
    }
  }
  EXPECT_GT(cuts, 0);
  EXPECT_NE(cluster.hub(0).Log().find("lost its"), std::string::npos) << cluster.hub(0).Log();
  for (Worker* w : {&w0, &w1}) {
    const int code = w->Wait();
    ASSERT_NE(code, -1) << "a worker hangs after the cuts:\n" << w->Text();
    const auto seen = w->Iterations();
    // Every iteration it finished is the undisturbed run's.
    for (const auto& [what, bits] : seen) EXPECT_EQ(bits, clean.at(what)) << what;
    if (code == 0) {
      EXPECT_EQ(seen.size(), 2u * kIterations);
    } else {
      EXPECT_EQ(code, 4) << w->Text();
      const std::string text = ReadFile(w->out);
      const auto at = text.find("\nerror ");
      ASSERT_NE(at, std::string::npos) << text;
      const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
      EXPECT_NE(line.find("WORKER_LOST"), std::string::npos) << line;
      EXPECT_NE(line.find("rack"), std::string::npos) << line;
    }
  }
}

// from_client keys while the hub links are cut every few milliseconds from
// the moment the workers start: rack 0's INIT frames to the chunks' homes and
// the homes' to the other rack may be lost in a cut; the hub that has the
// values offers them again on every reconnect, and a home never gets a rack
// sum before the values. So every worker gets rank 0's values, nothing
// hangs, and a worker finishes bit for bit as the undisturbed run or stops
// on WORKER_LOST naming the rack.
TEST(ClusterTest, FromClientValuesReachEveryRackThroughHubLinkCuts) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  // u has 12 chunks of 1024 floats (homes alternate between the racks).
  const std::vector<std::string> keys = {"u,12000,fp32,client", "z,1500,fp32,zeros",
                                         "h,3000,fp16,client"};
  constexpr int kIterations = 8;
  std::map<std::string, std::string> clean;
  for (int round = 0; round < 5; ++round) {
    const std::string token = CreateJob(cluster.hub(round % 2).admin_address(), 1);
    Worker w0(cluster.hub(0).data_address(), token, 0, 0, keys, kIterations);
    Worker w1(cluster.hub(1).data_address(), token, 1, 0, keys, kIterations);
    int cuts = 0;
    if (round > 0) {  // round 0 is the undisturbed run
      const auto until = std::chrono::steady_clock::now() + 1500ms;
      while (std::chrono::steady_clock::now() < until) {
        for (int r = 0; r < 2; ++r) {
          const int killed = KillConnections(cluster.interhub_port(r));
          if (killed < 0) GTEST_SKIP() << "ss -K cannot destroy sockets here";
          cuts += killed;
        }
        std::this_thread::sleep_for(10ms);
      }
    }
    for (Worker* w : {&w0, &w1}) {
      const int code = w->Wait();
      ASSERT_NE(code, -1) << "round " << round << ": a worker hangs:\n"
                          << w->Text() << cluster.hub(0).Log() << cluster.hub(1).Log();
      const auto seen = w->Iterations();
      ASSERT_EQ(seen.count("init u"), 1u) << "round " << round << ":\n" << w->Text();
      ASSERT_EQ(seen.count("init h"), 1u) << "round " << round << ":\n" << w->Text();
      if (round == 0) {
        ASSERT_EQ(code, 0) << w->Text();
        if (clean.empty()) clean = seen;
        EXPECT_EQ(seen, clean) << "the two racks' workers saw different values";
        continue;
      }
      for (const auto& [what, bits] : seen) {
        EXPECT_EQ(bits, clean.at(what)) << "round " << round << ": " << what;
      }
      if (code != 0) {
        EXPECT_EQ(code, 4) << w->Text();
        const std::string text = ReadFile(w->out);
        const auto at = text.find("\nerror ");
        ASSERT_NE(at, std::string::npos) << text;
        const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
        EXPECT_NE(line.find("WORKER_LOST"), std::string::npos) << line;
        EXPECT_NE(line.find("rack"), std::string::npos) << line;
      }
    }
    if (round > 0) EXPECT_GT(cuts, 0) << "round " << round;
    ASSERT_EQ(Ctl(cluster.hub(0).admin_address(), {"tenant", "delete", "job"}).exit_code, 0);
  }
}

// INIT of a tenant spanning racks is rank 0 of rack 0's: rank 0 of another
// rack is refused by name (fatal), and a push before the values arrived is
// NOT_READY (fatal), as on one hub.
TEST(ClusterTest, OnlyRankZeroOfRackZeroInitializesAcrossRacks) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  const std::string token = CreateJob(cluster.hub(0).admin_address(), 2);
  pb::Key key;
  {
    grpc::ClientContext ctx;
    pb::CreateKeyRequest req;
    req.set_tenant("job");
    req.set_name("k");
    req.set_elements(64);
    req.set_init(pb::FROM_CLIENT);
    const grpc::Status st = Keys(cluster.hub(0).admin_address())->CreateKey(&ctx, req, &key);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  const std::string admin = cluster.hub(1).admin_address();
  const auto declared = [&] { return Layout(admin, "job").count("k") == 1; };
  for (int i = 0; i < 100 && !declared(); ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(declared());
  // HELLO on rack 1's hub as `rank` of rack 1; the tenant's handle there.
  const auto join = [&](RawClient& raw, uint32_t rank) {
    data::v1::Hello hello;
    hello.set_tenant("job");
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_rack(1);
    hello.set_lane(0);
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    raw.Send(h, hello.SerializeAsString());
    const auto f = raw.Receive();
    data::v1::Welcome w;
    EXPECT_TRUE(f && f->h.opcode == net::Opcode::kWelcome) << testing::Describe(f);
    if (f) w.ParseFromString(f->payload);
    return w.tenant_handle();
  };
  const std::string values(64 * 4, '\0');
  RawClient rank1(cluster.hub(1).data_address());
  net::FrameHeader push;
  push.opcode = net::Opcode::kPush;
  push.tenant = join(rank1, 1);
  push.key = key.id();
  push.dtype = net::DType::kFp32;
  push.request_id = 3;
  rank1.Send(push, values);
  testing::ExpectError(rank1.Receive(), net::WireError::kNotReady, "no initial values yet", true);

  RawClient rank0(cluster.hub(1).data_address());
  net::FrameHeader init;
  init.opcode = net::Opcode::kInit;
  init.tenant = join(rank0, 0);
  init.key = key.id();
  init.dtype = net::DType::kFp32;
  init.request_id = 7;
  rank0.Send(init, values);
  testing::ExpectError(rank0.Receive(), net::WireError::kInvalidArgument,
                       "only rank 0 of rack 0 may INIT", true);
}

// etcd members killed (-9) and restarted while two hubs create keys at
// once: a create either succeeds (and its key is on both hubs) or fails
// with a clear error; no chunk or id is ever given twice; both hubs end
// with the same registry.
TEST(ClusterTest, EtcdMemberKillLoopNeverSplitsTheRegistry) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  ASSERT_EQ(Ctl(cluster.hub(0).admin_address(),
                {"tenant", "create", "job", "--workers", "1", "--chunk-bytes", "4096"})
                .exit_code,
            0);
  std::set<std::string> acknowledged;
  std::srand(static_cast<unsigned>(getpid()));
  for (int round = 0; round < 6; ++round) {
    const int victim = std::rand() % 3;
    etcd.Stop(victim);
    std::vector<grpc::Status> statuses(8);
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 30s);
        pb::CreateKeyRequest req;
        req.set_tenant("job");
        req.set_name("r" + std::to_string(round) + "k" + std::to_string(i));
        req.set_elements(1000 + 700 * i);
        pb::Key k;
        statuses[i] = Keys(cluster.hub(i % 2).admin_address())->CreateKey(&ctx, req, &k);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) {
      const std::string name = "r" + std::to_string(round) + "k" + std::to_string(i);
      if (statuses[i].ok()) {
        acknowledged.insert(name);
      } else {
        EXPECT_EQ(statuses[i].error_code(), grpc::StatusCode::UNAVAILABLE)
            << name << ": " << statuses[i].error_message();
      }
    }
    ASSERT_TRUE(etcd.Start(victim));
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!etcd.Writable(victim, 500ms) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
    }
  }
  EXPECT_GE(acknowledged.size(), 24u) << "with 2 of 3 members up most creates succeed";
  // Both hubs converge on one registry (their watches catch up).
  std::map<std::string, std::string> layout;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  do {
    layout = Layout(cluster.hub(0).admin_address(), "job");
    if (layout == Layout(cluster.hub(1).admin_address(), "job")) break;
    std::this_thread::sleep_for(200ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(Layout(cluster.hub(1).admin_address(), "job"), layout);
  for (const auto& name : acknowledged) EXPECT_EQ(layout.count(name), 1u) << name << " was lost";
  std::set<uint64_t> chunks, ids;
  for (const auto& [name, l] : layout) {
    std::istringstream in(l);
    uint64_t id, first, count;
    in >> id >> first >> count;
    EXPECT_TRUE(ids.insert(id).second) << "id " << id << " given twice";
    for (uint64_t c = first; c < first + count; ++c) {
      EXPECT_TRUE(chunks.insert(c).second) << "chunk " << c << " given twice";
    }
  }
}

// etcd with auth enabled (user + password) and TLS: the hub authenticates,
// verifies etcd's certificate and works; a wrong password or an unknown CA
// is a clear start-up error naming the setting.
TEST(ClusterTest, EtcdWithAuthAndTlsNeedsTheRightCredentials) {
  const std::string dir = MakeTempDir();
  // A CA and a certificate for 127.0.0.1 (openssl, as an operator would).
  auto openssl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    const CommandResult r = RunCommand(args, "", 60s);
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
  };
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
           "-keyout", dir + "/ca.key", "-out", dir + "/ca.pem"});
  openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
           dir + "/etcd.key", "-out", dir + "/etcd.csr"});
  WriteFile(dir + "/san.ext", "subjectAltName=IP:127.0.0.1\n");
  openssl({"x509", "-req", "-in", dir + "/etcd.csr", "-CA", dir + "/ca.pem", "-CAkey",
           dir + "/ca.key", "-CAcreateserial", "-days", "2", "-extfile", dir + "/san.ext", "-out",
           dir + "/etcd.pem"});
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
           "/CN=other-ca", "-keyout", dir + "/other.key", "-out", dir + "/other.pem"});
  EtcdCluster etcd(1, {"--cert-file", dir + "/etcd.pem", "--key-file", dir + "/etcd.key"});
  ASSERT_TRUE(etcd.started());
  // Auth on: a root user with a password.
  const std::string endpoint = "https://" + etcd.endpoint(0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"user", "add", "root", "--new-user-password=s3cret-pw"},
        std::vector<std::string>{"auth", "enable"}}) {
    std::vector<std::string> argv = {"/usr/bin/etcdctl", "--endpoints", endpoint, "--cacert",
                                     dir + "/ca.pem"};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = RunCommand(argv, "", 30s);
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
  }
  WriteFile(dir + "/right", "s3cret-pw\n");
  WriteFile(dir + "/wrong", "not-it\n");
  auto config = [&](const std::string& ca, const std::string& password) {
    const std::string path = MakeTempDir() + "/rackhubd.toml";
    WriteFile(path, "[registry]\nbackend = \"etcd\"\netcd_endpoints = \"" + etcd.endpoint(0) +
                        "\"\netcd_ca_file = \"" + ca + "\"\netcd_user = \"root\"\n" +
                        "etcd_password_file = \"" + password + "\"\netcd_timeout_ms = 2000\n");
    return path;
  };
  DaemonProcess hub({"--in-memory", "--lanes", "1", "--config", config(dir + "/ca.pem", dir + "/right")});
  ASSERT_TRUE(hub.started());
  const CommandResult created = Ctl(hub.admin_address(), {"tenant", "create", "job", "--workers", "1"});
  EXPECT_EQ(created.exit_code, 0) << Describe(created);
  const std::vector<std::string> base = {BinPath("rackhubd"), "--in-memory", "--no-metrics",
                                         "--admin-listen", "127.0.0.1:0", "--data-listen",
                                         "127.0.0.1:0", "--config"};
  auto wrong_password = base;
  wrong_password.push_back(config(dir + "/ca.pem", dir + "/wrong"));
  const CommandResult r1 = RunCommand(wrong_password, "", 30s);
  EXPECT_NE(r1.exit_code, 0) << Describe(r1);
  EXPECT_NE((r1.out + r1.err).find("registry.etcd_user: etcd refused user 'root'"),
            std::string::npos)
      << Describe(r1);
  auto wrong_ca = base;
  wrong_ca.push_back(config(dir + "/other.pem", dir + "/right"));
  const CommandResult r2 = RunCommand(wrong_ca, "", 30s);
  EXPECT_NE(r2.exit_code, 0) << Describe(r2);
  EXPECT_NE((r2.out + r2.err).find("registry.etcd"), std::string::npos) << Describe(r2);
}

// A hub killed -9 at random moments while the other creates keys, then
// restarted (same addresses, its old lease still alive): it takes its rack
// back, loads the whole registry from etcd, and both hubs agree.
TEST(ClusterTest, HubKill9LoopKeepsOneRegistryAndTheRack) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  Cluster cluster(etcd.endpoints(), 2);
  ASSERT_TRUE(cluster.started());
  ASSERT_EQ(Ctl(cluster.hub(0).admin_address(),
                {"tenant", "create", "job", "--workers", "1", "--chunk-bytes", "4096"})
                .exit_code,
            0);
  std::srand(static_cast<unsigned>(getpid()) * 7u);
  int created = 0;
  for (int round = 0; round < 5; ++round) {
    std::thread creator([&] {
      for (int i = 0; i < 4; ++i) {
        const CommandResult r =
            Ctl(cluster.hub(0).admin_address(),
                {"key", "create", "job", "r" + std::to_string(round) + "k" + std::to_string(i),
                 "--elements", std::to_string(1000 + 900 * i)});
        EXPECT_EQ(r.exit_code, 0) << Describe(r);
        created += r.exit_code == 0;
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(std::rand() % 150));
    EXPECT_EQ(cluster.hub(1).Kill(), 128 + SIGKILL);
    creator.join();
    ASSERT_TRUE(cluster.hub(1).Restart()) << cluster.hub(1).Log();
    EXPECT_EQ(Layout(cluster.hub(1).admin_address(), "job"),
              Layout(cluster.hub(0).admin_address(), "job"))
        << "round " << round;
  }
  EXPECT_EQ(created, 20);
  EXPECT_EQ(Layout(cluster.hub(1).admin_address(), "job").size(), 20u);
  // The restarted hub is a member again: a key made through it reaches hub 0.
  ASSERT_EQ(Ctl(cluster.hub(1).admin_address(), {"key", "create", "job", "last", "--elements",
                                                 "10"})
                .exit_code,
            0);
  EXPECT_EQ(Layout(cluster.hub(0).admin_address(), "job").count("last"), 1u);
  EXPECT_NE(cluster.hub(1).Log().find("cluster: rack 1 registered"), std::string::npos);
}

TEST(ClusterTest, ARackClaimedTwiceOrNeverStartedIsAClearError) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  // Rack 1 of 2 never starts: rack 0 gives up naming it.
  const std::string secret = MakeTempDir() + "/hub.secret";
  WriteFile(secret, std::string(48, 's') + "\n");
  const std::vector<std::string> base = {
      BinPath("rackhubd"), "--in-memory", "--no-metrics", "--admin-listen", "127.0.0.1:0",
      "--data-listen", "127.0.0.1:0", "--registry", "etcd", "--etcd-endpoints", etcd.endpoints(),
      "--etcd-prefix", "/claims/", "--racks-from", "etcd", "--rack-count", "2",
      "--hub-secret-file", secret};
  auto lonely = base;
  lonely.insert(lonely.end(), {"--rack", "0", "--interhub",
                               "127.0.0.1:" + std::to_string(FreeLoopbackPort()),
                               "--discover-timeout-s", "2"});
  const CommandResult r = RunCommand(lonely, "", 30s);
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_NE((r.out + r.err).find("no hub for rack(s) 1"), std::string::npos) << Describe(r);

  // Two hubs claiming rack 0 with different addresses: the second refuses.
  auto first = base;
  first.erase(first.begin());
  first.insert(first.end(), {"--rack", "0", "--interhub",
                             "127.0.0.1:" + std::to_string(FreeLoopbackPort())});
  DaemonProcess holder(first, false);  // waits for rack 1 meanwhile (SIGTERM ends the wait)
  std::this_thread::sleep_for(500ms);
  auto second = base;
  second.insert(second.end(), {"--rack", "0", "--interhub",
                               "127.0.0.1:" + std::to_string(FreeLoopbackPort())});
  const CommandResult twice = RunCommand(second, "", 30s);
  EXPECT_NE(twice.exit_code, 0) << Describe(twice);
  EXPECT_NE((twice.out + twice.err).find("rack 0 is already registered"), std::string::npos)
      << Describe(twice);
}

}  // namespace
}  // namespace rackhub
