// RDMA implementation of net::Connection (docs/architecture.md, Transports):
// one data-plane connection of one (worker, lane), a frame protocol over an
// rdma::Channel (header + payload written into the peer's registered ring with
// RDMA WRITE WITH IMMEDIATE; see channel.h). The lane sees exactly what it sees
// over TCP: AcceptHeader before the payload is touched, HandleFrame with the
// payload in place (in the registered receive ring, no copy),
// OnConnectionClosed once.
//
// Replies: SendShared/SendOwned copy the payload once into the registered
// staging ring and the NIC writes it straight into the client's receive ring;
// a shared payload's owner is held until then.
//
// Bounded (SendLimits): the backlog is the bytes of frames sent and not yet
// completed; above pause_bytes the channel holds arriving frames in its ring
// without consuming them (no credit returns, so the peer stops sending);
// past max_bytes the frames not posted yet are dropped and a fatal
// QUOTA_EXCEEDED ERROR is sent (closed once out, or after the channel's
// grace period).
//
// Thread safety: every member runs on the owning lane's thread only (the
// channel's fds are watched by that lane's io_context).
#pragma once

#include <memory>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/send_budget.h"
#include "rackhub/net/transport.h"

namespace rackhub::net::rdma {

class RdmaConnection final : public Connection {
 public:
  // `channel` is connected and detached; `io` is the lane's io_context (the
  // caller runs on its thread). `handler` must outlive the connection.
  RdmaConnection(FrameHandler* handler, std::shared_ptr<Channel> channel, ConnectionIdentity id,
                 boost::asio::io_context* io);
  ~RdmaConnection() override;

  const ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return open_; }
  void Start() override;
  void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) override;
  void SendOwned(const FrameHeader& header, std::string payload) override;
  void SendError(WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) override;
  void Close(const std::string& why) override;
  void SetSendLimits(const SendLimits& limits) override { budget_.set_limits(limits); }
  size_t backlog_bytes() const override { return budget_.bytes(); }
  bool Reserve(size_t bytes) override;
  void Unreserve(size_t bytes) override;

 private:
  void Queue(OutgoingFrame f, size_t bytes);
  void Counted(bool over);
  void Uncounted(size_t bytes);
  void FailOverLimit();
  void OnFrame(const FrameHeader& h, std::span<const std::byte> payload);
  void OnChannelClosed(const std::string& why);

  FrameHandler* handler_;
  std::shared_ptr<Channel> channel_;
  ConnectionIdentity id_;
  boost::asio::io_context* io_;
  bool open_ = true;
  bool started_ = false;
  bool closing_ = false;  // a fatal error is queued: deliver nothing more
  std::string fatal_;     // that error, for the close reason
  SendBudget budget_;
};

}  // namespace rackhub::net::rdma
