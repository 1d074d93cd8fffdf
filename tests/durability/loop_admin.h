// The admin calls the durability loops make (kill_loop_test.cc,
// replacement_loop_test.cc): tenants on one daemon, with the loops' token.
// The channel outlives daemon restarts. Single-threaded use from a test body.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::testing {

inline constexpr char kLoopToken[] = "durability-loop-token-0123456789abcdef";

// The admin API of one daemon (the channel outlives restarts).
struct LoopAdmin {
  explicit LoopAdmin(const std::string& address)
      : channel(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        tenants(admin::v1::TenantService::NewStub(channel)),
        checkpoints(admin::v1::CheckpointService::NewStub(channel)) {}

  admin::v1::Tenant CreateTenant(const std::string& name, uint32_t workers, uint32_t chunk_bytes,
                                 int64_t bounded = -1) {
    grpc::ClientContext ctx;
    admin::v1::CreateTenantRequest req;
    if (bounded >= 0) {
      req.set_consistency(admin::v1::BOUNDED);
      req.set_staleness(static_cast<uint32_t>(bounded));
    }
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(chunk_bytes);
    req.set_token(kLoopToken);
    admin::v1::CreateTenantResponse resp;
    const grpc::Status s = tenants->CreateTenant(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.tenant();
  }
  // "" or the error.
  std::string DeleteTenant(const std::string& name) {
    grpc::ClientContext ctx;
    admin::v1::DeleteTenantRequest req;
    req.set_name(name);
    admin::v1::DeleteTenantResponse resp;
    const grpc::Status s = tenants->DeleteTenant(&ctx, req, &resp);
    return s.ok() ? "" : s.error_message();
  }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<admin::v1::TenantService::Stub> tenants;
  std::unique_ptr<admin::v1::CheckpointService::Stub> checkpoints;
};

}  // namespace rackhub::testing
