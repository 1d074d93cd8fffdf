// Conversions between the admin API's protobuf messages and the registry's
// plain structs. Thread-safe (pure functions). Errors are rackhub::Status.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "rackhub/admin/v1/admin.pb.h"
#include "rackhub/common/status.h"
#include "registry.h"

namespace rackhub::server {

// A proto optimizer as a config, and whether the proto left the type
// unspecified (then config.type is SGD; SetOptimizer keeps the key's type).
struct ProtoOptimizer {
  aggregation::OptimizerConfig config;
  bool unspecified_type = false;
};
// Proto optimizer -> config. INVALID_ARGUMENT "type: ..." or "reduction: ..."
// for unknown enum values (callers put the message's field in front, e.g.
// "optimizer."). Hyperparameters are copied unchecked (see
// aggregation::NormalizeOptimizer).
Result<ProtoOptimizer> OptimizerFromProto(const admin::v1::Optimizer& in);

void OptimizerToProto(const aggregation::OptimizerConfig& in, admin::v1::Optimizer* out);

// The hyperparameters (learning rate to initial accumulator) of an optimizer
// message with the admin API's field names: admin::v1::Optimizer, and the
// etcd record cluster::v1::Optimizer. The type and reduction are the
// caller's: their enums differ between the messages.
template <typename OptimizerMessage>
void HyperparametersToProto(const aggregation::OptimizerConfig& in, OptimizerMessage* out) {
  out->set_learning_rate(in.learning_rate);
  out->set_momentum(in.momentum);
  out->set_weight_decay(in.weight_decay);
  out->set_beta1(in.beta1);
  out->set_beta2(in.beta2);
  out->set_epsilon(in.epsilon);
  out->set_initial_accumulator(in.initial_accumulator);
}
template <typename OptimizerMessage>
void HyperparametersFromProto(const OptimizerMessage& in, aggregation::OptimizerConfig* out) {
  out->learning_rate = in.learning_rate();
  out->momentum = in.momentum();
  out->weight_decay = in.weight_decay();
  out->beta1 = in.beta1();
  out->beta2 = in.beta2();
  out->epsilon = in.epsilon();
  out->initial_accumulator = in.initial_accumulator();
}
admin::v1::InitMode InitModeToProto(InitMode mode);
// Proto dtype / init mode -> the registry's (unspecified: fp32 / zeros);
// nullopt for a value the proto does not define (the caller names the field).
std::optional<WireDType> WireDTypeFromProto(admin::v1::DType dtype);
std::optional<InitMode> InitModeFromProto(admin::v1::InitMode mode);
// The KeySpec fields a key request names alike in the admin API
// (CreateKeyRequest) and on the data plane (DECLARE's KeyDeclaration): the
// name and shape, and how the values start. The dtype, init mode and
// optimizer are checked by the caller (the From* above).
template <typename KeyRequest>
void KeyShapeFromProto(const KeyRequest& in, KeySpec* spec) {
  spec->name = in.name();
  spec->elements = in.elements();
  spec->rows = in.rows();
  spec->dim = in.dim();
  spec->init_scale = in.init_scale();
  spec->init_seed = in.init_seed();
  spec->topk_ratio = in.topk_ratio_exact() != 0 ? in.topk_ratio_exact()
                                                : static_cast<double>(in.topk_ratio());
}
admin::v1::Consistency ConsistencyToProto(Consistency c);
void TenantToProto(const TenantInfo& in, admin::v1::Tenant* out);
// `chunks` may be empty (list calls leave the layout out).
void KeyToProto(const KeyInfo& in, const std::vector<aggregation::ChunkSpan>& chunks,
                admin::v1::Key* out);

}  // namespace rackhub::server
