// Client::Impl::ConnectShm: every lane over shared memory with a hub on this
// host (channel_lane.h, net/shm/channel.h). The hub's TCP port answers a
// HELLO with shm_probe with its offer (an abstract Unix socket and its boot
// id); each lane then sends HELLO on that socket and gets its rings.
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>
#include <utility>

#include "channel_lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/shm/channel.h"
#include "wire.h"

namespace rackhub::client {

namespace shm = net::shm;
using Clock = std::chrono::steady_clock;
using ShmLane = internal::ChannelLane<shm::Channel>;

namespace {

Error Fail(ErrorCode code, std::string message) {
  Error e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

// True when `address` is loopback or one of this host's interface addresses
// (getifaddrs(3)): only then can the hub be on this host.
bool IsLocalAddress(const asio::ip::address& address) {
  if (address.is_loopback() || address.is_unspecified()) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && address.is_v4()) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      found = address.to_v4().to_bytes() ==
              asio::ip::address_v4(ntohl(in->sin_addr.s_addr)).to_bytes();
    } else if (i->ifa_addr->sa_family == AF_INET6 && address.is_v6()) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      found = std::memcmp(address.to_v6().to_bytes().data(), in6->sin6_addr.s6_addr, 16) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

Error Client::Impl::ConnectShm(const tcp::endpoint& target, Clock::time_point deadline) {
  if (!IsLocalAddress(target.address())) {
    return Fail(ErrorCode::kConnectFailed, "hub " + options_.hub +
                                               " is not at an address of this host: no shared memory");
  }
  std::string offer_payload;
  {
    tcp::socket probe(io_);
    if (Error e = Handshake(io_, 0, target, deadline, &probe, &offer_payload, nullptr, true);
        !e.ok()) {
      return e;
    }
  }
  data::v1::Welcome offer;
  if (!offer.ParseFromString(offer_payload)) {
    return Fail(ErrorCode::kConnectFailed,
                "hub " + options_.hub + ": the shared-memory offer does not parse");
  }
  if (offer.shm_socket().empty()) {
    return Fail(ErrorCode::kConnectFailed,
                "hub " + options_.hub + " offers no shared memory (its data.shm is off)");
  }
  const std::string boot_id = shm::BootId();
  if (boot_id.empty() || offer.boot_id() != boot_id) {
    return Fail(ErrorCode::kConnectFailed,
                "hub " + options_.hub + " runs on another host (boot id " + offer.boot_id() +
                    ", ours " + (boot_id.empty() ? "unreadable" : boot_id) + ")");
  }
  const shm::PollMode poll = options_.shm_busy_poll ? shm::PollMode::kBusy : shm::PollMode::kEvents;
  std::vector<std::unique_ptr<internal::LaneLink>> lanes;
  uint32_t lane_count = 1;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    const std::string where = "hub " + options_.hub + " (shm @" + offer.shm_socket() + ") lane " +
                              std::to_string(lane);
    Result<shm::ConnectReply> reply =
        shm::Channel::Connect(offer.shm_socket(), HelloPayload(lane), poll, deadline);
    if (!reply.ok()) {
      // Another network namespace (abstract sockets are per namespace) looks
      // the same as another host: kConnectFailed, so auto falls back to TCP.
      return Fail(ErrorCode::kConnectFailed, where + ": " + reply.status().message());
    }
    std::string welcome;
    if (!reply->channel) {  // the hub refused HELLO
      return CheckHelloReply(where, reply->refusal, std::move(reply->refusal_body), &welcome);
    }
    // A frame must fit the ring as one record (row frames of tables are the
    // ones that can be larger: IssueRows checks against this).
    max_frame_payload_ = std::min<uint64_t>(max_frame_payload_.load(),
                                            reply->channel->ring_bytes() - shm::kRecordAlign);
    auto link = std::make_unique<ShmLane>(this, lane, reply->channel, "shm");
    Result<ShmLane::HandshakeReply> first = link->Handshake(io_, "", deadline);
    if (!first.ok()) return Fail(ErrorCode::kConnectFailed, where + ": " + first.status().message());
    if (Error e = CheckHelloReply(where, first->header, std::move(first->body), &welcome);
        !e.ok()) {
      return e;
    }
    if (Error e = AcceptWelcome(lane, welcome, &lane_count); !e.ok()) return e;
    lanes.push_back(std::move(link));
  }
  // A broken lane reconnects over TCP (reconnect.cc).
  can_reconnect_ = true;
  tcp_target_ = target;
  StartIo(std::move(lanes), "shm");
  return {};
}

}  // namespace rackhub::client
