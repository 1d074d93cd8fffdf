// Test support for the cross-rack recovery tests (cross_rack_recovery_test.cc,
// cluster_training_test.cc's HubLinkCutsNeverHangOrChangeTheBits,
// cluster_checkpoint_test.cc on durable hubs): one job
// on a cluster of hubs finding each other through a real etcd on loopback
// (cluster_fixture.h): tenant "job" (CreateJob: 4096-byte chunks) with W
// rackhub-durability-worker processes per rack training key "w" of
// kElements (5 chunks, homes alternating between the racks) with momentum
// (lr 0.05, mu 0.9), Pulling on WORKER_LOST; and the end of such a job: every
// worker told to stop a little beyond the newest version, waited for (a hang
// fails, naming the worker), and every output file checked against the
// reference (cross_rack_reference.h).
//
// Ownership: a CrossRackTraining owns etcd, the hubs and the workers (killed
// when it is destroyed); the worker files are removed unless the test failed
// (then their directory is printed). Single-threaded use from a test body.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "cross_rack_reference.h"
#include "etcd_cluster.h"
#include "process.h"
#include "wait.h"
#include "worker_set.h"

namespace rackhub::testing {

inline constexpr uint64_t kElements = 5000;       // 5 chunks of 1024 (CreateJob: 4096-byte chunks)
inline constexpr uint64_t kChunkElements = 1024;
inline constexpr auto kFinishLimit = std::chrono::seconds(60);

inline std::string TailOf(const std::string& s, size_t n = 3000) {
  return s.size() > n ? "..." + s.substr(s.size() - n) : s;
}

// One job: etcd, the hubs of `racks` racks, tenant "job" with `workers`
// workers per rack, and the worker processes.
class CrossRackTraining {
 public:
  // `lanes`: the hubs' lane count (cluster_fixture.h's Cluster runs 1).
  // `flat`: one hub serving every rack (topology.mode = flat: no hub links,
  // no etcd) in place of the cluster; the same bits (docs/architecture.md).
  // `durable`: hubs with state directories (checkpoints; not with `flat`),
  // whose restores the reference follows (CrossRackJob::rollbacks).
  CrossRackTraining(int racks, uint32_t workers, std::vector<std::string> hub_extra = {},
                    uint32_t lanes = 1, bool flat = false, bool durable = false)
      : racks_(racks), workers_(workers), lanes_(lanes), durable_(durable) {
    hub_extra.insert(hub_extra.end(), {"--lanes", std::to_string(lanes)});
    if (flat) {
      std::string list;
      for (int r = 0; r < racks; ++r) {
        list += (r ? "," : "") + std::string("127.0.0.1:0=127.0.0.1:") +
                std::to_string(FreeLoopbackPort());
      }
      std::vector<std::string> args = {"--in-memory", "--racks", list, "--rack", "0",
                                       "--topology-mode", "flat", "--straggler-timeout-ms",
                                       "20000"};
      args.insert(args.end(), hub_extra.begin(), hub_extra.end());
      flat_ = std::make_unique<DaemonProcess>(args);
      return;
    }
    etcd_ = std::make_unique<EtcdCluster>(1);
    if (!etcd_->started()) return;
    cluster_ = std::make_unique<Cluster>(etcd_->endpoints(), racks, std::move(hub_extra), true,
                                         durable);
  }

  // Creates the tenant and starts every worker; false (with a failure) if
  // the cluster did not start.
  bool Start() {
    if (flat_ ? !flat_->started() : !cluster_ || !cluster_->started()) return false;
    const std::string token = CreateJob(hub(0).admin_address(), workers_);
    if (token.empty()) return false;
    // The other hubs learn of the tenant through etcd's watch: a worker
    // that says HELLO before its hub did is refused (unknown tenant).
    for (int r = 1; r < hubs(); ++r) {
      const auto known = WaitUntil("tenant 'job' on rack " + std::to_string(r) + "'s hub", [&] {
        return Ctl(hub(r).admin_address(), {"tenant", "get", "job"}).exit_code == 0;
      });
      if (!known) {
        ADD_FAILURE() << known.message();
        return false;
      }
    }
    dir_ = MakeTempDir();
    stop_file_ = dir_ + "/stop";
    WorkerSet::Setup s;
    s.dir = dir_;
    s.tenant = "job";
    s.token = token;
    for (int r = 0; r < racks_; ++r) s.hubs.push_back(hub(r).data_address());
    s.args = {"--elements",  std::to_string(kElements), "--optimizer", "momentum",
              "--lr",        "0.05",                    "--momentum",  "0.9",
              "--dump-pulls", "--stop-file",            stop_file_,    "--op-timeout-ms",
              "20000"};
    workers_set_ = std::make_unique<WorkerSet>(s);
    for (int r = 0; r < racks_; ++r) {
      for (uint32_t k = 0; k < workers_; ++k) workers_set_->Start(k, r);
    }
    return true;
  }

  // The worker files are kept for a failed test (their directory is printed).
  ~CrossRackTraining() {
    workers_set_.reset();
    if (dir_.empty()) return;
    if (::testing::Test::HasFailure()) {
      std::printf("worker output kept in %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  Cluster& cluster() { return *cluster_; }  // not with `flat`
  // The hub rack r's workers use (the flat hub for every rack).
  DaemonProcess& hub(int r) { return flat_ ? *flat_ : cluster_->hub(r); }
  int hubs() const { return flat_ ? 1 : racks_; }
  WorkerSet& workers() { return *workers_set_; }
  int racks() const { return racks_; }
  uint32_t workers_per_rack() const { return workers_; }

  // Waits until every current worker completed a PushPull beyond version
  // `after` (the job goes on after a failure).
  ::testing::AssertionResult Progress(uint64_t after, const std::string& when) {
    std::string exited;
    auto r = WaitUntil("every worker past version " + std::to_string(after) + " " + when, [&] {
      exited = workers_set_->Exited();
      return !exited.empty() || workers_set_->MinCurrent() > after;
    });
    if (r && exited.empty()) return r;
    if (r) r = ::testing::AssertionFailure() << "a worker stopped " << when << ":\n" << exited;
    return r << "\n" << State();
  }

  // Lines of `kind` containing `text` in every generation's file so far.
  size_t Count(uint32_t rank, uint32_t rack, const std::string& kind,
               const std::string& text = "") const {
    size_t n = 0;
    for (const auto& [member, file] : workers_set_->files()) {
      if (member != WorkerSet::Member{rack, rank}) continue;
      for (const auto& l : workers_set_->Lines(file)) {
        n += l.kind == kind && l.text.find(text) != std::string::npos;
      }
    }
    return n;
  }

  // Tells every worker to stop at a version a little beyond the newest, waits
  // for them all (exit 0), and checks every file against the reference.
  void FinishAndCheck() {
    // Every rank must stop at the same version, so none may pass it before it
    // reads it: the workers are frozen (SIGSTOP, until the kernel shows them
    // stopped) while the newest version any of them reached is read and the
    // stop version written. A frozen worker may hold a version its file does
    // not show yet (a line cut short: the next version, or a Pull after a
    // recovery round: 1 + the newest any hub held); 10 more is far beyond
    // both, with no cut or kill left to start more rounds.
    std::vector<pid_t> pids;
    for (int r = 0; r < racks_; ++r) {
      for (uint32_t k = 0; k < workers_; ++k) pids.push_back(workers_set_->Process(k, r)->pid());
    }
    for (pid_t pid : pids) {
      ASSERT_EQ(kill(pid, SIGSTOP), 0);
      ASSERT_TRUE(WaitUntil("worker process " + std::to_string(pid) + " stopped",
                            [&] { return Stopped(pid); }));
    }
    const uint64_t stop = workers_set_->MaxVersion() + 10;
    WriteFile(stop_file_ + ".tmp", std::to_string(stop) + "\n");
    std::filesystem::rename(stop_file_ + ".tmp", stop_file_);  // read whole or not at all
    for (pid_t pid : pids) ASSERT_EQ(kill(pid, SIGCONT), 0);
    for (int r = 0; r < racks_; ++r) {
      for (uint32_t k = 0; k < workers_; ++k) {
        const int code = workers_set_->Wait(k, r, kFinishLimit);
        EXPECT_NE(code, -1) << "rack " << r << " rank " << k << " hangs (stop at " << stop
                            << ")\n" << State();
        EXPECT_EQ(code, 0) << "rack " << r << " rank " << k << "\n" << workers_set_->Tail(k, r);
      }
    }
    report_ = CheckAgainstReference(Job(), workers_set_->files());
    EXPECT_EQ(report_.problems, "") << State();
    EXPECT_GE(report_.newest, stop) << "the workers stopped before the stop version";
    std::printf("%s; %zu resyncs\n", report_.Summary().c_str(), workers_set_->Resyncs());
  }
  const ReferenceReport& report() const { return report_; }

  // The job as the reference sees it.
  CrossRackJob Job() const {
    CrossRackJob job;
    job.racks = racks_;
    job.workers_per_rack = workers_;
    job.lanes = lanes_;
    job.elements = kElements;
    job.chunk_elements = kChunkElements;
    job.optimizer.type = aggregation::OptimizerType::kMomentum;
    job.optimizer.learning_rate = 0.05;
    job.optimizer.momentum = 0.9;
    EXPECT_TRUE(aggregation::NormalizeOptimizer(&job.optimizer).ok());
    job.rollbacks = durable_;
    return job;
  }

  // Whether the process is stopped by a signal (state T in /proc/PID/stat).
  static bool Stopped(pid_t pid) {
    const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
    const auto at = stat.rfind(')');
    return at != std::string::npos && at + 2 < stat.size() && stat[at + 2] == 'T';
  }

  // The workers' last lines and the hubs' last log lines.
  std::string State() {
    std::string out;
    for (int r = 0; r < racks_; ++r) {
      for (uint32_t k = 0; k < workers_; ++k) {
        out += "--- rack " + std::to_string(r) + " rank " + std::to_string(k) + ":\n" +
               TailOf(workers_set_->Tail(k, r), 1500) + "\n";
      }
    }
    for (int r = 0; r < hubs(); ++r) {
      out += "--- hub of rack " + std::to_string(r) + ":\n" + TailOf(hub(r).Log()) + "\n";
    }
    return out;
  }

 private:
  const int racks_;
  const uint32_t workers_;
  const uint32_t lanes_;
  const bool durable_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<DaemonProcess> flat_;
  std::unique_ptr<WorkerSet> workers_set_;
  std::string dir_, stop_file_;
  ReferenceReport report_;
};

}  // namespace rackhub::testing
