// Private to librackhub: how the connection of one client lane is made, for
// every transport. A Dialer reaches the hub, sends the lane's HELLO and waits
// for the answer (WELCOME or ERROR), all on the calling thread; it hands back
// that answer and a way to turn the handshaken link into a net::Connection on
// the client's io_context, whose frame handler is the lane (lane.h). Nothing
// above this file names a transport: Connect and the reconnect loop
// (connect.cc, reconnect.cc) dial every transport the same way.
//
// Implementations: dial_tcp.cc (Boost.Asio sockets), dial_shm.cc (shared
// memory with a hub on this host, after asking its TCP port for the offer),
// dial_rdma.cc (verbs queue pairs) and, in rackhub_client_testing, the
// caller's dialer of rackhub/client/testing.h (in-memory connections).
//
// Ownership: a DialedLane owns its handshaken link until `adopt` is called
// (then the connection does) or the DialedLane is destroyed (the link is
// closed).
// Threads: Dial runs on the connecting thread (Connect) or the reconnect
// thread, never on the client's I/O thread; `adopt` runs on the thread that
// runs (or is about to run) the client's io_context.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::client::internal {

using Clock = std::chrono::steady_clock;

struct DialedLane {
  // Where the lane went, for errors ("hub 127.0.0.1:7700 (shm @...) lane 1").
  std::string where;
  // The hub's answer to HELLO: WELCOME (or, for a shared-memory offer,
  // WELCOME with the offer) or ERROR, and its payload.
  net::FrameHeader reply{};
  std::string body;
  // The largest frame payload the link carries.
  uint64_t max_payload = net::kMaxDataPayload;
  // The lanes' connections are flows sharing one link, and what they report
  // written is about to be on it (TCP with a small unsent backlog): the
  // client keeps such lanes in step (lane.h). Rings (shared memory, RDMA)
  // are not kept in step: nothing makes one lane's ring overtake another's.
  bool lanes_share_link = false;
  // Builds the lane's connection on `io` with `handler`, not started. Empty
  // when the hub refused (reply is an ERROR) or for a probe.
  std::function<std::shared_ptr<net::Connection>(boost::asio::io_context& io,
                                                 net::FrameHandler* handler)>
      adopt;
};

class Dialer {
 public:
  virtual ~Dialer() = default;
  // The transport's name ("tcp", "shm", "rdma", "memory"), for transport().
  virtual const char* transport() const = 0;
  // Dials lane `lane` with HELLO payload `hello` and waits for the hub's
  // answer until `deadline`; lanes are dialed in order, lane 0 first. A
  // transport failure (unreachable, timed out, closed, `cancel` set) is
  // UNAVAILABLE naming where and what; the hub's refusal is not a failure
  // here (reply is its ERROR).
  virtual Result<DialedLane> Dial(uint32_t lane, const std::string& hello,
                                  Clock::time_point deadline, const std::atomic<bool>* cancel) = 0;
};

// TCP to `hub` (HOST:PORT, already checked); `name` is options.hub and
// `connect_timeout` options.connect_timeout, for errors.
std::unique_ptr<Dialer> MakeTcpDialer(const net::Endpoint& hub, const std::string& name,
                                      std::chrono::milliseconds connect_timeout);
// True when `hub`'s host resolves to an address of this host (loopback or an
// interface's): only then can it be reached over shared memory. UNAVAILABLE
// when it does not resolve.
Result<bool> HubIsLocal(const net::Endpoint& hub);
// Shared memory: asks the hub's TCP port for its offer (`probe_hello`: a
// HELLO with shm_probe set) when lane 0 is dialed, then connects each lane
// to the offered socket. An offer that is missing, from another host or
// unusable is UNAVAILABLE (the caller falls back to the network).
std::unique_ptr<Dialer> MakeShmDialer(const net::Endpoint& hub, const std::string& name,
                                      std::chrono::milliseconds connect_timeout,
                                      std::string probe_hello, bool busy_poll);
// RDMA to the hub's RDMA listener: Options::rdma_hub if given (`hub`
// below), else `hub`'s host at the default RDMA port; `device`, ring size
// and polling as in Options.
struct RdmaDialOptions {
  std::optional<net::Endpoint> hub;
  std::string device;
  uint32_t ring_bytes = 0;
  bool busy_poll = false;
};
std::unique_ptr<Dialer> MakeRdmaDialer(const net::Endpoint& hub, const RdmaDialOptions& options);

// The test seam (rackhub/client/testing.h): while set on a thread,
// Client::Connect on that thread dials every lane through it, and so do the
// client's reconnects. Null in production.
std::shared_ptr<Dialer>& ThreadTestDialer();

}  // namespace rackhub::client::internal
