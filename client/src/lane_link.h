// Private to librackhub: what the client needs of one lane connection,
// whatever the transport (lane.h: TCP socket; channel_lane.h: RDMA queue pair or
// shared-memory rings).
//
// Thread: every member runs on the client's I/O thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>

#include "client_impl.h"
#include "rackhub/common/status.h"

namespace rackhub::client::internal {

class LaneLink {
 public:
  virtual ~LaneLink() = default;
  virtual uint32_t index() const = 0;
  virtual bool open() const = 0;
  virtual void StartReading() = 0;
  // Registers the request a frame carries, so its reply can be routed.
  virtual void Expect(uint64_t request_id, PendingRequest request) = 0;
  // Queues a frame; a borrowed user payload is released (io_refs) once the
  // transport no longer reads it.
  virtual void Send(OutFrame frame) = 0;
  // Queues BYE and closes once the queue is flushed.
  virtual void SendByeAndClose() = 0;
  // Closes at once; queued frames are dropped (their io_refs released).
  virtual void Abort() = 0;
};

// An ERROR frame from the hub on lane `lane`, for every transport: a fatal
// or malformed one returns UNAVAILABLE with the reason the lane is broken
// (FAILED_PRECONDITION for a fatal error the client caused itself, which a
// reconnect would not heal);
// otherwise the request it answers (if any, taken out of `pending`) fails
// with kServer and OK is returned.
Status HandleErrorFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                        std::span<const std::byte> payload,
                        std::unordered_map<uint64_t, PendingRequest>* pending);

// A whole frame from the hub after the handshake, for transports that receive
// complete frames (RDMA, the in-memory test transport): ERROR goes to
// HandleErrorFrame, a PARAMS / ACK / KEY_INFO completes the request it
// answers (taken out of `pending`), HEARTBEAT is ignored. UNAVAILABLE with the
// reason when the frame breaks the protocol (the lane is then broken).
// A ROWS reply of a PushPullRows / PullRows: checks it against `request`
// and scatters its rows into the operation's `out` (rows.cc). UNAVAILABLE
// when it breaks the protocol.
Status StoreRows(const net::FrameHeader& h, std::span<const std::byte> payload,
                 const PendingRequest& request);

Status RouteFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                  std::span<const std::byte> payload,
                  std::unordered_map<uint64_t, PendingRequest>* pending);

}  // namespace rackhub::client::internal
