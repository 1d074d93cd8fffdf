// Optimizer type and hyperparameters of one key, as the kernels understand
// them, and the rules for what is valid.
//
// Plain values; no synchronization.
#pragma once

#include <cstdint>
#include <string>

#include "rackhub/common/status.h"

namespace rackhub::aggregation {

enum class OptimizerType : uint8_t {
  kSgd = 1,
  kMomentum = 2,
  kNesterov = 3,
  kAdam = 4,
  kAdamW = 5,
  kAdaGrad = 6,
  kSumOnly = 7,  // no update: the reply is the reduced gradient
};

// How worker contributions are combined before the update. kMin, kMax and
// kProduct combine element-wise in rank order (kernels.h, ReduceInto, for the
// exact NaN and signed-zero rules) and are only valid with
// OptimizerType::kSumOnly: the reply is the reduced value itself.
enum class Reduction : uint8_t {
  kMean = 1,  // sum / number of contributions
  kSum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kSgd;
  double learning_rate = 0.01;
  double momentum = 0;
  double weight_decay = 0;
  double beta1 = 0;
  double beta2 = 0;
  double epsilon = 0;
  double initial_accumulator = 0;
  Reduction reduction = Reduction::kMean;

  bool operator==(const OptimizerConfig&) const = default;
};

// Fills defaults for zero fields (Adam betas 0.9/0.999, epsilon 1e-8, AdaGrad
// epsilon 1e-10) and checks every field against the type: INVALID_ARGUMENT
// "<field>: <reason>" naming the first bad field ("reduction: min needs
// optimizer type sum-only ..." for an element-wise reduction with an optimizer).
Status NormalizeOptimizer(OptimizerConfig* config);

const char* OptimizerTypeName(OptimizerType type);  // "sgd", "adam", ...
// "mean", "sum", "min", "max", "product"; "unknown" for other values.
const char* ReductionName(Reduction reduction);
// True for kMin, kMax and kProduct: combined element by element, not summed
// (no top-k compression, no row-sparse tables, sum-only keys only).
constexpr bool IsElementwiseReduction(Reduction r) {
  return r == Reduction::kMin || r == Reduction::kMax || r == Reduction::kProduct;
}
// Number of fp32 state values per parameter the optimizer keeps (0, 1 or 2).
int OptimizerStateSlots(OptimizerType type);

}  // namespace rackhub::aggregation
