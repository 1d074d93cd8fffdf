// The data-plane transport interface (docs/architecture.md, "Transports").
//
// A Connection carries the frames (net/frame.h) of one (worker, lane) pair.
// The hub's lane logic sees only this interface and FrameHandler; net/tcp/
// implements it over Boost.Asio sockets, net/rdma/ over verbs queue pairs and
// net/testing/ in memory (with fault injection, for tests). Acceptors build
// connections; outgoing ones come from a net::Connector (connector.h). The
// lane never sees a socket; the transport never sees an optimizer.
//
// Threading: a Connection belongs to one lane thread. Every member, and every
// FrameHandler callback, runs on that thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "rackhub/net/frame.h"

namespace rackhub::net {

// Who is on the other end, fixed once HELLO was authenticated.
struct ConnectionIdentity {
  uint32_t tenant_handle = 0;
  std::string tenant;
  uint32_t rank = 0;
  uint32_t lane = 0;
  std::string peer;  // transport address for logs ("ip:port")
  uint32_t rack = 0;  // the worker's rack, or the peer hub's rack
  bool hub = false;   // a link to another rack's hub, not a worker
};

class Connection;

// The lane side of a connection: validates headers and consumes frames.
class FrameHandler {
 public:
  enum class Verdict {
    kAccept,   // deliver the payload, then HandleFrame
    kDiscard,  // a non-fatal ERROR was sent: drop the payload, go on
    kReject,   // a fatal ERROR was sent: deliver nothing more
  };
  virtual ~FrameHandler() = default;
  // Called with every header (already checked by CheckHeader) before its
  // payload is received, so nothing is allocated for a frame that is refused.
  virtual Verdict AcceptHeader(Connection& conn, const FrameHeader& h) = 0;
  // The payload is valid only during the call.
  virtual void HandleFrame(Connection& conn, const FrameHeader& h,
                           std::span<const std::byte> payload) = 0;
  // Called exactly once, when the connection closes for any reason.
  virtual void OnConnectionClosed(Connection& conn, const std::string& why) = 0;
  virtual void OnBytesSent(Connection& conn, size_t bytes) = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  virtual ~Connection() = default;

  virtual const ConnectionIdentity& id() const = 0;
  virtual bool open() const = 0;
  // Starts delivering frames to the handler.
  virtual void Start() = 0;
  // Queues a frame whose payload the caller keeps valid and unchanged until
  // it is written (the lane's double-buffered parameters).
  virtual void SendBorrowed(const FrameHeader& header, std::span<const std::byte> payload) = 0;
  // Queues a frame that owns its payload (payload_bytes is set from it).
  virtual void SendOwned(const FrameHeader& header, std::string payload) = 0;
  // Queues ERROR(code, text) answering `request_id`. A fatal error stops
  // delivery at once and closes the connection once the frame is out.
  virtual void SendError(WireError code, const std::string& text, uint64_t request_id,
                         bool fatal) = 0;
  // Closes now (queued frames may be lost). Idempotent.
  virtual void Close(const std::string& why) = 0;
};

}  // namespace rackhub::net
