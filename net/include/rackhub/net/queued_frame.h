// QueuedFrame: one frame waiting in a stream transport's send queue (TCP, the
// in-memory test transport): the encoded header and a payload that is either
// owned by the frame or shared with the caller (`owner` keeps it alive and
// unchanged while the frame exists; see transport.h, SendShared).
//
// A plain value; no thread rules of its own (the owning connection's thread).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "rackhub/net/frame.h"

namespace rackhub::net {

struct QueuedFrame {
  std::array<std::byte, kHeaderBytes> header{};
  std::string owned;
  std::span<const std::byte> payload;  // shared (when `owned` is empty)
  std::shared_ptr<const void> owner;   // keeps `payload` alive and unchanged
  bool close_after = false;            // a fatal ERROR: close once it is written

  std::span<const std::byte> body() const {
    return owned.empty() ? payload : std::as_bytes(std::span(owned.data(), owned.size()));
  }
  size_t size() const { return kHeaderBytes + body().size(); }

  // `h` is sent as given (payload_bytes already set by the caller).
  static QueuedFrame Shared(const FrameHeader& h, std::span<const std::byte> payload,
                            std::shared_ptr<const void> owner) {
    QueuedFrame f;
    EncodeHeader(h, f.header);
    f.payload = payload;
    f.owner = std::move(owner);
    return f;
  }
  // payload_bytes is set from `payload`.
  static QueuedFrame Owned(const FrameHeader& h, std::string payload) {
    QueuedFrame f;
    FrameHeader sized = h;
    sized.payload_bytes = static_cast<uint32_t>(payload.size());
    EncodeHeader(sized, f.header);
    f.owned = std::move(payload);
    return f;
  }
  // ERROR(code, text) answering `request_id` on a connection of `tenant`.
  static QueuedFrame Error(WireError code, std::string_view text, uint32_t tenant,
                           uint64_t request_id, bool fatal) {
    ErrorFrame e = MakeErrorFrame(code, text, tenant, request_id, fatal);
    QueuedFrame f;
    EncodeHeader(e.header, f.header);
    f.owned = std::move(e.body);
    f.close_after = fatal;
    return f;
  }
};

}  // namespace rackhub::net
