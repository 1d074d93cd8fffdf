// Private to librackhub: mapping between the public client types and the
// wire / protobuf types. Pure functions; any thread.
#pragma once

#include <string>

#include "rackhub/client/client.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub::client::internal {

net::DType WireDType(DType dtype);
admin::v1::DType ProtoDType(DType dtype);
// Returns false for values this client does not know.
bool FromProtoDType(int proto, DType* out);

// Fills `out` from `spec`. Returns "" or what is wrong with the spec.
std::string FillOptimizer(const OptimizerSpec& spec, admin::v1::Optimizer* out);

// Converts a KEY_INFO / WELCOME key entry. Returns "" or why it is unusable.
std::string ToKeyInfo(const data::v1::KeyEntry& entry, uint32_t chunk_elements, KeyInfo* out);


}  // namespace rackhub::client::internal
