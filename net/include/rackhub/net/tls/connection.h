// TLS implementation of net::Connection: a hub link over TCP with TLS
// (docs/cluster.md, TLS for hub links). The same frames, receive path and
// bounded send queue as tcp::TcpConnection (StreamConnection,
// BoundedConnection); the bytes go through a TlsStream (net/tls/stream.h)
// whose handshake is already done.
//
// Writes: queued frames are copied into one staging buffer per batch (TLS
// encrypts a copy anyway; one record stream instead of one record per
// header) and written with SSL_write. OnBytesSent counts frame bytes, not
// TLS overhead.
//
// Thread safety: every member runs on the owning lane's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/stream_connection.h"
#include "rackhub/net/tls/stream.h"
#include "rackhub/net/transport.h"

namespace rackhub::net::tls {

class TlsConnection final : public StreamConnection {
 public:
  // `stream` has completed its handshake; `handler` must outlive the
  // connection's handlers (the lane that owns it).
  TlsConnection(FrameHandler* handler, TlsStream stream, ConnectionIdentity id);

  void Start() override;
  void Close(const std::string& why) override;

  // A fatal ERROR that is not written within this long closes anyway.
  static constexpr auto kFatalCloseGrace = std::chrono::seconds(2);

 private:
  void ReadMore() override;
  void OnRead(const boost::system::error_code& ec, size_t bytes);
  void Push(QueuedFrame frame) override { out_.push_back(std::move(frame)); }
  void Flush() override { WriteNext(); }
  size_t DropUnsent() override;
  void WriteNext();
  void OnWritten(const boost::system::error_code& ec);

  std::shared_ptr<TlsConnection> self() {
    return std::static_pointer_cast<TlsConnection>(shared_from_this());
  }

  TlsStream stream_;
  bool read_pending_ = false;
  boost::asio::steady_timer fatal_timer_;

  std::deque<QueuedFrame> out_;
  size_t in_flight_ = 0;  // frames at the front of out_ being written (copied to staging_)
  std::string staging_;   // their bytes, being written
};

}  // namespace rackhub::net::tls
