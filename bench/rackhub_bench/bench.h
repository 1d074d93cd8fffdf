// rackhub-bench: end-to-end push_pull benchmark with verification.
//
// The coordinator (main) starts or uses a hub, creates a tenant through the
// admin API, spawns W worker processes (this same binary in worker mode), and
// aggregates what they report. Each worker runs I iterations of push_pull over
// K keys holding M bytes in all, and checks every iteration's parameters
// bit for bit against a local reference: the same gradients of every rank
// (generated deterministically), summed in rank order, then the same fused
// optimizer kernel the hub runs.
//
// Single-threaded code apart from the client library's I/O thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::bench {

enum class WireType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };

struct WorkerParams {
  std::string hub;         // data-plane HOST:PORT
  std::string tenant;
  std::string token_file;
  std::string result_file;  // where the worker writes its JSON result
  uint32_t rank = 0;
  uint32_t workers = 2;
  uint64_t bytes = 64ull << 20;  // fp32 model bytes over all keys
  uint32_t keys = 4;
  uint32_t iterations = 20;
  uint32_t warmup = 2;  // extra untimed (but verified) iterations first
  WireType dtype = WireType::kFp32;
  aggregation::OptimizerConfig optimizer;  // normalized, as the hub holds it
  bool verify = true;
};

// Runs one worker; returns the process exit code.
int RunWorker(const WorkerParams& params);

// Deterministic gradient of element `index` of key `key` for (rank, iteration).
float Gradient(uint32_t rank, uint64_t iteration, uint32_t key, uint64_t index);

// Serializes the optimizer for the worker command line and back.
std::string EncodeOptimizer(const aggregation::OptimizerConfig& c);
bool DecodeOptimizer(const std::string& text, aggregation::OptimizerConfig* c);

}  // namespace rackhub::bench
