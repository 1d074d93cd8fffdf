// One control plane for many hubs (docs/cluster.md), with a real etcd on
// loopback and real rackhubd processes: the registry lives in etcd
// (registry.backend = "etcd") and the hubs find each other there
// (topology.racks_from = "etcd"). What the control plane promises:
//   - etcd unreachable at start-up: a clear error, the hub does not start;
//   - concurrent creates through two hubs: compare-and-swap gives every key
//     its own chunks and exactly one of two equal creates wins;
//   - etcd lost while training: admin mutations are refused with a clear
//     UNAVAILABLE, training goes on, mutations work again when etcd is back;
//   - 3 etcd members: one stopped changes nothing, two stopped refuse
//     mutations while the data plane keeps training;
//   - etcd members and hubs killed (-9) in loops: nothing acknowledged is
//     lost, no chunk or id is given twice, the hubs converge;
//   - etcd with auth and TLS; two hubs claiming one rack, or racks that
//     never come: clear errors.
// Training across the hubs of a cluster: cluster_training_test.cc.
#include <signal.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "etcd_cluster.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "raw_client.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::BinPath;
using testing::ChildProcess;
using testing::Cluster;
using testing::CommandResult;
using testing::CreateJob;
using testing::Ctl;
using testing::DaemonProcess;
using testing::EtcdCluster;
using testing::Field;
using testing::FreeLoopbackPort;
using testing::KillConnections;
using testing::Layout;
using testing::MakeTempDir;
using testing::RawClient;
using testing::ReadFile;
using testing::RunCommand;
using testing::WaitForLog;
using testing::WaitUntil;
using testing::Worker;
using testing::WriteFile;
using namespace std::chrono_literals;
using testing::Describe;

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
  // 2 x 12 key creates at once, half of them the same names on both hubs:
  // 24 rackhubctl processes (the hubs are under test, not a client's threads).
  std::vector<CommandResult> creates(24);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 24; ++i) {
      threads.emplace_back([&, i] {
        const int hub = i % 2;
        const std::string name = i < 12 ? "shared" + std::to_string(i / 2)
                                        : "own" + std::to_string(i);
        creates[i] = Ctl(cluster.hub(hub).admin_address(),
                         {"key", "create", "job", name, "--elements",
                          std::to_string(1000 + 1000 * (i % 5))});
      });
    }
    for (auto& t : threads) t.join();
  }
  int created = 0, existed = 0;
  for (const auto& r : creates) {
    if (r.exit_code == 0) {
      ++created;
    } else {
      EXPECT_NE(r.err.find("ALREADY_EXISTS"), std::string::npos) << Describe(r);
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
    // 8 rackhubctl processes at once through both hubs.
    std::vector<CommandResult> creates(8);
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        creates[i] = Ctl(cluster.hub(i % 2).admin_address(),
                         {"--timeout", "30", "key", "create", "job",
                          "r" + std::to_string(round) + "k" + std::to_string(i), "--elements",
                          std::to_string(1000 + 700 * i)});
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) {
      const std::string name = "r" + std::to_string(round) + "k" + std::to_string(i);
      if (creates[i].exit_code == 0) {
        acknowledged.insert(name);
      } else {
        EXPECT_NE(creates[i].err.find("UNAVAILABLE"), std::string::npos)
            << name << ": " << Describe(creates[i]);
      }
    }
    ASSERT_TRUE(etcd.Start(victim));
    // The next round stops a member again: only once this one has rejoined,
    // or two could be down at once.
    ASSERT_TRUE(WaitUntil(
        "etcd member " + std::to_string(victim) + " to take writes again",
        [&] { return etcd.Writable(victim, 500ms); }, 30s, 100ms))
        << "round " << round << "\n"
        << etcd.Logs();
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
  ASSERT_TRUE(WaitForLog(holder, "cluster: rack 0 registered in etcd"));
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
