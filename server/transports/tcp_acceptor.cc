#include "tcp_acceptor.h"

#include <netinet/in.h>
#include <optional>
#include <cerrno>
#include <netinet/tcp.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "hello_check.h"
#include "hello_session.h"
#include "hub_link_session.h"
#include "rackhub/net/shm/channel.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/tcp/connection.h"
#include "rackhub/net/tcp/keepalive.h"

namespace rackhub::server {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

namespace {

// Keepalive so a worker whose host vanished is noticed even without traffic:
// idle 10 s, then 5 probes 2 s apart (tcp(7)).
constexpr int kKeepAliveIdleS = 10;
constexpr int kKeepAliveIntervalS = 2;
constexpr int kKeepAliveProbes = 5;


// Binds and listens on `ep`; the error names `field`. `receive_buffer` > 0:
// SO_RCVBUF of the accepted sockets (set on the listener, so that the
// window scale they negotiate fits it).
Status ListenOn(tcp::acceptor& acceptor, const net::Endpoint& ep, const std::string& field,
                uint32_t receive_buffer = 0) {
  try {
    tcp::resolver resolver(acceptor.get_executor());
    const auto endpoint = resolver.resolve(ep.host, std::to_string(ep.port)).begin()->endpoint();
    acceptor.open(endpoint.protocol());
    acceptor.set_option(asio::socket_base::reuse_address(true));
    if (receive_buffer > 0) {
      acceptor.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(receive_buffer)));
    }
    acceptor.bind(endpoint);
    acceptor.listen();
  } catch (const std::exception& e) {
    return InvalidArgument(field + ": cannot listen on " + ep.ToString() + ": " + e.what());
  }
  return {};
}

}  // namespace

TcpAcceptor::TcpAcceptor(DataPlane* plane, std::shared_ptr<const net::tls::TlsContext> hub_tls)
    : plane_(plane) {
  hub_hooks_.plane = plane;
  hub_hooks_.tls = std::move(hub_tls);
  hub_hooks_.waiting = &unauthenticated_hubs_;
  hub_hooks_.warn = [this](const std::string& line) { warnings_.Warn(line); };
  hello_hooks_.plane = plane;
  hello_hooks_.waiting = &unauthenticated_workers_;
  hello_hooks_.warn = [this](const std::string& line) { warnings_.Warn(line); };
  hello_hooks_.accepted = [this](HelloResult checked, tcp::socket socket, const std::string& peer) {
    net::ConnectionIdentity id{checked.tenant.handle, checked.tenant.name, checked.hello.rank(),
                               checked.hello.lane(), peer, checked.hello.rack(), false,
                             checked.hello.session()};
    const uint64_t seq = plane_->NextSeq();
    MoveToLane(std::move(socket), id.lane,
               [id = std::move(id), seq](Lane& lane, tcp::socket s) mutable {
                 lane.AdoptWorker(std::make_shared<net::tcp::TcpConnection>(
                                      lane.worker_handler(), std::move(s), std::move(id)),
                                  seq);
               });
  };
  workers_.start = [this](tcp::socket socket) {
    boost::system::error_code ignored;
    socket.set_option(asio::socket_base::keep_alive(true), ignored);
    const int fd = socket.native_handle();
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepAliveIdleS, sizeof(int));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepAliveIntervalS, sizeof(int));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepAliveProbes, sizeof(int));
    const std::string peer = TcpPeerName(socket);
    std::make_shared<HelloSession<tcp::socket>>(std::move(socket), peer, &hello_hooks_)->Start();
  };
  OfferShm("");
}

void TcpAcceptor::OfferShm(const std::string& socket_name) {
  data::v1::Welcome offer;
  offer.set_shm_socket(socket_name);
  offer.set_boot_id(net::shm::BootId());
  offer.set_server_version(RACKHUB_VERSION);
  hello_hooks_.probe_reply = offer.SerializeAsString();
}

TcpAcceptor::~TcpAcceptor() { Stop(); }

Status TcpAcceptor::Listen() {
  const Config& config = plane_->config();
  if (Status s = ListenOn(workers_.acceptor, config.data.listen, "data.listen",
                         config.data.tcp_receive_buffer);
      !s.ok()) {
    return s;
  }
  if (config.data.tcp_receive_buffer > 0) {
    // The kernel doubles SO_RCVBUF for its bookkeeping and caps the request
    // at net.core.rmem_max (208 KiB on a stock kernel): say what it kept.
    asio::socket_base::receive_buffer_size kept;
    boost::system::error_code ec;
    workers_.acceptor.get_option(kept, ec);
    const int64_t asked = int64_t{config.data.tcp_receive_buffer};
    if (!ec && kept.value() < 2 * asked) {
      spdlog::info("data.tcp_receive_buffer: {} bytes asked, the kernel keeps {} per worker "
                   "connection (capped by net.core.rmem_max; raise it to allow more)",
                   asked, kept.value());
    }
  }
  const auto bound = workers_.acceptor.local_endpoint();
  address_ = net::Endpoint{bound.address().to_string(), bound.port()}.ToString();
  const auto& topo = config.topology;
  if (!topo.multi_rack_exchange()) return {};
  hubs_ = std::make_unique<Listener>(thread_.io(), "rack link", &unauthenticated_hubs_);
  hubs_->start = [this](tcp::socket socket) {
    net::tcp::EnableHubKeepAlive(socket);
    StartHubLinkSession(&hub_hooks_, std::move(socket));
  };
  if (Status s = ListenOn(hubs_->acceptor, topo.racks[topo.rack].interhub, "topology.racks");
      !s.ok()) {
    return s;
  }
  spdlog::info("rack exchange: rack {} of {}, hub links on {}{}", topo.rack, topo.rack_count(),
               topo.racks[topo.rack].interhub.ToString(),
               hub_hooks_.tls ? " (TLS, peer certificates verified against topology.tls_ca_file)"
                              : "");
  return {};
}

void TcpAcceptor::Start() {
  Accept(workers_);
  if (hubs_) Accept(*hubs_);
  thread_.Start("rackhub-accept");
}

void TcpAcceptor::Stop() {
  thread_.Stop([this] {
    boost::system::error_code ignored;
    workers_.acceptor.close(ignored);
    if (hubs_) hubs_->acceptor.close(ignored);
  });
}

void TcpAcceptor::Accept(Listener& l) {
  l.acceptor.async_accept([this, &l](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || thread_.stopping()) return;
      return AfterAcceptError(ec, l);
    }
    if (AdmitUnauthenticated(socket, l)) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      l.start(std::move(socket));
    }
    if (!thread_.stopping()) Accept(l);
  });
}

void TcpAcceptor::AfterAcceptError(const boost::system::error_code& ec, Listener& l) {
  const bool exhausted = ec == asio::error::no_descriptors || ec.value() == ENFILE ||
                         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
  warnings_.Warn(std::string(l.what) + ": accept failed: " + ec.message() +
                 (exhausted ? " (RLIMIT_NOFILE / LimitNOFILE or memory); retrying in 100 ms" : ""));
  if (!exhausted) {
    Accept(l);
    return;
  }
  l.retry.expires_after(kAcceptRetryDelay);
  l.retry.async_wait([this, &l](const boost::system::error_code& e) {
    if (!e && !thread_.stopping()) Accept(l);
  });
}

bool TcpAcceptor::AdmitUnauthenticated(tcp::socket& socket, const Listener& l) {
  const uint32_t limit = plane_->config().data.max_unauthenticated_connections;
  if (*l.waiting < limit) return true;
  warnings_.Warn(std::string(l.what) + ": " + std::to_string(*l.waiting) +
                 " connections are waiting for their first frame "
                 "(data.max_unauthenticated_connections); closed one from " + TcpPeerName(socket));
  boost::system::error_code ignored;
  socket.close(ignored);
  return false;
}

void TcpAcceptor::MoveToLane(tcp::socket socket, uint32_t lane,
                             std::function<void(Lane&, tcp::socket)> adopt) {
  MoveSocketToLane(plane_, std::move(socket), lane, std::move(adopt));
}

void MoveSocketToLane(DataPlane* plane, tcp::socket socket, uint32_t lane,
                      std::function<void(Lane&, tcp::socket)> adopt) {
  // Move the descriptor from the acceptor's io_context to the lane's.
  boost::system::error_code ec;
  const auto protocol = socket.local_endpoint(ec).protocol();
  const int fd = socket.release(ec);
  if (ec) {
    spdlog::error("data: cannot hand a connection to lane {}: {}", lane, ec.message());
    return;
  }
  plane->OnLane(lane, [protocol, fd, adopt = std::move(adopt)](Lane& target) {
    tcp::socket s(target.io());
    boost::system::error_code assign_ec;
    s.assign(protocol, fd, assign_ec);
    if (assign_ec) {
      ::close(fd);
      return;
    }
    adopt(target, std::move(s));
  });
}

std::unique_ptr<net::Connector> MakeTcpHubConnector(
    const Config& config, std::shared_ptr<const net::tls::TlsContext> tls) {
  if (!tls) return net::MakeTcpConnector();
  return net::MakeTlsConnector(std::move(tls),
                               std::chrono::milliseconds(config.data.hello_timeout_ms));
}

}  // namespace rackhub::server
