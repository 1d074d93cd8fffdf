// Private to rackhub_aggregation: the loops of the SIMD kernel paths, written
// once over a vector-traits type V and included by kernels_avx2.cc and
// kernels_avx512.cc right AFTER their RACKHUB_KERNEL_TARGET_BEGIN, so that
// every function here is compiled for that ISA (and has internal linkage: no
// AVX code can be picked by the linker for a baseline caller). A path's
// source then only defines its traits and names its table, kSimdKernels<V>.
//
// V provides: F (vector of kLanes floats), kPath, Set1, Load/Store/Stream
// (float*, any alignment except Stream: kLanes*4-byte aligned),
// LoadFp32/LoadFp16/LoadBf16 (wire bytes, any alignment, widened to fp32),
// StoreFp16/StoreBf16 (narrowed, round to nearest even), Add, Sub, Mul, Div,
// Min, Max (kernels.h MinOf / MaxOf), Sqrt (IEEE, exactly rounded) and Fence
// (after streaming stores). VectorArith and VectorMinMax (below) are what
// needs no ISA-specific code: the four IEEE operators and the NaN-propagating
// min / max, written with vector-extension comparisons and bit selects. Scalar (below) is the one-lane V the tails use. Per element, every path performs the same IEEE
// operations in the same order as the portable loops, so the bits are
// identical.
#pragma once

// Every header this file needs (<cmath>, <cstring>, kernels_internal.h) must
// be included by the includer BEFORE its target region, so that library
// inline functions are compiled for the baseline ISA (their out-of-line copies
// are shared with other translation units).
#ifndef RACKHUB_KERNEL_TARGET_BEGIN
#error "include kernels_simd.h only from a kernel path source, inside its target region"
#endif

namespace rackhub::aggregation::internal {
namespace {

// The arithmetic of V: IEEE add, subtract, multiply and divide are the
// operators of float and of the GCC/clang vector types (the AVX intrinsics
// _mm256_add_ps, _mm512_mul_ps, ... are defined as these very operators), so
// they are written once for every path.
struct VectorArith {
  template <class F>
  static F Add(F a, F b) {
    return a + b;
  }
  template <class F>
  static F Sub(F a, F b) {
    return a - b;
  }
  template <class F>
  static F Mul(F a, F b) {
    return a * b;
  }
  template <class F>
  static F Div(F a, F b) {
    return a / b;
  }
};

// Min and max of kernels.h (MinOf / MaxOf) on GCC/clang vector types, lane
// by lane with the very same selects: comparisons give all-ones lanes, the
// result is assembled from the operands' bits, no arithmetic on them.
struct VectorMinMax {
  template <bool kMin, class F>
  static F MinMax(F a, F b) {
    using I = decltype(a < b);  // a vector of 32-bit integers
    const I ia = (I)a, ib = (I)b;
    const I a_wins = kMin ? (a < b) : (b < a);
    const I b_wins = kMin ? (b < a) : (a < b);
    const I tie = kMin ? (ia | ib) : (ia & ib);  // -0 | +0 = -0, -0 & +0 = +0
    I r = (a_wins & ia) | (b_wins & ib) | (~(a_wins | b_wins) & tie);
    const I b_nan = b != b;
    r = (b_nan & ib) | (~b_nan & r);
    const I a_nan = a != a;
    r = (a_nan & ia) | (~a_nan & r);
    return (F)r;
  }
  template <class F>
  static F Min(F a, F b) {
    return MinMax<true>(a, b);
  }
  template <class F>
  static F Max(F a, F b) {
    return MinMax<false>(a, b);
  }
};

struct Scalar : VectorArith {
  using F = float;
  static F Min(F a, F b) { return MinOf(a, b); }
  static F Max(F a, F b) { return MaxOf(a, b); }
  static constexpr size_t kLanes = 1;
  static F Set1(float x) { return x; }
  static F Load(const float* p) { return *p; }
  static void Store(float* p, F v) { *p = v; }
  static void Stream(float* p, F v) { *p = v; }
  static F LoadFp32(const unsigned char* p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static F LoadFp16(const unsigned char* p) { return Fp16ToFloat(LoadU16(p)); }
  static F LoadBf16(const unsigned char* p) { return Bf16ToFloat(LoadU16(p)); }
  static void StoreFp16(unsigned char* p, F v) { StoreU16(p, FloatToFp16(v)); }
  static void StoreBf16(unsigned char* p, F v) { StoreU16(p, FloatToBf16(v)); }
  static F Sqrt(F a) { return std::sqrt(a); }

 private:
  static uint16_t LoadU16(const unsigned char* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void StoreU16(unsigned char* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }
};

// Runs Loop::Run<K>(args...) with K == k when k is one of kCounts (that loop
// is compiled for exactly k inputs: unrolled, the input pointers in
// registers), else Loop::Run<0> (k read at run time).
template <class Loop, int... kCounts, class... Args>
void RunForInputCount(size_t k, const Args&... args) {
  auto run = &Loop::template Run<0>;
  (void)((k == static_cast<size_t>(kCounts) && (run = &Loop::template Run<kCounts>, true)) ||
         ...);
  run(args...);
}

template <class V, ElementType E>
inline typename V::F LoadIn(const unsigned char* p) {
  if constexpr (E == ElementType::kFp32) {
    return V::LoadFp32(p);
  } else if constexpr (E == ElementType::kFp16) {
    return V::LoadFp16(p);
  } else {
    return V::LoadBf16(p);
  }
}

template <class V, bool kStream>
inline void Put(float* p, typename V::F v) {
  if constexpr (kStream) {
    V::Stream(p, v);
  } else {
    V::Store(p, v);
  }
}

// How a reduction combines two values (Op::Apply<V>): the sum's addition,
// or the element-wise min / max / product.
struct AddOp {
  template <class V, class F>
  static F Apply(F a, F b) {
    return V::Add(a, b);
  }
};
struct MinOp {
  template <class V, class F>
  static F Apply(F a, F b) {
    return V::Min(a, b);
  }
};
struct MaxOp {
  template <class V, class F>
  static F Apply(F a, F b) {
    return V::Max(a, b);
  }
};
struct MulOp {
  template <class V, class F>
  static F Apply(F a, F b) {
    return V::Mul(a, b);
  }
};

// U vectors of the sum at element i: in[first..k) added onto s (which holds
// dst[i..] when kAcc, else in[0][i..]). K > 0 fixes k at compile time (the
// input loop unrolls and the pointers stay in registers); K == 0: runtime k.
// Op (AddOp by default) is the combining operation.
template <class V, ElementType E, int U, int K, bool kAcc, class Op = AddOp>
inline void SumVectors(typename V::F (&s)[U], const float* dst, const unsigned char* const* in,
                       size_t k, size_t i) {
  constexpr size_t B = ElementBytes(E), L = V::kLanes;
  const size_t count = K > 0 ? static_cast<size_t>(K) : k;
  if constexpr (kAcc) {
    for (int u = 0; u < U; ++u) s[u] = V::Load(dst + i + u * L);
  } else {
    for (int u = 0; u < U; ++u) s[u] = LoadIn<V, E>(in[0] + (i + u * L) * B);
  }
  for (size_t j = kAcc ? 0 : 1; j < count; ++j) {
    const unsigned char* p = in[j] + i * B;
    for (int u = 0; u < U; ++u) {
      s[u] = Op::template Apply<V>(s[u], LoadIn<V, E>(p + u * L * B));
    }
  }
}

// Copies the input pointers into a local array (registers) when K > 0.
template <int K>
struct InputPointers {
  InputPointers(Inputs in, size_t /*k*/) {
    for (int j = 0; j < K; ++j) p[j] = in[j];
  }
  const unsigned char* p[K];
  const unsigned char* const* get() const { return p; }
};
template <>
struct InputPointers<0> {
  InputPointers(Inputs in, size_t /*k*/) : p(in) {}
  Inputs p;
  Inputs get() const { return p; }
};

// The sum loop for K inputs (K == 0: k of them, read at run time); Op as
// SumVectors.
template <class V, ElementType E, bool kStream, bool kAcc, class Op = AddOp>
struct SumLoop {
  template <int K>
  static void Run(float* dst, Inputs inputs, size_t k, size_t n) {
    constexpr size_t L = V::kLanes;
    constexpr int U = 4;
    const InputPointers<K> ptrs(inputs, k);
    const unsigned char* const* in = ptrs.get();
    size_t i = 0;
    for (; i + U * L <= n; i += U * L) {
      typename V::F s[U];
      SumVectors<V, E, U, K, kAcc, Op>(s, dst, in, k, i);
      for (int u = 0; u < U; ++u) Put<V, kStream>(dst + i + u * L, s[u]);
    }
    for (; i + L <= n; i += L) {
      typename V::F s[1];
      SumVectors<V, E, 1, K, kAcc, Op>(s, dst, in, k, i);
      Put<V, kStream>(dst + i, s[0]);
    }
    for (; i < n; ++i) {
      float s[1];
      SumVectors<Scalar, E, 1, K, kAcc, Op>(s, dst, in, k, i);
      dst[i] = s[0];
    }
    if constexpr (kStream) V::Fence();
  }
};

// Fixed input counts 1..8 (the common worker counts per hub), else runtime k.
template <class V, ElementType E, bool kStream, bool kAcc>
void SumByCount(float* dst, Inputs in, size_t k, size_t n) {
  RunForInputCount<SumLoop<V, E, kStream, kAcc>, 1, 2, 3, 4, 5, 6, 7, 8>(k, dst, in, k, n);
}

template <class V, ElementType E>
void SumByMode(float* dst, Inputs in, size_t k, size_t n, bool accumulate, bool stream) {
  if (accumulate) {  // dst is read first: its lines are cached, never stream
    SumByCount<V, E, false, true>(dst, in, k, n);
  } else if (stream) {
    SumByCount<V, E, true, false>(dst, in, k, n);
  } else {
    SumByCount<V, E, false, false>(dst, in, k, n);
  }
}

template <class V>
void SumImpl(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
             bool stream) {
  switch (type) {
    case ElementType::kFp32: return SumByMode<V, ElementType::kFp32>(dst, in, k, n, accumulate, stream);
    case ElementType::kFp16: return SumByMode<V, ElementType::kFp16>(dst, in, k, n, accumulate, stream);
    case ElementType::kBf16: return SumByMode<V, ElementType::kBf16>(dst, in, k, n, accumulate, stream);
  }
}

// Element-wise min / max / product: fixed input counts 2..4 (the first fold
// of a chunk usually has every rank), else runtime k; no streaming stores.
template <class V, ElementType E, class Op>
void CombineByMode(float* dst, Inputs in, size_t k, size_t n, bool accumulate) {
  if (accumulate) {
    RunForInputCount<SumLoop<V, E, false, true, Op>, 1, 2, 3, 4>(k, dst, in, k, n);
  } else {
    RunForInputCount<SumLoop<V, E, false, false, Op>, 1, 2, 3, 4>(k, dst, in, k, n);
  }
}

template <class V, class Op>
void CombineByType(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate) {
  switch (type) {
    case ElementType::kFp32: return CombineByMode<V, ElementType::kFp32, Op>(dst, in, k, n, accumulate);
    case ElementType::kFp16: return CombineByMode<V, ElementType::kFp16, Op>(dst, in, k, n, accumulate);
    case ElementType::kBf16: return CombineByMode<V, ElementType::kBf16, Op>(dst, in, k, n, accumulate);
  }
}

template <class V>
void CombineImpl(float* dst, Inputs in, size_t k, size_t n, ElementType type, bool accumulate,
                 Reduction op) {
  switch (op) {
    case Reduction::kMin: return CombineByType<V, MinOp>(dst, in, k, n, type, accumulate);
    case Reduction::kMax: return CombineByType<V, MaxOp>(dst, in, k, n, type, accumulate);
    case Reduction::kProduct: return CombineByType<V, MulOp>(dst, in, k, n, type, accumulate);
    case Reduction::kMean:
    case Reduction::kSum: return SumImpl<V>(dst, in, k, n, type, accumulate, false);
  }
}

template <class V>
void NarrowImpl(unsigned char* dst, const float* src, size_t n, ElementType type) {
  constexpr size_t L = V::kLanes;
  size_t i = 0;
  if (type == ElementType::kFp16) {
    for (; i + L <= n; i += L) V::StoreFp16(dst + 2 * i, V::Load(src + i));
    for (; i < n; ++i) Scalar::StoreFp16(dst + 2 * i, src[i]);
  } else {
    for (; i + L <= n; i += L) V::StoreBf16(dst + 2 * i, V::Load(src + i));
    for (; i < n; ++i) Scalar::StoreBf16(dst + 2 * i, src[i]);
  }
}

// ---- Fused sum + optimizer ----

template <class V>
struct Consts {
  using F = typename V::F;
  explicit Consts(const OptParams& o)
      : gs(V::Set1(o.gs)), lr(V::Set1(o.lr)), wd(V::Set1(o.wd)), mu(V::Set1(o.mu)),
        eps(V::Set1(o.eps)), keep(V::Set1(o.keep)), b1(V::Set1(o.b1)), omb1(V::Set1(o.omb1)),
        b2(V::Set1(o.b2)), omb2(V::Set1(o.omb2)), step_size(V::Set1(o.step_size)),
        inv_bc2(V::Set1(o.inv_bc2)) {}
  F gs, lr, wd, mu, eps, keep, b1, omb1, b2, omb2, step_size, inv_bc2;
};

// New parameters from the sum s at element i; updates the state in place.
// The operations and their order are those of the portable loops.
template <class V, OptKind K>
inline typename V::F Step(const Consts<V>& c, typename V::F s, const float* p_old, float* st0,
                          float* st1, size_t i) {
  using F = typename V::F;
  if constexpr (K == OptKind::kSumOnly) {
    return V::Mul(s, c.gs);
  } else {
    const F p = V::Load(p_old + i);
    const F d = V::Add(V::Mul(s, c.gs), V::Mul(c.wd, p));  // s*gs + wd*p
    if constexpr (K == OptKind::kSgd) {
      return V::Sub(p, V::Mul(c.lr, d));
    } else if constexpr (K == OptKind::kMomentum || K == OptKind::kNesterov) {
      const F v = V::Add(V::Mul(c.mu, V::Load(st0 + i)), d);  // mu*v + d
      V::Store(st0 + i, v);
      if constexpr (K == OptKind::kMomentum) {
        return V::Sub(p, V::Mul(c.lr, v));
      } else {
        return V::Sub(p, V::Mul(c.lr, V::Add(d, V::Mul(c.mu, v))));  // p - lr*(d + mu*v)
      }
    } else if constexpr (K == OptKind::kAdam) {
      const F m = V::Add(V::Mul(c.b1, V::Load(st0 + i)), V::Mul(c.omb1, d));
      const F v = V::Add(V::Mul(c.b2, V::Load(st1 + i)), V::Mul(c.omb2, V::Mul(d, d)));
      V::Store(st0 + i, m);
      V::Store(st1 + i, v);
      // p*keep - (step_size*m) / (sqrt(v*inv_bc2) + eps)
      const F denom = V::Add(V::Sqrt(V::Mul(v, c.inv_bc2)), c.eps);
      return V::Sub(V::Mul(p, c.keep), V::Div(V::Mul(c.step_size, m), denom));
    } else {  // kAdaGrad
      const F a = V::Add(V::Load(st0 + i), V::Mul(d, d));
      V::Store(st0 + i, a);
      // p - (lr*d) / (sqrt(a) + eps)
      return V::Sub(p, V::Div(V::Mul(c.lr, d), V::Add(V::Sqrt(a), c.eps)));
    }
  }
}

// The fused loop for N inputs (N == 0: k of them, read at run time).
template <class V, ElementType E, OptKind K, bool kStream>
struct FusedLoop {
  template <int N>
  static void Run(const OptParams& o, Inputs inputs, size_t k, const float* p_old, float* p_new,
                  float* st0, float* st1, size_t n) {
    constexpr size_t L = V::kLanes;
    constexpr int U = 2;
    const Consts<V> c(o);
    const InputPointers<N> ptrs(inputs, k);
    const unsigned char* const* in = ptrs.get();
    size_t i = 0;
    for (; i + U * L <= n; i += U * L) {
      typename V::F s[U];
      SumVectors<V, E, U, N, false>(s, nullptr, in, k, i);
      for (int u = 0; u < U; ++u) {
        Put<V, kStream>(p_new + i + u * L, Step<V, K>(c, s[u], p_old, st0, st1, i + u * L));
      }
    }
    for (; i + L <= n; i += L) {
      typename V::F s[1];
      SumVectors<V, E, 1, N, false>(s, nullptr, in, k, i);
      Put<V, kStream>(p_new + i, Step<V, K>(c, s[0], p_old, st0, st1, i));
    }
    const Consts<Scalar> cs(o);
    for (; i < n; ++i) {
      float s[1];
      SumVectors<Scalar, E, 1, N, false>(s, nullptr, in, k, i);
      p_new[i] = Step<Scalar, K>(cs, s[0], p_old, st0, st1, i);
    }
    if constexpr (kStream) V::Fence();
  }
};

// Fixed input counts 1, 2, 4, 8 (ApplyOptimizer is 1), else runtime k.
template <class V, ElementType E, OptKind K, bool kStream>
void FusedByCount(const OptParams& o, Inputs in, size_t k, const float* p_old, float* p_new,
                  float* st0, float* st1, size_t n) {
  RunForInputCount<FusedLoop<V, E, K, kStream>, 1, 2, 4, 8>(k, o, in, k, p_old, p_new, st0, st1,
                                                          n);
}

template <class V, ElementType E, bool kStream>
void FusedByKind(const OptParams& o, Inputs in, size_t k, const float* p_old, float* p_new,
                 float* st0, float* st1, size_t n) {
  switch (o.kind) {
    case OptKind::kSgd:
      return FusedByCount<V, E, OptKind::kSgd, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case OptKind::kMomentum:
      return FusedByCount<V, E, OptKind::kMomentum, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case OptKind::kNesterov:
      return FusedByCount<V, E, OptKind::kNesterov, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case OptKind::kAdam:
      return FusedByCount<V, E, OptKind::kAdam, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case OptKind::kAdaGrad:
      return FusedByCount<V, E, OptKind::kAdaGrad, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case OptKind::kSumOnly:
      return FusedByCount<V, E, OptKind::kSumOnly, kStream>(o, in, k, p_old, p_new, st0, st1, n);
  }
}

template <class V, bool kStream>
void FusedByType(const OptParams& o, Inputs in, size_t k, ElementType type, const float* p_old,
                 float* p_new, float* st0, float* st1, size_t n) {
  switch (type) {
    case ElementType::kFp32:
      return FusedByKind<V, ElementType::kFp32, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case ElementType::kFp16:
      return FusedByKind<V, ElementType::kFp16, kStream>(o, in, k, p_old, p_new, st0, st1, n);
    case ElementType::kBf16:
      return FusedByKind<V, ElementType::kBf16, kStream>(o, in, k, p_old, p_new, st0, st1, n);
  }
}

template <class V>
void FusedImpl(const OptParams& o, Inputs in, size_t k, ElementType type, const float* p_old,
               float* p_new, float* st0, float* st1, size_t n, bool stream) {
  if (stream) {
    FusedByType<V, true>(o, in, k, type, p_old, p_new, st0, st1, n);
  } else {
    FusedByType<V, false>(o, in, k, type, p_old, p_new, st0, st1, n);
  }
}

// The table of the path with traits V.
template <class V>
constexpr KernelTable kSimdKernels{V::kPath, SumImpl<V>, CombineImpl<V>, NarrowImpl<V>,
                                   FusedImpl<V>};

}  // namespace
}  // namespace rackhub::aggregation::internal
