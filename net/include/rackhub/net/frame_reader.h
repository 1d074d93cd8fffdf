// FrameReader: the receive side of a byte-stream transport. It turns a stream
// of encoded frames (40-byte header + payload, net/frame.h) into FrameHandler
// calls, for every transport that receives bytes rather than whole frames
// (TcpConnection, testing::MemoryConnection).
//
// Use: ask for room with WritableSpan(), put received bytes there, Commit()
// how many arrived, then Parse(). Many frames may arrive per Commit and a
// frame may arrive over many. Per frame, Parse:
//   - decodes the header and checks it with CheckHeader; a bad header is
//     fatal: conn.SendError(kMalformed, its message, fatal = true) and the
//     reader stops;
//   - asks handler.AcceptHeader before the payload is looked at or room is
//     made for it: kAccept delivers the payload, kDiscard skips exactly
//     payload_bytes, kReject stops the reader (the handler sent a fatal
//     ERROR: nothing more is delivered);
//   - hands an accepted payload to handler.HandleFrame in place, as a span
//     into the receive buffer (no copy), valid only during the call; or, when
//     handler.PayloadDestination names a buffer, receives the payload into
//     that buffer instead (bytes already buffered are copied there once;
//     WritableSpan then returns the rest of the destination, so the
//     connection's reads land in it directly) and hands that buffer over;
//   - returns at a frame boundary once paused (Pause).
// The buffer starts at `initial_bytes` (allocated on first use), is compacted
// when the frame being received does not fit behind the unconsumed bytes, and
// grows only when one frame is larger than the whole buffer.
//
// Ownership: the reader owns its receive buffer; it keeps no reference to the
// connection or handler beyond a Parse call.
// Threading: none of its own; every member is called on the owning
// connection's thread. The handler may close the connection (which must then
// call Stop()) from inside Parse; Parse returns as soon as the reader is
// stopped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

class FrameReader {
 public:
  // Room for several 32 KiB chunk frames per receive.
  static constexpr size_t kDefaultInitialBytes = 256 * 1024;

  explicit FrameReader(size_t initial_bytes = kDefaultInitialBytes)
      : initial_bytes_(initial_bytes) {}

  // The free tail of the receive buffer: at least `min` bytes (at least 1),
  // and room for the whole frame being received behind what is buffered.
  // Valid until the next call of any member.
  std::span<std::byte> WritableSpan(size_t min = 1);
  // `n` bytes were written at the start of the last WritableSpan().
  void Commit(size_t n) {
    if (writing_direct_) {
      dest_filled_ += n;
    } else {
      rend_ += n;
    }
  }
  // Delivers every complete frame (and skips discarded payload) buffered so
  // far, until the buffer holds no complete frame or the reader is stopped.
  void Parse(Connection& conn, FrameHandler& handler);

  // With a DeliveryScheduler (transport.h) set, frames wait for turns:
  // DeliverOrRequestTurn asks for one once a frame is complete and delivers
  // nothing itself; the connection's DeliverTurn calls TurnGranted() and
  // Parse. Without one it is Parse. Returns true when the connection should
  // read on (false: a turn is outstanding, read nothing until it comes).
  void set_scheduler(DeliveryScheduler* scheduler) { scheduler_ = scheduler; }
  bool DeliverOrRequestTurn(Connection& conn, FrameHandler& handler);
  void TurnGranted() { turn_requested_ = false; }
  // With a scheduler and no turn outstanding, asks for a turn for the end of
  // the stream (EOF, an error): true, and the connection closes when it is
  // granted, after the frames other connections received before it. False:
  // close now.
  bool RequestTurnToClose(Connection& conn);
  bool awaiting_turn() const { return turn_requested_; }

  // Deliver nothing more (the connection is closing or closed). Sticky.
  void Stop() { stopped_ = true; }
  bool stopped() const { return stopped_; }
  // While paused, Parse delivers nothing (it stops at the next frame
  // boundary: a handler may pause it from inside HandleFrame); buffered
  // bytes wait for Parse after Pause(false). Backpressure (SendLimits).
  // Held is the same stop for the handler's own reason
  // (Connection::HoldIntake); the two are independent, and the reader
  // delivers only while neither is on.
  void Pause(bool on) { paused_ = on; }
  void Hold(bool on) { held_ = on; }
  bool paused() const { return paused_ || held_; }
  // True if the stream stopped now would cut a frame: a header or payload is
  // partly received, or a discarded payload is partly skipped. An EOF here is
  // "inside a frame".
  bool inside_frame() const { return have_header_ || direct_ || skip_ > 0 || rstart_ != rend_; }
  // True if Parse would deliver or discard something now: a whole header, a
  // whole accepted payload, or bytes of a discarded one are buffered.
  bool deliverable() const;
  // Received bytes not consumed yet.
  size_t buffered() const { return rend_ - rstart_; }
  // Current size of the receive buffer (for tests of growth).
  size_t capacity() const { return buf_.size(); }

 private:
  size_t initial_bytes_;
  // Bytes [rstart_, rend_) are received but not consumed yet.
  std::vector<std::byte> buf_;
  size_t rstart_ = 0;
  size_t rend_ = 0;
  bool have_header_ = false;  // header_ is parsed and accepted, its payload pending
  // The accepted payload goes to the handler's destination: dest_filled_ of
  // dest_'s bytes have arrived.
  bool direct_ = false;
  std::span<std::byte> dest_;
  size_t dest_filled_ = 0;
  bool writing_direct_ = false;  // the last WritableSpan was dest_'s rest
  FrameHeader header_{};
  uint64_t skip_ = 0;  // payload bytes of a discarded frame still to drop
  bool stopped_ = false;
  bool paused_ = false;
  bool held_ = false;
  DeliveryScheduler* scheduler_ = nullptr;  // not owned
  bool turn_requested_ = false;
};

}  // namespace rackhub::net
