// One data-plane connection of one (worker, lane), owned by that lane's
// thread after the acceptor handed it over (DESIGN.md §5).
//
// Reads frames in order: header, then (after the lane accepted the header)
// the payload into a reusable buffer; the lane handles the frame; then the
// next header. Replies are queued and written as gathers of header + payload
// without staging copies; a payload that is not owned by the frame (the
// lane's double-buffered parameters) must stay valid until written, which the
// lane guarantees (see ChunkState).
//
// Thread safety: every member runs on the owning lane's thread only.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"

namespace rackhub::server {

class LaneService;

struct ConnectionIdentity {
  uint32_t tenant_handle = 0;
  std::string tenant;
  uint32_t rank = 0;
  uint32_t lane = 0;
  std::string peer;  // "ip:port" for logs
};

class LaneConnection : public std::enable_shared_from_this<LaneConnection> {
 public:
  LaneConnection(LaneService* lane, boost::asio::ip::tcp::socket socket, ConnectionIdentity id);

  const ConnectionIdentity& id() const { return id_; }
  bool open() const { return open_; }

  // Starts the read loop (after WELCOME was queued).
  void Start();
  // Queues a frame whose payload the caller keeps alive until written.
  void SendBorrowed(const net::FrameHeader& header, std::span<const std::byte> payload);
  // Queues a frame that owns its payload.
  void SendOwned(const net::FrameHeader& header, std::string payload);
  // Queues ERROR(code, text) for `request_id`. Fatal errors close the
  // connection once the queue is flushed (and stop reading at once).
  void SendError(net::WireError code, const std::string& text, uint64_t request_id, bool fatal);
  // Closes now; pending writes are dropped. Idempotent.
  void Close(const std::string& why);

  uint64_t bytes_in() const { return bytes_in_; }

 private:
  struct OutFrame {
    std::array<std::byte, net::kHeaderBytes> header;
    std::string owned;
    std::span<const std::byte> payload;
    bool close_after = false;
  };
  void ReadHeader();
  void OnHeader(const boost::system::error_code& ec);
  void OnPayload(const boost::system::error_code& ec);
  void Enqueue(OutFrame frame);
  void WriteNext();

  LaneService* lane_;
  boost::asio::ip::tcp::socket socket_;
  ConnectionIdentity id_;
  bool open_ = true;
  bool closing_ = false;  // a fatal error is queued: read nothing more
  bool discard_ = false;  // the current frame was refused without closing
  std::array<std::byte, net::kHeaderBytes> header_buf_{};
  net::FrameHeader header_{};
  std::vector<std::byte> payload_buf_;
  std::deque<OutFrame> out_;
  bool writing_ = false;
  uint64_t bytes_in_ = 0;
};

}  // namespace rackhub::server
