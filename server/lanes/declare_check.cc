#include "declare_check.h"

#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;
using net::WireError;

DeclareCheck CheckDeclare(std::span<const std::byte> payload, const std::string& tenant) {
  DeclareCheck r;
  auto fail = [&r](WireError code, std::string text) {
    r.fatal = code == WireError::kMalformed;
    r.code = code;
    r.text = std::move(text);
    return r;
  };
  data::v1::KeyDeclaration decl;
  if (!decl.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return fail(WireError::kMalformed, "payload: DECLARE is not a KeyDeclaration");
  }
  KeySpec& spec = r.spec;
  spec.tenant = tenant;
  spec.name = decl.name();
  spec.elements = decl.elements();
  switch (decl.dtype()) {
    case pb::DTYPE_UNSPECIFIED:
    case pb::FP32: spec.dtype = WireDType::kFp32; break;
    case pb::FP16: spec.dtype = WireDType::kFp16; break;
    case pb::BF16: spec.dtype = WireDType::kBf16; break;
    default: return fail(WireError::kInvalidArgument, "dtype: unknown dtype");
  }
  switch (decl.init()) {
    case pb::INIT_UNSPECIFIED:
    case pb::ZEROS: spec.init = InitMode::kZeros; break;
    case pb::FROM_CLIENT: spec.init = InitMode::kFromClient; break;
    case pb::RANDOM: spec.init = InitMode::kRandom; break;
    default: return fail(WireError::kInvalidArgument, "init: unknown init mode");
  }
  spec.rows = decl.rows();
  spec.dim = decl.dim();
  spec.init_scale = decl.init_scale();
  spec.init_seed = decl.init_seed();
  spec.topk_ratio = decl.topk_ratio();
  spec.use_tenant_optimizer = !decl.has_optimizer();
  if (decl.has_optimizer()) {
    Result<ProtoOptimizer> opt = OptimizerFromProto(decl.optimizer());
    if (!opt.ok() || opt->unspecified_type) {
      return fail(WireError::kInvalidArgument,
                  "optimizer." + (opt.ok() ? std::string("type: required")
                                           : opt.status().message()));
    }
    spec.optimizer = opt->config;
  }
  r.ok = true;
  return r;
}

}  // namespace rackhub::server
