// AVX-512 kernel path: 512-bit vectors (AVX-512F/BW/VL), vcvtph2ps/vcvtps2ph
// conversions (round to nearest even). Only reached through the dispatcher
// (kernels.cc) on CPUs with AVX-512F/BW/VL, AVX2 and F16C. The ISA is enabled
// per function by RACKHUB_KERNEL_TARGET_BEGIN below, after all includes, so nothing outside
// this file is compiled for AVX-512. bf16 narrowing uses integer rounding, not
// vcvtneps2bf16 (AVX512_BF16 flushes subnormal inputs to zero).
// GCC 12 false positive in its own headers (_mm512_undefined_*, GCC PR105593).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstring>

#include "kernels_internal.h"

RACKHUB_KERNEL_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx2,f16c")
#include "kernels_simd.h"

namespace rackhub::aggregation::internal {
namespace {

struct Avx512 : VectorArith, VectorMinMax {
  using F = __m512;
  static constexpr KernelPath kPath = KernelPath::kAvx512;
  static constexpr size_t kLanes = 16;
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void Stream(float* p, F v) { _mm512_stream_ps(p, v); }
  static void Fence() { _mm_sfence(); }
  static F LoadFp32(const unsigned char* p) { return _mm512_loadu_ps(p); }
  static F LoadFp16(const unsigned char* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBf16(const unsigned char* p) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void StoreFp16(unsigned char* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  // FloatToBf16 lane-wise: round to nearest even on the integer bits, NaN
  // keeps sign and top payload with the quiet bit forced.
  static void StoreBf16(unsigned char* p, F v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x0040));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));  // lanes <= 0xffff
  }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
};

}  // namespace
RACKHUB_KERNEL_TARGET_END()

const KernelTable& Avx512Kernels() { return kSimdKernels<Avx512>; }

}  // namespace rackhub::aggregation::internal
