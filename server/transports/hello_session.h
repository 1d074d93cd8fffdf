// HelloSession: reads and checks a worker's HELLO on an acceptor's thread,
// for every stream socket the hub accepts workers on (TCP in tcp_acceptor.cc,
// the shared-memory set-up socket in shm_acceptor.cc): a deadline of
// data.hello_timeout_ms, the header checked before the payload is read
// (hello_check.h), then either the acceptor's `accepted` hook takes the
// socket, or a fatal ERROR naming the field is written and the socket closed.
// A HELLO with shm_probe gets the acceptor's `probe_reply` (a WELCOME carrying
// the shared-memory offer) and is closed: nothing is adopted.
//
// Ownership: shared by its pending handlers; counts itself in *hooks.waiting
// while it lives. Threading: the acceptor's thread only.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data_plane.h"
#include "hello_check.h"
#include "rackhub/net/asio.h"

namespace rackhub::server {

template <typename Socket>
class HelloSession : public std::enable_shared_from_this<HelloSession<Socket>> {
 public:
  struct Hooks {
    DataPlane* plane = nullptr;
    size_t* waiting = nullptr;  // sessions alive, for the acceptor's limit
    std::function<void(const std::string&)> warn;  // rate-limited warning
    // HELLO passed every check: the socket is the hook's.
    std::function<void(HelloResult, Socket, const std::string& peer)> accepted;
    // Payload of the WELCOME answering a probe (empty: probes are refused).
    std::string probe_reply;
  };

  HelloSession(Socket socket, std::string peer, const Hooks* hooks)
      : hooks_(hooks), socket_(std::move(socket)), timer_(socket_.get_executor()),
        peer_(std::move(peer)) {
    ++*hooks_->waiting;
  }
  ~HelloSession() { --*hooks_->waiting; }

  void Start() {
    const uint32_t timeout_ms = hooks_->plane->config().data.hello_timeout_ms;
    timer_.expires_after(std::chrono::milliseconds(timeout_ms));
    timer_.async_wait([self = this->shared_from_this(), timeout_ms](const boost::system::error_code& e) {
      if (!e && !self->done_) {
        self->hooks_->warn("data: " + self->peer_ + " sent no HELLO within " +
                           std::to_string(timeout_ms) + " ms; closing");
        self->Fail(net::WireError::kMalformed, "hello: no HELLO within data.hello_timeout_ms");
      }
    });
    boost::asio::async_read(socket_, boost::asio::buffer(header_buf_),
                            [self = this->shared_from_this()](const boost::system::error_code& e,
                                                              size_t) { self->OnHeader(e); });
  }

 private:
  void OnHeader(const boost::system::error_code& ec) {
    if (ec || done_) return Finish();
    header_ = net::DecodeHeader(header_buf_);
    if (Status s = CheckHelloHeader(header_); !s.ok()) {
      return Fail(net::WireError::kMalformed, s.message());
    }
    payload_.resize(header_.payload_bytes);
    boost::asio::async_read(socket_, boost::asio::buffer(payload_),
                            [self = this->shared_from_this()](const boost::system::error_code& e,
                                                              size_t) { self->OnPayload(e); });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec || done_) return Finish();
    DataPlane* plane = hooks_->plane;
    HelloResult checked =
        CheckHello(payload_, plane->registry(), plane->config().topology, plane->lane_count());
    if (!checked.ok) return Fail(checked.code, checked.text);
    if (checked.hello.shm_probe()) {
      if (hooks_->probe_reply.empty()) {
        return Fail(net::WireError::kInvalidArgument,
                    "shm_probe: ask the hub's TCP data port for its shared-memory offer");
      }
      net::FrameHeader h;
      h.opcode = net::Opcode::kWelcome;
      h.tenant = checked.tenant.handle;
      h.payload_bytes = static_cast<uint32_t>(hooks_->probe_reply.size());
      return WriteAndFinish(h, hooks_->probe_reply);
    }
    done_ = true;
    timer_.cancel();
    hooks_->accepted(std::move(checked), std::move(socket_), peer_);
  }

  void Fail(net::WireError code, const std::string& text) {
    if (done_) return;
    hooks_->warn("data: refused connection from " + peer_ + ": " +
                 std::string(net::WireErrorName(code)) + ": " + text);
    net::ErrorFrame error = net::MakeErrorFrame(code, text, 0, header_.request_id, true);
    WriteAndFinish(error.header, std::move(error.body));
  }

  void WriteAndFinish(const net::FrameHeader& h, std::string body) {
    done_ = true;
    timer_.cancel();
    net::EncodeHeader(h, reply_header_);
    reply_body_ = std::move(body);
    std::array<boost::asio::const_buffer, 2> buffers = {boost::asio::buffer(reply_header_),
                                                        boost::asio::buffer(reply_body_)};
    boost::asio::async_write(socket_, buffers,
                             [self = this->shared_from_this()](const boost::system::error_code&,
                                                               size_t) { self->Finish(); });
  }

  void Finish() {
    done_ = true;
    timer_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(Socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  const Hooks* hooks_;
  Socket socket_;
  boost::asio::steady_timer timer_;
  std::string peer_;
  bool done_ = false;
  std::array<std::byte, net::kHeaderBytes> header_buf_{};
  net::FrameHeader header_{};
  std::vector<std::byte> payload_;
  std::array<std::byte, net::kHeaderBytes> reply_header_{};
  std::string reply_body_;
};

}  // namespace rackhub::server
