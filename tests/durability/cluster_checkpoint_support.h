// Shared support of the cluster checkpoint tests (cluster_checkpoint_test.cc:
// create, restore, a hub down; cluster_checkpoint_loop_test.cc: the hub kill -9
// loop): a hub's checkpoint files read from its state directory, the cut
// every hub holds, comparisons with the reference (cross_rack_reference.h),
// and the worker output lines (versions pulled, resyncs) since a snapshot.
// Test-only; the gtest thread calls it.
#pragma once

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

namespace fs = std::filesystem;
using server::CheckpointImage;
using server::CheckpointInfo;

inline const std::vector<std::string> kNoTriggers = {"--checkpoint-every-iterations", "0",
                                              "--checkpoint-every-seconds", "0"};

// The tenant's checkpoint directory on a hub (<state.dir>/checkpoints/
// <handle>-job), "" while there is none.
inline std::string CheckpointDir(const DaemonProcess& hub) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hub.state_dir() + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.ends_with("-job")) return e.path().string();
  }
  return "";
}

// The complete checkpoint files of the hub that verify (header and
// manifest), by sequence.
inline std::map<uint64_t, CheckpointInfo> Complete(const DaemonProcess& hub) {
  std::map<uint64_t, CheckpointInfo> out;
  const std::string dir = CheckpointDir(hub);
  if (dir.empty()) return out;
  for (CheckpointInfo& i : server::ListCheckpoints(dir)) {
    if (i.problem.empty()) out.emplace(i.sequence, std::move(i));
  }
  return out;
}

// Key "w"'s version in a checkpoint.
inline uint64_t VersionOf(const CheckpointInfo& info) {
  for (const auto& [key, version] : info.key_versions) {
    if (key == "w") return version;
  }
  ADD_FAILURE() << info.path << " has no key 'w'";
  return 0;
}

// The sequences complete on every hub in `sets`.
inline std::set<uint64_t> Common(const std::vector<std::set<uint64_t>>& sets) {
  std::set<uint64_t> common = sets.empty() ? std::set<uint64_t>{} : sets.front();
  for (const auto& s : sets) {
    std::erase_if(common, [&](uint64_t seq) { return !s.count(seq); });
  }
  return common;
}

inline std::set<uint64_t> Sequences(const DaemonProcess& hub) {
  std::set<uint64_t> out;
  for (const auto& [seq, info] : Complete(hub)) out.insert(seq);
  return out;
}

inline std::vector<std::set<uint64_t>> EveryHubsSequences(CrossRackTraining& run) {
  std::vector<std::set<uint64_t>> out;
  for (int r = 0; r < run.hubs(); ++r) out.push_back(Sequences(run.hub(r)));
  return out;
}

// Key "w" of an image: version, parameters and state slots, chunks in order.
inline KeyValues ValuesOf(const CheckpointImage& image, uint64_t* version) {
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
inline ::testing::AssertionResult SameAsReference(const CrossRackJob& job, const KeyValues& got,
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
inline std::vector<CheckpointImage> ReadCut(CrossRackTraining& run, uint64_t seq) {
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
inline std::map<std::string, size_t> LineCounts(CrossRackTraining& run) {
  std::map<std::string, size_t> out;
  for (const auto& [member, file] : run.workers().files()) {
    out[file] = run.workers().Lines(file).size();
  }
  return out;
}

// The versions pulled since the snapshot, by worker file.
inline std::map<std::string, std::vector<uint64_t>> PullsSince(CrossRackTraining& run,
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
inline ::testing::AssertionResult FirstResyncsOfRackAre(CrossRackTraining& run,
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
inline std::optional<uint64_t> LowestPullSince(CrossRackTraining& run,
                                        const std::map<std::string, size_t>& at) {
  std::optional<uint64_t> low;
  for (const auto& [file, versions] : PullsSince(run, at)) {
    for (uint64_t v : versions) low = std::min(low.value_or(v), v);
  }
  return low;
}

// Every current worker has a line of `kind` (pull, iter) at `version` since
// the snapshot.
inline bool EveryWorkerHas(CrossRackTraining& run, const std::map<std::string, size_t>& at,
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
inline void CheckImagesAgainstReference(
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

}  // namespace rackhub::testing
