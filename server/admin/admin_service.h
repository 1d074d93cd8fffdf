// The admin gRPC API (rackhub.admin.v1): TenantService, KeyService,
// StatsService over the Registry and CheckpointService over the Checkpointer
// (admin_checkpoint_service.cc), with admin-token authorization.
//
// Thread safety: the services are called concurrently by gRPC's threads; they
// hold no state of their own besides const configuration and go through the
// thread-safe Registry.
#pragma once

#include <chrono>
#include <functional>
#include <vector>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "registry.h"
#include "stall_report.h"

namespace rackhub::server {

// Checks the `authorization: Bearer <token>` metadata of a call.
class AdminAuth {
 public:
  // Empty admin_token disables token checks (loopback-only or mTLS setups).
  AdminAuth(std::string admin_token, std::string readonly_token);
  // OK, UNAUTHENTICATED (missing/wrong token) or PERMISSION_DENIED (read-only
  // token on a mutating call).
  grpc::Status Check(const grpc::ServerContext* context, bool mutation,
                     const char* method) const;

 private:
  std::string admin_token_;
  std::string readonly_token_;
};

// Bytes exchanged with another rack's hub (all lanes).
struct RackLinkInfo {
  uint32_t peer_rack = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  uint64_t chunk_bytes_out = 0;  // RACK_SUM + RACK_PARAMS frames only
};

// One lane thread as StatsService reports it.
struct LaneInfo {
  int cpu = -1;               // pinned core; -1: not pinned
  double busy_seconds = 0;    // CPU time of its thread
};

// What StatsService reports about the daemon itself, and the hub parts it
// asks (each function thread-safe).
struct DaemonIdentity {
  std::string version;
  std::chrono::steady_clock::time_point started;
  uint32_t rack = 0;
  uint32_t racks = 1;
  std::function<std::vector<RackLinkInfo>()> rack_links;
  std::function<std::vector<LaneInfo>()> lanes;
  // DataPlane::Stalls with a bounded wait.
  std::function<std::vector<StallEntry>(uint32_t handle, std::chrono::nanoseconds min_wait,
                                        std::vector<uint32_t>* unanswered)>
      stalls;
  std::mutex addresses_mu;
  std::string data_listen;   // GUARDED_BY(addresses_mu): set once listening
  std::string admin_listen;  // GUARDED_BY(addresses_mu)
};

class Checkpointer;

// Shared by the service implementations: a Status as a gRPC status (same
// codes), and the audit log line of a mutation (info when it succeeded,
// warn with the reason when refused). `what` quotes client-supplied names
// with QuoteForLog (rackhub/common/log_safe.h); the reason is passed through
// SafeForLog again and cut at kMaxLoggedMessageBytes.
inline constexpr size_t kMaxLoggedMessageBytes = 2048;
// The start of an UNAVAILABLE message the daemon sends itself (rackhubctl
// tells it from a daemon it cannot reach).
inline constexpr const char* kDaemonUnavailablePrefix = "rackhubd: ";
grpc::Status ToGrpc(const Status& s);
void Audit(const char* method, const std::string& what, const grpc::Status& s);
// StatsService (admin_stats_service.cc).
std::unique_ptr<grpc::Service> MakeStatsService(Registry* registry, const AdminAuth* auth,
                                                std::shared_ptr<DaemonIdentity> identity);
// CheckpointService (admin_checkpoint_service.cc).
std::unique_ptr<grpc::Service> MakeCheckpointService(Checkpointer* checkpointer,
                                                     const AdminAuth* auth);

// Owns the service implementations; register them with a builder.
class AdminServices {
 public:
  AdminServices(Registry* registry, const AdminAuth* auth,
                std::shared_ptr<DaemonIdentity> identity, Checkpointer* checkpointer);
  ~AdminServices();
  void RegisterWith(grpc::ServerBuilder* builder);
  // Set once listeners are bound (ports may be ephemeral).
  void SetListenAddresses(std::string admin, std::string data);

 private:
  class TenantServiceImpl;
  class KeyServiceImpl;
  std::unique_ptr<TenantServiceImpl> tenants_;
  std::unique_ptr<KeyServiceImpl> keys_;
  std::unique_ptr<grpc::Service> stats_;
  std::unique_ptr<grpc::Service> checkpoints_;
  std::shared_ptr<DaemonIdentity> identity_;
};

}  // namespace rackhub::server
