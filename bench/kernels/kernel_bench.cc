// rackhub-kernel-bench: throughput of the aggregation kernels against memcpy
// of the same size, measured in the same run (yardsticks: bench/README.md).
//
// Benchmarks, for 32 KiB (8192 floats, cache resident) and 64 MiB (memory
// bound) per buffer and for every kernel path the CPU supports:
//   memcpy/<size>                         one buffer copied (read + write)
//   sum/<type>/N:<n>/<size>/<path>        SumInto of n inputs (fp32; bf16 n=4)
//   fused/<optimizer>/N:4/<size>/<path>   SumAndApplyOptimizer of 4 fp32 inputs
// Each reports bytes/s (bytes read + written per call: inputs, output, p_old
// and the optimizer state read and written) and `ratio_to_memcpy`: its bytes/s
// divided by memcpy's bytes/s for the same size, measured in this process
// right after each repetition (median of 5 x 20 ms), so that both sides of the
// ratio see the same machine load. The memcpy/<size> rows give the absolute
// memcpy rate of the whole run.
// Every benchmark runs 5 repetitions and reports aggregates (mean, median,
// stddev, cv); pass --benchmark_report_aggregates_only=false to see each one.
// Rates use CPU time (Google Benchmark's default), which discounts time the
// thread was not running on a shared machine.
//
//   rackhub-kernel-bench --benchmark_out=kernels.json --benchmark_out_format=json
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {
namespace {

constexpr size_t kSmallBytes = 32 * 1024;
constexpr size_t kLargeBytes = 64 * 1024 * 1024;
constexpr int kMaxBuffers = 9;  // 8 inputs + output
constexpr int kRepetitions = 5;

const char* SizeName(size_t bytes) { return bytes == kSmallBytes ? "32KiB" : "64MiB"; }

// Buffers per size, 64-byte aligned, filled once (pages faulted in before any
// timing) with finite, normal values; allocated on first use and kept. Buffer
// b starts b * 448 bytes (mod 4 KiB) into its allocation, so the buffers of
// one call do not share their address bits 6..11 (which would make loads
// falsely wait on stores to other buffers: "4K aliasing").
float* Buffer(size_t bytes, int index) {
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{4096}); }
  };
  static std::map<size_t, std::vector<std::unique_ptr<std::byte, Free>>> pool;
  auto& list = pool[bytes];
  if (list.empty()) {
    for (int b = 0; b < kMaxBuffers; ++b) {
      auto* raw = static_cast<std::byte*>(::operator new(bytes + 4096, std::align_val_t{4096}));
      list.emplace_back(raw);
      float* p = reinterpret_cast<float*>(raw + (b * 448) % 4096);
      const size_t n = bytes / sizeof(float);
      for (size_t i = 0; i < n; ++i) p[i] = 0.25f + static_cast<float>((i * 7 + b) % 13) * 0.125f;
    }
  }
  return reinterpret_cast<float*>(list[index].get() + (index * 448) % 4096);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void MemcpyLoop(benchmark::State& state, size_t bytes) {
  float* src = Buffer(bytes, 0);
  float* dst = Buffer(bytes, 1);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
}

// memcpy bytes/s (read + written, per CPU second) of `bytes`, measured right
// now: the median of 5 runs of >= 20 ms each. Taken right after each
// repetition of a kernel, so a shared machine's drift in memory bandwidth
// (other tenants) affects both sides of the ratio alike.
double MemcpyRateNow(size_t bytes) {
  float* src = Buffer(bytes, 0);
  float* dst = Buffer(bytes, 1);
  std::vector<double> rates;
  for (int r = 0; r < kRepetitions; ++r) {
    const double t0 = ThreadCpuSeconds();
    size_t calls = 0;
    double elapsed = 0;
    // Reading the thread CPU clock is a system call (~0.5 us): check it only
    // every ~16 MiB copied so it does not count against small copies.
    const size_t batch = std::max<size_t>(1, (size_t{16} << 20) / bytes);
    do {
      for (size_t b = 0; b < batch; ++b) {
        std::memcpy(dst, src, bytes);
        benchmark::ClobberMemory();
      }
      calls += batch;
      elapsed = ThreadCpuSeconds() - t0;
    } while (elapsed < 0.02);
    rates.push_back(2.0 * static_cast<double>(bytes) * static_cast<double>(calls) / elapsed);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void Report(benchmark::State& state, size_t bytes, double bytes_per_call) {
  const double total = bytes_per_call * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(total));
  // A rate counter is divided by the (CPU) time: total / memcpy_rate / time
  // is this benchmark's bytes/s over memcpy's.
  state.counters["ratio_to_memcpy"] =
      benchmark::Counter(total / MemcpyRateNow(bytes), benchmark::Counter::kIsRate);
}

void BM_Memcpy(benchmark::State& state, size_t bytes) {
  MemcpyLoop(state, bytes);
  Report(state, bytes, 2.0 * static_cast<double>(bytes));
}

void BM_Sum(benchmark::State& state, KernelPath path, ElementType type, int inputs_count,
            size_t bytes) {
  if (!ForceKernelPath(path)) {
    state.SkipWithError("kernel path not available");
    return;
  }
  const size_t n = bytes / sizeof(float);  // elements of the fp32 output
  std::vector<const void*> inputs;
  for (int k = 0; k < inputs_count; ++k) inputs.push_back(Buffer(bytes, k));
  float* out = Buffer(bytes, kMaxBuffers - 1);
  for (auto _ : state) {
    SumInto(out, inputs, n, type);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  ResetKernelPath();
  const double in_bytes = static_cast<double>(n * ElementBytes(type));
  Report(state, bytes, inputs_count * in_bytes + static_cast<double>(bytes));
}

OptimizerConfig BenchConfig(OptimizerType type) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = type == OptimizerType::kSumOnly ? 0.0 : 1e-3;
  if (type == OptimizerType::kMomentum || type == OptimizerType::kNesterov) c.momentum = 0.9;
  if (type == OptimizerType::kAdaGrad) c.initial_accumulator = 0.1;
  if (!NormalizeOptimizer(&c).ok()) std::abort();
  return c;
}

void BM_Fused(benchmark::State& state, KernelPath path, OptimizerType opt, int inputs_count,
              size_t bytes) {
  if (!ForceKernelPath(path)) {
    state.SkipWithError("kernel path not available");
    return;
  }
  const size_t n = bytes / sizeof(float);
  const OptimizerConfig cfg = BenchConfig(opt);
  std::vector<const void*> inputs;
  for (int k = 0; k < inputs_count; ++k) inputs.push_back(Buffer(bytes, k));
  // p_old, p_new and state after the inputs (at most 4 + 4 buffers).
  const float* p_old = Buffer(bytes, inputs_count);
  float* p_new = Buffer(bytes, inputs_count + 1);
  float* s0 = Buffer(bytes, inputs_count + 2);
  float* s1 = Buffer(bytes, inputs_count + 3);
  const OptimizerStep step{1.0f / static_cast<float>(inputs_count), 10};
  for (auto _ : state) {
    SumAndApplyOptimizer(cfg, step, inputs, p_old, p_new, s0, s1, n, ElementType::kFp32);
    benchmark::DoNotOptimize(p_new);
    benchmark::ClobberMemory();
  }
  ResetKernelPath();
  const int slots = OptimizerStateSlots(opt);
  const double reads_writes =
      inputs_count + 1.0 /* p_new */ + (opt == OptimizerType::kSumOnly ? 0 : 1) /* p_old */ +
      2.0 * slots /* state read and written */;
  Report(state, bytes, reads_writes * static_cast<double>(bytes));
}

template <typename Fn>
void Register(const std::string& name, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), fn)
      ->Repetitions(kRepetitions)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMicrosecond);
}

void RegisterAll() {
  const OptimizerType optimizers[] = {
      OptimizerType::kSgd,   OptimizerType::kMomentum, OptimizerType::kNesterov,
      OptimizerType::kAdam,  OptimizerType::kAdamW,    OptimizerType::kAdaGrad,
      OptimizerType::kSumOnly};
  for (size_t bytes : {kSmallBytes, kLargeBytes}) {
    const std::string size = SizeName(bytes);
    Register("memcpy/" + size, [bytes](benchmark::State& s) { BM_Memcpy(s, bytes); });
    for (KernelPath path : kAllKernelPaths) {
      if (!KernelPathAvailable(path)) continue;
      const std::string suffix = "/" + size + "/" + KernelPathName(path);
      for (int k : {2, 4, 8}) {
        Register("sum/fp32/N:" + std::to_string(k) + suffix, [=](benchmark::State& s) {
          BM_Sum(s, path, ElementType::kFp32, k, bytes);
        });
      }
      Register("sum/bf16/N:4" + suffix, [=](benchmark::State& s) {
        BM_Sum(s, path, ElementType::kBf16, 4, bytes);
      });
      for (OptimizerType opt : optimizers) {
        Register(std::string("fused/") + OptimizerTypeName(opt) + "/N:4" + suffix,
                 [=](benchmark::State& s) { BM_Fused(s, path, opt, 4, bytes); });
      }
    }
  }
}

}  // namespace
}  // namespace rackhub::aggregation

int main(int argc, char** argv) {
  rackhub::aggregation::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("rackhub_default_kernel_path",
                              rackhub::aggregation::KernelPathName());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
