// Private to librackhub: one lane connection of a client (one TCP socket to
// one hub lane), with its write queue and its receive loop.
//
// Thread: every member runs on the client's I/O thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "client_impl.h"
#include "lane_link.h"

namespace rackhub::client::internal {

class Lane final : public LaneLink {
 public:
  Lane(Client::Impl* owner, uint32_t index, tcp::socket socket);
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  uint32_t index() const override { return index_; }
  bool open() const override { return open_; }

  void StartReading() override;
  // Registers the request a frame carries, so its reply can be routed.
  void Expect(uint64_t request_id, PendingRequest request) override;
  // Queues a frame (gather write: header + payload, no copy of the payload).
  void Send(OutFrame frame) override;
  // Queues BYE and closes the socket once the queue is flushed.
  void SendByeAndClose() override;
  // Closes the socket at once; queued frames are dropped (their io_refs
  // released). Handlers in flight complete with operation_aborted.
  void Abort() override;

 private:
  void WriteNext();
  void ReadHeader();
  void OnHeader();
  void ReadPayloadInto(void* dest, size_t bytes, bool direct, PendingRequest request);
  void OnReply(const PendingRequest& request);
  void OnError();
  void Broken(const std::string& reason, bool reconnectable = true);
  void IoFailed(const boost::system::error_code& ec, const char* what);
  void CloseSocket();
  void Release(OutFrame& frame);

  Client::Impl* const owner_;
  const uint32_t index_;
  tcp::socket socket_;
  bool open_ = true;
  bool closing_ = false;
  // The first in_flight_ frames of queue_ are being written (one gather
  // write for up to kMaxFramesPerWrite frames).
  size_t in_flight_ = 0;
  std::deque<OutFrame> queue_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
  std::array<std::byte, net::kHeaderBytes> header_bytes_{};
  net::FrameHeader header_;
  std::vector<std::byte> scratch_;  // payloads not read straight into the caller's buffer
};

}  // namespace rackhub::client::internal
