// grpc.health.v1.Health on the admin port, so `grpc_health_probe`, grpcurl
// and load balancers can ask whether rackhubd serves.
//
// A synchronous service of rackhubd's own (proto/grpc/health/v1/health.proto)
// rather than gRPC's built-in one, which uses gRPC's callback API: ThreadSanitizer
// cannot see that API's hand-overs inside uninstrumented libgrpc, and every
// other admin service is synchronous.
//
// Semantics (gRPC's doc/health-checking.md): Check of "" or of one of the
// admin services answers SERVING or NOT_SERVING, of any other name NOT_FOUND.
// Watch sends the current status at once and again on every change (an
// unknown name gets SERVICE_UNKNOWN) until the caller cancels or the daemon
// stops; at most kMaxWatchers at once (each holds a gRPC thread), beyond that
// RESOURCE_EXHAUSTED. Like gRPC's own health service it needs no admin token
// (probes and load balancers call it), so a peer that can reach the admin
// port can hold watcher slots until its connections end; Check is unaffected.
//
// Ownership: the Hub owns it and registers it with the admin server; it must
// outlive that server. Threading: SetServing and Shutdown from any thread;
// Check and Watch on gRPC's threads.
#pragma once

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace rackhub::server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  static constexpr int kMaxWatchers = 64;

  // `services`: the names Check and Watch know besides "".
  explicit HealthService(std::set<std::string> services);

  void SetServing(bool serving);
  // Ends every Watch (after a last NOT_SERVING) and refuses new ones
  // (UNAVAILABLE): call before the admin server's Shutdown, which would wait
  // for them.
  void Shutdown();

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  const std::set<std::string> services_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool serving_ = false;     // GUARDED_BY(mu_)
  bool shut_down_ = false;   // GUARDED_BY(mu_)
  uint64_t version_ = 0;     // GUARDED_BY(mu_): counts status changes
  int watchers_ = 0;         // GUARDED_BY(mu_)
};

}  // namespace rackhub::server
