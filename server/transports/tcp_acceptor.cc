#include "tcp_acceptor.h"

#include <netinet/in.h>
#include <optional>
#include <cerrno>
#include <netinet/tcp.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "hello_check.h"
#include "hello_session.h"
#include "rackhub/net/shm/channel.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/tcp/connection.h"

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

// "ip:port" of the remote end, for logs.
std::string PeerName(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  return ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
}

// Binds and listens on `ep`; the error names `field`.
Status ListenOn(tcp::acceptor& acceptor, const net::Endpoint& ep, const std::string& field) {
  try {
    tcp::resolver resolver(acceptor.get_executor());
    const auto endpoint = resolver.resolve(ep.host, std::to_string(ep.port)).begin()->endpoint();
    acceptor.open(endpoint.protocol());
    acceptor.set_option(asio::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen();
  } catch (const std::exception& e) {
    return InvalidArgument(field + ": cannot listen on " + ep.ToString() + ": " + e.what());
  }
  return {};
}

}  // namespace

// Runs the accepting side of a hub link's handshake on the acceptor thread
// (hub_handshake.h): reads and checks HUB_HELLO, writes HUB_CHALLENGE, reads
// and checks HUB_PROOF, then hands the link to the lane it names, which sends
// HUB_ACCEPT first. The whole handshake must finish within
// data.hello_timeout_ms. A refusal is a fatal ERROR naming the problem (and
// a rate-limited warning here); nothing after the refused frame is read.
class TcpAcceptor::HubHelloSession : public std::enable_shared_from_this<HubHelloSession> {
 public:
  HubHelloSession(TcpAcceptor* acceptor, tcp::socket socket)
      : acceptor_(acceptor),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        auth_(acceptor->plane_->hub_secret(), acceptor->plane_->config().topology.rack) {
    ++acceptor_->unauthenticated_hubs_;
  }
  ~HubHelloSession() { --acceptor_->unauthenticated_hubs_; }

  void Start() {
    peer_ = PeerName(socket_);
    const uint32_t timeout_ms = acceptor_->plane_->config().data.hello_timeout_ms;
    timer_.expires_after(std::chrono::milliseconds(timeout_ms));
    timer_.async_wait([self = shared_from_this(), timeout_ms](const boost::system::error_code& e) {
      if (!e) {
        self->Refuse(WireError::kMalformed,
                     "the handshake did not finish within data.hello_timeout_ms (" +
                         std::to_string(timeout_ms) + " ms)");
      }
    });
    ReadHeader();
  }

 private:
  void ReadHeader() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnHeader(e);
                     });
  }

  void OnHeader(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    const FrameHeader h = net::DecodeHeader(header_);
    const Status s = hello_ ? CheckHubProofHeader(h) : CheckHubHelloHeader(h);
    if (!s.ok()) return Refuse(WireError::kMalformed, s.message());
    payload_.resize(h.payload_bytes);
    asio::async_read(socket_, asio::buffer(payload_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnPayload(e);
                     });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    if (!hello_) return OnHello();
    OnProof();
  }

  void OnHello() {
    DataPlane* plane = acceptor_->plane_;
    Result<data::v1::HubHello> hello =
        CheckHubHello(payload_, plane->config().topology, plane->lane_count());
    if (!hello.ok()) return Refuse(CodeOf(hello.status()), hello.status().message());
    Result<std::string> challenge = auth_.OnHello(*hello);
    if (!challenge.ok()) return Refuse(CodeOf(challenge.status()), challenge.status().message());
    hello_ = *std::move(hello);
    Write(Opcode::kHubChallenge, *std::move(challenge), false);
  }

  void OnProof() {
    Result<std::string> accept = auth_.OnProof(payload_);
    if (!accept.ok()) return Refuse(CodeOf(accept.status()), accept.status().message());
    timer_.cancel();
    net::ConnectionIdentity id;
    id.hub = true;
    id.rack = hello_->rack();
    id.lane = hello_->lane();
    id.peer = peer_;
    acceptor_->MoveToLane(
        std::move(socket_), id.lane,
        [id, accept = *std::move(accept)](Lane& lane, tcp::socket s) mutable {
          lane.AdoptHubLink(
              std::make_shared<net::tcp::TcpConnection>(lane.hub_handler(), std::move(s), id),
              std::move(accept));
        });
  }

  static WireError CodeOf(const Status& s) {
    return s.code() == StatusCode::kUnauthenticated ? WireError::kUnauthenticated
                                                    : WireError::kInvalidArgument;
  }

  // Writes one frame; `last`: then closes (a refusal), else reads the next.
  void Write(Opcode op, std::string body, bool last) {
    FrameHeader h;
    h.opcode = op;
    if (last) h.flags = net::kFlagFatal;
    h.payload_bytes = static_cast<uint32_t>(body.size());
    net::EncodeHeader(h, out_header_);
    out_body_ = std::move(body);
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(out_header_),
                                                 asio::buffer(out_body_)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this(), last](const boost::system::error_code& e,
                                                        size_t) {
                        if (last || e) return self->Close(e ? e.message() : "");
                        self->ReadHeader();
                      });
  }

  // A refusal: logged (rate-limited), a fatal ERROR naming it to the peer,
  // then closed (the timer still bounds the write).
  void Refuse(WireError code, const std::string& why) {
    if (refused_ || !socket_.is_open()) return Close("");
    refused_ = true;
    acceptor_->warnings_.Warn("rack link: refused a hub link from " + peer_ + ": " + why);
    Write(Opcode::kError, net::EncodeErrorBody(code, "hub link: " + why), true);
  }

  // Closes; `why`: a transport error not logged yet (the peer went away).
  void Close(const std::string& why) {
    timer_.cancel();
    if (!socket_.is_open()) return;
    if (!why.empty() && !refused_) {
      acceptor_->warnings_.Warn("rack link: a hub link from " + peer_ +
                                " closed during the handshake: " + why);
    }
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  TcpAcceptor* acceptor_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  HubAcceptor auth_;
  std::optional<data::v1::HubHello> hello_;  // once checked
  bool refused_ = false;
  std::string peer_;
  std::array<std::byte, net::kHeaderBytes> header_{};
  std::vector<std::byte> payload_;
  std::array<std::byte, net::kHeaderBytes> out_header_{};
  std::string out_body_;
};

TcpAcceptor::TcpAcceptor(DataPlane* plane) : plane_(plane) {
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
    const std::string peer = PeerName(socket);
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
  if (Status s = ListenOn(workers_.acceptor, config.data.listen, "data.listen"); !s.ok()) {
    return s;
  }
  const auto bound = workers_.acceptor.local_endpoint();
  address_ = net::Endpoint{bound.address().to_string(), bound.port()}.ToString();
  const auto& topo = config.topology;
  if (!topo.multi_rack_exchange()) return {};
  hubs_ = std::make_unique<Listener>(thread_.io(), "rack link", &unauthenticated_hubs_);
  hubs_->start = [this](tcp::socket socket) {
    std::make_shared<HubHelloSession>(this, std::move(socket))->Start();
  };
  if (Status s = ListenOn(hubs_->acceptor, topo.racks[topo.rack].interhub, "topology.racks");
      !s.ok()) {
    return s;
  }
  spdlog::info("rack exchange: rack {} of {}, hub links on {}", topo.rack, topo.rack_count(),
               topo.racks[topo.rack].interhub.ToString());
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
                 "(data.max_unauthenticated_connections); closed one from " + PeerName(socket));
  boost::system::error_code ignored;
  socket.close(ignored);
  return false;
}

void TcpAcceptor::MoveToLane(tcp::socket socket, uint32_t lane,
                             std::function<void(Lane&, tcp::socket)> adopt) {
  // Move the descriptor from the acceptor's io_context to the lane's.
  boost::system::error_code ec;
  const auto protocol = socket.local_endpoint(ec).protocol();
  const int fd = socket.release(ec);
  if (ec) {
    spdlog::error("data: cannot hand a connection to lane {}: {}", lane, ec.message());
    return;
  }
  plane_->OnLane(lane, [protocol, fd, adopt = std::move(adopt)](Lane& target) {
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

std::unique_ptr<net::Connector> MakeTcpHubConnector() { return net::MakeTcpConnector(); }

}  // namespace rackhub::server
