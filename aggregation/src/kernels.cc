// Public kernel entry points: runtime dispatch to the portable / AVX2 /
// AVX-512 path (kernels_portable.cc, kernels_avx2.cc, kernels_avx512.cc) and
// the per-call optimizer scalars. Compiled for the baseline ISA only.
#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "kernels_internal.h"

namespace rackhub::aggregation {
namespace {

using internal::KernelTable;

bool CpuHas(KernelPath path) {
  __builtin_cpu_init();
  switch (path) {
    case KernelPath::kPortable: return true;
    case KernelPath::kAvx2: {
#if defined(__clang__)  // clang 14's __builtin_cpu_supports does not know "f16c"
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
      const bool f16c = __builtin_cpu_supports("f16c");
#endif
      return __builtin_cpu_supports("avx2") && f16c;
    }
    case KernelPath::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && CpuHas(KernelPath::kAvx2);
  }
  return false;
}

const KernelTable& TableOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx512: return internal::Avx512Kernels();
    case KernelPath::kAvx2: return internal::Avx2Kernels();
    case KernelPath::kPortable: break;
  }
  return internal::PortableKernels();
}

// The best available path, capped by RACKHUB_KERNEL_PATH when set.
const KernelTable* Detect() {
  KernelPath cap = KernelPath::kAvx512;
  if (const char* env = std::getenv("RACKHUB_KERNEL_PATH")) {
    for (KernelPath p : kAllKernelPaths) {
      if (std::string_view(env) == KernelPathName(p)) cap = p;
    }
  }
  for (KernelPath p : {KernelPath::kAvx512, KernelPath::kAvx2}) {
    if (p <= cap && CpuHas(p)) return &TableOf(p);
  }
  return &internal::PortableKernels();
}

std::atomic<const KernelTable*> g_table{nullptr};

const KernelTable& Table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) {  // first call; racing first calls store the same value
    t = Detect();
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

using Bytes = const unsigned char*;

bool Streamable(const void* dst, size_t bytes) {
  return bytes >= internal::kStreamingMinBytes && reinterpret_cast<uintptr_t>(dst) % 64 == 0;
}

internal::OptParams ParamsOf(const OptimizerConfig& cfg, const OptimizerStep& step) {
  using internal::OptKind;
  internal::OptParams o;
  o.gs = step.grad_scale;
  o.lr = static_cast<float>(cfg.learning_rate);
  o.wd = static_cast<float>(cfg.weight_decay);
  o.mu = static_cast<float>(cfg.momentum);
  o.eps = static_cast<float>(cfg.epsilon);
  switch (cfg.type) {
    case OptimizerType::kSgd: o.kind = OptKind::kSgd; break;
    case OptimizerType::kMomentum: o.kind = OptKind::kMomentum; break;
    case OptimizerType::kNesterov: o.kind = OptKind::kNesterov; break;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      // Adam folds wd into the gradient (keep = 1 leaves p exact); AdamW
      // decays p by keep = 1 - lr*wd and folds nothing (wd = 0).
      o.kind = OptKind::kAdam;
      const bool decoupled = cfg.type == OptimizerType::kAdamW;
      const double t = static_cast<double>(step.t);
      const double bc1 = 1.0 - std::pow(cfg.beta1, t);
      const double bc2 = 1.0 - std::pow(cfg.beta2, t);
      if (decoupled) {
        o.wd = 0.0f;
        o.keep = static_cast<float>(1.0 - cfg.learning_rate * cfg.weight_decay);
      }
      o.b1 = static_cast<float>(cfg.beta1);
      o.omb1 = static_cast<float>(1.0 - cfg.beta1);
      o.b2 = static_cast<float>(cfg.beta2);
      o.omb2 = static_cast<float>(1.0 - cfg.beta2);
      o.step_size = static_cast<float>(cfg.learning_rate / bc1);
      o.inv_bc2 = static_cast<float>(1.0 / bc2);
      break;
    }
    case OptimizerType::kAdaGrad: o.kind = OptKind::kAdaGrad; break;
    case OptimizerType::kSumOnly: o.kind = OptKind::kSumOnly; break;
  }
  return o;
}

}  // namespace

const char* ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp32: return "fp32";
    case ElementType::kFp16: return "fp16";
    case ElementType::kBf16: return "bf16";
  }
  return "unknown";
}

// ---- Kernel path selection ----

const char* KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kPortable: return "portable";
    case KernelPath::kAvx2: return "avx2";
    case KernelPath::kAvx512: return "avx512";
  }
  return "unknown";
}
const char* KernelPathName() { return KernelPathName(ActiveKernelPath()); }
KernelPath ActiveKernelPath() { return Table().path; }
bool KernelPathAvailable(KernelPath path) { return CpuHas(path); }

bool ForceKernelPath(KernelPath path) {
  if (!CpuHas(path)) return false;
  g_table.store(&TableOf(path), std::memory_order_release);
  return true;
}
void ResetKernelPath() { g_table.store(Detect(), std::memory_order_release); }

// ---- Conversions and reduction primitives ----

void ConvertFp16ToFp32(float* dst, const uint16_t* src, size_t n) {
  CopyIn(dst, src, n, ElementType::kFp16);
}
void ConvertFp32ToFp16(uint16_t* dst, const float* src, size_t n) {
  CopyOut(dst, src, n, ElementType::kFp16);
}
void ConvertBf16ToFp32(float* dst, const uint16_t* src, size_t n) {
  CopyIn(dst, src, n, ElementType::kBf16);
}
void ConvertFp32ToBf16(uint16_t* dst, const float* src, size_t n) {
  CopyOut(dst, src, n, ElementType::kBf16);
}

// n == 0: the arrays may be null (an empty std::vector's data()); memcpy and
// memset may not be given null even for 0 bytes (UBSan, fuzz/frame).
void CopyIn(float* dst, const void* src, size_t n, ElementType type) {
  if (n == 0) return;
  if (type == ElementType::kFp32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const Bytes in[1] = {static_cast<Bytes>(src)};
  Table().sum(dst, in, 1, n, type, false, false);
}

void AddIn(float* acc, const void* src, size_t n, ElementType type) {
  const Bytes in[1] = {static_cast<Bytes>(src)};
  Table().sum(acc, in, 1, n, type, true, false);
}

void CopyOut(void* dst, const float* src, size_t n, ElementType type) {
  if (n == 0) return;
  if (type == ElementType::kFp32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  Table().narrow(static_cast<unsigned char*>(dst), src, n, type);
}

// ---- Multi-input ----

void SumInto(float* dst, std::span<const void* const> inputs, size_t n, ElementType type) {
  if (n == 0) return;
  if (inputs.empty()) {
    std::memset(dst, 0, n * sizeof(float));
    return;
  }
  Table().sum(dst, reinterpret_cast<const Bytes*>(inputs.data()), inputs.size(), n, type, false,
              Streamable(dst, n * sizeof(float)));
}

void AccumulateInto(float* acc, std::span<const void* const> inputs, size_t n, ElementType type) {
  if (inputs.empty()) return;
  Table().sum(acc, reinterpret_cast<const Bytes*>(inputs.data()), inputs.size(), n, type, true,
              false);
}

void ReduceInto(float* dst, std::span<const void* const> inputs, size_t n, ElementType type,
                Reduction reduction) {
  if (!IsElementwiseReduction(reduction)) {
    SumInto(dst, inputs, n, type);
    return;
  }
  if (n == 0) return;
  if (inputs.empty()) {
    const float identity = reduction == Reduction::kMin   ? std::numeric_limits<float>::infinity()
                           : reduction == Reduction::kMax ? -std::numeric_limits<float>::infinity()
                                                          : 1.0f;
    std::fill_n(dst, n, identity);
    return;
  }
  Table().combine(dst, reinterpret_cast<const Bytes*>(inputs.data()), inputs.size(), n, type,
                  false, reduction);
}

void ReduceAccumulateInto(float* acc, std::span<const void* const> inputs, size_t n,
                          ElementType type, Reduction reduction) {
  if (!IsElementwiseReduction(reduction)) {
    AccumulateInto(acc, inputs, n, type);
    return;
  }
  if (inputs.empty() || n == 0) return;
  Table().combine(acc, reinterpret_cast<const Bytes*>(inputs.data()), inputs.size(), n, type,
                  true, reduction);
}

// ---- Optimizer ----

void ApplyOptimizer(const OptimizerConfig& cfg, const OptimizerStep& step, const float* sum,
                    const float* p_old, float* p_new, float* state0, float* state1, size_t n) {
  const Bytes in[1] = {reinterpret_cast<Bytes>(sum)};
  Table().fused(ParamsOf(cfg, step), in, 1, ElementType::kFp32, p_old, p_new, state0, state1, n,
                Streamable(p_new, n * sizeof(float)));
}

void SumAndApplyOptimizer(const OptimizerConfig& cfg, const OptimizerStep& step,
                          std::span<const void* const> inputs, const float* p_old, float* p_new,
                          float* state0, float* state1, size_t n, ElementType type) {
  static const float kZeros[1024] = {};  // the sum of no inputs, block by block
  if (inputs.empty()) {
    for (size_t b = 0; b < n; b += 1024) {
      const size_t len = n - b < 1024 ? n - b : 1024;
      ApplyOptimizer(cfg, step, kZeros, p_old ? p_old + b : nullptr, p_new + b,
                     state0 ? state0 + b : nullptr, state1 ? state1 + b : nullptr, len);
    }
    return;
  }
  Table().fused(ParamsOf(cfg, step), reinterpret_cast<const Bytes*>(inputs.data()),
                inputs.size(), type, p_old, p_new, state0, state1, n,
                Streamable(p_new, n * sizeof(float)));
}

}  // namespace rackhub::aggregation
