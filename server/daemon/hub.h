// Hub: the parts of one rackhubd instance (registry, lane threads, data
// plane, checkpointer, TCP and RDMA acceptors, admin gRPC server), started in dependency
// order by Start and torn down by the one path, Stop (also run by the
// destructor and after a failed Start). rackhubd runs one Hub from main();
// tests can run one in-process (ports 0 give ephemeral ports).
//
// Threading: Start and Stop from one thread (the main thread in rackhubd).
// Accessors may be used from that thread while the hub runs.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "config.h"
#include "rackhub/net/tls/context.h"
#include "rackhub/common/status.h"

namespace grpc {
class Server;
}

namespace rackhub::server {

class ClusterMembership;

class AdminAuth;
class AdminServices;
class Checkpointer;
class DataPlane;
class HealthService;
class LaneSet;
class MetricsExporter;
class RdmaListener;
class Registry;
class ShmAcceptor;
class TcpAcceptor;

class Hub {
 public:
  explicit Hub(const Config& config);
  ~Hub();
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;

  // FAILED_PRECONDITION: a configuration problem (exit 78, no restart);
  // INTERNAL: could not start (e.g. a port in use). Messages name the field.
  Status Start();
  // Workers get SHUTTING_DOWN and up to `grace` for their last frames; admin
  // calls drain; tenants are checkpointed (checkpoint.on_shutdown); every
  // thread is joined and the registry closed (the state directory is free
  // for another Hub; registry() may no longer be used). Idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  // What SIGKILL of rackhubd leaves behind, for tests that run the hub
  // in-process (tests/support/in_process_hub.h): no SHUTTING_DOWN, every
  // worker connection and hub link is closed at once (DataPlane::Abort) as
  // the kernel closes a killed process's sockets, admin calls are cancelled,
  // nothing is checkpointed (checkpoint.on_shutdown does not apply). The
  // state directory keeps only what was durable before: the registry and
  // the checkpoints already written. Then every thread is joined, as by
  // Stop. Idempotent; once either Stop or Crash ran, the other does nothing.
  void Crash();

  const std::string& admin_address() const { return admin_address_; }
  const std::string& data_address() const { return data_address_; }
  // HOST:PORT of /metrics; "" when metrics.enabled is false.
  const std::string& metrics_address() const { return metrics_address_; }
  DataPlane& data_plane() { return *data_plane_; }
  Registry& registry() { return *registry_; }
  LaneSet& lanes() { return *lanes_; }
  Checkpointer& checkpointer() { return *checkpointer_; }
  uint32_t lane_count() const { return lane_count_; }
  // Turns the admin server's health status to NOT_SERVING (draining).
  void SetNotServing();

 private:
  Status StartAdmin();
  // Stop and Crash: the one teardown path.
  void Teardown(bool crash, std::chrono::milliseconds grace);

  Status OpenRegistry();
  // topology.racks_from = "etcd": registers this hub and fills
  // config_.topology.racks from etcd.
  Status DiscoverRacks();

  Config config_;  // changed only by Start (racks from etcd), before any use
  uint32_t lane_count_ = 0;
  std::string admin_address_;
  std::string data_address_;
  std::string metrics_address_;
  // Declared in start order; Stop tears down in reverse.
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<LaneSet> lanes_;
  std::unique_ptr<DataPlane> data_plane_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<TcpAcceptor> tcp_;
  // Hub links' TLS (topology.tls_*), shared by the acceptor and the lanes'
  // connector; null without TLS.
  std::shared_ptr<const net::tls::TlsContext> hub_tls_;
  std::unique_ptr<ShmAcceptor> shm_;
  std::unique_ptr<RdmaListener> rdma_;
  std::unique_ptr<AdminAuth> auth_;
  std::unique_ptr<AdminServices> services_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> admin_;
  std::unique_ptr<MetricsExporter> metrics_;
  // After data_plane_: its threads call into the data plane, so it goes first.
  std::unique_ptr<ClusterMembership> membership_;
  bool stopped_ = false;
};

}  // namespace rackhub::server
