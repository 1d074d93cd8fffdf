#include "rdma_lane.h"

#include <cstring>
#include <utility>

#include "convert.h"
#include "rackhub/net/endpoint.h"
#include "wire.h"

namespace rackhub::client {

namespace rdma = net::rdma;
using Clock = std::chrono::steady_clock;

namespace internal {

RdmaLane::RdmaLane(Client::Impl* owner, uint32_t index, std::shared_ptr<rdma::Channel> channel)
    : owner_(owner), index_(index), channel_(std::move(channel)) {}

RdmaLane::~RdmaLane() {
  channel_->Detach();  // nothing may call back into this object any more
  channel_->Close("client lane destroyed");
}

Result<RdmaLane::HandshakeReply> RdmaLane::Handshake(asio::io_context& io,
                                                     const std::string& hello,
                                                     Clock::time_point deadline) {
  rdma::Channel::Callbacks cb;
  cb.on_frame = [this](const net::FrameHeader& h, std::span<const std::byte> payload) {
    OnFrame(h, payload);
  };
  cb.on_violation = [this](const std::string& text) { OnClosed(text); };
  cb.on_closed = [this](const std::string& why) { OnClosed(why); };
  channel_->Attach(io, std::move(cb));
  net::FrameHeader h;
  h.opcode = net::Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(hello.size());
  rdma::OutgoingFrame f;
  net::EncodeHeader(h, f.header);
  f.owned = hello;
  channel_->Send(std::move(f));
  io.restart();
  while (!have_reply_ && open_ && Clock::now() < deadline) io.run_one_until(deadline);
  if (have_reply_) return HandshakeReply{handshake_header_, std::move(handshake_body_)};
  return Unavailable(open_ ? std::string("timed out waiting for WELCOME")
                           : "connection closed: " + closed_why_);
}

void RdmaLane::Expect(uint64_t request_id, PendingRequest request) {
  pending_.emplace(request_id, std::move(request));
}

void RdmaLane::Send(OutFrame frame) {
  const bool borrows = frame.borrows_user && frame.op;
  auto release = [owner = owner_, op = frame.op, borrows] {
    if (borrows) owner->ReleaseIo(op);
  };
  if (!open_ || closing_) {
    release();
    return;
  }
  rdma::OutgoingFrame f;
  f.header = frame.header;
  f.borrowed = std::span<const std::byte>(static_cast<const std::byte*>(frame.payload), frame.bytes);
  if (frame.op) {
    // Frames of operations that already failed are not sent.
    f.still_wanted = [op = frame.op] { return !op->failed; };
  }
  f.release = std::move(release);
  channel_->Send(std::move(f));
}

void RdmaLane::SendByeAndClose() {
  if (!open_ || closing_) return;
  net::FrameHeader h;
  h.opcode = net::Opcode::kBye;
  h.tenant = owner_->tenant_handle();
  rdma::OutgoingFrame f;
  net::EncodeHeader(h, f.header);
  f.close_after = true;  // the channel disconnects once BYE was delivered
  closing_ = true;
  channel_->Send(std::move(f));
}

void RdmaLane::Abort() {
  if (!open_) return;
  open_ = false;
  channel_->Close("aborted");  // drops queued frames, releasing their io_refs
  pending_.clear();            // their operations are failed by the owner
  owner_->LaneClosed();
}

void RdmaLane::OnClosed(const std::string& why) {
  if (!open_) return;
  closed_why_ = why;
  if (handshake_) {
    open_ = false;
    return;
  }
  if (closing_ || owner_->closing()) {
    open_ = false;
    pending_.clear();
    owner_->LaneClosed();
    return;
  }
  Broken(why);
}

void RdmaLane::Broken(const std::string& reason) {
  owner_->ConnectionLost("lane " + std::to_string(index_) + " (rdma): " + reason);
}

void RdmaLane::OnFrame(const net::FrameHeader& h, std::span<const std::byte> payload) {
  if (!open_) return;
  if (const Status bad = net::CheckHeader(h); !bad.ok()) {
    if (handshake_) return OnClosed("invalid reply to HELLO: " + bad.message());
    return Broken("invalid frame header from the hub: " + bad.message());
  }
  if (handshake_) {
    if (have_reply_) return;
    handshake_header_ = h;
    handshake_body_.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    have_reply_ = true;
    return;
  }
  if (const Status s = RouteFrame(owner_, index_, h, payload, &pending_); !s.ok()) {
    owner_->ConnectionLost("lane " + std::to_string(index_) + ": " + s.message(),
                           s.code() != StatusCode::kFailedPrecondition);
    return;
  }
}

}  // namespace internal

Error Client::Impl::ConnectRdma(Clock::time_point deadline) {
  const auto fail = [](ErrorCode code, std::string message) {
    Error e;
    e.code = code;
    e.message = std::move(message);
    return e;
  };
  const Result<net::Endpoint> hub = net::ParseEndpoint(options_.hub);
  if (!hub.ok()) {
    return fail(ErrorCode::kInvalidArgument,
                "hub '" + options_.hub + "': " + hub.status().message());
  }
  net::Endpoint target{hub->host, rdma::kDefaultRdmaPort};
  if (!options_.rdma_hub.empty()) {
    const Result<net::Endpoint> ep = net::ParseEndpoint(options_.rdma_hub);
    if (!ep.ok() || ep->port == 0) {
      return fail(ErrorCode::kInvalidArgument,
                  "rdma_hub '" + options_.rdma_hub + "': " +
                      (ep.ok() ? std::string("port 0") : ep.status().message()));
    }
    target = *ep;
  }
  rdma::ChannelOptions copts;
  copts.ring_bytes = options_.rdma_ring_bytes;
  copts.device = options_.rdma_device;
  copts.poll = options_.rdma_busy_poll ? rdma::PollMode::kBusy : rdma::PollMode::kEvents;

  std::vector<std::unique_ptr<internal::RdmaLane>> lanes;
  uint32_t lane_count = 1;
  for (uint32_t lane = 0; lane < lane_count; ++lane) {
    const std::string where = "hub " + target.ToString() + " (rdma) lane " + std::to_string(lane);
    Result<std::shared_ptr<rdma::Channel>> connected =
        rdma::Channel::Connect(target, lane, copts, deadline);
    if (!connected.ok()) return fail(ErrorCode::kConnectFailed, connected.status().message());
    std::shared_ptr<rdma::Channel> channel = *std::move(connected);
    auto link = std::make_unique<internal::RdmaLane>(this, lane, channel);
    Result<internal::RdmaLane::HandshakeReply> reply =
        link->Handshake(io_, HelloPayload(lane), deadline);
    if (!reply.ok()) {
      return fail(ErrorCode::kConnectFailed, where + ": " + reply.status().message());
    }
    std::string welcome;
    if (Error e = CheckHelloReply(where, reply->header, std::move(reply->body), &welcome);
        !e.ok()) {
      return e;
    }
    if (Error e = AcceptWelcome(lane, welcome, &lane_count); !e.ok()) return e;
    lanes.push_back(std::move(link));
  }
  for (auto& l : lanes) lanes_.push_back(std::move(l));
  io_.restart();
  for (auto& lane : lanes_) lane->StartReading();
  work_.emplace(asio::make_work_guard(io_));
  thread_ = std::thread([this] { io_.run(); });
  return {};
}

}  // namespace rackhub::client
