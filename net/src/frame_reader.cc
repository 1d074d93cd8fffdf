#include "rackhub/net/frame_reader.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace rackhub::net {

std::span<std::byte> FrameReader::WritableSpan(size_t min) {
  writing_direct_ = direct_ && dest_filled_ < dest_.size();
  if (writing_direct_) return dest_.subspan(dest_filled_);
  min = std::max<size_t>(min, 1);
  if (buf_.empty()) buf_.resize(std::max(initial_bytes_, min));
  if (rstart_ == rend_) rstart_ = rend_ = 0;
  // Room for the frame being received: compact, and grow only when one frame
  // is larger than the buffer.
  const size_t need = have_header_ ? header_.payload_bytes : kHeaderBytes;
  if (buf_.size() - rstart_ < need || buf_.size() - rend_ < min) {
    std::memmove(buf_.data(), buf_.data() + rstart_, rend_ - rstart_);
    rend_ -= rstart_;
    rstart_ = 0;
    if (buf_.size() < need) buf_.resize(std::max(need, 2 * buf_.size()));
    if (buf_.size() - rend_ < min) buf_.resize(std::max(rend_ + min, 2 * buf_.size()));
  }
  return {buf_.data() + rend_, buf_.size() - rend_};
}

bool FrameReader::deliverable() const {
  if (direct_) return dest_filled_ == dest_.size();
  const size_t avail = rend_ - rstart_;
  if (skip_ > 0) return avail > 0;
  return avail >= (have_header_ ? header_.payload_bytes : kHeaderBytes);
}

bool FrameReader::DeliverOrRequestTurn(Connection& conn, FrameHandler& handler) {
  if (turn_requested_) return false;
  if (scheduler_ != nullptr && !stopped_ && !paused() && deliverable()) {
    turn_requested_ = true;
    scheduler_->RequestTurn(conn.shared_from_this(), buffered());
    return false;
  }
  Parse(conn, handler);
  return true;
}

bool FrameReader::RequestTurnToClose(Connection& conn) {
  // A stopped reader has nothing left to order the close after.
  if (scheduler_ == nullptr || turn_requested_ || stopped_) return false;
  turn_requested_ = true;
  scheduler_->RequestTurn(conn.shared_from_this(), 0);
  return true;
}

void FrameReader::Parse(Connection& conn, FrameHandler& handler) {
  while (!stopped_ && !paused()) {
    if (direct_) {
      if (dest_filled_ < dest_.size()) return;
      direct_ = false;
      handler.HandleFrame(conn, header_, std::exchange(dest_, {}));
      continue;
    }
    const size_t avail = rend_ - rstart_;
    if (skip_ > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(skip_, avail));
      rstart_ += n;
      skip_ -= n;
      if (skip_ > 0) return;
      continue;
    }
    if (!have_header_) {
      if (avail < kHeaderBytes) return;
      header_ = DecodeHeader(
          std::span<const std::byte, kHeaderBytes>(buf_.data() + rstart_, kHeaderBytes));
      rstart_ += kHeaderBytes;
      if (Status valid = CheckHeader(header_); !valid.ok()) {
        stopped_ = true;
        conn.SendError(WireError::kMalformed, valid.message(), header_.request_id, true);
        return;
      }
      // The handler checks every field against its state before the payload
      // is looked at (or room is made for it).
      const auto verdict = handler.AcceptHeader(conn, header_);
      if (verdict == FrameHandler::Verdict::kReject) {
        stopped_ = true;
        return;
      }
      if (verdict == FrameHandler::Verdict::kDiscard) {
        skip_ = header_.payload_bytes;
        continue;
      }
      if (header_.payload_bytes > 0) {
        const std::span<std::byte> dest = handler.PayloadDestination(conn, header_);
        if (dest.size() == header_.payload_bytes) {
          // What already arrived is copied once; the rest is read into place.
          const size_t n = std::min<size_t>(rend_ - rstart_, dest.size());
          std::memcpy(dest.data(), buf_.data() + rstart_, n);
          rstart_ += n;
          dest_ = dest;
          dest_filled_ = n;
          direct_ = true;
          continue;
        }
      }
      have_header_ = true;
      continue;
    }
    if (avail < header_.payload_bytes) return;
    const std::span<const std::byte> payload(buf_.data() + rstart_, header_.payload_bytes);
    rstart_ += header_.payload_bytes;
    have_header_ = false;
    handler.HandleFrame(conn, header_, payload);
  }
}

}  // namespace rackhub::net
