#include "proto_convert.h"

#include <fmt/format.h>

namespace rackhub::server {

namespace pb = rackhub::admin::v1;
using aggregation::OptimizerConfig;
using aggregation::OptimizerType;
using aggregation::Reduction;

static_assert(static_cast<int>(Reduction::kMean) == pb::MEAN &&
              static_cast<int>(Reduction::kSum) == pb::SUM &&
              static_cast<int>(Reduction::kMin) == pb::MIN &&
              static_cast<int>(Reduction::kMax) == pb::MAX &&
              static_cast<int>(Reduction::kProduct) == pb::PRODUCT);

Result<ProtoOptimizer> OptimizerFromProto(const pb::Optimizer& in) {
  ProtoOptimizer r;
  r.unspecified_type = in.type() == pb::OPTIMIZER_UNSPECIFIED;
  if (!r.unspecified_type && (in.type() < pb::SGD || in.type() > pb::SUM_ONLY)) {
    return InvalidArgument(
        fmt::format("type: unknown optimizer type {}", static_cast<int>(in.type())));
  }
  if (in.reduction() < pb::REDUCTION_UNSPECIFIED || in.reduction() > pb::PRODUCT) {
    return InvalidArgument(
        fmt::format("reduction: unknown reduction {}", static_cast<int>(in.reduction())));
  }
  OptimizerConfig& out = r.config;
  out.type = r.unspecified_type ? OptimizerType::kSgd : static_cast<OptimizerType>(in.type());
  HyperparametersFromProto(in, &out);
  // The wire values equal Reduction's (MEAN = kMean = 1, ... PRODUCT = kProduct = 5).
  out.reduction = in.reduction() == pb::REDUCTION_UNSPECIFIED
                      ? Reduction::kMean
                      : static_cast<Reduction>(in.reduction());
  return r;
}

void OptimizerToProto(const OptimizerConfig& in, pb::Optimizer* out) {
  out->set_type(static_cast<pb::OptimizerType>(in.type));
  HyperparametersToProto(in, out);
  out->set_reduction(static_cast<pb::GradientReduction>(in.reduction));
}

void TenantToProto(const TenantInfo& in, pb::Tenant* out) {
  out->set_name(in.name);
  out->set_handle(in.handle);
  out->set_workers_per_rack(in.workers_per_rack);
  out->set_chunk_bytes(in.chunk_bytes);
  OptimizerToProto(in.default_optimizer, out->mutable_default_optimizer());
  out->mutable_quotas()->set_max_parameter_bytes(in.quotas.max_parameter_bytes);
  out->mutable_quotas()->set_max_keys(in.quotas.max_keys);
  out->mutable_quotas()->set_max_workers(in.quotas.max_workers);
  out->mutable_quotas()->set_weight(in.quotas.weight);
  out->set_key_count(in.key_count);
  out->set_parameter_bytes(in.parameter_bytes);
  out->set_chunk_count(in.chunk_count);
  out->set_created_unix_ms(in.created_unix_ms);
  out->set_memory_bytes(in.memory_bytes);
  out->set_consistency(ConsistencyToProto(in.consistency));
  out->set_staleness(in.staleness);
  out->set_elastic(in.elastic);
  out->set_min_workers(in.min_workers);
  if (in.elastic && in.counters) {
    out->set_membership_generation(in.counters->membership_generation.load());
    out->set_members(in.counters->members.load());
    out->set_paused(in.counters->paused.load());
  }
}

pb::Consistency ConsistencyToProto(Consistency c) {
  switch (c) {
    case Consistency::kBounded: return pb::BOUNDED;
    case Consistency::kAsync: return pb::ASYNC;
    default: return pb::SYNC;
  }
}

pb::InitMode InitModeToProto(InitMode mode) {
  switch (mode) {
    case InitMode::kFromClient: return pb::FROM_CLIENT;
    case InitMode::kRandom: return pb::RANDOM;
    default: return pb::ZEROS;
  }
}

std::optional<WireDType> WireDTypeFromProto(pb::DType dtype) {
  switch (dtype) {
    case pb::DTYPE_UNSPECIFIED:
    case pb::FP32: return WireDType::kFp32;
    case pb::FP16: return WireDType::kFp16;
    case pb::BF16: return WireDType::kBf16;
    default: return std::nullopt;
  }
}

std::optional<InitMode> InitModeFromProto(pb::InitMode mode) {
  switch (mode) {
    case pb::INIT_UNSPECIFIED:
    case pb::ZEROS: return InitMode::kZeros;
    case pb::FROM_CLIENT: return InitMode::kFromClient;
    case pb::RANDOM: return InitMode::kRandom;
    default: return std::nullopt;
  }
}

void KeyToProto(const KeyInfo& in, const std::vector<aggregation::ChunkSpan>& chunks,
                pb::Key* out) {
  out->set_tenant(in.tenant);
  out->set_name(in.name);
  out->set_id(in.id);
  out->set_elements(in.elements);
  out->set_dtype(static_cast<pb::DType>(in.dtype));
  OptimizerToProto(in.optimizer, out->mutable_optimizer());
  out->set_init(InitModeToProto(in.init));
  out->set_ready(in.ready);
  out->set_rows(in.rows);
  out->set_dim(in.dim);
  out->set_init_scale(in.init_scale);
  out->set_init_seed(in.init_seed);
  out->set_topk_ratio(static_cast<float>(in.topk_ratio));
  out->set_topk_ratio_exact(in.topk_ratio);
  for (uint32_t rank : in.participants) out->add_participants(rank);
  if (in.table()) {
    out->set_rows_per_chunk(in.rows_per_chunk());
  }
  out->set_first_chunk(in.placement.first_chunk);
  out->set_chunk_count(in.placement.chunk_count);
  out->set_chunk_elements(in.chunk_elements);
  out->set_parameter_bytes(in.parameter_bytes());
  out->set_memory_bytes(in.memory_bytes);
  for (const auto& c : chunks) {
    auto* ci = out->add_chunks();
    ci->set_index(c.index);
    ci->set_lane(c.lane);
    ci->set_first_element(c.first_element);
    ci->set_elements(c.elements);
  }
}

}  // namespace rackhub::server
