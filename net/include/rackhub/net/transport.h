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
  std::string peer;   // transport address for logs ("ip:port")
  uint32_t rack = 0;  // the worker's rack, or the peer hub's rack
  bool hub = false;   // a link to another rack's hub, not a worker
  // The worker's client session (its HELLO's `session`: one per client
  // process, the same on every lane and reconnect; 0 if it named none).
  uint64_t session = 0;
};

class Connection;

// Bounds on what a connection holds for its peer (docs/architecture.md,
// "Bounded send queues"). The backlog is the bytes of frames handed to Send*
// and not written yet (header + payload, shared payloads included), plus the
// bytes the owner reserved for replies it will send later (Reserve).
struct SendLimits {
  // Above this backlog the connection stops taking frames from its peer (at
  // the next frame boundary; TCP stops reading, RDMA stops returning
  // credits) until the backlog is down to half of it. 0: never.
  size_t pause_bytes = 0;
  // Above this the connection fails: frames not being written yet are
  // dropped, a fatal ERROR QUOTA_EXCEEDED naming `setting` is queued, and
  // the connection closes once it is out (or 2 s later). A single frame on
  // an empty backlog never fails it. 0: never.
  size_t max_bytes = 0;
  std::string setting;  // the limit's name in the error text
};

// Turns for delivering received frames (docs/architecture.md, "Fair share
// of a lane"). A connection given a scheduler does not deliver frames as
// they arrive: once it holds a complete frame it asks for a turn, stops
// reading meanwhile (its peer is held back by the transport's own flow
// control), and delivers what it holds when the scheduler calls DeliverTurn.
// Which connection goes first is the scheduler's business (the lane's:
// weighted fair queueing over tenants); the transport only asks.
// Threading: the connection's thread, for every call both ways.
class DeliveryScheduler {
 public:
  virtual ~DeliveryScheduler() = default;
  // `conn` holds `bytes` received and not delivered. The scheduler calls
  // conn->DeliverTurn() exactly once for this request, later, on a fresh
  // stack (never from inside RequestTurn), unless it is dropped (shutdown).
  // A connection has at most one request outstanding.
  virtual void RequestTurn(std::shared_ptr<Connection> conn, size_t bytes) = 0;
};

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
  // Where an accepted frame's payload should land, asked right after
  // AcceptHeader returned kAccept: a span of exactly h.payload_bytes that
  // stays valid until HandleFrame or OnConnectionClosed, or empty (the
  // default) for the transport's own buffer. Byte-stream transports (TCP,
  // in-memory) then receive the payload straight into it and HandleFrame's
  // payload is that span; transports that receive whole frames into a ring
  // (RDMA, shared memory) do not ask, and the handler copies from the ring.
  // Either way HandleFrame sees the complete payload; a handler compares
  // payload.data() with its destination to know whether it must copy.
  virtual std::span<std::byte> PayloadDestination(Connection& conn, const FrameHeader& h) {
    (void)conn;
    (void)h;
    return {};
  }
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
  // Queues a frame whose payload is shared, not copied: `owner` keeps the
  // bytes of `payload` alive and unchanged for as long as the transport
  // holds it (until written, or dropped by a close), whatever the caller
  // does meanwhile (the lane's parameter buffers: ChunkState::wire_params_ref).
  virtual void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                          std::shared_ptr<const void> owner) = 0;
  // Queues a frame that owns its payload (payload_bytes is set from it).
  virtual void SendOwned(const FrameHeader& header, std::string payload) = 0;
  // Queues ERROR(code, text) answering `request_id`. A fatal error stops
  // delivery at once and closes the connection once the frame is out.
  virtual void SendError(WireError code, const std::string& text, uint64_t request_id,
                         bool fatal) = 0;
  // Closes now (queued frames may be lost). Idempotent.
  virtual void Close(const std::string& why) = 0;

  // Bounded send queue (SendLimits). Transports that do not bound (test
  // stubs) keep the defaults: no limits, no backlog.
  virtual void SetSendLimits(const SendLimits& limits) { (void)limits; }
  virtual size_t backlog_bytes() const { return 0; }
  // Counts `bytes` of replies the owner will send later for a request it
  // holds (a PULL held during a recovery) into the backlog, until
  // Unreserve(bytes): they pause reading and count against the limit like
  // queued frames. False (and nothing reserved) if the connection is closed,
  // failing, or this would take it past max_bytes (it then fails).
  virtual bool Reserve(size_t bytes) {
    (void)bytes;
    return open();
  }
  virtual void Unreserve(size_t bytes) { (void)bytes; }

  // Received frames wait for turns from `scheduler` (DeliveryScheduler; not
  // owned, it outlives the connection's use of it). Set before Start.
  // Transports that deliver whole frames from a credit-bounded ring (RDMA)
  // ignore it: their peer can never be more than the ring ahead.
  virtual void SetDeliveryScheduler(DeliveryScheduler* scheduler) { (void)scheduler; }
  // The scheduler's answer to RequestTurn: deliver what is held, read on.
  // Does nothing on a closed or closing connection.
  virtual void DeliverTurn() {}

  // The owner's own stop of intake, independent of the send backlog's
  // pause: while held, no frame is delivered (from the next frame boundary
  // on: it may be called inside HandleFrame) and a byte-stream transport
  // stops reading, so the peer's flow control holds it back; released, the
  // frames buffered meanwhile are delivered on a fresh stack. The hub's
  // lanes hold a worker that runs ahead of the others (IntakePacer).
  // Transports whose peer cannot run more than a ring ahead (shared memory,
  // RDMA) ignore it.
  virtual void HoldIntake(bool hold) { (void)hold; }
  // Whether HoldIntake does anything (byte-stream transports: TCP, in-memory).
  virtual bool can_hold_intake() const { return false; }
};

}  // namespace rackhub::net
