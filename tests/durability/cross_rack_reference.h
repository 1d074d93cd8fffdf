// Test support for cross_rack_recovery_test.cc: an independent reference for
// a sync tenant spanning racks whose workers (rackhub-durability-worker
// --rack R --dump-pulls) train one dense key through link cuts, stragglers
// and killed workers, and recover by a Pull.
//
// The reference replays the key from its first pulled version, by the hub's
// arithmetic as docs/architecture.md states it (Hierarchical rack exchange):
// each rack's ranks' gradients summed in fp32 in rank order, the racks' sums
// added in rack order, the optimizer applied with the mean over all
// racks * W workers (aggregation::ApplyOptimizer, the hub's fused fp32 step,
// which kernels_test and kernel_paths_test check against scalar formulas).
// The gradient of each rank at iteration v is the workers' deterministic
// Gradient(seed, v, 64 * rack + rank, params(v)) (training.h), so the step
// from v needs nothing but params(v), which every worker must share.
//
// What it checks, from every generation's output file:
//   - no "error" line; each worker's versions go up (a PushPull takes v to
//     v + 1, a Pull never goes back);
//   - every worker that saw a version saw the same parameters (hashes of
//     PushPull results, hashes and full values of Pulls);
//   - a version some worker reached by a PushPull (v + 1 from v) is exactly
//     the reference step from v;
//   - a version reached only by Pulls (a recovery round, V after v) holds,
//     chunk by chunk, either v's parameters (a skipped step) or the reference
//     step from v (the chunk's home applied that update before the round),
//     and V = v + 1 only if no chunk was applied (V is 1 + the newest version
//     any hub held). The optimizer state (momentum's velocity, Adam's moments)
//     is tracked per chunk the same way: advanced where the update was
//     applied, kept where the step was skipped. Where a chunk's home applied
//     an update nobody saw, the inputs of that update were still every
//     rank's gradient from v (no rank can push v + 1 without seeing v + 1).
//   - with `rollbacks` (a durable cluster that restores checkpoints,
//     cluster_checkpoint_test.cc): a Pull may go back to an older version,
//     whose values must be a state the reference already verified (a
//     checkpoint is a state the job reached; its optimizer state comes with
//     it); the job then has several histories, so the reference tracks
//     states by (version, params hash), each derived from the one before it
//     in some worker's file: a PushPull result is the step from the
//     worker's previous state, a realigned Pull is explained by the newest
//     verified state below its version. Without `rollbacks`, versions only
//     go up and every worker at a version saw the same parameters.
//
// Threading: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::testing {

struct CrossRackJob {
  uint32_t racks = 2;
  uint32_t workers_per_rack = 1;
  uint32_t lanes = 1;  // for naming a chunk's home: (chunk / lanes) % racks (the
                       // tenant's only key, so its chunk c is tenant-wide chunk c)
  uint64_t elements = 0;
  uint64_t chunk_elements = 0;
  uint32_t seed = 7;  // rackhub-durability-worker's key seed
  aggregation::OptimizerConfig optimizer;  // as the workers declare it
  bool rollbacks = false;  // a Pull may go back to a verified state (above)
};

// The key's parameters and optimizer state slots (OptimizerStateSlots many).
struct KeyValues {
  std::vector<float> params;
  std::vector<std::vector<float>> slots;
};

struct ReferenceReport {
  std::string problems;  // empty: every check passed
  uint64_t versions = 0;        // distinct versions the workers saw
  uint64_t steps = 0;           // versions reached by a PushPull, checked against the step
  uint64_t recoveries = 0;      // versions reached only by Pulls
  uint64_t chunks_applied = 0;  // chunks of those found one update ahead (applied at home)
  uint64_t chunks_skipped = 0;  // chunks of those found unchanged (skipped step)
  uint64_t rollbacks = 0;       // Pulls that went back to an older version
  uint64_t newest = 0;
  // Every state the reference verified, by (version, HashFloats of params).
  std::map<std::pair<uint64_t, std::string>, KeyValues> states;
  std::string Summary() const;
};

// The update from `from` (the key at version v) by every rank's gradient of
// iteration v, as the hubs compute it.
KeyValues ReferenceStep(const CrossRackJob& job, const KeyValues& from, uint64_t v);

// `files`: every generation's output file, with its (rack, rank).
ReferenceReport CheckAgainstReference(
    const CrossRackJob& job,
    const std::vector<std::pair<std::pair<uint32_t, uint32_t>, std::string>>& files);

}  // namespace rackhub::testing
