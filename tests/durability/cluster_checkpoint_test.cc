// Cluster checkpoints of a tenant spanning racks (issue 31 item 2;
// docs/durability.md, Checkpoints; docs/cluster.md): real rackhubd hubs of 2
// and 3 racks finding each other through a real etcd on loopback, each with
// its own state directory, and rackhub-durability-worker processes training
// one dense key "w" of 5 chunks (homes alternating between the racks) with
// momentum, whose velocity lives on each chunk's home hub
// (cross_rack_training.h). What is checked:
//   - create + restore (2 and 3 racks, 2 workers per rack): `rackhubctl
//     checkpoint create` on one hub writes ckpt-<S>.rhc on every hub with the
//     same S and key version V; every hub's file holds the reference's
//     parameters at V (every chunk) and its home chunks' velocity, bit for
//     bit, the reference being V steps from zeros computed here from the
//     inputs (cross_rack_reference.h); `checkpoint list` on a hub lists its
//     own files; a second checkpoint through rack 0's hub; `checkpoint
//     restore job S1` and then `checkpoint restore job` (the newest) through
//     other hubs bring every worker back to V1, then V2 (each one Pulls it)
//     and the job continues;
//   - a checkpoint asked for while a hub is down fails naming its rack
//     (UNAVAILABLE or DEADLINE_EXCEEDED) and leaves no file of that sequence
//     on the live hubs; the restarted hub brings every hub back to the only
//     common checkpoint.
//
//
// Every PushPull result and every Pull of every worker is checked against
// the reference replayed from version 0 through the restores
// (CrossRackJob::rollbacks). The tests wait for events (worker output lines,
// files, process exits), never for time.
// The hub kill -9 loop: cluster_checkpoint_loop_test.cc. Shared support:
// cluster_checkpoint_support.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cluster_checkpoint_support.h"

namespace rackhub::testing {
namespace {

// --- create + restore --------------------------------------------------------

// `rackhubctl checkpoint restore job [SEQ]` through rack `asked`'s hub
// (`seq` 0: the default, which must be `expect`); every worker of every rack
// Pulls `version` and none an older one.
void Restore(CrossRackTraining& run, int asked, uint64_t seq, uint64_t version,
             uint64_t expect = 0) {
  const auto before = LineCounts(run);
  std::vector<std::string> args = {"checkpoint", "restore", "job"};
  if (seq != 0) args.push_back(std::to_string(seq));
  const CommandResult r = Ctl(run.hub(asked).admin_address(), args);
  ASSERT_EQ(r.exit_code, 0) << Describe(r) << run.State();
  EXPECT_EQ(Field(r.out, "sequence"), std::to_string(seq ? seq : expect)) << r.out;
  ASSERT_TRUE(WaitUntil("every worker Pulled version " + std::to_string(version) +
                            " after the restore and pushed from there",
                        [&] {
                          return EveryWorkerHas(run, before, "pull", version) &&
                                 EveryWorkerHas(run, before, "iter", version + 1);
                        }))
      << run.State();
  EXPECT_EQ(LowestPullSince(run, before), version) << "a worker pulled an older version";
}

void CreateAndRestore(int racks) {
  CrossRackTraining run(racks, 2, kNoTriggers, 1, false, /*durable=*/true);
  ASSERT_TRUE(run.Start());
  ASSERT_TRUE(run.Progress(3, "before the checkpoint"));

  // Any hub takes the cluster checkpoint: here the last rack's.
  const int asked = racks - 1;
  const CommandResult created =
      Ctl(run.hub(asked).admin_address(), {"checkpoint", "create", "job"});
  ASSERT_EQ(created.exit_code, 0) << Describe(created) << run.State();
  const uint64_t seq = std::stoull(Field(created.out, "sequence"));
  EXPECT_EQ(Field(created.out, "path"),
            CheckpointDir(run.hub(asked)) + "/" + server::CheckpointFileName(seq))
      << "the reply is the asked hub's own file\n"
      << created.out;
  const std::vector<CheckpointImage> cut = ReadCut(run, seq);
  ASSERT_EQ(cut.size(), static_cast<size_t>(racks)) << run.State();
  uint64_t version = 0;
  ValuesOf(cut.front(), &version);
  EXPECT_GE(version, 3u);

  // The reference at V: V steps from zeros, computed from the inputs.
  const CrossRackJob job = run.Job();
  KeyValues ref{std::vector<float>(kElements, 0.0f), {std::vector<float>(kElements, 0.0f)}};
  for (uint64_t v = 0; v < version; ++v) ref = ReferenceStep(job, ref, v);
  for (int r = 0; r < racks; ++r) {
    uint64_t unused = 0;
    EXPECT_TRUE(SameAsReference(job, ValuesOf(cut[r], &unused), ref, r))
        << "checkpoint " << seq << " on rack " << r << "'s hub (version " << version << ")";
  }

  // `checkpoint list` on each hub lists that hub's own files.
  for (int r = 0; r < racks; ++r) {
    auto stub = admin::v1::CheckpointService::NewStub(
        grpc::CreateChannel(run.hub(r).admin_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    admin::v1::ListCheckpointsRequest req;
    req.set_tenant("job");
    admin::v1::ListCheckpointsResponse resp;
    const grpc::Status s = stub->ListCheckpoints(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << "rack " << r << ": " << s.error_message();
    ASSERT_EQ(resp.checkpoints_size(), 1) << "rack " << r << ": " << resp.DebugString();
    EXPECT_EQ(resp.checkpoints(0).sequence(), seq);
    EXPECT_EQ(resp.checkpoints(0).path(),
              CheckpointDir(run.hub(r)) + "/" + server::CheckpointFileName(seq));
  }

  // Training goes on; a second checkpoint, through rack 0's hub.
  ASSERT_TRUE(run.Progress(version + 3, "after the checkpoint"));
  const CommandResult second = Ctl(run.hub(0).admin_address(), {"checkpoint", "create", "job"});
  ASSERT_EQ(second.exit_code, 0) << Describe(second) << run.State();
  const uint64_t seq2 = std::stoull(Field(second.out, "sequence"));
  EXPECT_GT(seq2, seq);
  const std::vector<CheckpointImage> cut2 = ReadCut(run, seq2);
  ASSERT_EQ(cut2.size(), static_cast<size_t>(racks)) << run.State();
  uint64_t version2 = 0;
  ValuesOf(cut2.front(), &version2);
  EXPECT_GT(version2, version);

  // Restores through other hubs bring every worker of every rack back: to
  // the first (named), then to the newest (the default).
  ASSERT_TRUE(run.Progress(version2 + 3, "after the second checkpoint"));
  ASSERT_NO_FATAL_FAILURE(Restore(run, 0, seq, version));
  ASSERT_NO_FATAL_FAILURE(Restore(run, racks - 1, 0, version2, seq2));  // ahead, maybe
  run.FinishAndCheck();
  EXPECT_GE(run.report().rollbacks, static_cast<uint64_t>(racks) * 2)
      << "not every worker went back to the first checkpoint";
  std::map<std::pair<int, uint64_t>, CheckpointImage> images;
  for (int r = 0; r < racks; ++r) {
    images[{r, seq}] = cut[r];
    images[{r, seq2}] = cut2[r];
  }
  CheckImagesAgainstReference(run, images);
}

// The reference itself follows a restore (no processes): a Pull back to a
// state it verified is accepted and the steps after it are checked from it;
// a restore to values the job never had, or with another velocity, is not.
TEST(ClusterCheckpoint, TheReferenceFollowsARestore) {
  CrossRackJob job;
  job.racks = 2;
  job.workers_per_rack = 1;
  job.elements = 2500;
  job.chunk_elements = kChunkElements;
  job.optimizer.type = aggregation::OptimizerType::kMomentum;
  job.optimizer.learning_rate = 0.05;
  job.optimizer.momentum = 0.9;
  ASSERT_TRUE(aggregation::NormalizeOptimizer(&job.optimizer).ok());
  std::vector<KeyValues> s{
      {std::vector<float>(job.elements, 0.0f), {std::vector<float>(job.elements, 0.0f)}}};
  for (uint64_t v = 0; v < 3; ++v) s.push_back(ReferenceStep(job, s.back(), v));
  const auto pull = [](uint64_t v, const std::vector<float>& p) {
    return "pull " + std::to_string(v) + " " + HashFloats(p) + " " + HexFloats(p) + "\n";
  };
  const auto iter = [](uint64_t v, const std::vector<float>& p) {
    return "iter " + std::to_string(v) + " " + HashFloats(p) + "\n";
  };
  const std::string dir = MakeTempDir();
  const auto check = [&](const std::string& text) {
    WriteFile(dir + "/0.out", text);
    WriteFile(dir + "/1.out", text);
    return CheckAgainstReference(job, {{{0, 0}, dir + "/0.out"}, {{1, 0}, dir + "/1.out"}});
  };
  const std::string head = pull(0, s[0].params) + iter(1, s[1].params) + iter(2, s[2].params) +
                           iter(3, s[3].params) + "resync SERVER ... BAD_ITERATION\n";
  const std::string good = head + pull(1, s[1].params) + iter(2, s[2].params);
  job.rollbacks = true;
  const ReferenceReport ok = check(good);
  EXPECT_EQ(ok.problems, "");
  EXPECT_EQ(ok.rollbacks, 2u);
  EXPECT_EQ(ok.steps, 3u);
  EXPECT_EQ(ok.states.size(), 4u);
  job.rollbacks = false;
  EXPECT_NE(check(good).problems.find("pulled version 1 after version 3"), std::string::npos);
  job.rollbacks = true;
  std::vector<float> never = s[1].params;
  never[5] += 1.0f;
  EXPECT_NE(check(head + pull(1, never)).problems.find("follows from no state"), std::string::npos);
  // Restored with version 3's velocity: the next step shows it.
  const KeyValues wrong{s[1].params, s[3].slots};
  EXPECT_NE(check(head + pull(1, s[1].params) + iter(2, ReferenceStep(job, wrong, 1).params))
                .problems.find("version 2: rack 0 rank 0"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ClusterCheckpoint, CreateAndRestoreTwoRacks) { CreateAndRestore(2); }

TEST(ClusterCheckpoint, CreateAndRestoreThreeRacks) { CreateAndRestore(3); }

// One rack (a single-rack checkpoint): a control for the test's own checks.
TEST(ClusterCheckpoint, CreateAndRestoreOneRackControl) { CreateAndRestore(1); }

// --- a hub down -------------------------------------------------------------

TEST(ClusterCheckpoint, CreateWhileAHubIsDownFailsAndLeavesNoFile) {
  CrossRackTraining run(3, 1, kNoTriggers, 1, false, /*durable=*/true);
  ASSERT_TRUE(run.Start());
  ASSERT_TRUE(run.Progress(2, "at the start"));
  const CommandResult first = Ctl(run.hub(0).admin_address(), {"checkpoint", "create", "job"});
  ASSERT_EQ(first.exit_code, 0) << Describe(first) << run.State();
  const uint64_t seq = std::stoull(Field(first.out, "sequence"));
  const uint64_t version = VersionOf(Complete(run.hub(0)).at(seq));
  ASSERT_EQ(ReadCut(run, seq).size(), 3u);
  ASSERT_TRUE(run.Progress(version + 2, "after the checkpoint"));

  const auto lines = LineCounts(run);
  ASSERT_EQ(run.hub(2).Kill(), 128 + SIGKILL);
  const uint64_t at_kill = run.workers().MaxVersion();  // + 1 at most (a reply on its way)
  for (int asked : {0, 1}) {
    const CommandResult r = Ctl(run.hub(asked).admin_address(),
                                {"checkpoint", "create", "job", "--timeout-ms", "5000"});
    EXPECT_NE(r.exit_code, 0) << "asked rack " << asked << "'s hub\n" << Describe(r);
    EXPECT_TRUE(r.err.find("UNAVAILABLE") != std::string::npos ||
                r.err.find("DEADLINE_EXCEEDED") != std::string::npos)
        << Describe(r);
    EXPECT_NE(r.err.find("rack 2"), std::string::npos) << "the error names the rack that is down\n"
                                                       << Describe(r);
  }
  for (int r : {0, 1}) {
    EXPECT_EQ(Sequences(run.hub(r)), std::set<uint64_t>{seq})
        << "rack " << r << "'s hub keeps a file of a failed checkpoint";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(CheckpointDir(run.hub(r)), ec)) {
      EXPECT_EQ(e.path().filename().string(), server::CheckpointFileName(seq))
          << "rack " << r << "'s hub";
    }
  }

  // Back: every hub returns to the only common checkpoint, and the next one
  // is a cut of every hub again.
  ASSERT_TRUE(run.hub(2).Restart()) << run.hub(2).Log();
  ASSERT_TRUE(run.Progress(at_kill + 1, "after the restart"));
  EXPECT_EQ(LowestPullSince(run, lines), version)
      << "the workers must be brought back to checkpoint " << seq << "\n"
      << run.State();
  const CommandResult next = Ctl(run.hub(2).admin_address(), {"checkpoint", "create", "job"});
  ASSERT_EQ(next.exit_code, 0) << Describe(next) << run.State();
  const uint64_t seq2 = std::stoull(Field(next.out, "sequence"));
  EXPECT_GT(seq2, seq);
  EXPECT_EQ(ReadCut(run, seq2).size(), 3u);
  run.FinishAndCheck();
}

}  // namespace
}  // namespace rackhub::testing
