// Client::Impl::ConnectRdma: every lane over RDMA (channel_lane.h).
#include <utility>

#include "channel_lane.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/rdma/channel.h"
#include "wire.h"

namespace rackhub::client {

namespace rdma = net::rdma;
using Clock = std::chrono::steady_clock;
using RdmaLane = internal::ChannelLane<rdma::Channel>;

Error Client::Impl::ConnectRdma(Clock::time_point deadline) {
  const auto fail = [](ErrorCode code, std::string message) {
    Error e;
    e.code = code;
    e.message = std::move(message);
    return e;
  };
  const Result<net::Endpoint> hub = net::ParseEndpoint(options_.hub);
  if (!hub.ok()) {
    return fail(ErrorCode::kInvalidArgument,
                "hub '" + options_.hub + "': " + hub.status().message());
  }
  net::Endpoint target{hub->host, rdma::kDefaultRdmaPort};
  if (!options_.rdma_hub.empty()) {
    const Result<net::Endpoint> ep = net::ParseEndpoint(options_.rdma_hub);
    if (!ep.ok() || ep->port == 0) {
      return fail(ErrorCode::kInvalidArgument,
                  "rdma_hub '" + options_.rdma_hub + "': " +
                      (ep.ok() ? std::string("port 0") : ep.status().message()));
    }
    target = *ep;
  }
  rdma::ChannelOptions copts;
  copts.ring_bytes = options_.rdma_ring_bytes;
  copts.device = options_.rdma_device;
  copts.poll = options_.rdma_busy_poll ? rdma::PollMode::kBusy : rdma::PollMode::kEvents;

  std::vector<std::unique_ptr<RdmaLane>> lanes;
  uint32_t lane_count = 1;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    const std::string where = "hub " + target.ToString() + " (rdma) lane " + std::to_string(lane);
    Result<std::shared_ptr<rdma::Channel>> connected =
        rdma::Channel::Connect(target, lane, copts, deadline);
    if (!connected.ok()) return fail(ErrorCode::kConnectFailed, connected.status().message());
    std::shared_ptr<rdma::Channel> channel = *std::move(connected);
    auto link = std::make_unique<RdmaLane>(this, lane, channel, "rdma");
    Result<RdmaLane::HandshakeReply> reply =
        link->Handshake(io_, HelloPayload(lane), deadline);
    if (!reply.ok()) {
      return fail(ErrorCode::kConnectFailed, where + ": " + reply.status().message());
    }
    std::string welcome;
    if (Error e = CheckHelloReply(where, reply->header, std::move(reply->body), &welcome);
        !e.ok()) {
      return e;
    }
    if (Error e = AcceptWelcome(lane, welcome, &lane_count); !e.ok()) return e;
    lanes.push_back(std::move(link));
  }
  std::vector<std::unique_ptr<internal::LaneLink>> links;
  for (auto& l : lanes) links.push_back(std::move(l));
  StartIo(std::move(links), "rdma");
  return {};
}

}  // namespace rackhub::client
