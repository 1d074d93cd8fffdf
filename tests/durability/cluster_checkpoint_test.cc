// Cluster checkpoints of a tenant spanning racks (issue 31 item 2;
// docs/durability.md, Checkpoints; docs/cluster.md): real rackhubd hubs of 2
// and 3 racks finding each other through a real etcd on loopback, each with
// its own state directory, and rackhub-durability-worker processes training
// one dense key "w" of 5 chunks (homes alternating between the racks) with
// momentum, whose velocity lives on each chunk's home hub
// (cross_rack_training.h). What is checked:
//
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
//     reference verified, velocity included; 6 such rounds on 3 racks;
//   - a checkpoint asked for while a hub is down fails naming its rack
//     (UNAVAILABLE or DEADLINE_EXCEEDED) and leaves no file of that sequence
//     on the live hubs; the restarted hub brings every hub back to the only
//     common checkpoint.
//
// Every PushPull result and every Pull of every worker is checked against
// the reference replayed from version 0 through the restores
// (CrossRackJob::rollbacks). The tests wait for events (worker output lines,
// files, process exits), never for time; the only sleeps are the random
// delays before a kill (where it lands is what is tested).
// RACKHUB_CKPT_ROUNDS sets the kill loops' rounds (default 20 on 2 racks, 6 on 3;
// tests/durability/kill_loops.sh --checkpoints), RACKHUB_KILL_SEED replays
// the random points.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_file.h"
#include "cluster_fixture.h"
#include "cross_rack_reference.h"
#include "cross_rack_training.h"
#include "data_link.h"  // SameBits
#include "kill_points.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "training.h"
#include "wait.h"

namespace rackhub::testing {
namespace {

namespace fs = std::filesystem;
using server::CheckpointImage;
using server::CheckpointInfo;

const std::vector<std::string> kNoTriggers = {"--checkpoint-every-iterations", "0",
                                              "--checkpoint-every-seconds", "0"};

// The tenant's checkpoint directory on a hub (<state.dir>/checkpoints/
// <handle>-job), "" while there is none.
std::string CheckpointDir(const DaemonProcess& hub) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hub.state_dir() + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.ends_with("-job")) return e.path().string();
  }
  return "";
}

// The complete checkpoint files of the hub that verify (header and
// manifest), by sequence.
std::map<uint64_t, CheckpointInfo> Complete(const DaemonProcess& hub) {
  std::map<uint64_t, CheckpointInfo> out;
  const std::string dir = CheckpointDir(hub);
  if (dir.empty()) return out;
  for (CheckpointInfo& i : server::ListCheckpoints(dir)) {
    if (i.problem.empty()) out.emplace(i.sequence, std::move(i));
  }
  return out;
}

// Key "w"'s version in a checkpoint.
uint64_t VersionOf(const CheckpointInfo& info) {
  for (const auto& [key, version] : info.key_versions) {
    if (key == "w") return version;
  }
  ADD_FAILURE() << info.path << " has no key 'w'";
  return 0;
}

// The sequences complete on every hub in `sets`.
std::set<uint64_t> Common(const std::vector<std::set<uint64_t>>& sets) {
  std::set<uint64_t> common = sets.empty() ? std::set<uint64_t>{} : sets.front();
  for (const auto& s : sets) {
    std::erase_if(common, [&](uint64_t seq) { return !s.count(seq); });
  }
  return common;
}

std::set<uint64_t> Sequences(const DaemonProcess& hub) {
  std::set<uint64_t> out;
  for (const auto& [seq, info] : Complete(hub)) out.insert(seq);
  return out;
}

std::vector<std::set<uint64_t>> EveryHubsSequences(CrossRackTraining& run) {
  std::vector<std::set<uint64_t>> out;
  for (int r = 0; r < run.hubs(); ++r) out.push_back(Sequences(run.hub(r)));
  return out;
}

// Key "w" of an image: version, parameters and state slots, chunks in order.
KeyValues ValuesOf(const CheckpointImage& image, uint64_t* version) {
  KeyValues out;
  for (const auto& k : image.keys) {
    if (k.name != "w") continue;
    *version = k.version;
    out.slots.resize(k.state_slots);
    for (const auto& c : image.chunks) {
      if (c.key_id != k.id) continue;
      out.params.insert(out.params.end(), c.params.begin(), c.params.end());
      for (size_t s = 0; s < c.state.size() && s < out.slots.size(); ++s) {
        out.slots[s].insert(out.slots[s].end(), c.state[s].begin(), c.state[s].end());
      }
    }
  }
  return out;
}

// A hub's file against the reference state `want`: every chunk's parameters,
// and the optimizer state of the chunks the hub is home to (where it lives).
::testing::AssertionResult SameAsReference(const CrossRackJob& job, const KeyValues& got,
                                           const KeyValues& want, int rack) {
  if (!SameBits(got.params, want.params)) {
    return ::testing::AssertionFailure() << "its parameters are not the reference's";
  }
  if (got.slots.size() != want.slots.size()) {
    return ::testing::AssertionFailure()
           << got.slots.size() << " optimizer state slots, not " << want.slots.size();
  }
  for (uint64_t first = 0, c = 0; first < job.elements; first += job.chunk_elements, ++c) {
    if ((c / job.lanes) % job.racks != static_cast<uint64_t>(rack)) continue;
    const size_t n = std::min<uint64_t>(job.chunk_elements, job.elements - first);
    for (size_t s = 0; s < want.slots.size(); ++s) {
      if (got.slots[s].size() != job.elements ||
          std::memcmp(&want.slots[s][first], &got.slots[s][first], n * sizeof(float)) != 0) {
        return ::testing::AssertionFailure()
               << "the optimizer state of chunk " << c << " (its home) is not the reference's";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Checkpoint `seq` on every hub: one consistent cut (the same version and
// parameters everywhere). The hubs' images, by rack.
std::vector<CheckpointImage> ReadCut(CrossRackTraining& run, uint64_t seq) {
  std::vector<CheckpointImage> images;
  uint64_t version0 = 0;
  for (int r = 0; r < run.hubs(); ++r) {
    const std::string path = CheckpointDir(run.hub(r)) + "/" + server::CheckpointFileName(seq);
    Result<CheckpointImage> image = server::ReadCheckpoint(path);
    if (!image.ok()) {
      ADD_FAILURE() << "rack " << r << "'s hub: " << image.status().message();
      return {};
    }
    uint64_t version = 0;
    const KeyValues values = ValuesOf(*image, &version);
    if (r == 0) version0 = version;
    EXPECT_EQ(version, version0) << "checkpoint " << seq << ": key 'w' on rack " << r
                                 << "'s hub is at another version than on rack 0's";
    if (!images.empty()) {
      uint64_t unused = 0;
      EXPECT_TRUE(SameBits(values.params, ValuesOf(images.front(), &unused).params))
          << "checkpoint " << seq << ": rack " << r
          << "'s hub holds other parameters than rack 0's";
    }
    images.push_back(std::move(*image));
  }
  return images;
}

// Every worker file's complete lines so far (a snapshot to read past).
std::map<std::string, size_t> LineCounts(CrossRackTraining& run) {
  std::map<std::string, size_t> out;
  for (const auto& [member, file] : run.workers().files()) {
    out[file] = run.workers().Lines(file).size();
  }
  return out;
}

// The versions pulled since the snapshot, by worker file.
std::map<std::string, std::vector<uint64_t>> PullsSince(CrossRackTraining& run,
                                                        const std::map<std::string, size_t>& at) {
  std::map<std::string, std::vector<uint64_t>> out;
  for (const auto& [member, file] : run.workers().files()) {
    const auto& lines = run.workers().Lines(file);
    const auto it = at.find(file);
    for (size_t i = it == at.end() ? 0 : it->second; i < lines.size(); ++i) {
      if (lines[i].kind == "pull") out[file].push_back(lines[i].iteration);
    }
  }
  return out;
}

// Whether the first resync since the snapshot of each worker of `rack` that
// had one is of `code` (e.g. ROLLED_BACK); else the failure lists them. (A
// worker at the restored version when its hub died needs none.)
::testing::AssertionResult FirstResyncsOfRackAre(CrossRackTraining& run,
                                                 const std::map<std::string, size_t>& at,
                                                 uint32_t rack, const std::string& code) {
  bool ok = true;
  std::string seen;
  for (const auto& [member, file] : run.workers().files()) {
    if (member.first != rack) continue;
    const auto& lines = run.workers().Lines(file);
    const auto it = at.find(file);
    bool first = true;
    for (size_t i = it == at.end() ? 0 : it->second; i < lines.size(); ++i) {
      if (lines[i].kind != "resync") continue;
      seen += "rank " + std::to_string(member.second) + ":" + lines[i].text + "\n";
      ok = ok && (!first || lines[i].text.find(code) != std::string::npos);
      first = false;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the resyncs of rack " << rack << "'s workers:\n" << seen;
}

// The lowest version any worker pulled since the snapshot (nullopt: none).
std::optional<uint64_t> LowestPullSince(CrossRackTraining& run,
                                        const std::map<std::string, size_t>& at) {
  std::optional<uint64_t> low;
  for (const auto& [file, versions] : PullsSince(run, at)) {
    for (uint64_t v : versions) low = std::min(low.value_or(v), v);
  }
  return low;
}

// Every current worker has a line of `kind` (pull, iter) at `version` since
// the snapshot.
bool EveryWorkerHas(CrossRackTraining& run, const std::map<std::string, size_t>& at,
                    const std::string& kind, uint64_t version) {
  std::set<WorkerSet::Member> found;
  for (const auto& [member, file] : run.workers().files()) {
    const auto& lines = run.workers().Lines(file);
    const auto it = at.find(file);
    for (size_t i = it == at.end() ? 0 : it->second; i < lines.size(); ++i) {
      if (lines[i].kind == kind && lines[i].iteration == version) found.insert(member);
    }
  }
  return found.size() == static_cast<size_t>(run.racks()) * run.workers_per_rack();
}

// After the job finished: each checkpoint read during the test is a state
// the reference verified (parameters and the home chunks' velocity).
void CheckImagesAgainstReference(
    CrossRackTraining& run, const std::map<std::pair<int, uint64_t>, CheckpointImage>& images) {
  const CrossRackJob job = run.Job();
  const auto& states = run.report().states;
  size_t checked = 0;
  for (const auto& [at, image] : images) {
    uint64_t version = 0;
    const KeyValues got = ValuesOf(image, &version);
    const auto want = states.find({version, HashFloats(got.params)});
    if (want == states.end()) {
      const auto any = states.lower_bound({version, ""});
      EXPECT_TRUE(any == states.end() || any->first.first != version)
          << "checkpoint " << at.second << " on rack " << at.first << "'s hub: version " << version
          << " holds parameters no worker saw at that version";
      continue;
    }
    EXPECT_TRUE(SameAsReference(job, got, want->second, at.first))
        << "checkpoint " << at.second << " on rack " << at.first << "'s hub, version " << version;
    ++checked;
  }
  std::printf("%zu checkpoint files checked against the reference (of %zu read)\n", checked,
              images.size());
}

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
