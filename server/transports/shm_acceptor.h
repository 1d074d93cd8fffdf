// ShmAcceptor: the shared-memory side of rackhubd's data plane, for workers
// on this host (docs/architecture.md, Transports; net/shm/channel.h). On its
// own thread it accepts on an abstract Unix socket (its name is offered to
// authenticated workers through the TCP port, tcp_acceptor.h), checks HELLO
// exactly as for TCP (hello_session.h), creates the connection's sealed
// region and doorbells, sends their descriptors, and hands the channel to the
// lane HELLO names (Lane::AdoptWorker with a ChannelConnection<shm::Channel>).
// The only server file that knows shared memory.
//
// Ownership: owned by the hub; borrows the DataPlane (which outlives it).
// Threading: Listen/Start/Stop from the main thread; sessions on the acceptor
// thread; hand-overs on the lanes' threads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "acceptor_thread.h"
#include "data_plane.h"
#include "hello_session.h"
#include "log_limiter.h"
#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/shm/arena.h"

namespace rackhub::server {

class ShmAcceptor {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;

  explicit ShmAcceptor(DataPlane* plane);
  ~ShmAcceptor();
  ShmAcceptor(const ShmAcceptor&) = delete;
  ShmAcceptor& operator=(const ShmAcceptor&) = delete;

  // Binds a fresh abstract socket name; the error names data.shm.
  Status Listen();
  const std::string& socket_name() const { return name_; }
  void Start();
  // Stops accepting and joins the thread. Idempotent.
  void Stop();

 private:
  void Accept();
  void Adopt(HelloResult checked, Socket socket, const std::string& peer);

  DataPlane* plane_;
  size_t unauthenticated_ = 0;  // declared before thread_: sessions count out when it goes
  HelloSession<Socket>::Hooks hooks_;
  AcceptorThread thread_;  // "rackhub-shm"
  boost::asio::local::stream_protocol::acceptor acceptor_{thread_.io()};
  boost::asio::steady_timer retry_{thread_.io()};
  std::string name_;
  // Publish arenas by (tenant handle, lane), alive while a connection of
  // theirs is (acceptor thread).
  std::map<std::pair<uint32_t, uint32_t>, std::weak_ptr<net::shm::PublishArena>> arenas_;
  LogLimiter warnings_{20, std::chrono::seconds(10)};
};

}  // namespace rackhub::server
