// Test seam of librackhub (library rackhub_client_testing; never part of
// librackhub.so): a Client whose lane connections are made by the caller, over
// any net::Connection (typically the in-memory transport of
// rackhub/net/testing/memory_connection.h against a hub running in the same
// process). Everything is the production client, lanes included: the
// caller's connection is the lane's transport, joined to the client's I/O
// thread by an adapter that only hops threads (replies go through the lane's
// header checks and land in the caller's buffer as over TCP). Outgoing
// payloads are copied when the lane hands them over. Reconnects dial through
// the same `dial`.
//
// How a lane is made: for lane L, the client builds its HELLO and calls
// `dial(hello_header, hello_payload, io, handler)`. The dialer delivers that
// HELLO to the hub its own way and returns the client's end of the
// connection, built on `io` with `handler` and started (or with Start posted
// to `io`); the hub's first frame on it (WELCOME or ERROR) is the HELLO's
// answer. A null return fails the connect with kConnectFailed.
//
// Ownership and threads:
//  - `io` is run by a thread the caller owns. It must keep running, and
//    outlive every Client connected through it and the hub's ends of their
//    connections (the in-memory transport posts to both ends' io_contexts).
//  - The connection's callbacks run on `io`'s thread; the adapter hands
//    frames over to the client's own I/O thread. Destroying (or closing) the
//    Client closes its connections on `io`'s thread and waits for that.
//  - `dial` is called on the connecting thread (and on the client's
//    reconnect thread), once per lane, in lane order.
//  - The returned Client is an ordinary Client (client.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "rackhub/client/client.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::client::testing {

using LaneDialer = std::function<std::shared_ptr<net::Connection>(
    const net::FrameHeader& hello, const std::string& payload, boost::asio::io_context& io,
    net::FrameHandler* handler)>;

// As Client::Connect (same checks, HELLO/WELCOME of every lane within
// options.connect_timeout, same errors), with every lane made by `dial` on
// `io`. options.hub, transport and the rdma_* fields are not used for
// dialing (hub must still parse as HOST:PORT; the default does).
std::unique_ptr<Client> ConnectThrough(const Options& options, boost::asio::io_context& io,
                                       LaneDialer dial, Error* error);

// While alive, every Client::Connect on the constructing thread connects
// through `dial` on `io` as ConnectThrough does; so does rackhub_connect
// (rackhub_c.h) where the C ABI is linked statically into the same program
// (not through librackhub.so, which has its own copy of the client). Must be
// destroyed on the thread that made it; nested scopes restore the outer one.
class ScopedLaneDialer {
 public:
  ScopedLaneDialer(boost::asio::io_context& io, LaneDialer dial);
  ~ScopedLaneDialer();
  ScopedLaneDialer(const ScopedLaneDialer&) = delete;
  ScopedLaneDialer& operator=(const ScopedLaneDialer&) = delete;

  class Connector;

 private:
  std::shared_ptr<Connector> connector_;  // shared with the clients it connected
};

}  // namespace rackhub::client::testing
