#include "admin_service.h"

#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpointer.h"
#include "rackhub/common/log_safe.h"
#include "proto_convert.h"
#include "token.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;

namespace {

// GetKey's page of chunks: by default, and at most.
constexpr uint64_t kDefaultChunkPage = 1000;
constexpr uint64_t kMaxChunkPage = 10000;

grpc::Status Invalid(const std::string& m) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, m);
}

// Converts an optional proto optimizer; `present` false means "not given"
// (default config, type unspecified). Errors name the field: "optimizer.type: ...".
Result<ProtoOptimizer> OptimizerArg(const char* field, bool present, const pb::Optimizer& in) {
  if (!present) return ProtoOptimizer{{}, /*unspecified_type=*/true};
  Result<ProtoOptimizer> r = OptimizerFromProto(in);
  if (!r.ok()) return InvalidArgument(fmt::format("{}.{}", field, r.status().message()));
  return r;
}

}  // namespace

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // Client text in messages is escaped where it is quoted (QuoteForLog); this
  // bounds whatever reaches a client.
  // UNAVAILABLE from the daemon itself (etcd cannot be reached) starts with
  // kDaemonUnavailablePrefix, so clients do not take it for "the daemon
  // cannot be reached".
  std::string message = SafeForLog(s.message(), kMaxLoggedMessageBytes);
  if (s.code() == StatusCode::kUnavailable) message = kDaemonUnavailablePrefix + message;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), message);
}

void Audit(const char* method, const std::string& what, const grpc::Status& s) {
  if (s.ok()) {
    spdlog::info("admin: {} {}", method, what);
  } else {
    // The message quotes client text already made safe at its source; passing
    // it through again bounds the line whatever a source forgot.
    spdlog::warn("admin: {} {} refused: {}", method, what,
                 SafeForLog(s.error_message(), kMaxLoggedMessageBytes));
  }
}

AdminAuth::AdminAuth(std::string admin_token, std::string readonly_token)
    : admin_token_(std::move(admin_token)), readonly_token_(std::move(readonly_token)) {}

grpc::Status AdminAuth::Check(const grpc::ServerContext* context, bool mutation,
                              const char* method) const {
  if (admin_token_.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization: missing admin token (send metadata 'authorization: "
                        "Bearer <token>')");
  }
  const std::string value(it->second.data(), it->second.size());
  static const std::string kBearer = "Bearer ";
  if (value.rfind(kBearer, 0) != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization: expected 'Bearer <token>'");
  }
  const std::string token = value.substr(kBearer.size());
  if (SecretsEqual(token, admin_token_)) return grpc::Status::OK;
  if (!readonly_token_.empty() && SecretsEqual(token, readonly_token_)) {
    if (!mutation) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        std::string("authorization: the read-only token may not call ") + method);
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: wrong admin token");
}

class AdminServices::TenantServiceImpl final : public pb::TenantService::Service {
 public:
  TenantServiceImpl(Registry* r, const AdminAuth* a, Checkpointer* c)
      : registry_(r), auth_(a), checkpointer_(c) {}

  grpc::Status CreateTenant(grpc::ServerContext* ctx, const pb::CreateTenantRequest* req,
                            pb::CreateTenantResponse* resp) override {
    if (auto s = auth_->Check(ctx, true, "CreateTenant"); !s.ok()) return s;
    TenantSpec spec;
    spec.name = req->name();
    spec.workers_per_rack = req->workers_per_rack();
    spec.chunk_bytes = req->chunk_bytes();
    const Result<ProtoOptimizer> opt =
        OptimizerArg("default_optimizer", req->has_default_optimizer(), req->default_optimizer());
    if (!opt.ok()) return ToGrpc(opt.status());
    spec.default_optimizer = opt->config;
    if (opt->unspecified_type && req->has_default_optimizer()) {
      spec.default_optimizer.type = aggregation::OptimizerType::kSgd;
    }
    spec.quotas.max_parameter_bytes = req->quotas().max_parameter_bytes();
    spec.quotas.max_keys = req->quotas().max_keys();
    spec.quotas.max_workers = req->quotas().max_workers();
    spec.quotas.weight = req->quotas().weight();
    spec.token = req->token();
    switch (req->consistency()) {
      case pb::CONSISTENCY_UNSPECIFIED:
      case pb::SYNC: spec.consistency = Consistency::kSync; break;
      case pb::BOUNDED: spec.consistency = Consistency::kBounded; break;
      case pb::ASYNC: spec.consistency = Consistency::kAsync; break;
      default: return Invalid("consistency: unknown mode " + std::to_string(req->consistency()));
    }
    spec.staleness = req->staleness();
    spec.elastic = req->elastic();
    spec.min_workers = req->min_workers();
    TenantInfo info;
    std::string token;
    const auto status = ToGrpc(registry_->CreateTenant(spec, &info, &token));
    Audit("CreateTenant", QuoteForLog(req->name()), status);
    if (!status.ok()) return status;
    TenantToProto(info, resp->mutable_tenant());
    resp->set_token(token);
    return status;
  }

  grpc::Status GetTenant(grpc::ServerContext* ctx, const pb::GetTenantRequest* req,
                         pb::Tenant* resp) override {
    if (auto s = auth_->Check(ctx, false, "GetTenant"); !s.ok()) return s;
    TenantInfo info;
    if (auto s = ToGrpc(registry_->GetTenant(req->name(), &info)); !s.ok()) return s;
    TenantToProto(info, resp);
    return grpc::Status::OK;
  }

  grpc::Status ListTenants(grpc::ServerContext* ctx, const pb::ListTenantsRequest*,
                           pb::ListTenantsResponse* resp) override {
    if (auto s = auth_->Check(ctx, false, "ListTenants"); !s.ok()) return s;
    for (const auto& t : registry_->ListTenants()) TenantToProto(t, resp->add_tenants());
    return grpc::Status::OK;
  }

  grpc::Status UpdateQuotas(grpc::ServerContext* ctx, const pb::UpdateQuotasRequest* req,
                            pb::Tenant* resp) override {
    if (auto s = auth_->Check(ctx, true, "UpdateQuotas"); !s.ok()) return s;
    Quotas q{req->quotas().max_parameter_bytes(), req->quotas().max_keys(),
             req->quotas().max_workers(), req->quotas().weight()};
    TenantInfo info;
    const auto status = ToGrpc(registry_->UpdateQuotas(req->name(), q, &info));
    Audit("UpdateQuotas", QuoteForLog(req->name()), status);
    if (status.ok()) TenantToProto(info, resp);
    return status;
  }

  grpc::Status DeleteTenant(grpc::ServerContext* ctx, const pb::DeleteTenantRequest* req,
                            pb::DeleteTenantResponse*) override {
    if (auto s = auth_->Check(ctx, true, "DeleteTenant"); !s.ok()) return s;
    TenantInfo gone;
    const bool known = registry_->GetTenant(req->name(), &gone).ok();
    const auto status = ToGrpc(registry_->DeleteTenant(req->name()));
    Audit("DeleteTenant", QuoteForLog(req->name()), status);
    // Its checkpoints go with it (after the registry commit: a crash in
    // between leaves a directory the next start-up removes).
    if (status.ok() && known && checkpointer_) checkpointer_->TenantDeleted(gone.handle);
    return status;
  }

 private:
  Registry* registry_;
  const AdminAuth* auth_;
  Checkpointer* checkpointer_;
};

class AdminServices::KeyServiceImpl final : public pb::KeyService::Service {
 public:
  KeyServiceImpl(Registry* r, const AdminAuth* a) : registry_(r), auth_(a) {}

  grpc::Status CreateKey(grpc::ServerContext* ctx, const pb::CreateKeyRequest* req,
                         pb::Key* resp) override {
    if (auto s = auth_->Check(ctx, true, "CreateKey"); !s.ok()) return s;
    KeySpec spec;
    spec.tenant = req->tenant();
    KeyShapeFromProto(*req, &spec);
    const std::optional<WireDType> dtype = WireDTypeFromProto(req->dtype());
    if (!dtype) return Invalid("dtype: unknown dtype " + std::to_string(req->dtype()));
    spec.dtype = *dtype;
    const std::optional<InitMode> init = InitModeFromProto(req->init());
    if (!init) return Invalid("init: unknown init mode " + std::to_string(req->init()));
    spec.init = *init;
    const Result<ProtoOptimizer> opt =
        OptimizerArg("optimizer", req->has_optimizer(), req->optimizer());
    if (!opt.ok()) return ToGrpc(opt.status());
    spec.optimizer = opt->config;
    if (req->has_optimizer() && opt->unspecified_type) {
      return Invalid("optimizer.type: required when optimizer is given (omit optimizer to use "
                     "the tenant's default)");
    }
    spec.use_tenant_optimizer = !req->has_optimizer();
    KeyInfo key;
    const auto status = ToGrpc(registry_->CreateKey(spec, &key));
    Audit("CreateKey", QuoteForLog(req->tenant()) + "/" + QuoteForLog(req->name()), status);
    if (status.ok()) KeyToProto(key, {}, resp);
    return status;
  }

  grpc::Status GetKey(grpc::ServerContext* ctx, const pb::GetKeyRequest* req,
                      pb::Key* resp) override {
    if (auto s = auth_->Check(ctx, false, "GetKey"); !s.ok()) return s;
    KeyInfo key;
    if (auto s = ToGrpc(registry_->GetKey(req->tenant(), req->name(), &key)); !s.ok()) return s;
    // One page of the chunk list and a per-lane summary: the reply does not
    // grow with the key (a key of 2^30 elements in 1 KiB chunks has 4 M).
    const uint64_t count = key.placement.chunk_count;
    if (req->chunk_limit() > kMaxChunkPage) {
      return Invalid("chunk_limit: " + std::to_string(req->chunk_limit()) + " is more than " +
                     std::to_string(kMaxChunkPage) + " chunks per reply (page with chunk_offset)");
    }
    if (req->chunk_offset() > count) {
      return Invalid("chunk_offset: " + std::to_string(req->chunk_offset()) + " is past the " +
                     std::to_string(count) + " chunks of key '" + req->name() + "'");
    }
    const uint64_t limit = req->chunk_limit() == 0 ? kDefaultChunkPage : req->chunk_limit();
    KeyToProto(key, registry_->ChunksOf(key, req->chunk_offset(), limit), resp);
    resp->set_chunk_offset(req->chunk_offset());
    const auto lanes = registry_->LanesOf(key);
    for (uint32_t l = 0; l < lanes.size(); ++l) {
      auto* share = resp->add_lanes();
      share->set_lane(l);
      share->set_chunks(lanes[l].chunks);
      share->set_elements(lanes[l].elements);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListKeys(grpc::ServerContext* ctx, const pb::ListKeysRequest* req,
                        pb::ListKeysResponse* resp) override {
    if (auto s = auth_->Check(ctx, false, "ListKeys"); !s.ok()) return s;
    std::vector<KeyInfo> keys;
    if (auto s = ToGrpc(registry_->ListKeys(req->tenant(), &keys)); !s.ok()) return s;
    for (const auto& k : keys) KeyToProto(k, {}, resp->add_keys());
    return grpc::Status::OK;
  }

  grpc::Status DeleteKey(grpc::ServerContext* ctx, const pb::DeleteKeyRequest* req,
                         pb::DeleteKeyResponse*) override {
    if (auto s = auth_->Check(ctx, true, "DeleteKey"); !s.ok()) return s;
    const auto status = ToGrpc(registry_->DeleteKey(req->tenant(), req->name()));
    Audit("DeleteKey", QuoteForLog(req->tenant()) + "/" + QuoteForLog(req->name()), status);
    return status;
  }

  grpc::Status SetOptimizer(grpc::ServerContext* ctx, const pb::SetOptimizerRequest* req,
                            pb::Key* resp) override {
    if (auto s = auth_->Check(ctx, true, "SetOptimizer"); !s.ok()) return s;
    if (!req->has_optimizer()) return Invalid("optimizer: required");
    const Result<ProtoOptimizer> opt = OptimizerArg("optimizer", true, req->optimizer());
    if (!opt.ok()) return ToGrpc(opt.status());
    KeyInfo key;
    const auto status = ToGrpc(registry_->SetOptimizer(req->tenant(), req->name(), opt->config,
                                                       opt->unspecified_type, &key));
    Audit("SetOptimizer", QuoteForLog(req->tenant()) + "/" + QuoteForLog(req->name()), status);
    if (status.ok()) KeyToProto(key, {}, resp);
    return status;
  }

 private:
  Registry* registry_;
  const AdminAuth* auth_;
};

AdminServices::AdminServices(Registry* registry, const AdminAuth* auth,
                             std::shared_ptr<DaemonIdentity> identity, Checkpointer* checkpointer)
    : identity_(std::move(identity)) {
  tenants_ = std::make_unique<TenantServiceImpl>(registry, auth, checkpointer);
  checkpoints_ = MakeCheckpointService(checkpointer, auth);
  keys_ = std::make_unique<KeyServiceImpl>(registry, auth);
  stats_ = MakeStatsService(registry, auth, identity_);
}

AdminServices::~AdminServices() = default;

void AdminServices::RegisterWith(grpc::ServerBuilder* builder) {
  builder->RegisterService(tenants_.get());
  builder->RegisterService(keys_.get());
  builder->RegisterService(stats_.get());
  builder->RegisterService(checkpoints_.get());
}

void AdminServices::SetListenAddresses(std::string admin, std::string data) {
  std::lock_guard lock(identity_->addresses_mu);
  identity_->admin_listen = std::move(admin);
  identity_->data_listen = std::move(data);
}

}  // namespace rackhub::server
