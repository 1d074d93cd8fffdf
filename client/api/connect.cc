// Client::Impl::Connect: dialing every lane (dialer.h) over the transport the
// options choose, on the caller's thread, and adopting the lanes (lane.h);
// the I/O thread starts once every lane is connected. The reconnect loop
// (reconnect.cc) dials through the same DialAll.
#include <algorithm>
#include <utility>

#include "client_impl.h"
#include "dialer.h"
#include "lane.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/rdma/device.h"
#include "wire.h"

namespace rackhub::client {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kClientVersion = "librackhub 0.1.0";


}  // namespace

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
    const Result<net::ErrorBody> error = net::DecodeErrorBody(std::as_bytes(std::span(body)));
    if (!error.ok()) return MakeError(ErrorCode::kConnectFailed, where + ": ERROR frame too short");
    const net::WireError code = error->code;
    const std::string& text = error->text;
    const std::string what =
        where + ": hub refused HELLO: " + net::WireErrorName(code) + ": " + text;
    return MakeError(code == net::WireError::kUnauthenticated ? ErrorCode::kUnauthenticated
                                                              : ErrorCode::kConnectFailed,
                     what, internal::ToClientWireError(code));
  }
  if (reply.opcode != net::Opcode::kWelcome) {
    return MakeError(ErrorCode::kConnectFailed,
                     where + ": expected WELCOME, got " + net::OpcodeName(reply.opcode));
  }
  *welcome_payload = std::move(body);
  return {};
}

Error Client::Impl::AcceptWelcome(uint32_t lane, const std::string& payload) {
  data::v1::Welcome welcome;
  if (!welcome.ParseFromString(payload)) {
    return MakeError(ErrorCode::kConnectFailed, "hub " + options_.hub + " lane " +
                                                    std::to_string(lane) +
                                                    ": WELCOME payload does not parse");
  }
  if (lane == 0) {
    if (welcome.lanes() == 0 || welcome.chunk_elements() == 0 || welcome.lanes() > 4096) {
      return MakeError(ErrorCode::kConnectFailed,
                       "hub " + options_.hub + ": WELCOME with " + std::to_string(welcome.lanes()) +
                           " lanes and chunk_elements " + std::to_string(welcome.chunk_elements()));
    }
    tenant_handle_ = welcome.tenant_handle();
    lane_count_ = welcome.lanes();
    workers_ = welcome.workers();
    chunk_elements_ = welcome.chunk_elements();
    straggler_timeout_ms_ = welcome.straggler_timeout_ms();
    hub_incarnation_ = welcome.incarnation();
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

Error Client::Impl::DialLanes(internal::Dialer& dialer, Clock::time_point deadline,
                              const std::atomic<bool>* cancel, internal::DialedLanes* out) {
  out->transport = dialer.transport();
  out->max_payload = net::kMaxDataPayload;
  uint32_t lane_count = 1;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    Result<internal::DialedLane> dialed = dialer.Dial(lane, HelloPayload(lane), deadline, cancel);
    if (!dialed.ok()) return MakeError(ErrorCode::kConnectFailed, dialed.status().message());
    std::string welcome;
    if (Error e = CheckHelloReply(dialed->where, dialed->reply, dialed->body, &welcome); !e.ok()) {
      return e;
    }
    if (!dialed->adopt) {
      return MakeError(ErrorCode::kConnectFailed, dialed->where + ": no connection to adopt");
    }
    if (lane == 0) {
      data::v1::Welcome w;
      if (!w.ParseFromString(welcome) || w.lanes() == 0 || w.lanes() > 4096) {
        return MakeError(ErrorCode::kConnectFailed,
                         "hub " + options_.hub + ": lane 0: unusable WELCOME");
      }
      lane_count = w.lanes();
    }
    dialed->body = std::move(welcome);
    out->max_payload = std::min(out->max_payload, dialed->max_payload);
    out->lanes.push_back(*std::move(dialed));
  }
  return {};
}

Error Client::Impl::DialAll(Clock::time_point deadline, const std::atomic<bool>* cancel,
                            internal::DialedLanes* out) {
  *out = internal::DialedLanes{};
  if (test_dialer_) return DialLanes(*test_dialer_, deadline, cancel, out);
  const Result<net::Endpoint> hub = net::ParseEndpoint(options_.hub);
  if (!hub.ok()) return MakeError(ErrorCode::kInvalidArgument, hub.status().message());
  // auto: what cannot be reached one way (kConnectFailed) is tried the next;
  // anything else (auth, ...) is the answer.
  const auto fall_back = [](const Error& e) { return e.code == ErrorCode::kConnectFailed; };
  if (options_.shm == Shm::kOn ||
      (options_.shm == Shm::kAuto && options_.transport != Transport::kRdma)) {
    auto shm = internal::MakeShmDialer(*hub, options_.hub, options_.connect_timeout,
                                       HelloPayload(0, /*shm_probe=*/true), options_.shm_busy_poll);
    Error e = DialLanes(*shm, deadline, cancel, out);
    if (e.ok() || options_.shm == Shm::kOn || !fall_back(e)) return e;
    *out = internal::DialedLanes{};
  }
  if (options_.transport != Transport::kTcp &&
      (options_.transport == Transport::kRdma || net::rdma::DevicePresent(options_.rdma_device))) {
    internal::RdmaDialOptions ro;
    if (!options_.rdma_hub.empty()) ro.hub = *net::ParseEndpoint(options_.rdma_hub);
    ro.device = options_.rdma_device;
    ro.ring_bytes = options_.rdma_ring_bytes;
    ro.busy_poll = options_.rdma_busy_poll;
    auto rdma = internal::MakeRdmaDialer(*hub, ro);
    Error e = DialLanes(*rdma, deadline, cancel, out);
    if (e.ok() || options_.transport == Transport::kRdma || !fall_back(e)) return e;
    *out = internal::DialedLanes{};
  }
  auto tcp = internal::MakeTcpDialer(*hub, options_.hub, options_.connect_timeout);
  return DialLanes(*tcp, deadline, cancel, out);
}

std::vector<std::unique_ptr<internal::Lane>> Client::Impl::AdoptLanes(
    internal::DialedLanes dialed) {
  std::vector<std::unique_ptr<internal::Lane>> lanes;
  for (uint32_t i = 0; i < dialed.lanes.size(); ++i) {
    auto lane = std::make_unique<internal::Lane>(this, i);
    std::shared_ptr<net::Connection> conn = dialed.lanes[i].adopt(io_, lane.get());
    if (!conn) return {};
    lane->Start(std::move(conn), dialed.lanes[i].lanes_share_link);
    lanes.push_back(std::move(lane));
  }
  transport_ = dialed.transport;
  max_frame_payload_ = dialed.max_payload;
  return lanes;
}

Error Client::Impl::Connect() {
  const Result<net::Endpoint> endpoint = net::ParseEndpoint(options_.hub);
  if (!endpoint.ok() || endpoint->port == 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "hub '" + options_.hub + "': " +
                         (endpoint.ok() ? std::string("port 0") : endpoint.status().message()));
  }
  if (options_.tenant.empty()) return MakeError(ErrorCode::kInvalidArgument, "tenant is empty");
  test_dialer_ = internal::ThreadTestDialer();
  if (!test_dialer_) {
    if (options_.shm == Shm::kOn && options_.transport == Transport::kRdma) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "shm: on contradicts transport kRdma (choose one)");
    }
    if (!options_.rdma_hub.empty()) {
      const Result<net::Endpoint> ep = net::ParseEndpoint(options_.rdma_hub);
      if (!ep.ok() || ep->port == 0) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "rdma_hub '" + options_.rdma_hub +
                             "': " + (ep.ok() ? std::string("port 0") : ep.status().message()));
      }
    }
  }
  const auto deadline = Clock::now() + options_.connect_timeout;
  internal::DialedLanes dialed;
  if (Error e = DialAll(deadline, nullptr, &dialed); !e.ok()) return e;
  for (uint32_t lane = 0; lane < dialed.lanes.size(); ++lane) {
    if (Error e = AcceptWelcome(lane, dialed.lanes[lane].body); !e.ok()) return e;
  }
  io_.restart();
  lanes_ = AdoptLanes(std::move(dialed));
  if (lanes_.empty()) {
    return MakeError(ErrorCode::kConnectFailed, "hub " + options_.hub + ": adopting a lane failed");
  }
  can_reconnect_ = true;
  work_.emplace(asio::make_work_guard(io_));
  thread_ = std::thread([this] { io_.run(); });
  return {};
}

namespace internal {

std::shared_ptr<Dialer>& ThreadTestDialer() {
  thread_local std::shared_ptr<Dialer> dialer;
  return dialer;
}

}  // namespace internal

}  // namespace rackhub::client
