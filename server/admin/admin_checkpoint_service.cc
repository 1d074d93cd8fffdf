// CheckpointService (rackhub.admin.v1): the admin API's face of the
// Checkpointer. Create/Delete/Restore are mutations (admin token); List is
// read-only. Threading: gRPC's threads, concurrently; the Checkpointer
// serializes what must be.
#include <chrono>
#include <memory>
#include <string>

#include "admin_service.h"
#include "checkpointer.h"
#include "rackhub/common/log_safe.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;

namespace {

void CheckpointToProto(const std::string& tenant, const CheckpointInfo& info,
                       pb::Checkpoint* out) {
  out->set_tenant(tenant);
  out->set_sequence(info.sequence);
  out->set_path(info.path);
  out->set_created_unix_ms(info.created_unix_ms);
  out->set_bytes(info.bytes);
  for (const auto& [key, iteration] : info.key_versions) {
    auto* k = out->add_keys();
    k->set_key(key);
    k->set_iteration(iteration);
  }
  out->set_problem(info.problem);
}

// Longest wait a caller may ask of CreateCheckpoint.
constexpr uint32_t kMaxTimeoutMs = 3600 * 1000;

class CheckpointServiceImpl final : public pb::CheckpointService::Service {
 public:
  CheckpointServiceImpl(Checkpointer* c, const AdminAuth* a) : checkpointer_(c), auth_(a) {}

  grpc::Status CreateCheckpoint(grpc::ServerContext* ctx, const pb::CreateCheckpointRequest* req,
                                pb::Checkpoint* resp) override {
    if (auto s = auth_->Check(ctx, true, "CreateCheckpoint"); !s.ok()) return s;
    if (req->timeout_ms() > kMaxTimeoutMs) {
      return ToGrpc(InvalidArgument("timeout_ms: at most " + std::to_string(kMaxTimeoutMs)));
    }
    const auto timeout = std::chrono::milliseconds(req->timeout_ms() == 0 ? 10000
                                                                         : req->timeout_ms());
    Result<CheckpointInfo> r = checkpointer_->Create(req->tenant(), timeout);
    const grpc::Status status = ToGrpc(r.status());
    Audit("CreateCheckpoint", QuoteForLog(req->tenant()), status);
    if (status.ok()) CheckpointToProto(req->tenant(), *r, resp);
    return status;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const pb::ListCheckpointsRequest* req,
                               pb::ListCheckpointsResponse* resp) override {
    if (auto s = auth_->Check(ctx, false, "ListCheckpoints"); !s.ok()) return s;
    Result<std::vector<CheckpointInfo>> r = checkpointer_->List(req->tenant());
    if (!r.ok()) return ToGrpc(r.status());
    for (const CheckpointInfo& c : *r) CheckpointToProto(req->tenant(), c, resp->add_checkpoints());
    return grpc::Status::OK;
  }

  grpc::Status DeleteCheckpoint(grpc::ServerContext* ctx, const pb::DeleteCheckpointRequest* req,
                                pb::DeleteCheckpointResponse*) override {
    if (auto s = auth_->Check(ctx, true, "DeleteCheckpoint"); !s.ok()) return s;
    if (req->sequence() == 0) return ToGrpc(InvalidArgument("sequence: required (>= 1)"));
    const grpc::Status status = ToGrpc(checkpointer_->Delete(req->tenant(), req->sequence()));
    Audit("DeleteCheckpoint", QuoteForLog(req->tenant()) + " #" + std::to_string(req->sequence()),
          status);
    return status;
  }

  grpc::Status RestoreCheckpoint(grpc::ServerContext* ctx, const pb::RestoreCheckpointRequest* req,
                                 pb::Checkpoint* resp) override {
    if (auto s = auth_->Check(ctx, true, "RestoreCheckpoint"); !s.ok()) return s;
    Result<CheckpointInfo> r = checkpointer_->Restore(req->tenant(), req->sequence());
    const grpc::Status status = ToGrpc(r.status());
    Audit("RestoreCheckpoint",
          QuoteForLog(req->tenant()) + " " +
              (req->sequence() == 0 ? std::string("newest") : "#" + std::to_string(req->sequence())),
          status);
    if (status.ok()) CheckpointToProto(req->tenant(), *r, resp);
    return status;
  }

 private:
  Checkpointer* checkpointer_;
  const AdminAuth* auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeCheckpointService(Checkpointer* checkpointer,
                                                     const AdminAuth* auth) {
  return std::make_unique<CheckpointServiceImpl>(checkpointer, auth);
}

}  // namespace rackhub::server
