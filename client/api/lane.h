// Private to librackhub: one lane of a client, over any transport. The lane
// is the frame handler (net/transport.h) of its lane's net::Connection, which
// a Dialer made (dialer.h: TCP, shared memory, RDMA, or the in-memory test
// transport): it routes each reply to the request it answers, with one set of
// checks for every transport, and keeps the lane's write queue.
//
// Replies land straight in the caller's buffer: an fp32 PARAMS reply's
// payload is named as the connection's destination (PayloadDestination), so
// byte-stream transports receive it in place; ring transports hand it over in
// their ring and the lane copies it once. Requests are handed to the
// connection while less than kSendWindowBytes of them are unsent; the rest
// wait in the lane's queue, where frames of operations that failed meanwhile
// are dropped unsent.
//
// Lanes in step: a worker's lanes share its link, and the hub completes a
// chunk only once every worker pushed it. If one lane's TCP flow ran ahead
// of another's (flows share a link unevenly), each worker would push its
// chunks in a different order, the hub's chunks would complete at the pace
// of the slowest lane of any worker, and the replies would trail the pushes
// (measured on per-worker links: 1.22-1.27x the link bound with two lanes,
// 1.05x with one). So pushes carry their place in the client's stream of
// pushed bytes (OutFrame::pos, in issue order across lanes), and a lane
// hands a push to its connection only while it is less than the lookahead
// (kLookaheadBytes, or one push per lane if pushes are larger) past the
// oldest push that no lane has written yet (Client::Impl::PaceFrontier).
// The oldest push can always go, so this never deadlocks; written bytes
// advance the frontier (PumpLanes). Only lanes whose dialer says they share
// a link are paced (DialedLane::lanes_share_link: TCP, whose dialer keeps
// the kernel's unsent backlog small with TCP_NOTSENT_LOWAT, so written is
// close to on the wire); shared-memory and RDMA rings are not. A frame's payload (the caller's gradient, or the key's
// staging buffer) is held through an io_ref of its operation until the
// connection no longer needs it, so a ticket never completes while a
// transport still reads or writes its buffers.
//
// Ownership: the client owns its lanes (also retired ones, whose aborted
// connections may still report); each lane owns its connection.
// Thread: every member runs on the client's I/O thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "client_impl.h"
#include "rackhub/common/status.h"
#include "rackhub/net/transport.h"

namespace rackhub::client::internal {

class Lane final : public net::FrameHandler {
 public:
  // Requests handed to the connection and not yet sent, at most (one more
  // frame may go over it): enough to keep a link busy in both directions.
  static constexpr uint64_t kSendWindowBytes = 8u << 20;
  // How far a lane's pushes may run ahead of the oldest unwritten push.
  static constexpr uint64_t kLookaheadBytes = 256u << 10;

  Lane(Client::Impl* owner, uint32_t index);
  ~Lane() override;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Takes the lane's handshaken connection (built on the client's
  // io_context with this lane as its handler) and starts it; `in_step`:
  // its pushes are paced with the other lanes' (above).
  void Start(std::shared_ptr<net::Connection> conn, bool in_step);

  uint32_t index() const { return index_; }
  bool open() const { return open_; }
  // Registers the request a frame carries, so its reply can be routed.
  void Expect(uint64_t request_id, PendingRequest request);
  // Queues a frame. Its io_ref (OutFrame::holds_io) is released once the
  // connection no longer needs the payload, or at once if it is dropped.
  void Send(OutFrame frame);
  // Queues BYE and closes once everything handed over was sent.
  void SendByeAndClose();
  // Closes at once; queued frames are dropped (their io_refs released).
  void Abort();

  // net::FrameHandler.
  Verdict AcceptHeader(net::Connection& conn, const net::FrameHeader& h) override;
  std::span<std::byte> PayloadDestination(net::Connection& conn,
                                          const net::FrameHeader& h) override;
  void HandleFrame(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection& conn, size_t bytes) override;

  // Hands queued frames to the connection while the window (and, for
  // pushes, the frontier) allows.
  void Pump();
  // OutFrame::pos of this lane's oldest push not yet written (queued or
  // handed over); UINT64_MAX if none, once the lane is closed, or if it is
  // not kept in step.
  uint64_t OldestUnwritten() const;

 private:
  // The reply to `request` in `payload` (the destination, when one was
  // named): stored where it belongs and counted.
  Status StoreReply(const net::FrameHeader& h, std::span<const std::byte> payload,
                    const PendingRequest& request);
  // The lane breaks the client's connection (ConnectionLost), then is
  // closed. `reconnectable` as in ConnectionLost.
  void Broken(const std::string& reason, bool reconnectable = true);
  // The lane is closed: drops what it holds.
  void Shut();
  void Release(OutFrame& frame);
  // Drops the reply being received (its destination's io_ref).
  void DropCurrent();

  Client::Impl* const owner_;
  const uint32_t index_;
  std::shared_ptr<net::Connection> conn_;
  bool open_ = true;
  bool in_step_ = false;  // pushes paced with the other lanes' (Start)
  bool closing_ = false;     // BYE queued: nothing more is sent
  bool bye_handed_ = false;  // BYE is with the connection: close once sent
  std::deque<OutFrame> queue_;
  uint64_t handed_bytes_ = 0;  // frame bytes handed to the connection
  uint64_t sent_bytes_ = 0;    // of those, reported sent
  // Pushes in queue_ (their pos, in queue order), and pushes handed over
  // and not yet written: (pos, handed_bytes_ once written).
  std::deque<uint64_t> queued_pushes_;
  std::deque<std::pair<uint64_t, uint64_t>> handed_pushes_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
  // The reply between AcceptHeader and HandleFrame, and its destination in
  // the caller's buffer (holding an io_ref of its operation) if it has one.
  PendingRequest current_;
  std::span<std::byte> dest_;
};

// An ERROR frame from the hub on lane `lane`: a fatal or malformed one
// returns UNAVAILABLE with the reason the lane is broken (FAILED_PRECONDITION
// for a fatal error the client caused itself, which a reconnect would not
// heal); otherwise the request it answers (if any, taken out of `pending`)
// fails with kServer and OK is returned.
Status HandleErrorFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                        std::span<const std::byte> payload,
                        std::unordered_map<uint64_t, PendingRequest>* pending);

// A ROWS reply of a PushPullRows / PullRows: checks it against `request`
// and scatters its rows into the operation's `out` (rows.cc). UNAVAILABLE
// when it breaks the protocol.
Status StoreRows(const net::FrameHeader& h, std::span<const std::byte> payload,
                 const PendingRequest& request);

}  // namespace rackhub::client::internal
