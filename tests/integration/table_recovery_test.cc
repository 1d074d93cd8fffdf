// Row-sparse tables spanning racks recover from failures across racks
// (issue 31 items 1 and 3; docs/cluster.md, Recovery across racks), with
// real hubs on loopback and librackhub workers (tests/support/table_racks.h:
// three tables with momentum, Adam and row-wise AdaGrad, homed on different
// racks):
//   - a straggler on rack 1 aborts the update on every rack (one hub per
//     rack, and one flat hub serving both racks); afterwards every
//     worker of every rack Pulls the rows of the last update, bit for bit an
//     independent reference (tests/support/table_reference.h), at the agreed
//     version 1 + the newest, and the next update equals the reference's;
//   - hub links cut at random points of training, 12 times: whatever each
//     cut hit, every PushPullRows that succeeds and every PullRows after a
//     failure equals the reference, which applies exactly the updates some
//     worker was answered (an update is applied at its rows' home, whose
//     own workers it answers) and skips the others; the job goes on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"  // KillConnections
#include "data_link.h"  // SameBits
#include "table_racks.h"

namespace rackhub {
namespace {

using namespace testing::table_racks;
using testing::TablePush;
using testing::TableReference;
using testing::SameBits;

// The job: 2 racks x kWorkers workers, every table, one reference per table.
struct Job {
  Job(const std::string& straggler_ms, bool flat) : hubs(StartHubs(2, flat, straggler_ms)) {
    for (uint32_t rack = 0; rack < 2; ++rack) {
      for (uint32_t rank = 0; rank < kWorkers; ++rank) {
        keys.emplace_back();
        workers.push_back(ConnectWorker(hubs, rack, rank, &keys.back(), 30s));
      }
    }
    for (const TableKind& k : kTables) refs.emplace_back(ConfigOf(k), 2 * kWorkers, 0, kRows, kDim);
    for (uint64_t i = 0; i < kRows; ++i) all.push_back(i);
  }
  bool ok() const {
    for (const auto& w : workers) {
      if (!w) return false;
    }
    return true;
  }
  // Worker index -> (rack, rank).
  static uint32_t Rack(size_t w) { return static_cast<uint32_t>(w / kWorkers); }
  static uint32_t Rank(size_t w) { return static_cast<uint32_t>(w % kWorkers); }

  // Every worker pushes every table (those for which `skip(w, table)` is
  // false) at step `step`; returns each op's error and reply, [w][table].
  template <typename Skip>
  void Step(int step, Skip skip, std::vector<std::vector<client::Error>>* errors,
            std::vector<std::vector<std::vector<float>>>* replies) {
    errors->assign(workers.size(), std::vector<client::Error>(kTables.size()));
    replies->assign(workers.size(), std::vector<std::vector<float>>(
                                        kTables.size(), std::vector<float>(kRows * kDim)));
    std::vector<std::vector<client::Ticket>> tickets(workers.size());
    for (size_t w = 0; w < workers.size(); ++w) {
      for (size_t t = 0; t < kTables.size(); ++t) {
        if (skip(w, t)) {
          tickets[w].push_back(0);
          continue;
        }
        const TablePush p = MakePush(Rack(w), Rank(w), step, t);
        tickets[w].push_back(
            workers[w]->PushPullRows(keys[w][t], p.ids, p.rows, all, (*replies)[w][t]));
      }
    }
    for (size_t w = 0; w < workers.size(); ++w) {
      for (size_t t = 0; t < kTables.size(); ++t) {
        if (tickets[w][t] != 0) (*errors)[w][t] = workers[w]->Wait(tickets[w][t]);
      }
    }
  }
  // The reference's update of table `t` at step `step`.
  void Apply(int step, size_t t) {
    std::vector<std::vector<TablePush>> by_rack(2);
    for (size_t w = 0; w < workers.size(); ++w) by_rack[Rack(w)].push_back(MakePush(Rack(w), Rank(w), step, t));
    refs[t].UpdateAcrossRacks(by_rack);
  }
  // Every worker Pulls every table: the reference's rows, on every rack, at
  // one version per table (which the reference takes as its step count).
  void PullAndCheck(const std::string& when) {
    for (size_t t = 0; t < kTables.size(); ++t) {
      uint64_t version = 0;
      for (size_t w = 0; w < workers.size(); ++w) {
        std::vector<float> rows(kRows * kDim);
        const client::Error e = workers[w]->Wait(workers[w]->PullRows(keys[w][t], all, rows));
        ASSERT_TRUE(e.ok()) << when << ": worker " << w << " table " << t << ": " << e.message;
        EXPECT_TRUE(SameBits(rows, refs[t].values))
            << when << ": worker " << w << " (rack " << Rack(w) << ") pulled other rows of "
            << kTables[t].name << " than the reference";
        const uint64_t v = workers[w]->GetKeyInfo(keys[w][t])->next_iteration;
        if (w == 0) version = v;
        EXPECT_EQ(v, version) << when << ": worker " << w << " table " << t;
      }
      refs[t].t = version;  // a skipped step: Adam's step count is the version
    }
  }

  Hubs hubs;
  std::vector<std::unique_ptr<client::Client>> workers;
  std::vector<std::vector<client::KeyId>> keys;
  std::vector<TableReference> refs;
  std::vector<uint64_t> all;
};

class StragglerTest : public ::testing::TestWithParam<bool> {};

TEST_P(StragglerTest, AStragglerOnOneRackRealignsEveryRacksRowsToTheLastUpdate) {
  Job job("1500", GetParam());
  ASSERT_TRUE(job.ok());
  std::vector<std::vector<client::Error>> errors;
  std::vector<std::vector<std::vector<float>>> replies;
  job.Step(0, [](size_t, size_t) { return false; }, &errors, &replies);
  for (size_t t = 0; t < kTables.size(); ++t) {
    job.Apply(0, t);
    for (size_t w = 0; w < job.workers.size(); ++w) {
      ASSERT_TRUE(errors[w][t].ok()) << errors[w][t].message;
      EXPECT_TRUE(SameBits(replies[w][t], job.refs[t].values)) << "worker " << w << " table " << t;
    }
  }
  // Step 1: rack 1's rank 1 never pushes; every other push fails once the
  // straggler timeout aborts the update on every rack.
  const size_t straggler = kWorkers + 1;
  job.Step(1, [&](size_t w, size_t) { return w == straggler; }, &errors, &replies);
  for (size_t w = 0; w < job.workers.size(); ++w) {
    if (w == straggler) continue;
    for (size_t t = 0; t < kTables.size(); ++t) {
      EXPECT_EQ(errors[w][t].wire, client::WireError::kWorkerLost)
          << "worker " << w << " table " << t << ": " << errors[w][t].message;
    }
  }
  job.PullAndCheck("after the straggler");
  for (size_t t = 0; t < kTables.size(); ++t) {
    EXPECT_EQ(job.refs[t].t, 2u) << "1 + the newest version (1) of " << kTables[t].name;
  }
  job.Step(2, [](size_t, size_t) { return false; }, &errors, &replies);
  for (size_t t = 0; t < kTables.size(); ++t) {
    job.Apply(2, t);
    for (size_t w = 0; w < job.workers.size(); ++w) {
      ASSERT_TRUE(errors[w][t].ok()) << errors[w][t].message;
      EXPECT_TRUE(SameBits(replies[w][t], job.refs[t].values))
          << "worker " << w << " table " << t << " after the recovery";
    }
  }
}

// One hub per rack, and one flat hub serving both racks (the same skip).
INSTANTIATE_TEST_SUITE_P(Topology, StragglerTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Flat" : "Hierarchical"; });

TEST(TableRecoveryTest, HubLinkCutsAtRandomPointsNeverLeaveTheRacksRowsApart) {
  Job job("30000", false);
  ASSERT_TRUE(job.ok());
  const uint16_t port0 = static_cast<uint16_t>(
      std::stoi(job.hubs.interhub[0].substr(job.hubs.interhub[0].rfind(':') + 1)));
  const uint16_t port1 = static_cast<uint16_t>(
      std::stoi(job.hubs.interhub[1].substr(job.hubs.interhub[1].rfind(':') + 1)));
  std::mt19937 pick(20261128);
  int cuts = 0, failed_steps = 0;
  for (int step = 0; step < 24; ++step) {
    std::vector<std::vector<client::Error>> errors;
    std::vector<std::vector<std::vector<float>>> replies;
    std::thread cutter;
    if (step % 2 == 1) {
      // The cut's random point within the step is what this test varies.
      const auto delay = std::chrono::microseconds(pick() % 4000);
      cutter = std::thread([&, delay] {
        std::this_thread::sleep_for(delay);
        const int a = testing::KillConnections(port0), b = testing::KillConnections(port1);
        if (a > 0 || b > 0) ++cuts;
      });
    }
    job.Step(step, [](size_t, size_t) { return false; }, &errors, &replies);
    if (cutter.joinable()) cutter.join();
    bool any_failed = false;
    for (size_t t = 0; t < kTables.size(); ++t) {
      bool applied = false;
      for (size_t w = 0; w < job.workers.size(); ++w) {
        applied = applied || errors[w][t].ok();
        any_failed = any_failed || !errors[w][t].ok();
      }
      if (!applied) continue;  // aborted everywhere: the reference skips it
      job.Apply(step, t);
      for (size_t w = 0; w < job.workers.size(); ++w) {
        if (!errors[w][t].ok()) continue;
        EXPECT_TRUE(SameBits(replies[w][t], job.refs[t].values))
            << "step " << step << " worker " << w << " table " << t;
      }
    }
    if (any_failed) {
      ++failed_steps;
      job.PullAndCheck("step " + std::to_string(step));
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (cuts == 0) GTEST_SKIP() << "ss -K destroyed no hub link here (needs CAP_NET_ADMIN)";
  EXPECT_GT(failed_steps, 0) << "no cut met an update: the test checked nothing of recovery";
  RecordProperty("cuts", cuts);
  RecordProperty("failed_steps", failed_steps);
  job.PullAndCheck("the end");
}

}  // namespace
}  // namespace rackhub
