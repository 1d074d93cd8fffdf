#include "hub_link_session.h"

#include <array>
#include <optional>
#include <span>
#include <vector>

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "hello_check.h"
#include "hub_handshake.h"
#include "lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/tcp/connection.h"
#include "rackhub/net/tls/connection.h"
#include "rackhub/net/tls/stream.h"
#include "tcp_acceptor.h"

namespace rackhub::server {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

namespace {

// The first byte of a TLS connection: a handshake record (ClientHello).
constexpr unsigned char kTlsHandshakeRecord = 0x16;

// The byte stream the handshake runs on: the socket itself, or TLS over it.
class LinkStream {
 public:
  using Done = std::function<void(const boost::system::error_code&)>;
  virtual ~LinkStream() = default;
  virtual void ReadExactly(std::span<std::byte> into, Done done) = 0;
  virtual void WriteAll(std::string bytes, Done done) = 0;  // kept until done
  virtual void Close() = 0;
  virtual bool is_open() const = 0;
  // Moves the link to lane `lane` of `plane`, where it is adopted as a
  // connection with `id` (after which HUB_ACCEPT `accept` goes first).
  virtual void HandOver(DataPlane* plane, net::ConnectionIdentity id, std::string accept) = 0;
};

class PlainStream final : public LinkStream {
 public:
  explicit PlainStream(tcp::socket socket) : socket_(std::move(socket)) {}
  void ReadExactly(std::span<std::byte> into, Done done) override {
    asio::async_read(socket_, asio::buffer(into.data(), into.size()),
                     [done = std::move(done)](const boost::system::error_code& e, size_t) {
                       done(e);
                     });
  }
  void WriteAll(std::string bytes, Done done) override {
    out_ = std::move(bytes);
    asio::async_write(socket_, asio::buffer(out_),
                      [done = std::move(done)](const boost::system::error_code& e, size_t) {
                        done(e);
                      });
  }
  void Close() override {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }
  bool is_open() const override { return socket_.is_open(); }
  void HandOver(DataPlane* plane, net::ConnectionIdentity id, std::string accept) override {
    MoveSocketToLane(plane, std::move(socket_), id.lane,
                     [id, accept = std::move(accept)](Lane& lane, tcp::socket s) mutable {
                       lane.AdoptHubLink(std::make_shared<net::tcp::TcpConnection>(
                                             lane.hub_handler(), std::move(s), id),
                                         std::move(accept));
                     });
  }
  tcp::socket& socket() { return socket_; }

 private:
  tcp::socket socket_;
  std::string out_;
};

class TlsLinkStream final : public LinkStream {
 public:
  explicit TlsLinkStream(net::tls::TlsStream stream) : stream_(std::move(stream)) {}
  void ReadExactly(std::span<std::byte> into, Done done) override {
    if (into.empty()) {
      return asio::post(stream_.socket().get_executor(), [done = std::move(done)] { done({}); });
    }
    stream_.AsyncReadSome(into, [this, into, done = std::move(done)](
                                    const boost::system::error_code& e, size_t n) mutable {
      if (e) return done(e);
      ReadExactly(into.subspan(n), std::move(done));
    });
  }
  void WriteAll(std::string bytes, Done done) override {
    out_ = std::move(bytes);
    stream_.AsyncWrite(std::as_bytes(std::span<const char>(out_)),
                       [done = std::move(done)](const boost::system::error_code& e, size_t) {
                         done(e);
                       });
  }
  void Close() override { stream_.Close(); }
  bool is_open() const override { return stream_.is_open(); }
  net::tls::TlsStream& stream() { return stream_; }
  void HandOver(DataPlane* plane, net::ConnectionIdentity id, std::string accept) override {
    Result<net::tls::TlsStream::Detached> detached = std::move(stream_).Detach();
    if (!detached.ok()) {  // closed; the peer dials again
      spdlog::error("rack link: lane {}: {}", id.lane, detached.status().message());
      return;
    }
    auto session = std::make_shared<net::tls::TlsStream::Detached>(*std::move(detached));
    plane->OnLane(id.lane, [session, id, accept = std::move(accept)](Lane& lane) mutable {
      Result<net::tls::TlsStream> s = net::tls::TlsStream::Attach(lane.io(), std::move(*session));
      if (!s.ok()) {  // closed; the peer dials again
        spdlog::error("rack link: lane {}: {}", id.lane, s.status().message());
        return;
      }
      lane.AdoptHubLink(std::make_shared<net::tls::TlsConnection>(lane.hub_handler(),
                                                                  *std::move(s), id),
                        std::move(accept));
    });
  }

 private:
  net::tls::TlsStream stream_;
  std::string out_;
};

class HubLinkSession : public std::enable_shared_from_this<HubLinkSession> {
 public:
  HubLinkSession(const HubLinkHooks* hooks, tcp::socket socket)
      : hooks_(hooks),
        peer_(TcpPeerName(socket)),
        timer_(socket.get_executor()),
        auth_(hooks->plane->hub_secret(), hooks->plane->config().topology.rack) {
    ++*hooks_->waiting;
    plain_ = std::make_unique<PlainStream>(std::move(socket));
    stream_ = plain_.get();
  }
  ~HubLinkSession() { --*hooks_->waiting; }

  void Start() {
    const uint32_t timeout_ms = hooks_->plane->config().data.hello_timeout_ms;
    timer_.expires_after(std::chrono::milliseconds(timeout_ms));
    timer_.async_wait([self = shared_from_this(), timeout_ms](const boost::system::error_code& e) {
      if (!e) {
        self->Refuse(WireError::kMalformed,
                     "the handshake did not finish within data.hello_timeout_ms (" +
                         std::to_string(timeout_ms) + " ms)");
      }
    });
    if (!hooks_->tls) return ReadHeader();
    // TLS: the peer's first byte tells a TLS client from a plaintext hub.
    plain_->socket().async_wait(tcp::socket::wait_read,
                                [self = shared_from_this()](const boost::system::error_code& e) {
                                  self->OnFirstBytes(e);
                                });
  }

 private:
  void OnFirstBytes(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    unsigned char first = 0;
    const ssize_t n = ::recv(plain_->socket().native_handle(), &first, 1, MSG_PEEK);
    if (n <= 0) return Close(n == 0 ? "the peer closed the connection" : "recv failed");
    if (first != kTlsHandshakeRecord) {
      return Refuse(WireError::kInvalidArgument,
                    "this hub requires TLS on hub links (topology.tls_cert_file is set) and the "
                    "peer speaks plaintext; set topology.tls_* on every hub or on none");
    }
    Result<net::tls::TlsStream> tls =
        net::tls::TlsStream::Make(std::move(plain_->socket()), *hooks_->tls, net::tls::Role::kServer);
    if (!tls.ok()) return Close(tls.status().message());
    tls_ = std::make_unique<TlsLinkStream>(*std::move(tls));
    stream_ = tls_.get();
    tls_stream_ = &tls_->stream();
    tls_stream_->AsyncHandshake([self = shared_from_this()](Status s) {
      if (!s.ok()) return self->Close(s.message());
      self->tls_ready_ = true;
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    stream_->ReadExactly(header_, [self = shared_from_this()](const boost::system::error_code& e) {
      self->OnHeader(e);
    });
  }

  void OnHeader(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    const FrameHeader h = net::DecodeHeader(header_);
    Status s = hello_ ? CheckHubProofHeader(h) : CheckHubHelloHeader(h);
    if (!s.ok()) {
      if (!hello_ && !hooks_->tls &&
          static_cast<unsigned char>(header_[0]) == kTlsHandshakeRecord) {
        s = InvalidArgument("the peer speaks TLS (its topology.tls_* is set) and this hub does "
                            "not; set topology.tls_* on every hub or on none");
      }
      return Refuse(WireError::kMalformed, s.message());
    }
    payload_.resize(h.payload_bytes);
    stream_->ReadExactly(payload_, [self = shared_from_this()](const boost::system::error_code& e) {
      self->OnPayload(e);
    });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    if (!hello_) return OnHello();
    OnProof();
  }

  void OnHello() {
    DataPlane* plane = hooks_->plane;
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
    done_ = true;
    stream_->HandOver(hooks_->plane, id, *std::move(accept));
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
    std::array<std::byte, net::kHeaderBytes> header{};
    net::EncodeHeader(h, header);
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size());
    bytes += body;
    stream_->WriteAll(std::move(bytes),
                      [self = shared_from_this(), last](const boost::system::error_code& e) {
                        if (last || e) return self->Close(e ? e.message() : "");
                        self->ReadHeader();
                      });
  }

  // A refusal: logged (rate-limited), a fatal ERROR naming it to the peer,
  // then closed (the timer still bounds the write).
  void Refuse(WireError code, const std::string& why) {
    if (done_ || refused_ || !stream_->is_open()) return Close("");
    if (tls_ && !tls_ready_) return Close(why);  // no channel to tell the peer on yet
    refused_ = true;
    hooks_->warn("rack link: refused a hub link from " + peer_ + ": " + why);
    Write(Opcode::kError, net::EncodeErrorBody(code, "hub link: " + why), true);
  }

  // Closes; `why`: a transport error not logged yet (the peer went away, a
  // failed TLS handshake).
  void Close(const std::string& why) {
    timer_.cancel();
    if (done_ || !stream_->is_open()) return;
    if (!why.empty() && !refused_) {
      hooks_->warn("rack link: a hub link from " + peer_ + " closed during the handshake: " + why);
    }
    stream_->Close();
  }

  const HubLinkHooks* hooks_;
  const std::string peer_;
  asio::steady_timer timer_;
  HubAcceptor auth_;
  std::unique_ptr<PlainStream> plain_;
  std::unique_ptr<TlsLinkStream> tls_;
  net::tls::TlsStream* tls_stream_ = nullptr;
  LinkStream* stream_ = nullptr;  // plain_ or tls_
  std::optional<data::v1::HubHello> hello_;  // once checked
  bool tls_ready_ = false;  // the TLS handshake is done
  bool refused_ = false;
  bool done_ = false;  // handed over
  std::array<std::byte, net::kHeaderBytes> header_{};
  std::vector<std::byte> payload_;
};

}  // namespace

std::string TcpPeerName(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  return ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
}

void StartHubLinkSession(const HubLinkHooks* hooks, tcp::socket socket) {
  std::make_shared<HubLinkSession>(hooks, std::move(socket))->Start();
}

}  // namespace rackhub::server
