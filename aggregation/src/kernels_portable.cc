// Portable kernel path: scalar loops written for GCC's auto-vectorizer (one
// plain loop per function, __restrict pointers, no lambdas, selects instead of
// branches), vectorized for the baseline ISA only. Multi-input sums and the
// fused optimizer work block by block through an L1-resident buffer, so memory
// is still traversed once. The per-element operations are exactly those of
// the SIMD paths (kernels_simd.h), which keeps all paths bitwise identical.
// Built with -O3 -fno-math-errno -ffp-contract=off (aggregation/CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels_internal.h"

namespace rackhub::aggregation::internal {
namespace {

// Wire-side loads and stores go through memcpy: payloads may sit at any byte
// offset of a receive buffer. GCC turns these into (vector) unaligned moves.
inline float LoadFloat(const unsigned char* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint16_t LoadU16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreU16(unsigned char* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// ---- Reduction loops ----

void CopyInFp16(float* __restrict dst, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(LoadU16(src + 2 * i));
}
void CopyInBf16(float* __restrict dst, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(src + 2 * i));
}
void AddInFp32(float* __restrict acc, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += LoadFloat(src + 4 * i);
}
void AddInFp16(float* __restrict acc, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += Fp16ToFloat(LoadU16(src + 2 * i));
}
void AddInBf16(float* __restrict acc, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += Bf16ToFloat(LoadU16(src + 2 * i));
}
void CopyOutFp16(unsigned char* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, FloatToFp16(src[i]));
}
void CopyOutBf16(unsigned char* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, FloatToBf16(src[i]));
}
void CopyInFp32(float* __restrict dst, const unsigned char* __restrict src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// ---- Optimizer loops (one per type) ----

void SgdLoop(float gs, float lr, float wd, const float* __restrict sum,
             const float* __restrict p_old, float* __restrict p_new, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    p_new[i] = p - lr * d;
  }
}

// Momentum and Nesterov share the loop: both update the velocity alike and
// differ in the step they take with it.
template <bool kNesterov>
void MomentumLoop(float gs, float lr, float wd, float mu, const float* __restrict sum,
                  const float* __restrict p_old, float* __restrict p_new,
                  float* __restrict vel, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    const float v = mu * vel[i] + d;
    vel[i] = v;
    if constexpr (kNesterov) {
      p_new[i] = p - lr * (d + mu * v);
    } else {
      p_new[i] = p - lr * v;
    }
  }
}

// Adam and AdamW share the loop: `wd` is the L2 term folded into the gradient
// (Adam; 0 for AdamW) and `keep` the decoupled decay factor 1 - lr*wd (AdamW;
// 1 for Adam, which leaves p unchanged exactly).
void AdamLoop(float gs, float wd, float keep, float b1, float one_minus_b1, float b2,
              float one_minus_b2, float step_size, float inv_bc2, float eps,
              const float* __restrict sum, const float* __restrict p_old,
              float* __restrict p_new, float* __restrict m_state, float* __restrict v_state,
              size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    const float m = b1 * m_state[i] + one_minus_b1 * d;
    const float v = b2 * v_state[i] + one_minus_b2 * (d * d);
    m_state[i] = m;
    v_state[i] = v;
    p_new[i] = p * keep - step_size * m / (std::sqrt(v * inv_bc2) + eps);
  }
}

void AdaGradLoop(float gs, float lr, float wd, float eps, const float* __restrict sum,
                 const float* __restrict p_old, float* __restrict p_new,
                 float* __restrict acc, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    const float s = acc[i] + d * d;
    acc[i] = s;
    p_new[i] = p - lr * d / (std::sqrt(s) + eps);
  }
}

void SumOnlyLoop(float gs, const float* __restrict sum, float* __restrict p_new, size_t n) {
  for (size_t i = 0; i < n; ++i) p_new[i] = sum[i] * gs;
}


// ---- Dispatch by element type ----

using WidenFn = void (*)(float* __restrict, const unsigned char* __restrict, size_t);
WidenFn CopyInFor(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return CopyInFp16;
    case ElementType::kBf16: return CopyInBf16;
    default: return CopyInFp32;
  }
}
WidenFn AddInFor(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return AddInFp16;
    case ElementType::kBf16: return AddInBf16;
    default: return AddInFp32;
  }
}

// Elements per block: 4 KiB of fp32, well inside L1 with the inputs' lines.
constexpr size_t kBlock = 1024;

// dst[0, len) = sum over the inputs of their elements [begin, begin + len).
void SumBlock(float* dst, Inputs in, size_t k, size_t begin, size_t len, ElementType type,
              bool accumulate) {
  const size_t offset = begin * ElementBytes(type);
  size_t first = 0;
  if (!accumulate) {
    CopyInFor(type)(dst, in[0] + offset, len);
    first = 1;
  }
  const WidenFn add_in = AddInFor(type);
  for (size_t j = first; j < k; ++j) add_in(dst, in[j] + offset, len);
}

// ---- Element-wise min / max / product (kernels.h MinOf, MaxOf, *) ----

struct MinOp {
  static float Apply(float a, float b) { return MinOf(a, b); }
};
struct MaxOp {
  static float Apply(float a, float b) { return MaxOf(a, b); }
};
struct MulOp {
  static float Apply(float a, float b) { return a * b; }
};

inline float LoadFp16(const unsigned char* p) { return Fp16ToFloat(LoadU16(p)); }
inline float LoadBf16(const unsigned char* p) { return Bf16ToFloat(LoadU16(p)); }

template <class Op, float (*Load)(const unsigned char*), size_t kBytes>
void CombineIn(float* __restrict acc, const unsigned char* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op::Apply(acc[i], Load(src + kBytes * i));
}

template <class Op>
WidenFn CombineInFor(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return CombineIn<Op, LoadFp16, 2>;
    case ElementType::kBf16: return CombineIn<Op, LoadBf16, 2>;
    default: return CombineIn<Op, LoadFloat, 4>;
  }
}

WidenFn CombineInFor(ElementType type, Reduction op) {
  switch (op) {
    case Reduction::kMin: return CombineInFor<MinOp>(type);
    case Reduction::kMax: return CombineInFor<MaxOp>(type);
    case Reduction::kProduct: return CombineInFor<MulOp>(type);
    default: return AddInFor(type);
  }
}

void Combine(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
             Reduction op) {
  const WidenFn combine_in = CombineInFor(type, op);
  const size_t bytes = ElementBytes(type);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = n - b < kBlock ? n - b : kBlock;
    size_t first = 0;
    if (!accumulate) {
      CopyInFor(type)(dst + b, in[0] + b * bytes, len);
      first = 1;
    }
    for (size_t j = first; j < k; ++j) combine_in(dst + b, in[j] + b * bytes, len);
  }
}

void Sum(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
         bool /*stream*/) {
  for (size_t b = 0; b < n; b += kBlock) {
    SumBlock(dst + b, in, k, b, n - b < kBlock ? n - b : kBlock, type, accumulate);
  }
}

void Narrow(unsigned char* dst, const float* src, size_t n, ElementType type) {
  if (type == ElementType::kFp16) {
    CopyOutFp16(dst, src, n);
  } else {
    CopyOutBf16(dst, src, n);
  }
}

void Optimize(const OptParams& o, const float* sum, const float* p_old, float* p_new,
              float* state0, float* state1, size_t n) {
  switch (o.kind) {
    case OptKind::kSgd: SgdLoop(o.gs, o.lr, o.wd, sum, p_old, p_new, n); return;
    case OptKind::kMomentum:
      MomentumLoop<false>(o.gs, o.lr, o.wd, o.mu, sum, p_old, p_new, state0, n);
      return;
    case OptKind::kNesterov:
      MomentumLoop<true>(o.gs, o.lr, o.wd, o.mu, sum, p_old, p_new, state0, n);
      return;
    case OptKind::kAdam:
      AdamLoop(o.gs, o.wd, o.keep, o.b1, o.omb1, o.b2, o.omb2, o.step_size, o.inv_bc2, o.eps,
               sum, p_old, p_new, state0, state1, n);
      return;
    case OptKind::kAdaGrad: AdaGradLoop(o.gs, o.lr, o.wd, o.eps, sum, p_old, p_new, state0, n); return;
    case OptKind::kSumOnly: SumOnlyLoop(o.gs, sum, p_new, n); return;
  }
}

void Fused(const OptParams& o, Inputs in, size_t k, ElementType type, const float* p_old,
           float* p_new, float* state0, float* state1, size_t n, bool /*stream*/) {
  // One fp32 input: it is the sum already (ApplyOptimizer).
  if (k == 1 && type == ElementType::kFp32 && reinterpret_cast<uintptr_t>(in[0]) % 4 == 0) {
    Optimize(o, reinterpret_cast<const float*>(in[0]), p_old, p_new, state0, state1, n);
    return;
  }
  alignas(64) float block[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = n - b < kBlock ? n - b : kBlock;
    SumBlock(block, in, k, b, len, type, false);
    Optimize(o, block, p_old ? p_old + b : nullptr, p_new + b, state0 ? state0 + b : nullptr,
             state1 ? state1 + b : nullptr, len);
  }
}

}  // namespace

const KernelTable& PortableKernels() {
  static const KernelTable table{KernelPath::kPortable, Sum, Combine, Narrow, Fused};
  return table;
}

}  // namespace rackhub::aggregation::internal
