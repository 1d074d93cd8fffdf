#include "declare_check.h"

#include <optional>

#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

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
  KeyShapeFromProto(decl, &spec);
  spec.participants.assign(decl.participants().begin(), decl.participants().end());
  const std::optional<WireDType> dtype = WireDTypeFromProto(decl.dtype());
  if (!dtype) return fail(WireError::kInvalidArgument, "dtype: unknown dtype");
  spec.dtype = *dtype;
  const std::optional<InitMode> init = InitModeFromProto(decl.init());
  if (!init) return fail(WireError::kInvalidArgument, "init: unknown init mode");
  spec.init = *init;
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

void KeyDeclarationOf(const KeyInfo& key, data::v1::KeyDeclaration* out) {
  out->set_name(key.name);
  out->set_elements(key.table() ? 0 : key.elements);
  out->set_dtype(static_cast<admin::v1::DType>(key.dtype));
  OptimizerToProto(key.schedule.base, out->mutable_optimizer());
  out->set_init(InitModeToProto(key.init));
  out->set_rows(key.rows);
  out->set_dim(key.dim);
  out->set_init_scale(key.init_scale);
  out->set_init_seed(key.init_seed);
  out->set_topk_ratio(static_cast<float>(key.topk_ratio));
  out->set_topk_ratio_exact(key.topk_ratio);
}

}  // namespace rackhub::server
