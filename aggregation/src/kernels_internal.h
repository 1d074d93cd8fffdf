// Private to rackhub_aggregation: the table of kernel entry points one kernel
// path (portable / AVX2 / AVX-512) provides, the per-call optimizer scalars
// every path receives already rounded to float, so that all paths compute
// with the very same constants, and the two macros that compile a region of a
// SIMD path's source for its ISA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation::internal {

// Outputs of at least this many bytes may be written with streaming stores.
inline constexpr size_t kStreamingMinBytes = size_t{1} << 20;

// Which loop an optimizer runs (Adam and AdamW share one).
enum class OptKind : uint8_t { kSgd, kMomentum, kNesterov, kAdam, kAdaGrad, kSumOnly };

// Per-call scalars, see ApplyOptimizer in kernels.h for the formulas:
//   kSgd:      d = s*gs + wd*p; p' = p - lr*d
//   kMomentum: d = s*gs + wd*p; v = mu*v + d; p' = p - lr*v
//   kNesterov: d = s*gs + wd*p; v = mu*v + d; p' = p - lr*(d + mu*v)
//   kAdam:     d = s*gs + wd*p; m = b1*m + omb1*d; v = b2*v + omb2*(d*d);
//              p' = p*keep - step_size*m / (sqrt(v*inv_bc2) + eps)
//   kAdaGrad:  d = s*gs + wd*p; a = a + d*d; p' = p - lr*d / (sqrt(a) + eps)
//   kSumOnly:  p' = s*gs
struct OptParams {
  OptKind kind = OptKind::kSumOnly;
  float gs = 1, lr = 0, wd = 0, mu = 0, eps = 0;
  float keep = 1, b1 = 0, omb1 = 0, b2 = 0, omb2 = 0, step_size = 0, inv_bc2 = 0;
};

// Wire bytes of the inputs, in rank order.
using Inputs = const unsigned char* const*;

struct KernelTable {
  KernelPath path;
  // dst[i] = (accumulate ? dst[i] + in[0][i] : in[0][i]) + in[1][i] + ...
  // (k >= 1 when !accumulate). `stream` allows streaming stores (the
  // caller checked size and 64-byte alignment of dst).
  void (*sum)(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
              bool stream);
  // The same with an element-wise reduction `op` (kMin, kMax or kProduct;
  // kernels.h, ReduceInto) in place of the addition. Never streams.
  void (*combine)(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
                  Reduction op);
  // dst[i] = src[i] narrowed to type (fp16 or bf16).
  void (*narrow)(unsigned char* dst, const float* src, size_t n, ElementType type);
  // s = in[0][i] + ... + in[k-1][i] (k >= 1), then the optimizer step of `p`.
  void (*fused)(const OptParams& p, Inputs in, size_t k, ElementType type, const float* p_old,
                float* p_new, float* state0, float* state1, size_t n, bool stream);
};

// Everything between RACKHUB_KERNEL_TARGET_BEGIN("avx2,f16c") and
// RACKHUB_KERNEL_TARGET_END() is compiled for that ISA, function by function
// (GCC's `#pragma GCC target`; clang ignores it and takes its own
// `#pragma clang attribute`). Only the SIMD path sources use them, after all
// their includes but kernels_simd.h.
#define RACKHUB_KERNEL_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define RACKHUB_KERNEL_TARGET_BEGIN(isa) \
  RACKHUB_KERNEL_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define RACKHUB_KERNEL_TARGET_END() RACKHUB_KERNEL_PRAGMA(clang attribute pop)
#else
#define RACKHUB_KERNEL_TARGET_BEGIN(isa) \
  RACKHUB_KERNEL_PRAGMA(GCC push_options) RACKHUB_KERNEL_PRAGMA(GCC target(isa))
#define RACKHUB_KERNEL_TARGET_END() RACKHUB_KERNEL_PRAGMA(GCC pop_options)
#endif

const KernelTable& PortableKernels();
// Defined in kernels_avx2.cc / kernels_avx512.cc; call only when the CPU
// supports the instructions (KernelPathAvailable).
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

}  // namespace rackhub::aggregation::internal
