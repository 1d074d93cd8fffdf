// The element type the aggregation kernels use for a dtype of the wire
// (net::DType, in frame headers) or of the registry (WireDType, a key's
// declared dtype): the three enums share their values by design.
//
// Pure functions: any thread.
#pragma once

#include <cstdint>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/net/frame.h"
#include "registry.h"

namespace rackhub::server {

static_assert(static_cast<uint8_t>(net::DType::kFp32) ==
                  static_cast<uint8_t>(aggregation::ElementType::kFp32) &&
              static_cast<uint8_t>(net::DType::kFp16) ==
                  static_cast<uint8_t>(aggregation::ElementType::kFp16) &&
              static_cast<uint8_t>(net::DType::kBf16) ==
                  static_cast<uint8_t>(aggregation::ElementType::kBf16));
static_assert(static_cast<uint8_t>(WireDType::kFp32) == static_cast<uint8_t>(net::DType::kFp32) &&
              static_cast<uint8_t>(WireDType::kFp16) == static_cast<uint8_t>(net::DType::kFp16) &&
              static_cast<uint8_t>(WireDType::kBf16) == static_cast<uint8_t>(net::DType::kBf16));

inline aggregation::ElementType ElementTypeOf(net::DType d) {
  return static_cast<aggregation::ElementType>(static_cast<uint8_t>(d));
}
inline aggregation::ElementType ElementTypeOf(WireDType d) {
  return static_cast<aggregation::ElementType>(static_cast<uint8_t>(d));
}

}  // namespace rackhub::server
