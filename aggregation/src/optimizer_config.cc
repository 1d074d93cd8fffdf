#include "rackhub/aggregation/optimizer_config.h"

#include <cmath>

namespace rackhub::aggregation {
namespace {

bool Finite(double v) { return std::isfinite(v); }

std::string MustBeZero(const char* field, double v, OptimizerType t) {
  if (v != 0) {
    return std::string(field) + ": not used by " + OptimizerTypeName(t) + " (must be 0)";
  }
  return "";
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

std::string NormalizeOptimizer(OptimizerConfig* c) {
  const double fields[] = {c->learning_rate, c->momentum,  c->weight_decay,       c->beta1,
                           c->beta2,         c->epsilon,   c->initial_accumulator};
  const char* names[] = {"learning_rate", "momentum", "weight_decay",       "beta1",
                         "beta2",         "epsilon",  "initial_accumulator"};
  for (int i = 0; i < 7; ++i) {
    if (!Finite(fields[i])) return std::string(names[i]) + ": must be a finite number";
  }
  if (c->reduction != Reduction::kMean && c->reduction != Reduction::kSum) {
    return "reduction: must be mean or sum";
  }
  const OptimizerType t = c->type;
  if (t == OptimizerType::kSumOnly) {
    for (int i = 0; i < 7; ++i) {
      if (auto e = MustBeZero(names[i], fields[i], t); !e.empty()) return e;
    }
    return "";
  }
  if (!(c->learning_rate > 0)) return "learning_rate: must be > 0";
  if (c->weight_decay < 0) return "weight_decay: must be >= 0";
  const bool adam = t == OptimizerType::kAdam || t == OptimizerType::kAdamW;
  const bool uses_momentum = t == OptimizerType::kMomentum || t == OptimizerType::kNesterov;
  if (uses_momentum) {
    if (!(c->momentum > 0 && c->momentum < 1)) return "momentum: must be in (0, 1)";
  } else if (auto e = MustBeZero("momentum", c->momentum, t); !e.empty()) {
    return e;
  }
  if (adam) {
    if (c->beta1 == 0) c->beta1 = 0.9;
    if (c->beta2 == 0) c->beta2 = 0.999;
    if (c->epsilon == 0) c->epsilon = 1e-8;
    if (!(c->beta1 > 0 && c->beta1 < 1)) return "beta1: must be in [0, 1)";
    if (!(c->beta2 > 0 && c->beta2 < 1)) return "beta2: must be in [0, 1)";
  } else {
    if (auto e = MustBeZero("beta1", c->beta1, t); !e.empty()) return e;
    if (auto e = MustBeZero("beta2", c->beta2, t); !e.empty()) return e;
  }
  if (t == OptimizerType::kAdaGrad) {
    if (c->epsilon == 0) c->epsilon = 1e-10;
    if (c->initial_accumulator < 0) return "initial_accumulator: must be >= 0";
  } else if (auto e = MustBeZero("initial_accumulator", c->initial_accumulator, t); !e.empty()) {
    return e;
  }
  if (adam || t == OptimizerType::kAdaGrad) {
    if (!(c->epsilon > 0)) return "epsilon: must be > 0";
  } else if (auto e = MustBeZero("epsilon", c->epsilon, t); !e.empty()) {
    return e;
  }
  return "";
}

}  // namespace rackhub::aggregation
