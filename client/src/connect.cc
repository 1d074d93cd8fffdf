// Client::Impl::Connect: the HELLO/WELCOME handshake of every lane, run on
// the caller's thread (the I/O thread starts once every lane is connected).
#include <algorithm>
#include <utility>

#include "client_impl.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/rdma/device.h"
#include "lane.h"
#include "wire.h"

namespace rackhub::client {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kClientVersion = "librackhub 0.1.0";

Error MakeError(ErrorCode code, std::string message, WireError wire = WireError::kNone) {
  Error e;
  e.code = code;
  e.wire = wire;
  e.message = std::move(message);
  return e;
}

// Runs one asynchronous operation on `io` (not yet run by any other thread)
// until it completes or `deadline` passes; on timeout closes `socket` (which
// aborts the operation) and returns timed_out.
// `cancel` (may be null) is polled every 50 ms: once true, the operation is
// aborted as on timeout.
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

}  // namespace

Error Client::Impl::Handshake(asio::io_context& io, uint32_t lane, const tcp::endpoint& endpoint,
                              Clock::time_point deadline, tcp::socket* socket,
                              std::string* welcome_payload, const std::atomic<bool>* cancel,
                              bool shm_probe) {
  const std::string where = "hub " + options_.hub + " lane " + std::to_string(lane);
  const auto failed = [&](const char* step, const boost::system::error_code& ec) {
    const std::string why = ec == asio::error::timed_out
                                ? "timed out (connect_timeout " +
                                      std::to_string(options_.connect_timeout.count()) + " ms)"
                                : ec == asio::error::eof ? "the hub closed the connection"
                                                         : ec.message();
    return MakeError(ErrorCode::kConnectFailed, where + ": " + step + ": " + why);
  };
  auto ec = RunUntil(io, *socket, deadline, cancel,
                     [&](auto handler) { socket->async_connect(endpoint, handler); });
  if (ec) return failed("connect", ec);
  socket->set_option(tcp::no_delay(true), ec);

  const std::string payload = HelloPayload(lane, shm_probe);
  net::FrameHeader h;
  h.opcode = net::Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> header{};
  net::EncodeHeader(h, header);
  const std::array<asio::const_buffer, 2> out = {asio::buffer(header), asio::buffer(payload)};
  ec = RunUntil(io, *socket, deadline, cancel,
                [&](auto handler) { asio::async_write(*socket, out, handler); });
  if (ec) return failed("sending HELLO", ec);

  ec = RunUntil(io, *socket, deadline, cancel,
                [&](auto handler) { asio::async_read(*socket, asio::buffer(header), handler); });
  if (ec) return failed("reading WELCOME", ec);
  const net::FrameHeader reply = net::DecodeHeader(header);
  if (const Status bad = net::CheckHeader(reply); !bad.ok()) {
    return MakeError(ErrorCode::kConnectFailed,
                     where + ": invalid reply to HELLO: " + bad.message());
  }
  std::string body(reply.payload_bytes, '\0');
  ec = RunUntil(io, *socket, deadline, cancel, [&](auto handler) {
    asio::async_read(*socket, asio::buffer(body), handler);
  });
  if (ec) return failed("reading WELCOME", ec);
  return CheckHelloReply(where, reply, std::move(body), welcome_payload);
}

std::string Client::Impl::HelloPayload(uint32_t lane, bool shm_probe) const {
  data::v1::Hello hello;
  hello.set_tenant(options_.tenant);
  hello.set_token(options_.token);
  hello.set_rank(options_.rank);
  hello.set_rack(options_.rack);
  hello.set_lane(lane);
  hello.set_client_version(kClientVersion);
  hello.set_shm_probe(shm_probe);
  hello.set_session(session_);
  return hello.SerializeAsString();
}

Error Client::Impl::CheckHelloReply(const std::string& where, const net::FrameHeader& reply,
                                    std::string body, std::string* welcome_payload) const {
  if (reply.opcode == net::Opcode::kError) {
    net::WireError code{};
    std::string text;
    if (!net::DecodeErrorBody(std::as_bytes(std::span(body)), &code, &text)) {
      return MakeError(ErrorCode::kConnectFailed, where + ": ERROR frame too short");
    }
    const std::string what = where + ": hub refused HELLO: " + net::WireErrorName(code) + ": " +
                              text;
    return MakeError(code == net::WireError::kUnauthenticated ? ErrorCode::kUnauthenticated
                                                              : ErrorCode::kConnectFailed,
                     what, internal::ToClientWireError(code));
  }
  if (reply.opcode != net::Opcode::kWelcome) {
    return MakeError(ErrorCode::kConnectFailed, where + ": expected WELCOME, got " +
                                                    net::OpcodeName(reply.opcode));
  }
  *welcome_payload = std::move(body);
  return {};
}

Error Client::Impl::AcceptWelcome(uint32_t lane, const std::string& payload,
                                  uint32_t* lane_count) {
  data::v1::Welcome welcome;
  if (!welcome.ParseFromString(payload)) {
    return MakeError(ErrorCode::kConnectFailed, "hub " + options_.hub + " lane " +
                                                    std::to_string(lane) +
                                                    ": WELCOME payload does not parse");
  }
  if (lane == 0) {
    if (welcome.lanes() == 0 || welcome.chunk_elements() == 0 || welcome.lanes() > 4096) {
      return MakeError(ErrorCode::kConnectFailed,
                       "hub " + options_.hub + ": WELCOME with " +
                           std::to_string(welcome.lanes()) + " lanes and chunk_elements " +
                           std::to_string(welcome.chunk_elements()));
    }
    tenant_handle_ = welcome.tenant_handle();
    lane_count_ = *lane_count = welcome.lanes();
    workers_ = welcome.workers();
    chunk_elements_ = welcome.chunk_elements();
    straggler_timeout_ms_ = welcome.straggler_timeout_ms();
    std::lock_guard lock(mu_);
    for (const auto& entry : welcome.keys()) {
      const Result<KeyInfo> info = internal::ToKeyInfo(entry, chunk_elements_);
      if (!info.ok()) {
        return MakeError(ErrorCode::kConnectFailed,
                         "hub " + options_.hub + ": WELCOME " + info.status().message());
      }
      ImportKey(*info);
    }
  } else if (welcome.tenant_handle() != tenant_handle_ || welcome.lanes() != lane_count_ ||
             welcome.chunk_elements() != chunk_elements_) {
    return MakeError(ErrorCode::kConnectFailed,
                     "hub " + options_.hub + " lane " + std::to_string(lane) +
                         ": WELCOME disagrees with lane 0's (tenant handle, lanes or chunk size)");
  }
  return {};
}

Error Client::Impl::Connect() {
  const Result<net::Endpoint> endpoint = net::ParseEndpoint(options_.hub);
  if (!endpoint.ok() || endpoint->port == 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "hub '" + options_.hub + "': " +
                         (endpoint.ok() ? std::string("port 0") : endpoint.status().message()));
  }
  if (options_.tenant.empty()) return MakeError(ErrorCode::kInvalidArgument, "tenant is empty");
  const auto deadline = Clock::now() + options_.connect_timeout;
  if (internal::LaneConnector* connector = internal::ThreadLaneConnector()) {
    return connector->ConnectLanes(*this, deadline);
  }
  if (options_.shm == Shm::kOn && options_.transport == Transport::kRdma) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "shm: on contradicts transport kRdma (choose one)");
  }
  tcp::resolver resolver(io_);
  boost::system::error_code ec;
  const auto results = resolver.resolve(endpoint->host, std::to_string(endpoint->port),
                                        asio::ip::resolver_base::numeric_service, ec);
  if (ec || results.empty()) {
    return MakeError(ErrorCode::kConnectFailed,
                     "hub " + options_.hub + ": cannot resolve: " + ec.message());
  }
  const tcp::endpoint target = *results.begin();
  if (options_.shm == Shm::kOn ||
      (options_.shm == Shm::kAuto && options_.transport != Transport::kRdma)) {
    Error e = ConnectShm(target, deadline);
    // auto: a hub elsewhere (or offering none) is reached over the network;
    // anything else (auth, ...) is the answer.
    if (e.ok() || options_.shm == Shm::kOn || e.code != ErrorCode::kConnectFailed) return e;
    lanes_.clear();
  }
  if (options_.transport != Transport::kTcp) {
    const bool want = options_.transport == Transport::kRdma ||
                      net::rdma::DevicePresent(options_.rdma_device);
    if (want) {
      Error e = ConnectRdma(deadline);
      // auto: a hub without RDMA (or a host whose device cannot reach it)
      // falls back to TCP; anything else (auth, ...) is the answer.
      if (e.ok() || options_.transport == Transport::kRdma ||
          e.code != ErrorCode::kConnectFailed) {
        return e;
      }
      lanes_.clear();
    }
  }

  std::vector<tcp::socket> sockets;
  uint32_t lane_count = 1;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    tcp::socket socket(io_);
    std::string payload;
    if (Error e = Handshake(io_, lane, target, deadline, &socket, &payload); !e.ok()) return e;
    if (Error e = AcceptWelcome(lane, payload, &lane_count); !e.ok()) return e;
    sockets.push_back(std::move(socket));
  }
  std::vector<std::unique_ptr<internal::LaneLink>> lanes;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    lanes.push_back(std::make_unique<internal::Lane>(this, lane, std::move(sockets[lane])));
  }
  can_reconnect_ = true;
  tcp_target_ = target;
  StartIo(std::move(lanes), "tcp");
  return {};
}

void Client::Impl::StartIo(std::vector<std::unique_ptr<internal::LaneLink>> lanes,
                           const char* transport) {
  transport_ = transport;
  for (auto& lane : lanes) lanes_.push_back(std::move(lane));
  io_.restart();
  for (auto& lane : lanes_) lane->StartReading();
  work_.emplace(asio::make_work_guard(io_));
  thread_ = std::thread([this] { io_.run(); });
}

namespace internal {

LaneConnector*& ThreadLaneConnector() {
  thread_local LaneConnector* connector = nullptr;
  return connector;
}

}  // namespace internal

}  // namespace rackhub::client
