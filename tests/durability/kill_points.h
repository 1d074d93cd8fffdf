// Test support for the kill and cut loops (kill_loop_test.cc,
// cross_rack_recovery_test.cc): the loops' numbers from the environment and
// the random points they kill or cut at. RACKHUB_KILL_SEED replays the random
// points of an earlier run (each run prints its seed once).
//
// Threading: call from the test's main thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace rackhub::testing {

inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

inline uint64_t Seed() {
  static const uint64_t seed = [] {
    const uint64_t s = EnvOr("RACKHUB_KILL_SEED",
                             static_cast<uint64_t>(
                                 std::chrono::steady_clock::now().time_since_epoch().count()));
    std::printf("RACKHUB_KILL_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::mt19937_64 Rng() { return std::mt19937_64(Seed()); }

}  // namespace rackhub::testing
