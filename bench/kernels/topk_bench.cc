// rackhub-topk-bench: worker-side top-k sparsification (topk.h) against
// memcpy of the same bytes, measured in the same run (yardstick as
// rackhub-kernel-bench: bench/README.md).
//
// For chunks of 32Ki, 1Mi and 16Mi floats and ratios 0.1, 0.01 and 0.001
// (k = TopKCount(ratio, n)), per round and per (size, ratio), one after the
// other:
//   compress  CompressTopK with error feedback (residual += grad, select,
//             values, zero the sent entries) on one residual per size
//   select    SelectTopK alone on the gradient
//   memcpy    memcpy of the gradient's n*4 bytes into another buffer
// Rate = n*4 bytes of gradient / thread CPU time per call (one core; CPU time
// discounts time the thread did not run on a shared machine), each timing
// >= --min-ms of calls. Rounds are interleaved (every cell once per round),
// and the table shows the median over the rounds; the ratios are the medians
// of the per-round ratios to that round's memcpy of the same size.
// Gradients: N(0, 1) values (fixed seed) in 4 buffers per size, rotated call
// by call, so a 16Mi chunk (64 MiB) comes from DRAM, not from the caches.
//
//   rackhub-topk-bench [--rounds 7] [--min-ms 40] [--path portable|avx2|avx512]
#include <time.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/topk.h"

namespace rackhub::aggregation {
namespace {

constexpr int kGradBuffers = 4;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Free {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, Free>;

// n floats, 64-byte aligned.
Buffer Allocate(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

struct SizeState {
  size_t n = 0;
  std::vector<Buffer> grads;  // kGradBuffers of n N(0,1) values
  Buffer residual;            // error-feedback state (starts at 0)
  Buffer copy;                // memcpy destination
  int next = 0;               // gradient buffer of the next call
  const float* NextGrad() {
    const float* g = grads[next].get();
    next = (next + 1) % kGradBuffers;
    return g;
  }
};

// Thread CPU seconds per call of fn, over >= min_s of calls (the clock is
// read every >= 16Mi elements so it does not weigh on small calls).
template <class Fn>
double SecondsPerCall(size_t n, double min_s, Fn fn) {
  const size_t batch = std::max<size_t>(1, (size_t{16} << 20) / n);
  fn();  // warm-up
  size_t calls = 0;
  const double t0 = ThreadCpuSeconds();
  double elapsed = 0;
  do {
    for (size_t b = 0; b < batch; ++b) fn();
    calls += batch;
    elapsed = ThreadCpuSeconds() - t0;
  } while (elapsed < min_s);
  return elapsed / static_cast<double>(calls);
}

int Main(int argc, char** argv) {
  int rounds = 7;
  double min_ms = 40;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--min-ms" && i + 1 < argc) {
      min_ms = std::atof(argv[++i]);
    } else if (a == "--path" && i + 1 < argc) {
      const std::string_view p = argv[++i];
      bool ok = false;
      for (KernelPath kp : kAllKernelPaths) {
        if (p == KernelPathName(kp)) ok = ForceKernelPath(kp);
      }
      if (!ok) {
        std::fprintf(stderr, "kernel path %s not available\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--min-ms MS] [--path portable|avx2|avx512]\n",
                   argv[0]);
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;

  const size_t sizes[] = {size_t{32} << 10, size_t{1} << 20, size_t{16} << 20};
  const char* size_names[] = {"32Ki", "1Mi", "16Mi"};
  const double ratios[] = {0.1, 0.01, 0.001};
  constexpr int kOps = 3;  // compress, select, memcpy

  std::mt19937_64 rng(20261125);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<SizeState> states(std::size(sizes));
  for (size_t s = 0; s < std::size(sizes); ++s) {
    SizeState& st = states[s];
    st.n = sizes[s];
    for (int b = 0; b < kGradBuffers; ++b) {
      st.grads.push_back(Allocate(st.n));
      for (size_t i = 0; i < st.n; ++i) st.grads.back().get()[i] = normal(rng);
    }
    st.residual = Allocate(st.n);
    std::fill_n(st.residual.get(), st.n, 0.0f);
    st.copy = Allocate(st.n);
    std::fill_n(st.copy.get(), st.n, 0.0f);
  }
  const uint32_t max_k = TopKCount(ratios[0], static_cast<uint32_t>(sizes[2]));
  std::vector<uint32_t> idx(max_k);
  std::vector<float> values(max_k);
  TopKScratch scratch;

  // Per cell (size, ratio) and op, one entry per round: GB/s of gradient,
  // the rate over memcpy's, microseconds per call.
  const size_t cells = std::size(sizes) * std::size(ratios);
  std::vector<std::vector<double>> rates(cells * kOps), to_memcpy(cells * kOps);
  std::vector<std::vector<double>> us(cells * kOps);
  uint64_t checksum = 0;
  const double min_s = min_ms / 1000.0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t s = 0; s < std::size(sizes); ++s) {
      SizeState& st = states[s];
      const size_t n = st.n;
      for (size_t r = 0; r < std::size(ratios); ++r) {
        const uint32_t k = TopKCount(ratios[r], static_cast<uint32_t>(n));
        double secs[kOps];
        secs[0] = SecondsPerCall(n, min_s, [&] {
          CompressTopK({st.NextGrad(), n}, {st.residual.get(), n}, k, true, idx.data(),
                       values.data(), scratch);
          checksum += idx[k / 2];
        });
        secs[1] = SecondsPerCall(n, min_s, [&] {
          SelectTopK({st.NextGrad(), n}, k, idx.data(), scratch);
          checksum += idx[k / 2];
        });
        secs[2] = SecondsPerCall(n, min_s, [&] {
          std::memcpy(st.copy.get(), st.NextGrad(), n * sizeof(float));
          checksum += std::bit_cast<uint32_t>(st.copy.get()[n / 2]);
        });
        const size_t cell = (s * std::size(ratios) + r) * kOps;
        for (int op = 0; op < kOps; ++op) {
          const double gbps = static_cast<double>(n * sizeof(float)) / secs[op] / 1e9;
          rates[cell + op].push_back(gbps);
          to_memcpy[cell + op].push_back(secs[2] / secs[op]);
          us[cell + op].push_back(secs[op] * 1e6);
        }
      }
    }
    std::fprintf(stderr, "round %d/%d done\n", round + 1, rounds);
  }

  std::printf(
      "rackhub-topk-bench: kernel path %s, %d rounds, >= %.0f ms per timing, "
      "thread CPU time, median of rounds\n\n",
      KernelPathName(), rounds, min_ms);
  std::printf(
      "| n (floats) | ratio | k | CompressTopK+EF GB/s (us) | SelectTopK GB/s (us) | "
      "memcpy GB/s (us) | EF / memcpy | select / memcpy |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (size_t s = 0; s < std::size(sizes); ++s) {
    for (size_t r = 0; r < std::size(ratios); ++r) {
      const size_t cell = (s * std::size(ratios) + r) * kOps;
      const uint32_t k = TopKCount(ratios[r], static_cast<uint32_t>(sizes[s]));
      std::printf("| %s | %g | %u | %.2f (%.1f) | %.2f (%.1f) | %.2f (%.1f) | %.2f | %.2f |\n",
                  size_names[s], ratios[r], k, Median(rates[cell]), Median(us[cell]),
                  Median(rates[cell + 1]), Median(us[cell + 1]), Median(rates[cell + 2]),
                  Median(us[cell + 2]), Median(to_memcpy[cell]), Median(to_memcpy[cell + 1]));
    }
  }
  std::fprintf(stderr, "(checksum %llu)\n", static_cast<unsigned long long>(checksum));
  return 0;
}

}  // namespace
}  // namespace rackhub::aggregation

int main(int argc, char** argv) { return rackhub::aggregation::Main(argc, argv); }
