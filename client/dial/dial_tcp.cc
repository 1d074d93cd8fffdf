// The client's TCP dialer (dialer.h): connect, HELLO, the hub's answer, each
// step bounded by the deadline and abortable through `cancel`, on a private
// io_context of the dialing thread; the handshaken socket is then adopted by
// the client's io_context as a net::tcp::TcpConnection. The only place of the
// client that names TCP.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "dialer.h"
#include "rackhub/net/tcp/connection.h"

namespace rackhub::client::internal {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// TCP_NOTSENT_LOWAT of a lane's socket: a few chunks.
constexpr int kNotSentLowWatermark = 128 * 1024;

// Runs one asynchronous operation on `io` (run by no other thread) until it
// completes or `deadline` passes; on timeout closes `socket` (which aborts the
// operation) and returns timed_out. `cancel` (may be null) is polled every
// 50 ms: once true, the operation is aborted as on timeout.
template <typename StartFn>
boost::system::error_code RunUntil(asio::io_context& io, tcp::socket& socket,
                                   Clock::time_point deadline, const std::atomic<bool>* cancel,
                                   StartFn start) {
  bool done = false;
  boost::system::error_code result;
  io.restart();
  start([&](const boost::system::error_code& ec, auto&&...) {
    result = ec;
    done = true;
  });
  while (!done) {
    const bool cancelled = cancel != nullptr && cancel->load();
    if (Clock::now() >= deadline || cancelled) {
      boost::system::error_code ignored;
      socket.close(ignored);
      while (!done) io.run_one();  // the aborted handler
      return cancelled ? asio::error::operation_aborted : asio::error::timed_out;
    }
    io.run_one_until(cancel ? std::min(deadline, Clock::now() + std::chrono::milliseconds(50))
                            : deadline);
  }
  return result;
}

Result<tcp::endpoint> Resolve(const net::Endpoint& hub, const std::string& name) {
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto results = resolver.resolve(hub.host, std::to_string(hub.port),
                                        asio::ip::resolver_base::numeric_service, ec);
  if (ec || results.empty()) {
    return Unavailable("hub " + name +
                       ": cannot resolve: " + (ec ? ec.message() : std::string("no address")));
  }
  return *results.begin();
}

// A handshaken socket's descriptor, closed unless adopted.
struct OwnedFd {
  explicit OwnedFd(int f) : fd(f) {}
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int fd;
};

class TcpDialer final : public Dialer {
 public:
  TcpDialer(net::Endpoint hub, std::string name, std::chrono::milliseconds connect_timeout)
      : hub_(std::move(hub)), name_(std::move(name)), connect_timeout_(connect_timeout) {}

  const char* transport() const override { return "tcp"; }

  Result<DialedLane> Dial(uint32_t lane, const std::string& hello, Clock::time_point deadline,
                          const std::atomic<bool>* cancel) override {
    DialedLane out;
    out.lanes_share_link = true;
    out.where = "hub " + name_ + " lane " + std::to_string(lane);
    if (lane == 0 || !target_) {
      Result<tcp::endpoint> target = Resolve(hub_, name_);
      if (!target.ok()) return target.status();
      target_ = *target;
    }
    const auto failed = [&](const char* step, const boost::system::error_code& ec) {
      const std::string why =
          ec == asio::error::timed_out
              ? "timed out (connect_timeout " + std::to_string(connect_timeout_.count()) + " ms)"
          : ec == asio::error::eof ? "the hub closed the connection"
                                   : ec.message();
      return Unavailable(out.where + ": " + step + ": " + why);
    };
    asio::io_context io;
    tcp::socket socket(io);
    auto ec = RunUntil(io, socket, deadline, cancel,
                       [&](auto handler) { socket.async_connect(*target_, handler); });
    if (ec) return failed("connect", ec);
    socket.set_option(tcp::no_delay(true), ec);
    // The kernel keeps at most this much unsent (beyond what is in flight):
    // what the lane counts as written is then close to on the wire, which
    // keeps a worker's lanes in step (client/api/lane.h). Best effort.
    socket.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_NOTSENT_LOWAT>(
                          kNotSentLowWatermark),
                      ec);

    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    h.payload_bytes = static_cast<uint32_t>(hello.size());
    std::array<std::byte, net::kHeaderBytes> header{};
    net::EncodeHeader(h, header);
    const std::array<asio::const_buffer, 2> request = {asio::buffer(header), asio::buffer(hello)};
    ec = RunUntil(io, socket, deadline, cancel,
                  [&](auto handler) { asio::async_write(socket, request, handler); });
    if (ec) return failed("sending HELLO", ec);

    ec = RunUntil(io, socket, deadline, cancel,
                  [&](auto handler) { asio::async_read(socket, asio::buffer(header), handler); });
    if (ec) return failed("reading WELCOME", ec);
    out.reply = net::DecodeHeader(header);
    if (const Status bad = net::CheckHeader(out.reply); !bad.ok()) {
      return Unavailable(out.where + ": invalid reply to HELLO: " + bad.message());
    }
    out.body.assign(out.reply.payload_bytes, '\0');
    ec = RunUntil(io, socket, deadline, cancel,
                  [&](auto handler) { asio::async_read(socket, asio::buffer(out.body), handler); });
    if (ec) return failed("reading WELCOME", ec);
    if (out.reply.opcode != net::Opcode::kWelcome) return out;  // refused: nothing to adopt
    auto fd = std::make_shared<OwnedFd>(socket.release());
    const auto protocol = target_->protocol();
    out.adopt = [fd, protocol, where = out.where](
                    asio::io_context& client_io,
                    net::FrameHandler* handler) -> std::shared_ptr<net::Connection> {
      tcp::socket s(client_io);
      boost::system::error_code error;
      s.assign(protocol, std::exchange(fd->fd, -1), error);
      if (error) return nullptr;
      net::ConnectionIdentity id;
      id.peer = where;
      return std::make_shared<net::tcp::TcpConnection>(handler, std::move(s), std::move(id));
    };
    return out;
  }

 private:
  const net::Endpoint hub_;
  const std::string name_;
  const std::chrono::milliseconds connect_timeout_;  // for messages
  std::optional<tcp::endpoint> target_;
};

}  // namespace

std::unique_ptr<Dialer> MakeTcpDialer(const net::Endpoint& hub, const std::string& name,
                                      std::chrono::milliseconds connect_timeout) {
  return std::make_unique<TcpDialer>(hub, name, connect_timeout);
}

Result<bool> HubIsLocal(const net::Endpoint& hub) {
  Result<tcp::endpoint> target = Resolve(hub, hub.ToString());
  if (!target.ok()) return target.status();
  const asio::ip::address address = target->address();
  if (address.is_loopback() || address.is_unspecified()) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && address.is_v4()) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      found =
          address.to_v4().to_bytes() == asio::ip::address_v4(ntohl(in->sin_addr.s_addr)).to_bytes();
    } else if (i->ifa_addr->sa_family == AF_INET6 && address.is_v6()) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      found = std::memcmp(address.to_v6().to_bytes().data(), in6->sin6_addr.s6_addr, 16) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace rackhub::client::internal
