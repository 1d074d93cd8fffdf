// Cluster checkpoints of a tenant spanning racks, the hub kill -9 loops (issue 31 item 2;
// docs/durability.md, Checkpoints; docs/cluster.md): real rackhubd hubs of 2
// and 3 racks finding each other through a real etcd on loopback, each with
// its own state directory, and rackhub-durability-worker processes training
// one dense key "w" of 5 chunks (homes alternating between the racks) with
// momentum, whose velocity lives on each chunk's home hub
// (cross_rack_training.h). What is checked:
//   - a hub kill -9 loop on 2 racks (checkpoint.every_iterations = 3 on
//     every hub; only rack 0's triggers, its log shows): each round kills a
//     random hub (every fifth round every hub) at a random point, half of
//     the rounds while that hub writes a checkpoint file, and restarts it.
//     The files complete on every hub before the kill are read from the
//     state directories; the version the workers are brought back to must
//     be at least that of the newest of them (exactly it when every hub was
//     killed), never older; the job must move past where it was; the first
//     resync of a worker of the restarted hub (one hub killed) is
//     kRolledBack. Every common checkpoint is one consistent cut (same
//     version, same parameters on every hub) and, at the end, a state the
//     reference verified, velocity included; 6 such rounds on 3 racks, and a
//     one-rack control (single-rack checkpoints).
// Every PushPull result and every Pull of every worker is checked against
// the reference replayed from version 0 through the restores
// (CrossRackJob::rollbacks). The tests wait for events (worker output lines,
// files, process exits), never for time; the only sleeps are the random
// delays before a kill (where it lands is what is tested).
// RACKHUB_CKPT_ROUNDS sets the kill loops' rounds (default 20 on 2 racks, 6 on 3;
// tests/durability/kill_loops.sh --checkpoints), RACKHUB_KILL_SEED replays
// the random points.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cluster_checkpoint_support.h"

namespace rackhub::testing {
namespace {

// --- hub kill -9 loop -------------------------------------------------------

// `ci_rounds` rounds; RACKHUB_CKPT_ROUNDS replaces it.
void HubKill9Loop(int racks, uint64_t ci_rounds) {
  auto rng = Rng();
  const uint64_t rounds = EnvOr("RACKHUB_CKPT_ROUNDS", ci_rounds);
  CrossRackTraining run(racks, 2,
                        {"--checkpoint-every-iterations", "3", "--checkpoint-every-seconds", "0"},
                        1, false, /*durable=*/true);
  ASSERT_TRUE(run.Start());
  // Without a checkpoint on every hub a restarted hub's chunks are lost
  // (docs/cluster.md): the first kill waits for one.
  ASSERT_TRUE(WaitUntil("a checkpoint complete on every hub", [&] {
    return !Common(EveryHubsSequences(run)).empty();
  })) << run.State();
  std::map<std::pair<int, uint64_t>, CheckpointImage> images;
  uint64_t during_write = 0, rolled_back = 0, every_hub = 0;
  for (uint64_t round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const bool all = round % 5 == 4;
    const int victim = static_cast<int>(rng() % racks);
    std::vector<int> victims{victim};
    for (int r = 0; r < racks && all; ++r) {
      if (r != victim) victims.push_back(r);
    }
    if (round % 2 == 1) {
      // While the victim writes a checkpoint file, if one shows up soon.
      during_write += static_cast<bool>(WaitUntil(
          "a checkpoint being written on rack " + std::to_string(victim) + "'s hub",
          [&] {
            std::error_code ec;
            for (const auto& e : fs::directory_iterator(CheckpointDir(run.hub(victim)), ec)) {
              if (e.path().extension() == ".tmp") return true;
            }
            return false;
          },
          std::chrono::milliseconds(1000), std::chrono::milliseconds(1)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 25));  // the random point
    }
    // Complete before the kill: a live hub's files now, a victim's after it.
    const std::vector<std::set<uint64_t>> before = EveryHubsSequences(run);
    const auto lines = LineCounts(run);
    for (int v : victims) ASSERT_EQ(run.hub(v).Kill(), 128 + SIGKILL);
    // No update completes without the killed hub; a reply already on its way
    // may still take a worker one further, no more.
    const uint64_t at_kill = run.workers().MaxVersion();
    std::vector<std::set<uint64_t>> sets = before;
    for (int v : victims) sets[v] = Sequences(run.hub(v));
    const std::set<uint64_t> common = Common(sets);
    ASSERT_FALSE(common.empty()) << "no checkpoint complete on every hub\n" << run.State();
    const uint64_t newest = *common.rbegin();
    const uint64_t bound = VersionOf(Complete(run.hub(victims.front())).at(newest));
    std::vector<CheckpointImage> cut = ReadCut(run, newest);
    for (size_t r = 0; r < cut.size(); ++r)
      images[{static_cast<int>(r), newest}] = std::move(cut[r]);
    for (int v : victims) ASSERT_TRUE(run.hub(v).Restart(false)) << run.hub(v).Log();
    for (int v : victims) ASSERT_TRUE(run.hub(v).WaitReady()) << run.hub(v).Log();
    ASSERT_TRUE(run.Progress(
        at_kill + 1, "after the restart of rack " + std::to_string(victims.back()) + "'s hub"));
    every_hub += all;
    const std::optional<uint64_t> low = LowestPullSince(run, lines);
    if (!low) continue;  // nothing to roll back (the checkpoint was the newest version)
    rolled_back += *low < at_kill;
    for (int v : victims) {
      // The restarted hub's workers reconnect to a hub at another version
      // (with every hub killed, one after the other, a worker may get
      // WORKER_LOST for the first before its own hub dies).
      if (*low >= at_kill || all) continue;
      EXPECT_TRUE(FirstResyncsOfRackAre(run, lines, static_cast<uint32_t>(v), "ROLLED_BACK"))
          << "a worker of rack " << v << " did not get kRolledBack first from its restarted "
          << "hub (rolled back from " << at_kill << " to " << *low << ")";
    }
    EXPECT_GE(*low, bound) << "the workers were brought back to version " << *low
                           << ", older than checkpoint " << newest << " (version " << bound
                           << ") complete on every hub before the kill\n"
                           << run.State();
    if (all) {
      EXPECT_EQ(*low, bound) << "every hub was killed: they must resume checkpoint " << newest
                             << ", the newest on every hub\n"
                             << run.State();
    }
  }
  run.FinishAndCheck();
  CheckImagesAgainstReference(run, images);
  EXPECT_GT(rolled_back, 0u) << "no kill ever rolled the job back";
  // For a tenant spanning racks only rack 0's hub triggers (and coordinates).
  const std::string coordinated = "cluster checkpoint ckpt-";
  for (int r = 0; r < racks; ++r) {
    const bool found = run.hub(r).Log().find(coordinated) != std::string::npos;
    EXPECT_EQ(found, racks > 1 && r == 0)
        << "rack " << r << "'s hub: the log line '" << coordinated << "... written on every "
        << "rack's hub'";
  }
  std::printf(
      "cluster checkpoint kill loop: %llu rounds (%llu during a checkpoint write, %llu "
      "of every hub), %llu rolled back\n",
      static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(during_write),
      static_cast<unsigned long long>(every_hub), static_cast<unsigned long long>(rolled_back));
}

TEST(ClusterCheckpoint, HubKill9LoopTwoRacks) { HubKill9Loop(2, 20); }

TEST(ClusterCheckpoint, HubKill9LoopThreeRacks) { HubKill9Loop(3, 6); }

// The same loop on a one-rack cluster (single-rack checkpoints, which predate
// cluster checkpoints): a control for the loop's own checks.
TEST(ClusterCheckpoint, HubKill9LoopOneRackControl) { HubKill9Loop(1, 6); }

}  // namespace
}  // namespace rackhub::testing
