#include "rackhub/aggregation/optimizer_config.h"

#include <cmath>

namespace rackhub::aggregation {
namespace {

bool Finite(double v) { return std::isfinite(v); }

Status MustBeZero(const char* field, double v, OptimizerType t) {
  if (v != 0) {
    return InvalidArgument(std::string(field) + ": not used by " + OptimizerTypeName(t) +
                           " (must be 0)");
  }
  return Status::Ok();
}

}  // namespace

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd: return "sgd";
    case OptimizerType::kMomentum: return "momentum";
    case OptimizerType::kNesterov: return "nesterov";
    case OptimizerType::kAdam: return "adam";
    case OptimizerType::kAdamW: return "adamw";
    case OptimizerType::kAdaGrad: return "adagrad";
    case OptimizerType::kSumOnly: return "sum-only";
  }
  return "unknown";
}

const char* ReductionName(Reduction reduction) {
  switch (reduction) {
    case Reduction::kMean: return "mean";
    case Reduction::kSum: return "sum";
    case Reduction::kMin: return "min";
    case Reduction::kMax: return "max";
    case Reduction::kProduct: return "product";
  }
  return "unknown";
}

int OptimizerStateSlots(OptimizerType type) {
  switch (type) {
    case OptimizerType::kMomentum:
    case OptimizerType::kNesterov:
    case OptimizerType::kAdaGrad: return 1;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: return 2;
    default: return 0;
  }
}

Status NormalizeOptimizer(OptimizerConfig* c) {
  const double fields[] = {c->learning_rate, c->momentum, c->weight_decay,       c->beta1,
                           c->beta2,         c->epsilon,  c->initial_accumulator};
  const char* names[] = {"learning_rate", "momentum", "weight_decay",       "beta1",
                         "beta2",         "epsilon",  "initial_accumulator"};
  for (int i = 0; i < 7; ++i) {
    if (!Finite(fields[i])) {
      return InvalidArgument(std::string(names[i]) + ": must be a finite number");
    }
  }
  if (c->reduction < Reduction::kMean || c->reduction > Reduction::kProduct) {
    return InvalidArgument("reduction: must be mean, sum, min, max or product");
  }
  const OptimizerType t = c->type;
  if (IsElementwiseReduction(c->reduction) && t != OptimizerType::kSumOnly) {
    return InvalidArgument(std::string("reduction: ") + ReductionName(c->reduction) +
                           " needs optimizer type sum-only (the hub returns the reduced value; " +
                           OptimizerTypeName(t) + " would update parameters with it)");
  }
  if (t == OptimizerType::kSumOnly) {
    for (int i = 0; i < 7; ++i) {
      if (Status s = MustBeZero(names[i], fields[i], t); !s.ok()) return s;
    }
    return Status::Ok();
  }
  if (!(c->learning_rate > 0)) return InvalidArgument("learning_rate: must be > 0");
  if (c->weight_decay < 0) return InvalidArgument("weight_decay: must be >= 0");
  const bool adam = t == OptimizerType::kAdam || t == OptimizerType::kAdamW;
  const bool uses_momentum = t == OptimizerType::kMomentum || t == OptimizerType::kNesterov;
  if (uses_momentum) {
    if (!(c->momentum > 0 && c->momentum < 1)) {
      return InvalidArgument("momentum: must be in (0, 1)");
    }
  } else if (Status s = MustBeZero("momentum", c->momentum, t); !s.ok()) {
    return s;
  }
  if (adam) {
    if (c->beta1 == 0) c->beta1 = 0.9;
    if (c->beta2 == 0) c->beta2 = 0.999;
    if (c->epsilon == 0) c->epsilon = 1e-8;
    if (!(c->beta1 > 0 && c->beta1 < 1)) return InvalidArgument("beta1: must be in [0, 1)");
    if (!(c->beta2 > 0 && c->beta2 < 1)) return InvalidArgument("beta2: must be in [0, 1)");
  } else {
    if (Status s = MustBeZero("beta1", c->beta1, t); !s.ok()) return s;
    if (Status s = MustBeZero("beta2", c->beta2, t); !s.ok()) return s;
  }
  if (t == OptimizerType::kAdaGrad) {
    if (c->epsilon == 0) c->epsilon = 1e-10;
    if (c->initial_accumulator < 0) return InvalidArgument("initial_accumulator: must be >= 0");
  } else if (Status s = MustBeZero("initial_accumulator", c->initial_accumulator, t); !s.ok()) {
    return s;
  }
  if (adam || t == OptimizerType::kAdaGrad) {
    if (!(c->epsilon > 0)) return InvalidArgument("epsilon: must be > 0");
  } else if (Status s = MustBeZero("epsilon", c->epsilon, t); !s.ok()) {
    return s;
  }
  return Status::Ok();
}

}  // namespace rackhub::aggregation
