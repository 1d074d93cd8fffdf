// Helpers shared by the kernel tests (kernels_test.cc, kernel_paths_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation::testing {

// Wire buffer helpers for the reduction tests: values exactly representable
// in every type, stored at an odd byte offset to exercise unaligned access.
inline std::vector<std::byte> Encode(const std::vector<float>& v, ElementType type, size_t offset) {
  std::vector<std::byte> out(offset + v.size() * ElementBytes(type));
  for (size_t i = 0; i < v.size(); ++i) {
    std::byte* at = out.data() + offset + i * ElementBytes(type);
    if (type == ElementType::kFp32) {
      std::memcpy(at, &v[i], 4);
    } else {
      const uint16_t h = type == ElementType::kFp16 ? FloatToFp16(v[i]) : FloatToBf16(v[i]);
      std::memcpy(at, &h, 2);
    }
  }
  return out;
}

inline OptimizerConfig Make(OptimizerType type, double lr, double mu, double wd) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  c.momentum = mu;
  c.weight_decay = wd;
  if (type == OptimizerType::kAdaGrad) c.initial_accumulator = 0.1;
  if (type == OptimizerType::kSumOnly) c = OptimizerConfig{OptimizerType::kSumOnly, 0};
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  return c;
}

}  // namespace rackhub::aggregation::testing
