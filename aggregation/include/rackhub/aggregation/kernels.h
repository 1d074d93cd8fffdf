// Math kernels of a hub lane: element type conversions (fp32 <-> fp16/bf16),
// the reduction primitives (copy the first contribution into the accumulator,
// add the following ones) and the fused, out-of-place optimizer step.
//
// Plain free functions over raw pointers and element counts, no state, no
// allocation, no synchronization: any thread may call them on memory it owns.
// Pointers passed to one call must not overlap unless stated otherwise.
// `src` / `dst` pointers of the wire side (`const void*` / `void*`) may have any
// alignment; fp32 master buffers should be 64-byte aligned for speed but need
// only the natural alignment of float.
//
// Results are deterministic: the same inputs give bitwise identical outputs
// (no FMA contraction, no reassociation; the kernel sources are built with
// -ffp-contract=off and without -ffast-math).
//
// Kernel paths and runtime dispatch: every kernel exists three times, chosen
// once per process from what the CPU supports (__builtin_cpu_supports):
//   "avx512"   AVX-512F/BW/VL + F16C intrinsics (512-bit vectors)
//   "avx2"     AVX2 + F16C intrinsics (256-bit vectors)
//   "portable" plain C++ that GCC auto-vectorizes for the baseline ISA; the
//              library never requires AVX to load or run.
// The environment variable RACKHUB_KERNEL_PATH=portable|avx2|avx512 caps the
// choice (a path the CPU lacks is never used).
// The three paths give BITWISE IDENTICAL results for every kernel, element
// type, length and alignment: each element goes through the same sequence of
// IEEE fp32 operations (add, mul, sub, correctly rounded div and sqrt; no FMA,
// no reciprocal approximations, no reassociation), and the F16C conversions
// (round to nearest even) match the scalar conversions below for every input,
// NaNs included (verified for all 65536 fp16 patterns and a sweep of fp32
// patterns in kernels_test). This covers infinities, subnormals, signed zeros
// and NaN inputs, with ONE exception: when two NaNs with different bits meet
// in one operation (e.g. two contributions both NaN at the same element, or
// an input NaN meeting an inf - inf), which of them propagates depends on the
// operand order the compiler picked, so the result is a NaN on every path but
// its payload/sign bits may differ between paths. This assumes the default
// MXCSR (no flush-to-zero / denormals-are-zero), which rackhub never changes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {

// Element type of payloads on the wire. Values are the wire encoding.
enum class ElementType : uint8_t {
  kFp32 = 1,
  kFp16 = 2,  // IEEE 754 binary16
  kBf16 = 3,  // bfloat16: the upper 16 bits of an fp32
};

// Bytes per element of `type`; 0 for a value that is not an ElementType.
constexpr size_t ElementBytes(ElementType type) {
  switch (type) {
    case ElementType::kFp32: return 4;
    case ElementType::kFp16:
    case ElementType::kBf16: return 2;
  }
  return 0;
}

// True when `raw` (e.g. a wire field) names an ElementType.
constexpr bool IsValidElementType(uint8_t raw) { return raw >= 1 && raw <= 3; }

const char* ElementTypeName(ElementType type);  // "fp32", "fp16", "bf16"

// ---- Scalar conversions (inline so the array loops vectorize them) ----
//
// Widening (fp16/bf16 -> fp32) is exact for every value, including
// subnormals and infinities; a NaN stays a NaN of the same sign and payload
// (fp16: made quiet, like F16C; bf16: bits kept as they are).
// Narrowing (fp32 -> fp16/bf16) rounds to nearest, ties to even; a NaN gives a
// quiet NaN of the same sign; fp16 results beyond the largest finite value
// (65504) become infinity, results below the smallest subnormal round to
// (signed) zero or to the smallest subnormal as rounding dictates.

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7fffu;  // exponent and mantissa bits
  // Normal numbers: move the fields into place and rebias the exponent from
  // 15 to 127 (add 112 to it).
  const uint32_t normal = (magnitude << 13) + (112u << 23);
  // Infinity / NaN: exponent all ones, mantissa (NaN payload) kept, and a NaN
  // made quiet (as F16C's vcvtph2ps does).
  const uint32_t quiet = 0x00400000u & (0u - static_cast<uint32_t>(magnitude > 0x7c00u));
  const uint32_t special = (magnitude << 13) | 0x7f800000u | quiet;
  // Zero and subnormals: mantissa * 2^-24, exact in fp32.
  const uint32_t tiny = std::bit_cast<uint32_t>(static_cast<float>(magnitude) * 0x1p-24f);
  // Branch-free selects (masks) so GCC if-converts and vectorizes the loops.
  const uint32_t is_normal = 0u - static_cast<uint32_t>(magnitude >= 0x0400u);
  const uint32_t is_special = 0u - static_cast<uint32_t>(magnitude >= 0x7c00u);
  uint32_t bits = (normal & is_normal) | (tiny & ~is_normal);
  bits = (special & is_special) | (bits & ~is_special);
  return std::bit_cast<float>(sign | bits);
}

inline uint16_t FloatToFp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;  // |f| as bits
  // NaN: quiet NaN keeping the top payload bits.
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
  // |f| >= 65520 rounds to infinity (65504 is the largest fp16, 65520 the tie
  // between it and 2^16).
  const uint32_t inf = 0x7c00u;
  // Normal fp16 range (|f| >= 2^-14): rebias the exponent from 127 to 15 and
  // drop 13 mantissa bits with round-to-nearest-even. A carry out of the
  // mantissa correctly bumps the exponent.
  const uint32_t rebased = a - (112u << 23);
  const uint32_t normal = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  // Subnormal fp16 range (|f| < 2^-14): adding 0.5 leaves |f| rounded (to
  // nearest even, by the FPU) to a multiple of 2^-24 in the low mantissa bits
  // of the sum; that multiple is the fp16 mantissa (1024 = smallest normal).
  const float tiny_sum = std::bit_cast<float>(a) + 0.5f;
  const uint32_t tiny = std::bit_cast<uint32_t>(tiny_sum) - 0x3f000000u;
  const uint32_t is_normal = 0u - static_cast<uint32_t>(a >= 0x38800000u);
  const uint32_t is_inf = 0u - static_cast<uint32_t>(a >= 0x477ff000u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7f800000u);
  uint32_t bits = (normal & is_normal) | (tiny & ~is_normal);
  bits = (inf & is_inf) | (bits & ~is_inf);
  bits = (nan & is_nan) | (bits & ~is_nan);
  return static_cast<uint16_t>(sign | bits);
}

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // Round to nearest even on the 16 dropped bits; finite values that round
  // past the largest bf16 become infinity, as they should.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  // NaN: keep sign and top payload bits, force the quiet bit so the result
  // cannot turn into infinity.
  const uint32_t nan = (x >> 16) | 0x0040u;
  const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// ---- Array conversions ----
void ConvertFp16ToFp32(float* dst, const uint16_t* src, size_t n);
void ConvertFp32ToFp16(uint16_t* dst, const float* src, size_t n);
void ConvertBf16ToFp32(float* dst, const uint16_t* src, size_t n);
void ConvertFp32ToBf16(uint16_t* dst, const float* src, size_t n);

// ---- Reduction primitives ----
// `src`/`dst` hold n elements of `type` (n * ElementBytes(type) bytes).
// dst[i] = float(src[i]).
void CopyIn(float* dst, const void* src, size_t n, ElementType type);
// acc[i] += float(src[i]).
void AddIn(float* acc, const void* src, size_t n, ElementType type);
// dst[i] = src[i] converted to `type` (round to nearest even).
void CopyOut(void* dst, const float* src, size_t n, ElementType type);

// ---- Optimizer step ----
struct OptimizerStep {
  // Multiplies the reduced sum into the gradient: 1/workers for
  // Reduction::kMean, 1 for Reduction::kSum.
  float grad_scale = 1.0f;
  // 1-based number of the update being computed (Adam bias correction).
  uint64_t t = 1;
};

// One fused optimizer step over n elements, out of place:
//   g       = sum[i] * grad_scale
//   p       = p_old[i], p_new[i] = p'
//   state0  = v (Momentum, Nesterov), m (Adam, AdamW), s (AdaGrad)
//   state1  = v (Adam, AdamW)
// Per element, all arithmetic in fp32; per-call scalars (learning rate, decay
// factors, bias corrections) are computed once in double and rounded to float.
//   kSgd:      d = g + wd*p;                   p' = p - lr*d
//   kMomentum: d = g + wd*p; v = mu*v + d;     p' = p - lr*v
//   kNesterov: d = g + wd*p; v = mu*v + d;     p' = p - lr*(d + mu*v)
//   kAdam:     d = g + wd*p; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d;
//              p' = p - (lr/bc1) * m / (sqrt(v * (1/bc2)) + eps)
//              with bc1 = 1 - b1^t, bc2 = 1 - b2^t
//   kAdamW:    d = g;  m, v as Adam;
//              p' = p*(1 - lr*wd) - (lr/bc1) * m / (sqrt(v * (1/bc2)) + eps)
//   kAdaGrad:  d = g + wd*p; s = s + d*d;      p' = p - lr*d / (sqrt(s) + eps)
//              (s starts at initial_accumulator)
//   kSumOnly:  p' = g  (p_old and the state are not read)
// (lr/bc1 and 1/bc2 are the double-precision per-call scalars; this equals the
// PyTorch formulation lr * (m/bc1) / (sqrt(v/bc2) + eps) up to fp32 rounding.)
// Momentum, Nesterov and AdaGrad follow torch.optim semantics (dampening 0,
// lr_decay 0); v and m start at 0.
// REQUIRES: state0 (state1) has n elements when the type uses 1 (2) state
// slots (OptimizerStateSlots); otherwise it may be null. p_new must not alias
// sum, p_old or the state. step.t >= 1.
void ApplyOptimizer(const OptimizerConfig& cfg, const OptimizerStep& step, const float* sum,
                    const float* p_old, float* p_new, float* state0, float* state1, size_t n);

// ---- Multi-input fast path ----
// `inputs` are the contributions in rank order, each n elements of `type`, at
// any alignment. One pass over memory, each output element written once; when
// the output is large (> 1 MiB) and 64-byte aligned the SIMD paths write it
// with streaming (non-temporal) stores.

// dst[i] = float(in0[i]) + float(in1[i]) + ... (left to right): the bits of
// CopyIn(dst, in0) followed by AddIn(dst, ink) for k = 1, 2, ...
// An empty `inputs` fills dst with +0.0f. dst must not overlap the inputs.
void SumInto(float* dst, std::span<const void* const> inputs, size_t n, ElementType type);

// acc[i] = acc[i] + float(in0[i]) + float(in1[i]) + ... (left to right): the
// bits of AddIn(acc, ink) for k = 0, 1, ... in one pass. acc must not overlap
// the inputs.
void AccumulateInto(float* acc, std::span<const void* const> inputs, size_t n, ElementType type);

// Sums the inputs in rank order and applies the optimizer step in the same
// pass, never materializing the sum: the bits of p_new and of the state equal
// SumInto(sum, inputs) followed by ApplyOptimizer(cfg, step, sum, ...).
// REQUIRES: as ApplyOptimizer; inputs non-empty (an empty list sums to +0.0f);
// p_new does not alias the inputs.
void SumAndApplyOptimizer(const OptimizerConfig& cfg, const OptimizerStep& step,
                          std::span<const void* const> inputs, const float* p_old, float* p_new,
                          float* state0, float* state1, size_t n, ElementType type);

// ---- Element-wise reductions: min, max, product ----
// The same rank-order scheme as the sum: the first contribution is widened to
// fp32 and copied, each following one is combined into it, left to right:
//   kMin:     r = MinOf(r, x)      kMax: r = MaxOf(r, x)      kProduct: r = r * x
// all in fp32 (fp16/bf16 inputs widened exactly; a caller narrowing the result
// rounds once, as for the sum).
// NaN: min and max PROPAGATE NaN, as torch.minimum / torch.maximum do (not
// as fminf/fmaxf or minps/maxps, which drop or order-depend on it): when
// either operand is NaN the result is the first NaN in rank order, its bits
// unchanged (no arithmetic touches it, so every path gives the same bits,
// even for several NaNs). Product propagates NaN by IEEE multiplication,
// which quiets it; two NaNs meeting fall under the exception stated above.
// Signed zeros: min(-0, +0) = min(+0, -0) = -0 and max(-0, +0) = +0, in
// either order (-0 orders below +0); product follows IEEE (-0 * 5 = -0).
// Infinities order as numbers; inf * 0 = NaN (IEEE).
inline float MinOf(float a, float b) {
  const uint32_t ia = std::bit_cast<uint32_t>(a), ib = std::bit_cast<uint32_t>(b);
  if (a != a) return a;
  if (b != b) return b;
  if (a < b) return a;
  if (b < a) return b;
  return std::bit_cast<float>(ia | ib);  // equal: the same bits, or -0 and +0 -> -0
}
inline float MaxOf(float a, float b) {
  const uint32_t ia = std::bit_cast<uint32_t>(a), ib = std::bit_cast<uint32_t>(b);
  if (a != a) return a;
  if (b != b) return b;
  if (b < a) return a;
  if (a < b) return b;
  return std::bit_cast<float>(ia & ib);  // equal: the same bits, or -0 and +0 -> +0
}

// dst[i] = in0[i] op in1[i] op ... in rank order (op = `reduction`: kMin,
// kMax, kProduct as above; kSum and kMean are SumInto). An empty `inputs`
// fills dst with the identity (+inf for min, -inf for max, 1 for product,
// +0 for sum). One pass over memory; dispatched once per call, the sum
// loops are unchanged. dst must not overlap the inputs.
void ReduceInto(float* dst, std::span<const void* const> inputs, size_t n, ElementType type,
                Reduction reduction);
// acc[i] = acc[i] op in0[i] op in1[i] ... (kSum, kMean: AccumulateInto): the
// bits of ReduceInto over acc's values followed by the inputs.
void ReduceAccumulateInto(float* acc, std::span<const void* const> inputs, size_t n,
                          ElementType type, Reduction reduction);

// ---- Kernel path selection ----
enum class KernelPath : uint8_t {
  kPortable = 0,
  kAvx2 = 1,
  kAvx512 = 2,
};
inline constexpr KernelPath kAllKernelPaths[] = {KernelPath::kPortable, KernelPath::kAvx2,
                                                 KernelPath::kAvx512};

const char* KernelPathName(KernelPath path);  // "portable", "avx2", "avx512"
// The path the kernels use now ("avx512", "avx2" or "portable").
const char* KernelPathName();
KernelPath ActiveKernelPath();
// True when this CPU (and OS) can run `path`.
bool KernelPathAvailable(KernelPath path);

// TEST AND BENCHMARK ONLY: makes every following kernel call (on any thread)
// use `path`. Returns false, changing nothing, when the path is not available.
// Not meant to be called while other threads run kernels (they would switch
// paths between calls, which is harmless for the bits but skews timings).
bool ForceKernelPath(KernelPath path);
// TEST AND BENCHMARK ONLY: back to the automatic choice.
void ResetKernelPath();

}  // namespace rackhub::aggregation
