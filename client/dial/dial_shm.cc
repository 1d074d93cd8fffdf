// The client's shared-memory dialer (dialer.h, net/shm/channel.h). Lane 0
// first asks the hub's TCP port for its offer (a HELLO with shm_probe: an
// abstract Unix socket and the hub's boot id); each lane then sends its HELLO
// on that socket and gets its rings, and the hub's WELCOME arrives through
// them. A reconnect dials the same way, so it asks for a fresh offer (a
// restarted hub has a new socket).
#include <algorithm>
#include <utility>

#include "channel_dial.h"
#include "dialer.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/shm/channel.h"

namespace rackhub::client::internal {

namespace shm = net::shm;

namespace {

class ShmDialer final : public Dialer {
 public:
  ShmDialer(const net::Endpoint& hub, std::string name, std::chrono::milliseconds connect_timeout,
            std::string probe_hello, bool busy_poll)
      : hub_(hub),
        name_(std::move(name)),
        tcp_(MakeTcpDialer(hub, name_, connect_timeout)),
        probe_hello_(std::move(probe_hello)),
        poll_(busy_poll ? shm::PollMode::kBusy : shm::PollMode::kEvents) {}

  const char* transport() const override { return "shm"; }

  Result<DialedLane> Dial(uint32_t lane, const std::string& hello, Clock::time_point deadline,
                          const std::atomic<bool>* cancel) override {
    if (lane == 0 || socket_.empty()) {
      Result<DialedLane> refused = Probe(deadline, cancel);
      if (!refused.ok() || refused->reply.opcode != net::Opcode::kWelcome) return refused;
    }
    DialedLane out;
    out.where = "hub " + name_ + " (shm @" + socket_ + ") lane " + std::to_string(lane);
    Result<shm::ConnectReply> reply = shm::Channel::Connect(socket_, hello, poll_, deadline);
    if (!reply.ok()) {
      // Another network namespace (abstract sockets are per namespace) looks
      // the same as another host: UNAVAILABLE, so auto falls back to TCP.
      return Unavailable(out.where + ": " + reply.status().message());
    }
    if (!reply->channel) {  // the hub refused HELLO
      out.reply = reply->refusal;
      out.body = std::move(reply->refusal_body);
      return out;
    }
    // A frame must fit the ring as one record (row frames of tables are the
    // ones that can be larger: IssueRows checks against this).
    out.max_payload =
        std::min<uint64_t>(net::kMaxDataPayload, reply->channel->ring_bytes() - shm::kRecordAlign);
    if (Status s = ChannelHandshake(reply->channel, "", deadline, cancel, &out); !s.ok()) return s;
    return out;
  }

 private:
  // Asks the hub's TCP port for its offer; sets socket_. The hub's refusal
  // of the probe comes back as the DialedLane (its ERROR reply).
  Result<DialedLane> Probe(Clock::time_point deadline, const std::atomic<bool>* cancel) {
    socket_.clear();
    Result<bool> local = HubIsLocal(hub_);
    if (!local.ok()) return local.status();
    if (!*local) {
      return Unavailable("hub " + name_ + " is not at an address of this host: no shared memory");
    }
    Result<DialedLane> probe = tcp_->Dial(0, probe_hello_, deadline, cancel);
    if (!probe.ok() || probe->reply.opcode != net::Opcode::kWelcome) return probe;
    data::v1::Welcome offer;
    if (!offer.ParseFromString(probe->body)) {
      return Unavailable("hub " + name_ + ": the shared-memory offer does not parse");
    }
    if (offer.shm_socket().empty()) {
      return Unavailable("hub " + name_ + " offers no shared memory (its data.shm is off)");
    }
    const std::string boot_id = shm::BootId();
    if (boot_id.empty() || offer.boot_id() != boot_id) {
      return Unavailable("hub " + name_ + " runs on another host (boot id " + offer.boot_id() +
                         ", ours " + (boot_id.empty() ? "unreadable" : boot_id) + ")");
    }
    socket_ = offer.shm_socket();
    return probe;  // the probe connection closes here (never adopted)
  }

  const net::Endpoint hub_;
  const std::string name_;
  std::unique_ptr<Dialer> tcp_;
  const std::string probe_hello_;
  const shm::PollMode poll_;
  std::string socket_;  // this attempt's offer
};

}  // namespace

std::unique_ptr<Dialer> MakeShmDialer(const net::Endpoint& hub, const std::string& name,
                                      std::chrono::milliseconds connect_timeout,
                                      std::string probe_hello, bool busy_poll) {
  return std::make_unique<ShmDialer>(hub, name, connect_timeout, std::move(probe_hello), busy_poll);
}

}  // namespace rackhub::client::internal
