// Conversions between the admin API's protobuf messages and the registry's
// plain structs. Thread-safe (pure functions).
#pragma once

#include "rackhub/admin/v1/admin.pb.h"
#include "registry.h"

namespace rackhub::server {

// Proto optimizer -> config. `keep_type` is set when the proto leaves the
// type unspecified. Returns an error "field: reason" for unknown enum values.
std::string OptimizerFromProto(const admin::v1::Optimizer& in, aggregation::OptimizerConfig* out,
                               bool* unspecified_type);
void OptimizerToProto(const aggregation::OptimizerConfig& in, admin::v1::Optimizer* out);
void TenantToProto(const TenantInfo& in, admin::v1::Tenant* out);
// `chunks` may be empty (list calls leave the layout out).
void KeyToProto(const KeyInfo& in, const std::vector<aggregation::ChunkSpan>& chunks,
                admin::v1::Key* out);

}  // namespace rackhub::server
