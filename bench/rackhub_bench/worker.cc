// Worker mode of rackhub-bench: push_pull loop, timing and verification.
#include <chrono>
#include <filesystem>
#include <thread>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench.h"
#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/client/client.h"

namespace rackhub::bench {

namespace agg = rackhub::aggregation;

float Gradient(uint32_t rank, uint64_t iteration, uint32_t key, uint64_t index) {
  // A cheap integer hash; the top 24 bits become a float in [-0.5, 0.5)
  // exactly, then one rounding multiply: identical on every machine.
  uint32_t x = static_cast<uint32_t>(index) * 2654435761u;
  x ^= (rank + 1) * 0x9E3779B9u;
  x ^= static_cast<uint32_t>(iteration + 1) * 0x85EBCA6Bu;
  x ^= (key + 1) * 0xC2B2AE35u;
  x ^= x >> 15;
  x *= 0x27D4EB2Fu;
  x ^= x >> 13;
  return (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.01f;
}

std::string EncodeOptimizer(const agg::OptimizerConfig& c) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%d,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%d",
                static_cast<int>(c.type), c.learning_rate, c.momentum, c.weight_decay, c.beta1,
                c.beta2, c.epsilon, c.initial_accumulator, static_cast<int>(c.reduction));
  return buf;
}

bool DecodeOptimizer(const std::string& text, agg::OptimizerConfig* c) {
  int type = 0, reduction = 0;
  const int n = std::sscanf(text.c_str(), "%d,%lg,%lg,%lg,%lg,%lg,%lg,%lg,%d", &type,
                            &c->learning_rate, &c->momentum, &c->weight_decay, &c->beta1,
                            &c->beta2, &c->epsilon, &c->initial_accumulator, &reduction);
  c->type = static_cast<agg::OptimizerType>(type);
  c->reduction = static_cast<agg::Reduction>(reduction);
  return n == 9;
}

namespace {

// The hub's view of one key, recomputed locally.
struct Reference {
  agg::AlignedBuffer<float> params, next, state0, state1, sum, scratch, rack_sum;
  explicit Reference(size_t n)
      : params(n), next(n), state0(n), state1(n), sum(n), scratch(n), rack_sum(n) {}
};

int Fail(const WorkerParams& p, const std::string& what, const client::Error& e) {
  std::fprintf(stderr, "rackhub-bench worker %u: %s: %s\n", p.rank, what.c_str(),
               e.message.c_str());
  return 1;
}

}  // namespace

// Waits until every worker reached `iteration` (see WorkerParams::barrier_dir).
bool Barrier(const WorkerParams& p, uint32_t iteration) {
  const uint32_t members = p.racks * p.workers;
  auto name = [&](uint32_t m) {
    return p.barrier_dir + "/it" + std::to_string(iteration) + "-m" + std::to_string(m);
  };
  std::ofstream(name(p.rack * p.workers + p.rank)).put('.');
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (uint32_t m = 0; m < members;) {
    if (std::filesystem::exists(name(m))) {
      ++m;
    } else if (std::chrono::steady_clock::now() > deadline) {
      return false;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return true;
}

int RunWorker(const WorkerParams& p) {
  std::ifstream tf(p.token_file);
  std::string token;
  tf >> token;
  client::Options options;
  options.hub = p.hub;
  options.tenant = p.tenant;
  options.token = token;
  options.rank = p.rank;
  options.rack = p.rack;
  options.transport = p.transport == "rdma"   ? client::Transport::kRdma
                      : p.transport == "auto" ? client::Transport::kAuto
                                              : client::Transport::kTcp;
  options.rdma_hub = p.rdma_hub;
  options.shm_busy_poll = p.busy_poll;
  options.shm = p.transport == "shm"    ? client::Shm::kOn
                : p.transport == "auto" ? client::Shm::kAuto
                                        : client::Shm::kOff;
  // Soft-RoCE under emulation (the CI VM) is slow to connect.
  options.connect_timeout = std::chrono::seconds(60);
  client::Error error;
  auto c = client::Client::Connect(options, &error);
  if (!c) return Fail(p, "connect to " + p.hub, error);

  const agg::ElementType wire = static_cast<agg::ElementType>(p.dtype);
  const std::vector<uint64_t> sizes = KeyElements(p);
  std::vector<client::KeyId> ids(p.keys);
  for (uint32_t k = 0; k < p.keys; ++k) {
    client::KeyDecl decl;
    decl.name = "bench.k" + std::to_string(k);
    decl.elements = sizes[k];
    decl.dtype = static_cast<client::DType>(p.dtype);
    if (auto e = c->DeclareKey(decl, &ids[k]); !e.ok()) return Fail(p, "declare " + decl.name, e);
  }
  std::vector<agg::AlignedBuffer<float>> grad_store, outs;
  std::vector<client::LeasedBuffer> leases(p.keys);
  std::vector<std::span<float>> grads;
  std::vector<std::unique_ptr<Reference>> refs;
  for (uint32_t k = 0; k < p.keys; ++k) {
    if (p.lease) {
      if (auto e = c->Lease(ids[k], &leases[k]); !e.ok()) return Fail(p, "lease", e);
      grads.push_back(leases[k].floats());
    } else {
      grads.push_back(grad_store.emplace_back(sizes[k]).span());
    }
    outs.emplace_back(sizes[k]);
    if (p.verify) refs.push_back(std::make_unique<Reference>(sizes[k]));
  }
  std::vector<uint16_t> wire_tmp;
  // Start and end of every timed iteration on the host-wide monotonic clock,
  // so the coordinator can time each iteration from the moment the LAST
  // worker started it (as if they had passed a barrier, like gloo's bench).
  std::vector<double> times_ms, start_ms, end_ms;
  auto clock_ms = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t.time_since_epoch()).count();
  };
  bool verified = p.verify;
  uint64_t mismatches = 0;
  const uint32_t total_iterations = p.warmup + p.iterations;
  for (uint32_t it = 0; it < total_iterations; ++it) {
    const uint32_t me = p.rack * p.workers + p.rank;
    for (uint32_t k = 0; k < p.keys; ++k) {
      float* g = grads[k].data();
      for (uint64_t i = 0; i < sizes[k]; ++i) g[i] = Gradient(me, it, k, i);
    }
    if (!p.barrier_dir.empty() && !Barrier(p, it)) {
      std::fprintf(stderr, "rackhub-bench worker %u: the other workers did not reach iteration %u\n",
                   p.rank, it);
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<client::Ticket> tickets(p.keys);
    for (uint32_t k = 0; k < p.keys; ++k) {
      tickets[k] = c->PushPull(ids[k], grads[k], outs[k].span());
    }
    for (uint32_t k = 0; k < p.keys; ++k) {
      if (auto e = c->Wait(tickets[k]); !e.ok()) {
        return Fail(p, "push_pull iteration " + std::to_string(it), e);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= p.warmup) {
      times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      start_ms.push_back(clock_ms(t0));
      end_ms.push_back(clock_ms(t1));
    }
    if (!p.verify) continue;
    for (uint32_t k = 0; k < p.keys; ++k) {
      Reference& r = *refs[k];
      const size_t n = sizes[k];
      wire_tmp.resize(n * 2);
      for (uint32_t rack = 0; rack < p.racks; ++rack) {
        // One rack's sum, in rank order (into `sum` directly for rack 0).
        float* rack_sum = rack == 0 ? r.sum.data() : r.rack_sum.data();
        for (uint32_t rank = 0; rank < p.workers; ++rank) {
          float* g = r.scratch.data();
          for (size_t i = 0; i < n; ++i) g[i] = Gradient(rack * p.workers + rank, it, k, i);
          // What the hub receives: the gradient in the wire type.
          const void* src = g;
          if (wire != agg::ElementType::kFp32) {
            agg::CopyOut(wire_tmp.data(), g, n, wire);
            src = wire_tmp.data();
          }
          if (rank == 0) {
            agg::CopyIn(rack_sum, src, n, wire);
          } else {
            agg::AddIn(rack_sum, src, n, wire);
          }
        }
        // Rack sums travel and add in fp32, in rack order.
        if (rack > 0) agg::AddIn(r.sum.data(), rack_sum, n, agg::ElementType::kFp32);
      }
      const agg::OptimizerStep step{
          p.optimizer.reduction == agg::Reduction::kMean
              ? static_cast<float>(1.0 / (p.racks * p.workers))
              : 1.0f,
          it + 1ull};
      agg::ApplyOptimizer(p.optimizer, step, r.sum.data(), r.params.data(), r.next.data(),
                          r.state0.data(), r.state1.data(), n);
      std::swap(r.params, r.next);
      // What the hub sends back: the master copy in the wire type.
      const float* expect = r.params.data();
      if (wire != agg::ElementType::kFp32) {
        agg::CopyOut(wire_tmp.data(), r.params.data(), n, wire);
        agg::CopyIn(r.scratch.data(), wire_tmp.data(), n, wire);
        expect = r.scratch.data();
      }
      if (std::memcmp(expect, outs[k].data(), n * sizeof(float)) != 0) {
        verified = false;
        for (size_t i = 0; i < n; ++i) mismatches += std::memcmp(&expect[i], &outs[k].data()[i], 4) != 0;
      }
    }
  }
  c->Close();
  std::ofstream out(p.result_file, std::ios::trunc);
  out << "{\"rank\":" << p.rank << ",\"transport\":\"" << c->transport() << "\""
      << ",\"verified\":" << (verified ? "true" : "false")
      << ",\"mismatches\":" << mismatches << ",\"times_ms\":[";
  for (size_t i = 0; i < times_ms.size(); ++i) out << (i ? "," : "") << times_ms[i];
  // FNV-1a over the final parameters of every key: equal digests mean
  // bitwise-equal results (e.g. hierarchical vs. flat runs).
  uint64_t digest = 1469598103934665603ull;
  for (uint32_t k = 0; k < p.keys; ++k) {
    const auto* b = reinterpret_cast<const unsigned char*>(outs[k].data());
    for (size_t i = 0; i < sizes[k] * sizeof(float); ++i) digest = (digest ^ b[i]) * 1099511628211ull;
  }
  out << "],\"digest\":\"" << std::hex << digest << std::dec << "\"";
  out << ",\"start_ms\":[";
  out.precision(15);
  for (size_t i = 0; i < start_ms.size(); ++i) out << (i ? "," : "") << start_ms[i];
  out << "],\"end_ms\":[";
  for (size_t i = 0; i < end_ms.size(); ++i) out << (i ? "," : "") << end_ms[i];
  out << "]}\n";
  return out.good() ? 0 : 1;
}

}  // namespace rackhub::bench
