// The client's RDMA dialer (dialer.h, net/rdma/channel.h): a queue pair to
// the hub's lane through its RDMA listener, then HELLO and WELCOME through
// the rings.
#include <utility>

#include "channel_dial.h"
#include "dialer.h"
#include "rackhub/net/rdma/channel.h"

namespace rackhub::client::internal {

namespace rdma = net::rdma;

namespace {

class RdmaDialer final : public Dialer {
 public:
  RdmaDialer(const net::Endpoint& hub, const RdmaDialOptions& options)
      : hub_(options.hub ? *options.hub : net::Endpoint{hub.host, rdma::kDefaultRdmaPort}) {
    copts_.ring_bytes = options.ring_bytes;
    copts_.device = options.device;
    copts_.poll = options.busy_poll ? rdma::PollMode::kBusy : rdma::PollMode::kEvents;
  }

  const char* transport() const override { return "rdma"; }

  Result<DialedLane> Dial(uint32_t lane, const std::string& hello, Clock::time_point deadline,
                          const std::atomic<bool>* cancel) override {
    DialedLane out;
    out.where = "hub " + hub_.ToString() + " (rdma) lane " + std::to_string(lane);
    Result<std::shared_ptr<rdma::Channel>> connected =
        rdma::Channel::Connect(hub_, lane, copts_, deadline);
    if (!connected.ok()) return Unavailable(connected.status().message());
    if (Status s = ChannelHandshake(*std::move(connected), hello, deadline, cancel, &out);
        !s.ok()) {
      return s;
    }
    return out;
  }

 private:
  const net::Endpoint hub_;
  rdma::ChannelOptions copts_;
};

}  // namespace

std::unique_ptr<Dialer> MakeRdmaDialer(const net::Endpoint& hub, const RdmaDialOptions& options) {
  return std::make_unique<RdmaDialer>(hub, options);
}

}  // namespace rackhub::client::internal
