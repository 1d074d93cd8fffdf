// Recovery of a sync tenant spanning racks (issue 31 item 1; docs/cluster.md,
// docs/durability.md): real rackhubd hubs of 2 (and 3) racks finding each
// other through a real etcd on loopback (tests/support/cluster_fixture.h),
// and rackhub-durability-worker processes (1 or 2 per rack) training one
// dense key of 5 chunks whose homes alternate between the racks. Failures
// are thrown at the job while it trains:
//
//   - hub links cut (ss -K on every hub's interhub port) at random points,
//     >= 20 cuts that destroyed a connection, and 10 on a 3-rack cluster;
//     and, on hubs of 2 lanes, 10 cuts of one lane's link of one hub;
//   - a straggler: one worker stopped (SIGSTOP) past data.straggler_timeout_ms
//     (1.5 s here) until every other worker of every rack got WORKER_LOST,
//     then continued (SIGCONT), 20 times;
//   - kill -9 of a worker of rack 1, and a replacement process for its rank.
//
// The straggler and the kills also on one flat hub serving both racks
// (topology.mode = flat), which must recover the same way with the same bits.
//
// After each failure every worker must continue (it Pulls on WORKER_LOST, as
// docs/durability.md tells a trainer) and make progress; at the end every
// worker reaches the stop iteration (bounded waits: a hang fails, naming the
// worker). No step is checked against another run or only ranks against
// each other: cross_rack_reference.h replays the job from version 0 with the
// hubs' fp32 arithmetic and every rank's deterministic gradient, and checks
// every PushPull result and every Pull of every worker of every generation.
// The optimizer is momentum (lr 0.05, mu 0.9), whose velocity lives on the
// chunk's home hub: the reference tracks it per chunk, advancing it where a
// realigned version shows the chunk's update applied (its values are the
// update from the previous version) and keeping it where the step was skipped
// (the values unchanged), so a skipped step that touched the optimizer state,
// or a home that lost an applied update, shows in the next step's bits.
//
// The tests wait for events (worker output lines: a newer completed
// iteration, a resync), never for time. The only sleeps are the random delay
// before each cut, stop or kill: where in an iteration the failure lands is
// what is being tested. RACKHUB_XRACK_ROUNDS multiplies the rounds
// (tests/durability/kill_loops.sh --cross-rack); RACKHUB_KILL_SEED replays
// the random points.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "cross_rack_reference.h"
#include "cross_rack_training.h"
#include "kill_points.h"
#include "process.h"
#include "training.h"
#include "wait.h"
#include "worker_set.h"

namespace rackhub::testing {
namespace {

using namespace std::chrono_literals;

// Rounds of a loop: `ci` in CI, times RACKHUB_XRACK_ROUNDS (kill_loops.sh).
uint64_t Rounds(uint64_t ci) { return ci * EnvOr("RACKHUB_XRACK_ROUNDS", 1); }

// The reference itself, on made-up worker files (no processes): it accepts
// a realigned version whose chunks are each skipped or applied at their
// home, and catches a chunk that is neither, a skipped step that moved the
// velocity, two workers that disagree, and a realigned version too low.
TEST(CrossRackRecovery, TheReferenceCatchesWhatItMust) {
  CrossRackJob job;
  job.racks = 2;
  job.workers_per_rack = 1;
  job.elements = 2500;  // 3 chunks
  job.chunk_elements = kChunkElements;
  job.optimizer.type = aggregation::OptimizerType::kMomentum;
  job.optimizer.learning_rate = 0.05;
  job.optimizer.momentum = 0.9;
  ASSERT_TRUE(aggregation::NormalizeOptimizer(&job.optimizer).ok());
  const KeyValues v0{std::vector<float>(job.elements, 0.0f),
                     {std::vector<float>(job.elements, 0.0f)}};
  const KeyValues v1 = ReferenceStep(job, v0, 0), v2 = ReferenceStep(job, v1, 1);
  // Chunk 0 was applied at its home (v2's values and velocity), 1 and 2 skipped.
  KeyValues v3 = v1;
  std::copy_n(v2.params.begin(), kChunkElements, v3.params.begin());
  std::copy_n(v2.slots[0].begin(), kChunkElements, v3.slots[0].begin());
  const KeyValues v4 = ReferenceStep(job, v3, 3);
  const auto pull = [](uint64_t v, const std::vector<float>& p) {
    return "pull " + std::to_string(v) + " " + HashFloats(p) + " " + HexFloats(p) + "\n";
  };
  const auto iter = [](uint64_t v, const std::vector<float>& p) {
    return "iter " + std::to_string(v) + " " + HashFloats(p) + "\n";
  };
  const std::string dir = MakeTempDir();
  const auto check = [&](const std::string& rack0, const std::string& rack1) {
    WriteFile(dir + "/0.out", rack0);
    WriteFile(dir + "/1.out", rack1);
    return CheckAgainstReference(job, {{{0, 0}, dir + "/0.out"}, {{1, 0}, dir + "/1.out"}});
  };
  const std::string head = pull(0, v0.params) + iter(1, v1.params) +
                           "resync SERVER ... WORKER_LOST: rack link\n";
  const std::string good = head + pull(3, v3.params) + iter(4, v4.params);
  const ReferenceReport ok = check(good, good + "pull 4 " + HashFloats(v4.params) + "\n");
  EXPECT_EQ(ok.problems, "");
  EXPECT_EQ(ok.steps, 2u);
  EXPECT_EQ(ok.recoveries, 1u);
  EXPECT_EQ(ok.chunks_applied, 1u);
  EXPECT_EQ(ok.chunks_skipped, 2u);

  std::vector<float> wrong = v3.params;
  wrong[kChunkElements + 7] += 1.0f;  // chunk 1: neither skipped nor applied
  const std::string neither = head + pull(3, wrong);
  EXPECT_NE(check(neither, neither).problems.find("chunk 1 (home rack 1) is neither"),
            std::string::npos);
  // The velocity of the skipped chunks moved as if they had been updated.
  KeyValues moved = v3;
  moved.slots[0] = v2.slots[0];
  const std::string bad_velocity = head + pull(3, v3.params) +
                                   iter(4, ReferenceStep(job, moved, 3).params);
  EXPECT_NE(check(bad_velocity, bad_velocity).problems.find("version 4: rack 0 rank 0"),
            std::string::npos);
  EXPECT_NE(check(good, pull(0, v0.params) + iter(1, v2.params)).problems.find("version 1: "),
            std::string::npos);
  const std::string too_low = head + pull(2, v3.params);
  EXPECT_NE(check(too_low, too_low).problems.find("must be at least 3"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Cuts every hub link (each hub's interhub port) after a random delay into a
// training iteration, `cuts` times a connection was destroyed; after each,
// the job must make progress.
// Destroys one established connection to 127.0.0.1:`port`, picked at random
// (one lane's link of one hub); the number destroyed (0 or 1), -1 if ss
// cannot do it here.
int KillOneConnection(uint16_t port, std::mt19937_64& rng) {
  const std::string dst = "127.0.0.1:" + std::to_string(port);
  const CommandResult list =
      RunCommand({"/usr/bin/ss", "-t", "-n", "-H", "state", "established", "dst", dst});
  std::vector<std::string> local_ports;
  std::istringstream in(list.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string recv_q, send_q, local;
    if (l >> recv_q >> send_q >> local) local_ports.push_back(local.substr(local.rfind(':') + 1));
  }
  if (local_ports.empty()) return 0;
  const CommandResult r =
      RunCommand({"/usr/bin/ss", "-K", "-t", "-n", "state", "established", "dst", dst, "sport",
                  "=", ":" + local_ports[rng() % local_ports.size()]});
  if (r.exit_code != 0) return -1;
  return r.out.find(dst) != std::string::npos ? 1 : 0;
}

// Cuts hub links after a random delay into a training iteration until `cuts`
// cuts destroyed a connection; after each, the job must make progress.
// `one_link`: one lane's link of one hub at a time, else every link.
void LinkCutLoop(int racks, uint32_t workers, uint64_t cuts, uint32_t lanes = 1,
                 bool one_link = false) {
  auto rng = Rng();
  CrossRackTraining run(racks, workers, {}, lanes);
  ASSERT_TRUE(run.Start());
  ASSERT_TRUE(run.Progress(0, "at the start"));
  uint64_t done = 0, tries = 0;
  while (done < cuts) {
    ASSERT_LT(tries++, cuts * 5) << "cuts destroyed no connection (links never up?)";
    // The random point of the cut within training (what is tested).
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 25));
    int killed = 0;
    if (one_link) {
      killed = KillOneConnection(run.cluster().interhub_port(rng() % racks), rng);
      if (killed < 0) GTEST_SKIP() << "ss -K cannot destroy sockets here (needs CAP_NET_ADMIN)";
    }
    for (int r = 0; r < racks && !one_link; ++r) {
      const int k = KillConnections(run.cluster().interhub_port(r));
      if (k < 0) GTEST_SKIP() << "ss -K cannot destroy sockets here (needs CAP_NET_ADMIN)";
      killed += k;
    }
    done += killed > 0;
    const uint64_t at_cut = run.workers().MaxIteration();
    ASSERT_TRUE(run.Progress(at_cut + 1, "after cut " + std::to_string(done)));
  }
  run.FinishAndCheck();
  EXPECT_GT(run.workers().Resyncs(), 0u)
      << "no cut met a cross-rack update: the recovery was not exercised";
}

TEST(CrossRackRecovery, HubLinkCutsAtRandomPointsTwoRacks) {
  LinkCutLoop(2, 2, Rounds(20));
}

// Two lanes per hub (a key's chunks on both), one lane's link cut at a time:
// the other lane's updates of the iteration fail too, on every hub.
TEST(CrossRackRecovery, OneLaneLinkCutsAtRandomPointsTwoLanes) {
  LinkCutLoop(2, 1, Rounds(10), 2, true);
}

TEST(CrossRackRecovery, HubLinkCutsAtRandomPointsThreeRacks) {
  LinkCutLoop(3, 1, Rounds(10));
}

// One worker stalls past the straggler timeout: every other worker of every
// rack gets WORKER_LOST, then all continue, the straggler too. 20 rounds
// across racks (about 1.8 s each: the timeout and the recovery), 3 on the
// flat hub (the control).
void StragglerLoop(bool flat) {
  auto rng = Rng();
  CrossRackTraining run(2, 2, {"--straggler-timeout-ms", "1500"}, 1, flat);
  ASSERT_TRUE(run.Start());
  ASSERT_TRUE(run.Progress(0, "at the start"));
  const uint64_t rounds = Rounds(flat ? 3 : 20);
  for (uint64_t round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const uint32_t rack = rng() % 2, rank = rng() % 2;
    std::map<WorkerSet::Member, size_t> lost;
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint32_t k = 0; k < 2; ++k) lost[{r, k}] = run.Count(k, r, "resync", "WORKER_LOST");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 25));  // the random point
    ASSERT_EQ(kill(run.workers().Process(rank, rack)->pid(), SIGSTOP), 0);
    const uint64_t at_stop = run.workers().MaxIteration();
    const auto every_other_lost = [&] {
      for (const auto& [m, n] : lost) {
        if (m != WorkerSet::Member{rack, rank} && run.Count(m.second, m.first, "resync",
                                                            "WORKER_LOST") <= n) {
          return false;
        }
      }
      return true;
    };
    const auto waited = WaitUntil("WORKER_LOST at every worker but the straggler (rack " +
                                      std::to_string(rack) + " rank " + std::to_string(rank) + ")",
                                  every_other_lost);
    ASSERT_EQ(kill(run.workers().Process(rank, rack)->pid(), SIGCONT), 0);
    ASSERT_TRUE(waited) << run.State();
    ASSERT_TRUE(run.Progress(at_stop + 1, "after the straggler"));
  }
  run.FinishAndCheck();
  bool named = false;
  for (int r = 0; r < run.hubs(); ++r) {
    named = named || run.hub(r).Log().find("straggler") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no hub logged the straggler abort\n" << run.State();
}

// kill -9 of a worker of rack 1 at random points; a replacement process for
// the same rank joins; the survivors of both racks and it continue.
void WorkerKill9Loop(bool flat) {
  auto rng = Rng();
  CrossRackTraining run(2, 2, {}, 1, flat);
  ASSERT_TRUE(run.Start());
  ASSERT_TRUE(run.Progress(0, "at the start"));
  const uint64_t rounds = Rounds(6);
  for (uint64_t round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const uint32_t rank = rng() % 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 25));  // the random point
    run.workers().Kill(rank, 1);
    const uint64_t at_kill = run.workers().MaxIteration();
    run.workers().Start(rank, 1);
    ASSERT_TRUE(run.Progress(at_kill + 1, "after the kill of rack 1 rank " + std::to_string(rank)));
  }
  run.FinishAndCheck();
}

TEST(CrossRackRecovery, StragglerAcrossRacksIsAbortedAndEveryoneContinues) {
  StragglerLoop(false);
}

TEST(CrossRackRecovery, WorkerKill9LoopOnOneRack) { WorkerKill9Loop(false); }

// One flat hub serving both racks (no hub links) recovers the same way, with
// the same bits.
TEST(CrossRackRecovery, StragglerOnAFlatHubServingTwoRacks) { StragglerLoop(true); }

TEST(CrossRackRecovery, WorkerKill9LoopOnAFlatHubServingTwoRacks) { WorkerKill9Loop(true); }

}  // namespace
}  // namespace rackhub::testing
