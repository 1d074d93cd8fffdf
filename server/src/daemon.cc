#include "daemon.h"

#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "admin_service.h"
#include "data_plane.h"
#include "rdma_listener.h"
#include "lanes.h"
#include "registry.h"

#ifndef RACKHUB_VERSION
#define RACKHUB_VERSION "0.0.0"
#endif

namespace rackhub::server {
namespace {

// In-flight admin calls get this long to finish at shutdown (they are short).
constexpr auto kShutdownGrace = std::chrono::seconds(1);

bool ReadSecretFile(const std::string& field, const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    spdlog::critical("{}: cannot read '{}'", field, path);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  const auto first = s.find_first_not_of(" \t\r\n");
  const auto last = s.find_last_not_of(" \t\r\n");
  *out = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  if (out->empty()) {
    spdlog::critical("{}: '{}' holds no token", field, path);
    return false;
  }
  if (out->find_first_of(" \t\r\n") != std::string::npos) {
    spdlog::critical("{}: '{}' must hold one token on one line", field, path);
    return false;
  }
  return true;
}

bool ReadPem(const std::string& field, const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    spdlog::critical("{}: cannot read '{}'", field, path);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  if (out->find("-----BEGIN") == std::string::npos) {
    spdlog::critical("{}: '{}' is not a PEM file", field, path);
    return false;
  }
  return true;
}

std::shared_ptr<grpc::ServerCredentials> AdminCredentials(const AdminConfig& admin, bool* ok) {
  *ok = true;
  if (admin.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  *ok = ReadPem("admin.tls_key_file", admin.tls_key_file, &pair.private_key) &&
        ReadPem("admin.tls_cert_file", admin.tls_cert_file, &pair.cert_chain);
  if (!admin.tls_client_ca_file.empty()) {
    *ok = *ok && ReadPem("admin.tls_client_ca_file", admin.tls_client_ca_file,
                         &opts.pem_root_certs);
    opts.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  opts.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(opts);
}

// Writes the ready file atomically (temp file + rename) so readers never see
// a partial one.
bool WriteReadyFile(const std::string& path, const std::string& admin, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "admin " << admin << "\n" << "data " << data << "\n";
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

void SetUpLogging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("rackhubd");
  spdlog::set_default_logger(logger);
  // Under systemd the journal adds timestamps; the pattern stays readable either way.
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace

int RunDaemon(const Config& config) {
  // Block the stop signals before any thread starts: every thread inherits the
  // mask and only the main thread takes them, with sigtimedwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A peer closing a socket must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  SetUpLogging(config.log_level);
  spdlog::info("rackhubd {} starting", RACKHUB_VERSION);

  std::string admin_token, readonly_token;
  if (!config.admin.token_file.empty() &&
      !ReadSecretFile("admin.token_file", config.admin.token_file, &admin_token)) {
    return kExitConfigError;
  }
  if (!config.admin.readonly_token_file.empty() &&
      !ReadSecretFile("admin.readonly_token_file", config.admin.readonly_token_file,
                      &readonly_token)) {
    return kExitConfigError;
  }
  bool creds_ok = true;
  auto creds = AdminCredentials(config.admin, &creds_ok);
  if (!creds_ok) return kExitConfigError;

  const uint32_t lane_count = EffectiveLaneCount(config);
  Registry registry(lane_count, config.tenants);
  LaneSet lanes;
  lanes.Start(lane_count, config.lanes.pin);
  {
    const auto cpus = lanes.PinnedCpus();
    std::string pinned;
    for (int c : cpus) pinned += (pinned.empty() ? "" : ",") + std::to_string(c);
    spdlog::info("{} lanes started (cpus: {})", lane_count, config.lanes.pin ? pinned : "unpinned");
  }

  // Data-plane listener: bound before READY so a busy port fails start-up,
  // not the first trainer.
  boost::asio::io_context acceptor_io{1};
  boost::asio::ip::tcp::acceptor data_acceptor(acceptor_io);
  std::string data_address;
  try {
    boost::asio::ip::tcp::resolver resolver(acceptor_io);
    const auto results = resolver.resolve(config.data.listen.host,
                                          std::to_string(config.data.listen.port));
    const auto endpoint = results.begin()->endpoint();
    data_acceptor.open(endpoint.protocol());
    data_acceptor.set_option(boost::asio::socket_base::reuse_address(true));
    data_acceptor.bind(endpoint);
    data_acceptor.listen();
    const auto bound = data_acceptor.local_endpoint();
    net::Endpoint shown{bound.address().to_string(), bound.port()};
    data_address = shown.ToString();
  } catch (const std::exception& e) {
    spdlog::critical("data.listen: cannot listen on {}: {}", config.data.listen.ToString(),
                     e.what());
    lanes.Stop();
    return kExitRuntimeError;
  }

  DataPlane data_plane(config, &registry, &lanes);
  data_plane.Start(&acceptor_io, &data_acceptor);
  if (!data_plane.started_ok()) {
    data_plane.Shutdown(std::chrono::milliseconds(0));
    lanes.Stop();
    return kExitRuntimeError;
  }
  // RDMA data plane (data.transport); TCP keeps running beside it.
  bool rdma_fatal = false;
  auto rdma_listener =
      RdmaListener::StartConfigured(config, &registry, &lanes, &data_plane, &rdma_fatal);
  if (rdma_fatal) {
    data_plane.Shutdown(std::chrono::milliseconds(0));
    lanes.Stop();
    return kExitRuntimeError;
  }

  AdminAuth auth(admin_token, readonly_token);
  AdminServices services(&registry, &auth,
                         DaemonIdentity{RACKHUB_VERSION, "", "", std::chrono::steady_clock::now(),
                                        config.topology.rack, config.topology.rack_count(),
                                        [&data_plane] {
                                          std::vector<RackLinkInfo> out;
                                          for (const auto& l : data_plane.RackLinks()) {
                                            out.push_back({l.rack, l.bytes_out, l.bytes_in, l.chunk_bytes_out});
                                          }
                                          return out;
                                        }});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int admin_port = 0;
  builder.AddListeningPort(config.admin.listen.ToString(), creds, &admin_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.admin.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would
  // then start and silently split the calls. Make a busy port an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  services.RegisterWith(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || admin_port == 0) {
    spdlog::critical("admin.listen: cannot listen on {} (address in use or not local?)",
                     config.admin.listen.ToString());
    data_plane.Shutdown(std::chrono::milliseconds(0));
    lanes.Stop();
    return kExitRuntimeError;
  }
  net::Endpoint admin_bound = config.admin.listen;
  admin_bound.port = static_cast<uint16_t>(admin_port);
  const std::string admin_address = admin_bound.ToString();
  services.SetListenAddresses(admin_address, data_address);
  server->GetHealthCheckService()->SetServingStatus(true);

  spdlog::info("admin API on {} ({}{}), data plane on {}", admin_address,
               config.admin.tls_cert_file.empty() ? "plaintext" : "TLS",
               admin_token.empty() ? ", no admin token: loopback only" : ", token auth",
               data_address);
  if (!config.ready_file.empty() &&
      !WriteReadyFile(config.ready_file, admin_address, data_address)) {
    spdlog::error("ready_file: cannot write '{}'", config.ready_file);
  }
  sd_notifyf(0, "READY=1\nSTATUS=serving: admin %s, data %s, %u lanes", admin_address.c_str(),
             data_address.c_str(), lane_count);

  // Watchdog: ping at half the interval systemd asked for, and only while
  // every lane thread ticks (a wedged lane must get us restarted).
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  const auto wait_step = watchdog ? std::chrono::microseconds(watchdog_usec / 2)
                                  : std::chrono::microseconds(std::chrono::seconds(1));
  const auto lane_max_age = std::max<std::chrono::steady_clock::duration>(
      std::chrono::microseconds(watchdog_usec / 2), 10 * LaneSet::kHeartbeatPeriod);
  if (watchdog) spdlog::info("systemd watchdog every {} ms", watchdog_usec / 2000);

  int signal_number = 0;
  while (signal_number <= 0) {
    timespec ts{};
    ts.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(wait_step).count();
    ts.tv_nsec = (std::chrono::duration_cast<std::chrono::nanoseconds>(wait_step) -
                  std::chrono::seconds(ts.tv_sec))
                     .count();
    signal_number = sigtimedwait(&stop_signals, nullptr, &ts);
    if (signal_number < 0 && errno != EAGAIN && errno != EINTR) {
      spdlog::critical("sigtimedwait: {}", std::strerror(errno));
      break;
    }
    if (watchdog && signal_number <= 0) {
      if (lanes.AllLanesAlive(lane_max_age)) {
        sd_notify(0, "WATCHDOG=1");
      } else {
        spdlog::error("a lane stopped ticking: withholding the watchdog ping");
      }
    }
  }

  spdlog::info("received {}, draining", signal_number > 0 ? strsignal(signal_number) : "error");
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  server->GetHealthCheckService()->SetServingStatus(false);
  // Workers get a SHUTTING_DOWN error (nothing hangs), then admin calls drain.
  if (rdma_listener) rdma_listener->Stop();
  data_plane.Shutdown(std::chrono::milliseconds(2000));
  server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server->Wait();
  lanes.Stop();
  spdlog::info("stopped");
  return signal_number > 0 ? kExitOk : kExitRuntimeError;
}

}  // namespace rackhub::server
