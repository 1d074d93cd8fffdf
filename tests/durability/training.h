// Test support for the durability suite (tests/durability/): a deterministic
// training step that the kill loops run on the hub under test and on an
// uninterrupted reference hub, so that their results can be compared bit for
// bit, and a worker loop that recovers the way docs/durability.md tells a
// trainer to (Pull on kRolledBack / WORKER_LOST / BAD_ITERATION, continue).
//
// Gradient(seed, it, rank, p) = 0.01 * p + u(seed, it, rank, i), u a hash of
// its arguments in [-1, 1): it depends on the parameters (a wrong resume
// shows) and on nothing that differs between runs.
//
// Threading: plain functions; a TrainingKey belongs to one worker thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rackhub/client/client.h"

namespace rackhub::testing {

void Gradient(uint32_t seed, uint64_t iteration, uint32_t rank, std::span<const float> params,
              std::span<float> grad);

// XXH3 of the fp32 bit patterns, as 16 hex digits.
std::string HashFloats(std::span<const float> values);
// Each element's fp32 bit pattern as 8 hex digits, concatenated.
std::string HexFloats(std::span<const float> values);

// One key as a worker trains it.
struct TrainingKey {
  client::KeyId id = 0;
  uint32_t seed = 0;
  std::vector<float> params;  // after the last completed PushPull or Pull
  std::vector<float> grad;
  std::vector<float> out;
  uint64_t iteration = 0;  // the next PushPull contributes to this iteration
};

// Pulls `key` (params and iteration from the hub). False with *error set if
// the Pull failed.
bool PullKey(client::Client& c, TrainingKey& key, client::Error* error);

// Whether a PushPull error is one a trainer recovers from by a Pull.
bool NeedsResync(const client::Error& e);

}  // namespace rackhub::testing
