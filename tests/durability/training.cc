#include "training.h"

#include <cstdio>
#include <cstring>

#include <xxhash.h>

namespace rackhub::testing {

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void Gradient(uint32_t seed, uint64_t iteration, uint32_t rank, std::span<const float> params,
              std::span<float> grad) {
  const uint64_t base = Mix((uint64_t{seed} << 40) ^ (iteration << 8) ^ rank);
  for (size_t i = 0; i < grad.size(); ++i) {
    const uint64_t h = Mix(base + i);
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    grad[i] = 0.01f * params[i] + u;
  }
}

std::string HashFloats(std::span<const float> values) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(values.data(), values.size_bytes())));
  return buf;
}

std::string HexFloats(std::span<const float> values) {
  std::string out(values.size() * 8, '0');
  char buf[9];
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    std::snprintf(buf, sizeof buf, "%08x", bits);
    std::memcpy(&out[i * 8], buf, 8);
  }
  return out;
}

bool PullKey(client::Client& c, TrainingKey& key, client::Error* error) {
  *error = c.Wait(c.Pull(key.id, key.params));
  if (!error->ok()) return false;
  key.iteration = c.GetKeyInfo(key.id)->next_iteration;
  return true;
}

bool NeedsResync(const client::Error& e) {
  return e.code == client::ErrorCode::kRolledBack ||
         (e.code == client::ErrorCode::kServer &&
          (e.wire == client::WireError::kWorkerLost ||
           e.wire == client::WireError::kBadIteration));
}

}  // namespace rackhub::testing
