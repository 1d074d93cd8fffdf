// BoundedConnection: the send side every transport's Connection shares
// (tcp::TcpConnection, testing::MemoryConnection, ChannelConnection<Channel>),
// written once: frames built from Send* (QueuedFrame), the backlog accounted
// against SendLimits (SendBudget: queued and not yet written, plus
// reservations), the fatal-error state (after a fatal ERROR nothing more is
// queued), and the three decisions taken on the backlog: above pause_bytes
// the transport stops taking frames from the peer (PauseIntake), once back
// down to half of it it resumes (ResumeIntake), and past max_bytes the frames
// not being written are dropped (DropUnsent) and a fatal QUOTA_EXCEEDED ERROR
// is queued.
//
// A transport derives from it, keeps its frames and does the I/O: Push takes
// each frame (in order; nothing is written before Flush), and the transport
// calls Uncounted(bytes) when bytes left the backlog (written, or taken by
// the peer). Order per frame: counted, pushed, backlog checked, flushed; so a
// frame that takes the backlog past max_bytes is dropped with the others not
// being written, and the fatal ERROR is all that follows them.
//
// Ownership: holds the connection's identity, budget and fatal state; frames
// belong to the transport from Push on.
// Threading: every member runs on the owning connection's thread only, like
// the transport (docs/threading.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "rackhub/net/frame.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/send_budget.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

class BoundedConnection : public Connection {
 public:
  const ConnectionIdentity& id() const final { return id_; }
  void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) final;
  void SendOwned(const FrameHeader& header, std::string payload) final;
  // A fatal ERROR stops intake at once and is the last frame queued.
  void SendError(WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) final;
  void SetSendLimits(const SendLimits& limits) final { budget_.set_limits(limits); }
  size_t backlog_bytes() const final { return budget_.bytes(); }
  bool Reserve(size_t bytes) final;
  void Unreserve(size_t bytes) final { Uncounted(bytes); }

 protected:
  explicit BoundedConnection(ConnectionIdentity id) : id_(std::move(id)) {}

  // --- What the transport implements ---
  // Takes a counted frame into the send queue (or hands it to the channel).
  virtual void Push(QueuedFrame frame) = 0;
  // Starts writing what Push took, unless a write is under way.
  virtual void Flush() {}
  // A fatal ERROR is queued: take nothing more from the peer, ever.
  virtual void StopIntake() {}
  // The backlog is above pause_bytes: take no more frames from the peer.
  virtual void PauseIntake() = 0;
  // The backlog is down to half of pause_bytes: take frames again, on a
  // fresh stack (this may run inside the handling of another connection's
  // frame).
  virtual void ResumeIntake() = 0;
  // Past max_bytes, before the fatal QUOTA_EXCEEDED is queued: drops the
  // frames not being written yet (with the memory they hold) and makes sure
  // the connection closes even if the peer never takes the ERROR. Returns the
  // bytes that leave the backlog with them.
  virtual size_t DropUnsent() = 0;

  // --- What the transport calls ---
  // `bytes` of the backlog were written (or taken by the peer).
  void Uncounted(size_t bytes);
  // A fatal ERROR is queued: deliver nothing more, queue nothing more.
  bool closing() const { return closing_; }
  // That error ("QUOTA_EXCEEDED: ..."), for the close reason.
  const std::string& fatal_error() const { return fatal_; }

 private:
  void Submit(QueuedFrame frame);
  // `over`: what SendBudget::Add returned for the bytes just counted.
  void Counted(bool over);
  void FailOverLimit();

  const ConnectionIdentity id_;
  SendBudget budget_;     // owning thread
  bool closing_ = false;  // owning thread
  std::string fatal_;     // owning thread
};

}  // namespace rackhub::net
