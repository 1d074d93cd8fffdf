// Test support for the replacement loop (kill_loop_test.cc,
// WorkerReplacementLoop) and its worker (generation_worker.cc): a gradient
// that tells the process that pushed it apart from every other process.
//
// SaltedGradient(salt, rank, step, i) = salt * 256 + h, h = a hash of (salt,
// rank, step, i) in [0, 256). Each process gets its own salt in [1, kMaxSalt]
// from the test, so two processes' values differ at EVERY element (their salts
// differ, and |salt difference| * 256 > 255): a contribution of another
// generation summed in place of the expected one changes every element it
// touches. The values are integers below 2^18, so a sum of a few of them is
// exact in fp32 whatever the order: the expected reply of a sum-only key is
// computed independently of the hub's rank order.
//
// Threading: pure functions.
#pragma once

#include <cstdint>

namespace rackhub::testing {

inline constexpr uint32_t kMaxSalt = 1023;

inline float SaltedGradient(uint32_t salt, uint32_t rank, uint64_t step, uint64_t index) {
  uint64_t x = (uint64_t{salt} << 48) ^ (uint64_t{rank} << 40) ^ (step << 32) ^ index;
  x += 0x9e3779b97f4a7c15ULL;  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<float>(uint64_t{salt} * 256 + (x & 255));
}

}  // namespace rackhub::testing
