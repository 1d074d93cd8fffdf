// Private to librackhub: the handshake of a lane over a frame channel
// (net/shm/channel.h, net/rdma/channel.h) for their dialers (dial_shm.cc,
// dial_rdma.cc): attach the connected channel to a private io_context, send
// HELLO through it if asked, wait for the hub's first frame, detach. The
// detached channel is then adopted by the client's io_context as a
// net::ChannelConnection.
// Thread: the dialing thread; the channel is attached to nothing else
// meanwhile.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "dialer.h"
#include "rackhub/net/channel_connection.h"
#include "rackhub/net/outgoing_frame.h"

namespace rackhub::client::internal {

// Fills out->reply/body with the hub's first frame on `channel` (after
// sending HELLO(`hello`) unless it is empty: shared memory sent it at set-up)
// and out->adopt with the channel's adoption. UNAVAILABLE naming out->where
// when the channel closes, the deadline passes or `cancel` is set first.
template <typename Channel>
Status ChannelHandshake(std::shared_ptr<Channel> channel, const std::string& hello,
                        Clock::time_point deadline, const std::atomic<bool>* cancel,
                        DialedLane* out) {
  boost::asio::io_context io;
  bool have_reply = false;
  std::string closed;
  typename Channel::Callbacks cb;
  cb.on_frame = [&](const net::FrameHeader& h, std::span<const std::byte> payload) {
    if (have_reply || !closed.empty()) return;
    if (const Status bad = net::CheckHeader(h); !bad.ok()) {
      closed = "invalid reply to HELLO: " + bad.message();
      return;
    }
    out->reply = h;
    out->body.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    have_reply = true;
  };
  cb.on_violation = [&](const std::string& text) { closed = text; };
  cb.on_closed = [&](const std::string& why) {
    if (closed.empty()) closed = "connection closed: " + why;
  };
  channel->Attach(io, std::move(cb));
  if (!hello.empty()) {
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    h.payload_bytes = static_cast<uint32_t>(hello.size());
    net::OutgoingFrame f;
    net::EncodeHeader(h, f.header);
    f.owned = hello;
    channel->Send(std::move(f));
  }
  auto work = boost::asio::make_work_guard(io);
  while (!have_reply && closed.empty() && Clock::now() < deadline &&
         !(cancel != nullptr && cancel->load())) {
    io.run_one_until(std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
  }
  channel->Detach();
  if (!have_reply) {
    if (!closed.empty()) return Unavailable(out->where + ": " + closed);
    return Unavailable(out->where + ": timed out waiting for WELCOME");
  }
  if (out->reply.opcode != net::Opcode::kWelcome) {
    channel->Close("the hub refused HELLO");
    return Status::Ok();
  }
  out->adopt = [channel = std::move(channel), where = out->where](
                   boost::asio::io_context& client_io,
                   net::FrameHandler* handler) -> std::shared_ptr<net::Connection> {
    net::ConnectionIdentity id;
    id.peer = where;
    return std::make_shared<net::ChannelConnection<Channel>>(handler, channel, std::move(id),
                                                             &client_io);
  };
  return Status::Ok();
}

}  // namespace rackhub::client::internal
