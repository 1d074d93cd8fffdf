#include "convert.h"

#include <bit>
#include <cstring>

namespace rackhub::client {

uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  // 65520 = 0x477ff000 is halfway between 65504 (largest half) and 2^16:
  // it and everything above rounds to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // >= 2^-14: a normal half
    // Round the 13 dropped mantissa bits to nearest even, then rebias the
    // exponent (127 -> 15, i.e. minus 112). A mantissa carry bumps the exponent.
    const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  if (a < 0x33000000u) return sign;  // below 2^-25 (half the smallest subnormal): zero
  // Subnormal half: the result is round(|f| * 2^24). |f| = m * 2^(e - 150)
  // with the implicit bit in m, so |f| * 2^24 = m >> (126 - e).
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14..24 for e in 102..112
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // may become 0x400: smallest normal
  return static_cast<uint16_t>(sign | q);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x03ffu;
  if (e == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float tiny = static_cast<float>(m) * 0x1p-24f;  // exact
    return sign ? -tiny : tiny;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t FloatToBfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float Bfloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

namespace internal {

void NarrowFloats(DType dtype, const float* src, uint16_t* dst, size_t n) {
  if (dtype == DType::kFp16) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBfloat16(src[i]);
  }
}

void WidenToFloats(DType dtype, const void* src, float* dst, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, bytes + 2 * i, 2);
    dst[i] = dtype == DType::kFp16 ? HalfToFloat(v) : Bfloat16ToFloat(v);
  }
}

}  // namespace internal
}  // namespace rackhub::client
