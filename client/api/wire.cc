#include "wire.h"

#include <cstring>

#include <fmt/format.h>

namespace rackhub::client::internal {

net::DType WireDType(DType dtype) { return static_cast<net::DType>(static_cast<uint8_t>(dtype)); }

// client::WireError mirrors net::WireError number for number (client.h keeps
// the wire header out of the public API); these keep the two in step.
#define RACKHUB_SAME_WIRE_CODE(name)                   \
  static_assert(static_cast<uint32_t>(WireError::name) == \
                static_cast<uint32_t>(net::WireError::name))
RACKHUB_SAME_WIRE_CODE(kMalformed);
RACKHUB_SAME_WIRE_CODE(kUnauthenticated);
RACKHUB_SAME_WIRE_CODE(kUnknownKey);
RACKHUB_SAME_WIRE_CODE(kBadChunk);
RACKHUB_SAME_WIRE_CODE(kBadDType);
RACKHUB_SAME_WIRE_CODE(kBadIteration);
RACKHUB_SAME_WIRE_CODE(kDuplicatePush);
RACKHUB_SAME_WIRE_CODE(kNotReady);
RACKHUB_SAME_WIRE_CODE(kWorkerLost);
RACKHUB_SAME_WIRE_CODE(kQuotaExceeded);
RACKHUB_SAME_WIRE_CODE(kInvalidArgument);
RACKHUB_SAME_WIRE_CODE(kTenantGone);
RACKHUB_SAME_WIRE_CODE(kShuttingDown);
RACKHUB_SAME_WIRE_CODE(kInternal);
#undef RACKHUB_SAME_WIRE_CODE

WireError ToClientWireError(net::WireError code) {
  return static_cast<WireError>(static_cast<uint32_t>(code));
}

admin::v1::DType ProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return admin::v1::FP32;
    case DType::kFp16: return admin::v1::FP16;
    case DType::kBf16: return admin::v1::BF16;
  }
  return admin::v1::DTYPE_UNSPECIFIED;
}

bool FromProtoDType(int proto, DType* out) {
  switch (proto) {
    case admin::v1::DTYPE_UNSPECIFIED:
    case admin::v1::FP32: *out = DType::kFp32; return true;
    case admin::v1::FP16: *out = DType::kFp16; return true;
    case admin::v1::BF16: *out = DType::kBf16; return true;
    default: return false;
  }
}

Result<admin::v1::Optimizer> ToProtoOptimizer(const OptimizerSpec& spec) {
  static const struct {
    const char* name;
    admin::v1::OptimizerType type;
  } kTypes[] = {
      {"", admin::v1::OPTIMIZER_UNSPECIFIED}, {"sgd", admin::v1::SGD},
      {"momentum", admin::v1::MOMENTUM},      {"nesterov", admin::v1::NESTEROV},
      {"adam", admin::v1::ADAM},              {"adamw", admin::v1::ADAMW},
      {"adagrad", admin::v1::ADAGRAD},        {"sum-only", admin::v1::SUM_ONLY},
      {"sum_only", admin::v1::SUM_ONLY},
  };
  admin::v1::Optimizer out;
  bool known = false;
  for (const auto& t : kTypes) {
    if (spec.type == t.name) {
      out.set_type(t.type);
      known = true;
    }
  }
  if (!known) {
    return InvalidArgument(fmt::format(
        "optimizer type '{}' is not one of sgd, momentum, nesterov, adam, adamw, adagrad, "
        "sum-only",
        spec.type));
  }
  out.set_learning_rate(spec.learning_rate);
  out.set_momentum(spec.momentum);
  out.set_weight_decay(spec.weight_decay);
  out.set_beta1(spec.beta1);
  out.set_beta2(spec.beta2);
  out.set_epsilon(spec.epsilon);
  out.set_initial_accumulator(spec.initial_accumulator);
  static const struct {
    const char* name;
    admin::v1::GradientReduction reduction;
  } kReductions[] = {{"", admin::v1::MEAN},       {"mean", admin::v1::MEAN},
                     {"sum", admin::v1::SUM},     {"min", admin::v1::MIN},
                     {"max", admin::v1::MAX},     {"product", admin::v1::PRODUCT}};
  bool known_reduction = false;
  for (const auto& r : kReductions) {
    if (spec.reduction == r.name) {
      out.set_reduction(r.reduction);
      known_reduction = true;
    }
  }
  if (!known_reduction) {
    return InvalidArgument(fmt::format(
        "optimizer reduction '{}' is not one of mean, sum, min, max, product", spec.reduction));
  }
  return out;
}

net::MembershipSuffix ReadMembership(std::span<const std::byte> bytes) {
  net::MembershipSuffix m;
  std::memcpy(&m.generation, bytes.data(), 8);
  std::memcpy(&m.members, bytes.data() + 8, 4);
  return m;
}

net::VersionsSuffix ReadVersions(std::span<const std::byte> bytes) {
  net::VersionsSuffix v;
  std::memcpy(&v.updates, bytes.data(), 8);
  std::memcpy(&v.slowest, bytes.data() + 8, 8);
  return v;
}

Result<KeyInfo> ToKeyInfo(const data::v1::KeyEntry& entry, uint32_t chunk_elements) {
  KeyInfo k;
  k.id = entry.id();
  k.name = entry.name();
  k.elements = entry.elements();
  if (!FromProtoDType(entry.dtype(), &k.dtype)) {
    return InvalidArgument(
        fmt::format("key '{}': unknown dtype {}", entry.name(), static_cast<int>(entry.dtype())));
  }
  k.init = entry.init() == admin::v1::FROM_CLIENT ? Init::kFromClient
           : entry.init() == admin::v1::RANDOM    ? Init::kRandom
                                                  : Init::kZeros;
  k.rows = entry.rows();
  k.dim = entry.dim();
  k.rows_per_chunk = entry.rows_per_chunk();
  k.topk_ratio = entry.topk_ratio_exact() != 0 ? entry.topk_ratio_exact()
                                              : static_cast<double>(entry.topk_ratio());
  k.participants.assign(entry.participants().begin(), entry.participants().end());
  k.first_chunk = entry.first_chunk();
  k.chunk_count = entry.chunk_count();
  k.version = entry.version();
  k.next_iteration = entry.version();
  if (k.elements == 0) return InvalidArgument(fmt::format("key '{}': 0 elements", entry.name()));
  if (chunk_elements == 0) return InvalidArgument("chunk_elements: 0");
  if (k.rows > 0) {  // a table: whole rows per chunk (checked against the lanes when used)
    const uint64_t per = k.rows_per_chunk;
    if (k.dim == 0 || k.elements / k.dim != k.rows || k.elements % k.dim != 0 || per == 0 ||
        per > k.rows || k.chunk_count != k.rows / per + (k.rows % per != 0)) {
      return InvalidArgument(fmt::format("key '{}': a table of {} x {} with {} elements in {} "
                                         "chunks of {} rows is inconsistent",
                                         entry.name(), k.rows, k.dim, k.elements, k.chunk_count,
                                         per));
    }
    return k;
  }
  // Not (elements + chunk_elements - 1) / chunk_elements: that wraps for
  // elements near 2^64 and accepted e.g. 2^64-1 elements in 0 chunks (found
  // by fuzz/control).
  const uint64_t chunks = k.elements / chunk_elements + (k.elements % chunk_elements != 0);
  if (k.chunk_count != chunks) {
    return InvalidArgument(
        fmt::format("key '{}': {} elements in {} chunks of {} elements is inconsistent",
                    entry.name(), k.elements, k.chunk_count, chunk_elements));
  }
  return k;
}

}  // namespace rackhub::client::internal
