// Scalar kernels written for GCC's auto-vectorizer: one plain loop per
// function, __restrict pointers, no lambdas, selects instead of branches.
// Built with -O3 -fno-math-errno -ffp-contract=off (aggregation/CMakeLists.txt).
#include "rackhub/aggregation/kernels.h"

#include <cmath>
#include <cstring>

namespace rackhub::aggregation {
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

// ---- Optimizer loops (one per type) ----

void SgdLoop(float gs, float lr, float wd, const float* __restrict sum,
             const float* __restrict p_old, float* __restrict p_new, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    p_new[i] = p - lr * d;
  }
}

void MomentumLoop(float gs, float lr, float wd, float mu, const float* __restrict sum,
                  const float* __restrict p_old, float* __restrict p_new,
                  float* __restrict vel, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    const float v = mu * vel[i] + d;
    vel[i] = v;
    p_new[i] = p - lr * v;
  }
}

void NesterovLoop(float gs, float lr, float wd, float mu, const float* __restrict sum,
                  const float* __restrict p_old, float* __restrict p_new,
                  float* __restrict vel, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float p = p_old[i];
    const float d = sum[i] * gs + wd * p;
    const float v = mu * vel[i] + d;
    vel[i] = v;
    p_new[i] = p - lr * (d + mu * v);
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

}  // namespace

const char* ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp32: return "fp32";
    case ElementType::kFp16: return "fp16";
    case ElementType::kBf16: return "bf16";
  }
  return "unknown";
}

void ConvertFp16ToFp32(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}
void ConvertFp32ToFp16(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}
void ConvertBf16ToFp32(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}
void ConvertFp32ToBf16(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

void CopyIn(float* dst, const void* src, size_t n, ElementType type) {
  const auto* s = static_cast<const unsigned char*>(src);
  switch (type) {
    case ElementType::kFp32: std::memcpy(dst, s, n * sizeof(float)); return;
    case ElementType::kFp16: CopyInFp16(dst, s, n); return;
    case ElementType::kBf16: CopyInBf16(dst, s, n); return;
  }
}

void AddIn(float* acc, const void* src, size_t n, ElementType type) {
  const auto* s = static_cast<const unsigned char*>(src);
  switch (type) {
    case ElementType::kFp32: AddInFp32(acc, s, n); return;
    case ElementType::kFp16: AddInFp16(acc, s, n); return;
    case ElementType::kBf16: AddInBf16(acc, s, n); return;
  }
}

void CopyOut(void* dst, const float* src, size_t n, ElementType type) {
  auto* d = static_cast<unsigned char*>(dst);
  switch (type) {
    case ElementType::kFp32: std::memcpy(d, src, n * sizeof(float)); return;
    case ElementType::kFp16: CopyOutFp16(d, src, n); return;
    case ElementType::kBf16: CopyOutBf16(d, src, n); return;
  }
}

void ApplyOptimizer(const OptimizerConfig& cfg, const OptimizerStep& step, const float* sum,
                    const float* p_old, float* p_new, float* state0, float* state1, size_t n) {
  const float gs = step.grad_scale;
  const float lr = static_cast<float>(cfg.learning_rate);
  const float wd = static_cast<float>(cfg.weight_decay);
  const float mu = static_cast<float>(cfg.momentum);
  const float eps = static_cast<float>(cfg.epsilon);
  switch (cfg.type) {
    case OptimizerType::kSgd: SgdLoop(gs, lr, wd, sum, p_old, p_new, n); return;
    case OptimizerType::kMomentum:
      MomentumLoop(gs, lr, wd, mu, sum, p_old, p_new, state0, n);
      return;
    case OptimizerType::kNesterov:
      NesterovLoop(gs, lr, wd, mu, sum, p_old, p_new, state0, n);
      return;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      const bool decoupled = cfg.type == OptimizerType::kAdamW;
      const double t = static_cast<double>(step.t);
      const double bc1 = 1.0 - std::pow(cfg.beta1, t);
      const double bc2 = 1.0 - std::pow(cfg.beta2, t);
      const float l2 = decoupled ? 0.0f : wd;
      const float keep =
          decoupled ? static_cast<float>(1.0 - cfg.learning_rate * cfg.weight_decay) : 1.0f;
      AdamLoop(gs, l2, keep, static_cast<float>(cfg.beta1), static_cast<float>(1.0 - cfg.beta1),
               static_cast<float>(cfg.beta2), static_cast<float>(1.0 - cfg.beta2),
               static_cast<float>(cfg.learning_rate / bc1), static_cast<float>(1.0 / bc2), eps,
               sum, p_old, p_new, state0, state1, n);
      return;
    }
    case OptimizerType::kAdaGrad: AdaGradLoop(gs, lr, wd, eps, sum, p_old, p_new, state0, n); return;
    case OptimizerType::kSumOnly: SumOnlyLoop(gs, sum, p_new, n); return;
  }
}

}  // namespace rackhub::aggregation
