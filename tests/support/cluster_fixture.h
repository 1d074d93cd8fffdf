// Test support for the cluster tests (tests/integration/cluster_test.cc,
// cluster_training_test.cc): hubs that share a registry in a real etcd and
// find each other there, rackhubctl calls, and training worker processes
// (rackhub-test-worker) whose every iteration is compared bit for bit.
// Single-threaded use from a test body (the processes it starts are the
// concurrency).
#pragma once

#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "etcd_cluster.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::testing {

namespace cluster_pb = rackhub::admin::v1;

inline std::string Describe(const CommandResult& r) {
  return "exit=" + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "--- stderr:\n" +
         r.err;
}

inline CommandResult Ctl(const std::string& admin, std::vector<std::string> args) {
  args.insert(args.begin(), {BinPath("rackhubctl"), "--admin", admin});
  return RunCommand(args, "", std::chrono::seconds(30));
}

// The value of the first "label: value" line.
inline std::string Field(const std::string& out, const std::string& label) {
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
// for the others; all are started first, then waited for. `durable`: each hub
// keeps its state in its own state directory (DaemonProcess's), e.g. for
// checkpoints; otherwise --in-memory.
class Cluster {
 public:
  Cluster(const std::string& endpoints, int racks, std::vector<std::string> extra = {},
          bool wait = true, bool durable = false)
      : endpoints_(endpoints), racks_(racks), durable_(durable) {
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
    std::vector<std::string> a = {"--lanes",           "1",
                                  "--registry",        "etcd",            "--etcd-endpoints",
                                  endpoints_,          "--etcd-prefix",   prefix_,
                                  "--etcd-timeout-ms", "1500",            "--lease-ttl-s",
                                  "2",                 "--racks-from",    "etcd",
                                  "--rack-count",      std::to_string(racks_), "--rack",
                                  std::to_string(rack), "--interhub",
                                  "127.0.0.1:" + std::to_string(interhub_[rack]),
                                  "--hub-secret-file", secret_,
                                  "--straggler-timeout-ms", "20000"};
    if (!durable_) a.insert(a.begin(), "--in-memory");
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
  bool durable_;
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
  int Wait() { return process->Wait(std::chrono::seconds(120)); }
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

inline std::unique_ptr<cluster_pb::KeyService::Stub> Keys(const std::string& admin) {
  return cluster_pb::KeyService::NewStub(grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
}

// (name -> "id first_chunk chunk_count") of a tenant's keys on one hub.
inline std::map<std::string, std::string> Layout(const std::string& admin, const std::string& tenant) {
  grpc::ClientContext ctx;
  cluster_pb::ListKeysRequest req;
  req.set_tenant(tenant);
  cluster_pb::ListKeysResponse resp;
  EXPECT_TRUE(Keys(admin)->ListKeys(&ctx, req, &resp).ok());
  std::map<std::string, std::string> m;
  for (const auto& k : resp.keys()) {
    m[k.name()] = std::to_string(k.id()) + " " + std::to_string(k.first_chunk()) + " " +
                  std::to_string(k.chunk_count());
  }
  return m;
}

// Creates tenant "job" through rackhubctl on `admin`; returns its token.
inline std::string CreateJob(const std::string& admin, int workers) {
  const CommandResult r =
      Ctl(admin, {"tenant", "create", "job", "--workers", std::to_string(workers),
                  "--chunk-bytes", "4096", "--optimizer", "momentum", "--lr", "0.1",
                  "--momentum", "0.9"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  const std::string token = Field(r.out, "data-plane token");
  EXPECT_FALSE(token.empty()) << r.out;
  return token;
}

// Kills every TCP connection to `port` on loopback (ss -K: the kernel's
// SOCK_DESTROY); the number killed, -1 if ss cannot do it here.
inline int KillConnections(uint16_t port) {
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

}  // namespace rackhub::testing
