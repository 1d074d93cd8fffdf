#include "hub.h"

#include <fstream>
#include <set>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "admin_service.h"
#include "checkpointer.h"
#include "data_plane.h"
#include "health_service.h"
#include "lanes.h"
#include "metrics_exporter.h"
#include "pem_file.h"
#include "rdma_listener.h"
#include "registry.h"
#include "cluster_membership.h"
#include "etcd_registry_store.h"
#include "registry_store.h"
#include "shm_acceptor.h"
#include "tcp_acceptor.h"
#include "token.h"

#ifndef RACKHUB_VERSION
#define RACKHUB_VERSION "0.0.0"
#endif

namespace rackhub::server {
namespace {

// In-flight admin calls get this long to finish at shutdown (they are short).
constexpr auto kAdminShutdownGrace = std::chrono::seconds(1);
// ListStalls waits this long for every lane (a hung lane is named instead).
constexpr auto kStallsTimeout = std::chrono::milliseconds(1000);

Status ReadSecretFile(const std::string& field, const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return FailedPrecondition(field + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  const auto first = s.find_first_not_of(" \t\r\n");
  const auto last = s.find_last_not_of(" \t\r\n");
  *out = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  if (out->empty()) return FailedPrecondition(field + ": '" + path + "' holds no token");
  if (out->find_first_of(" \t\r\n") != std::string::npos) {
    return FailedPrecondition(field + ": '" + path + "' must hold one token on one line");
  }
  return {};
}

Result<std::shared_ptr<grpc::ServerCredentials>> AdminCredentials(const AdminConfig& admin) {
  if (admin.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  Result<std::string> key = ReadPemFile("admin.tls_key_file", admin.tls_key_file);
  if (!key.ok()) return key.status();
  pair.private_key = *std::move(key);
  Result<std::string> cert = ReadPemFile("admin.tls_cert_file", admin.tls_cert_file);
  if (!cert.ok()) return cert.status();
  pair.cert_chain = *std::move(cert);
  if (!admin.tls_client_ca_file.empty()) {
    Result<std::string> ca = ReadPemFile("admin.tls_client_ca_file", admin.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *std::move(ca);
    opts.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  opts.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(opts);
}

}  // namespace

Hub::Hub(const Config& config) : config_(config) {}

Hub::~Hub() { Stop(std::chrono::milliseconds(0)); }

Status Hub::Start() {
  std::string admin_token, readonly_token;
  if (!config_.admin.token_file.empty()) {
    if (Status s = ReadSecretFile("admin.token_file", config_.admin.token_file, &admin_token);
        !s.ok()) {
      return s;
    }
  }
  if (!config_.admin.readonly_token_file.empty()) {
    if (Status s = ReadSecretFile("admin.readonly_token_file", config_.admin.readonly_token_file,
                                  &readonly_token);
        !s.ok()) {
      return s;
    }
  }
  auth_ = std::make_unique<AdminAuth>(admin_token, readonly_token);
  lane_count_ = EffectiveLaneCount(config_);
  if (config_.topology.racks_from == "etcd") {
    if (Status s = DiscoverRacks(); !s.ok()) return s;
  }
  if (config_.topology.multi_rack_exchange()) {
    // Hub links need the shared secret (config validation checked it once).
    const TopologyConfig& topo = config_.topology;
    Result<std::string> secret =
        topo.secret_file.empty()
            ? FailedPrecondition("topology.secret_file: required with " +
                                 std::to_string(topo.racks.size()) + " racks")
            : ReadHubSecret(topo.secret_file);
    if (!secret.ok()) return secret.status();
    if (topo.hub_tls()) {
      Result<std::shared_ptr<const net::tls::TlsContext>> tls = LoadHubTlsContext(topo);
      if (!tls.ok()) return tls.status();
      hub_tls_ = *std::move(tls);
    }
  }

  if (Status s = OpenRegistry(); !s.ok()) return s;
  lanes_ = std::make_unique<LaneSet>();
  lanes_->Start(lane_count_, config_.lanes.pin);
  {
    std::string pinned;
    for (int c : lanes_->PinnedCpus()) pinned += (pinned.empty() ? "" : ",") + std::to_string(c);
    spdlog::info("{} lanes started (cpus: {})", lane_count_, config_.lanes.pin ? pinned : "unpinned");
  }
  // RDMA data plane (data.transport); TCP keeps running beside it. Decided
  // first: hub links (hierarchical topology) use RDMA when it runs and can
  // listen on this rack's interhub address, dialing the peers' interhub
  // addresses with rdma_cm (rdma_listener.h); otherwise TCP, with TLS when
  // topology.tls_* is set (then never RDMA). The hubs of a
  // topology must make the same choice. The lanes never learn which.
  bool rdma_fatal = false;
  rdma_ = RdmaListener::ListenConfigured(config_, registry_.get(), lanes_.get(), &rdma_fatal);
  if (rdma_fatal) return Internal("data.transport: rdma was asked for and cannot run (logged)");
  data_plane_ = std::make_unique<DataPlane>(config_, registry_.get(), lanes_.get(),
                                            rdma_ && rdma_->hub_links()
                                                ? rdma_->HubConnector()
                                                : MakeTcpHubConnector(config_, hub_tls_));
  // Tenants resume from their newest valid checkpoints before any worker
  // can connect.
  checkpointer_ = std::make_unique<Checkpointer>(config_, registry_.get(), data_plane_.get());
  checkpointer_->RestoreAll();
  // Listeners are bound before READY so a busy port fails start-up, not the
  // first trainer.
  tcp_ = std::make_unique<TcpAcceptor>(data_plane_.get(), hub_tls_);
  if (Status s = tcp_->Listen(); !s.ok()) return Internal(s.message());
  data_address_ = tcp_->address();
  // Shared memory for workers on this host (data.shm), offered through the
  // TCP port to authenticated workers.
  if (config_.data.shm != "off") {
    shm_ = std::make_unique<ShmAcceptor>(data_plane_.get());
    if (Status s = shm_->Listen(); !s.ok()) {
      if (config_.data.shm == "on") return Internal(s.message());
      spdlog::warn("{}; workers on this host use TCP", s.message());
      shm_.reset();
    } else {
      tcp_->OfferShm(shm_->socket_name());
      shm_->Start();
      spdlog::info("shared memory for local workers on @{}", shm_->socket_name());
    }
  }
  tcp_->Start();
  if (rdma_) rdma_->Start(data_plane_.get());
  data_plane_->StartHubLinks();
  if (membership_) {
    DataPlane* plane = data_plane_.get();
    membership_->Start(
        config_.topology.rack_count(), [plane](uint32_t rack) { plane->RackLost(rack); },
        [](uint32_t) {});  // the links reconnect on their own
  }
  checkpointer_->Start();
  if (Status s = StartAdmin(); !s.ok()) return s;
  if (config_.metrics.enabled) {
    metrics_ = std::make_unique<MetricsExporter>(config_, registry_.get(), lanes_.get(),
                                                 data_plane_.get(), admin_token, readonly_token);
    if (Status s = metrics_->Start(); !s.ok()) return s;
    metrics_address_ = metrics_->address();
  }
  return {};
}

namespace {

Result<EtcdOptions> EtcdOptionsOf(const Config& config) {
  const RegistryConfig& r = config.registry;
  EtcdOptions o;
  o.endpoints = EtcdEndpoints(r);
  o.ca_file = r.etcd_ca_file;
  o.cert_file = r.etcd_cert_file;
  o.key_file = r.etcd_key_file;
  o.user = r.etcd_user;
  if (!r.etcd_password_file.empty()) {
    if (Status s = ReadSecretFile("registry.etcd_password_file", r.etcd_password_file,
                                  &o.password);
        !s.ok()) {
      return s;
    }
  }
  o.timeout = std::chrono::milliseconds(r.etcd_timeout_ms);
  return o;
}

}  // namespace

Status Hub::DiscoverRacks() {
  Result<EtcdOptions> options = EtcdOptionsOf(config_);
  if (!options.ok()) return options.status();
  TopologyConfig& topo = config_.topology;
  ClusterMembership::Self self;
  self.rack = topo.rack;
  self.data = topo.advertise_data.port ? topo.advertise_data : config_.data.listen;
  self.interhub = topo.interhub;
  self.lanes = lane_count_;
  Result<std::unique_ptr<ClusterMembership>> m = ClusterMembership::Join(
      *options, config_.registry.etcd_prefix, self, config_.registry.lease_ttl_s);
  if (!m.ok()) return m.status();
  membership_ = *std::move(m);
  spdlog::info("cluster: waiting for {} racks in etcd (up to {} s)", topo.discover_racks,
               topo.discover_timeout_s);
  Result<std::vector<RackAddress>> racks = membership_->WaitForRacks(
      topo.discover_racks, std::chrono::seconds(topo.discover_timeout_s));
  if (!racks.ok()) return racks.status();
  if (topo.discover_racks > 1) topo.racks = *std::move(racks);
  for (size_t r = 0; r < topo.racks.size(); ++r) {
    spdlog::info("cluster: rack {}: data {}, interhub {}", r, topo.racks[r].data.ToString(),
                 topo.racks[r].interhub.ToString());
  }
  return Status::Ok();
}

Status Hub::OpenRegistry() {
  if (config_.state.in_memory && config_.registry.backend != "etcd") {
    registry_ = std::make_unique<Registry>(lane_count_, config_.tenants, config_.topology);
    spdlog::warn("state.in_memory: tenants and keys are not stored; a restart starts empty");
    return Status::Ok();
  }
  std::unique_ptr<RegistryBackend> backend;
  std::string where;  // the store, for the log line
  if (config_.registry.backend == "etcd") {
    // Shared by the hubs of a cluster; etcd unreachable stops start-up.
    Result<EtcdOptions> options = EtcdOptionsOf(config_);
    if (!options.ok()) return options.status();
    Result<std::unique_ptr<EtcdRegistryStore>> store =
        EtcdRegistryStore::Open(*options, config_.registry.etcd_prefix);
    if (!store.ok()) return store.status();
    where = (*store)->where();
    backend = *std::move(store);
  } else {
    // A bad registry database stops start-up (FAILED_PRECONDITION: exit 78);
    // never start empty in its place.
    Result<std::unique_ptr<RegistryStore>> store = RegistryStore::Open(config_.state.dir);
    if (!store.ok()) return store.status();
    where = "registry " + (*store)->path();
    backend = *std::move(store);
  }
  Result<std::unique_ptr<Registry>> registry =
      Registry::Open(lane_count_, config_.tenants, std::move(backend), config_.topology);
  if (!registry.ok()) return registry.status();
  registry_ = *std::move(registry);
  const Registry::Totals totals = registry_->GetTotals();
  spdlog::info("{}: {} tenants, {} keys", where, totals.tenants, totals.keys);
  return Status::Ok();
}

Status Hub::StartAdmin() {
  Result<std::shared_ptr<grpc::ServerCredentials>> creds = AdminCredentials(config_.admin);
  if (!creds.ok()) return creds.status();
  DataPlane* plane = data_plane_.get();
  LaneSet* lanes = lanes_.get();
  auto identity = std::make_shared<DaemonIdentity>();
  identity->version = RACKHUB_VERSION;
  identity->started = std::chrono::steady_clock::now();
  identity->rack = config_.topology.rack;
  identity->racks = config_.topology.rack_count();
  identity->rack_links = [plane] {
    std::vector<RackLinkInfo> out;
    for (const auto& l : plane->RackLinks()) {
      out.push_back({l.rack, l.bytes_out, l.bytes_in, l.chunk_bytes_out});
    }
    return out;
  };
  identity->lanes = [lanes] {
    std::vector<LaneInfo> out;
    const std::vector<int> cpus = lanes->PinnedCpus();
    const std::vector<double> busy = lanes->BusySeconds();
    for (size_t i = 0; i < cpus.size(); ++i) out.push_back({cpus[i], busy[i]});
    return out;
  };
  identity->stalls = [plane](uint32_t handle, std::chrono::nanoseconds min_wait,
                             std::vector<uint32_t>* unanswered) {
    return plane->Stalls(handle, min_wait, kStallsTimeout, unanswered);
  };
  services_ = std::make_unique<AdminServices>(registry_.get(), auth_.get(), std::move(identity),
                                              checkpointer_.get());
  health_ = std::make_unique<HealthService>(std::set<std::string>{
      "rackhub.admin.v1.TenantService", "rackhub.admin.v1.KeyService",
      "rackhub.admin.v1.StatsService", "rackhub.admin.v1.CheckpointService"});
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int admin_port = 0;
  builder.AddListeningPort(config_.admin.listen.ToString(), *creds, &admin_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.admin.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would
  // then start and silently split the calls. Make a busy port an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  services_->RegisterWith(&builder);
  builder.RegisterService(health_.get());
  admin_ = builder.BuildAndStart();
  if (!admin_ || admin_port == 0) {
    return Internal("admin.listen: cannot listen on " + config_.admin.listen.ToString() +
                    " (address in use or not local?)");
  }
  net::Endpoint admin_bound = config_.admin.listen;
  admin_bound.port = static_cast<uint16_t>(admin_port);
  admin_address_ = admin_bound.ToString();
  services_->SetListenAddresses(admin_address_, data_address_);
  health_->SetServing(true);
  spdlog::info("admin API on {} ({}{}), data plane on {}", admin_address_,
               config_.admin.tls_cert_file.empty() ? "plaintext" : "TLS",
               config_.admin.token_file.empty() ? ", no admin token: loopback only" : ", token auth",
               data_address_);
  return {};
}

void Hub::SetNotServing() {
  if (health_) health_->SetServing(false);
}

void Hub::Stop(std::chrono::milliseconds grace) { Teardown(false, grace); }

void Hub::Crash() { Teardown(true, std::chrono::milliseconds(0)); }

void Hub::Teardown(bool crash, std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  SetNotServing();
  // Leave the cluster first: the other hubs fail this rack's pending work
  // now instead of after the lease's TTL.
  membership_.reset();
  if (metrics_) metrics_->Stop();  // scrapes read everything below
  // No new connections; workers get a SHUTTING_DOWN error (nothing hangs),
  // then admin calls drain, then the tenants are checkpointed (the lanes
  // still run, nothing else touches them), then the lane threads stop.
  if (checkpointer_) checkpointer_->Stop();
  if (rdma_) rdma_->Stop();
  if (shm_) shm_->Stop();
  if (tcp_) tcp_->Stop();
  if (data_plane_) {
    if (crash) {
      data_plane_->Abort();
    } else {
      data_plane_->Shutdown(grace);
    }
  }
  if (admin_) {
    health_->Shutdown();  // its watchers would hold the admin server's Shutdown
    // A crash cancels what is in flight (a deadline in the past).
    admin_->Shutdown(std::chrono::system_clock::now() +
                     (crash ? std::chrono::milliseconds(0) : kAdminShutdownGrace));
    admin_->Wait();
  }
  if (checkpointer_ && config_.checkpoint.on_shutdown && !crash) {
    checkpointer_->CheckpointAll();
  }
  if (lanes_) lanes_->Stop();
  admin_.reset();
  health_.reset();
  metrics_.reset();
  services_.reset();
  checkpointer_.reset();
  rdma_.reset();
  shm_.reset();
  tcp_.reset();
  data_plane_.reset();
  // Last user gone: the state directory's lock goes with the registry, so
  // another Hub may open the directory at once (a restart in-process).
  registry_.reset();
}

}  // namespace rackhub::server
