// A frame queued on a channel transport (rdma::Channel, shm::Channel): the
// encoded header plus either an owned or a borrowed payload. Channels copy the
// payload into their ring when the frame is posted; until then `owner` (if
// set: a reference keeping the borrowed bytes alive and unchanged) is held.
// `release` runs once the frame no longer references the borrowed bytes
// (posted or dropped).
//
// Threading: a value type; used by the thread that owns the channel.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "rackhub/net/frame.h"

namespace rackhub::net {

struct OutgoingFrame {
  std::array<std::byte, kHeaderBytes> header{};
  std::string owned;
  std::span<const std::byte> borrowed;
  std::shared_ptr<const void> owner;
  bool close_after = false;            // close once this frame was sent
  std::function<bool()> still_wanted;  // false at posting time: drop it
  std::function<void()> release;

  std::span<const std::byte> payload() const {
    return owned.empty() ? borrowed
                         : std::span<const std::byte>(
                               reinterpret_cast<const std::byte*>(owned.data()), owned.size());
  }
};

}  // namespace rackhub::net
