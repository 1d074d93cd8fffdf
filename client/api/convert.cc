// Element conversions for the wire: the client uses the same kernels as the
// hub (aggregation/kernels.h: round to nearest even, SIMD with runtime
// dispatch), so both sides convert bit for bit alike.
#include "convert.h"

#include "rackhub/aggregation/kernels.h"

namespace rackhub::client {

namespace agg = rackhub::aggregation;

uint16_t FloatToHalf(float f) { return agg::FloatToFp16(f); }
float HalfToFloat(uint16_t h) { return agg::Fp16ToFloat(h); }
uint16_t FloatToBfloat16(float f) { return agg::FloatToBf16(f); }
float Bfloat16ToFloat(uint16_t b) { return agg::Bf16ToFloat(b); }

namespace internal {

namespace {
agg::ElementType ElementTypeOf(DType dtype) {
  return dtype == DType::kFp16 ? agg::ElementType::kFp16 : agg::ElementType::kBf16;
}
}  // namespace

void NarrowFloats(DType dtype, const float* src, uint16_t* dst, size_t n) {
  agg::CopyOut(dst, src, n, ElementTypeOf(dtype));
}

void WidenToFloats(DType dtype, const void* src, float* dst, size_t n) {
  agg::CopyIn(dst, src, n, ElementTypeOf(dtype));
}

}  // namespace internal
}  // namespace rackhub::client
