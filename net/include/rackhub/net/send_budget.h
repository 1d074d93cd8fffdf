// SendBudget: the backlog accounting every transport shares (SendLimits in
// transport.h): bytes queued and not written yet plus reserved bytes, when
// to pause taking frames from the peer, when to resume, when the connection
// is past its limit. It decides; the transport acts (stops reading, queues
// the fatal ERROR, closes).
//
// A plain value; no thread rules of its own (the owning connection's thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "rackhub/net/transport.h"

namespace rackhub::net {

class SendBudget {
 public:
  void set_limits(const SendLimits& limits) { limits_ = limits; }
  const SendLimits& limits() const { return limits_; }
  size_t bytes() const { return bytes_; }
  // Taking frames from the peer is paused (backlog above pause_bytes, not
  // yet back down to half of it).
  bool paused() const { return paused_; }
  // Whether adding `n` more bytes would take the backlog past max_bytes (a
  // single frame on an empty backlog never does).
  bool WouldExceed(size_t n) const {
    return limits_.max_bytes != 0 && bytes_ > 0 && bytes_ + n > limits_.max_bytes;
  }
  // `n` bytes were queued or reserved. True when the backlog is now past
  // max_bytes: the transport fails the connection.
  bool Add(size_t n) {
    const bool over = WouldExceed(n);
    bytes_ += n;
    if (limits_.pause_bytes != 0 && bytes_ > limits_.pause_bytes) paused_ = true;
    return over;
  }
  // `n` bytes were written, dropped or unreserved. True when taking frames
  // should resume now.
  bool Remove(size_t n) {
    bytes_ -= std::min(n, bytes_);
    if (paused_ && bytes_ <= limits_.pause_bytes / 2) {
      paused_ = false;
      return true;
    }
    return false;
  }
  // The fatal ERROR's text (after Add returned true).
  std::string OverLimitText() const {
    return "connection: " + std::to_string(bytes_) +
           " bytes of frames wait to be written to this peer, more than " +
           (limits_.setting.empty() ? std::string("the limit") : limits_.setting) + " (" +
           std::to_string(limits_.max_bytes) + " bytes): it does not read what it asked for";
  }

 private:
  SendLimits limits_;
  size_t bytes_ = 0;
  bool paused_ = false;
};

}  // namespace rackhub::net
