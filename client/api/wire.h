// Private to librackhub: mapping between the public client types and the
// wire / protobuf types. Pure functions; any thread. Errors are
// rackhub::Status (turned into client::Error by the callers).
#pragma once

#include <string>

#include "rackhub/client/client.h"
#include "rackhub/common/status.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub::client::internal {

net::DType WireDType(DType dtype);
// The VersionsSuffix at the end of a PARAMS payload (kFlagVersions); `bytes`
// holds at least net::kVersionsSuffixBytes.
net::VersionsSuffix ReadVersions(std::span<const std::byte> bytes);
// The MembershipSuffix at the end of a PARAMS payload (kFlagMembership);
// `bytes` holds at least net::kMembershipSuffixBytes.
net::MembershipSuffix ReadMembership(std::span<const std::byte> bytes);
// The public mirror of a wire error code (same number; client.h).
WireError ToClientWireError(net::WireError code);
admin::v1::DType ProtoDType(DType dtype);
// Returns false for values this client does not know.
bool FromProtoDType(int proto, DType* out);

// `spec` as the protobuf message; INVALID_ARGUMENT ("optimizer type 'x' ...")
// for a type this client does not know.
Result<admin::v1::Optimizer> ToProtoOptimizer(const OptimizerSpec& spec);

// Converts a KEY_INFO / WELCOME key entry; INVALID_ARGUMENT ("key 'w': ...")
// when it is unusable.
Result<KeyInfo> ToKeyInfo(const data::v1::KeyEntry& entry, uint32_t chunk_elements);


}  // namespace rackhub::client::internal
