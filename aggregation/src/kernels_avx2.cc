// AVX2 kernel path: 256-bit vectors, F16C conversions (round to nearest
// even). Only reached through the dispatcher (kernels.cc) on CPUs with AVX2
// and F16C. The ISA is enabled per function by RACKHUB_KERNEL_TARGET_BEGIN
// below, after all includes, so nothing outside this file is compiled for AVX2.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels_internal.h"

RACKHUB_KERNEL_TARGET_BEGIN("avx2,f16c")
#include "kernels_simd.h"

namespace rackhub::aggregation::internal {
namespace {

struct Avx2 : VectorArith, VectorMinMax {
  using F = __m256;
  static constexpr KernelPath kPath = KernelPath::kAvx2;
  static constexpr size_t kLanes = 8;
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void Stream(float* p, F v) { _mm256_stream_ps(p, v); }
  static void Fence() { _mm_sfence(); }
  static F LoadFp32(const unsigned char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static F LoadFp16(const unsigned char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBf16(const unsigned char* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void StoreFp16(unsigned char* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  // FloatToBf16 lane-wise: round to nearest even on the integer bits, NaN
  // keeps sign and top payload with the quiet bit forced.
  static void StoreBf16(unsigned char* p, F v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                              _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Every lane is <= 0xffff, so the unsigned-saturating pack is exact; it
    // packs within 128-bit halves, the permute gathers quadwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
};

}  // namespace
RACKHUB_KERNEL_TARGET_END()

const KernelTable& Avx2Kernels() { return kSimdKernels<Avx2>; }

}  // namespace rackhub::aggregation::internal
