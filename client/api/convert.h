// fp32 <-> fp16 / bf16 array conversions for wire payloads (client side).
//
// Kept independent of aggregation/ (the client must not link the hub's
// kernels). Narrowing rounds to nearest, ties to even. Pure functions; any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rackhub/client/client.h"

namespace rackhub::client::internal {

// dst[i] = src[i] narrowed to `dtype` (kFp16 or kBf16).
void NarrowFloats(DType dtype, const float* src, uint16_t* dst, size_t n);
// dst[i] = src[i] widened from `dtype` (kFp16 or kBf16). `src` may be unaligned.
void WidenToFloats(DType dtype, const void* src, float* dst, size_t n);

}  // namespace rackhub::client::internal
