#include "rackhub/net/stream_connection.h"

#include <memory>
#include <utility>

namespace rackhub::net {

bool StreamConnection::CanRead() const {
  return open_ && started_ && !closing() && !reader_.stopped() && !reader_.paused() &&
         !reader_.awaiting_turn();
}

void StreamConnection::Pump() {
  if (reader_.DeliverOrRequestTurn(*this, *handler_)) ReadMore();
}

void StreamConnection::DeliverTurn() {
  reader_.TurnGranted();
  if (!close_in_turn_.empty()) return Close(close_in_turn_);
  if (!open_ || closing()) return;
  reader_.Parse(*this, *handler_);
  ReadMore();
}

void StreamConnection::EndOfStream(std::string why) {
  if (reader_.RequestTurnToClose(*this)) {
    close_in_turn_ = std::move(why);
  } else {
    Close(why);
  }
}

void StreamConnection::ResumeIntake() {
  reader_.Pause(false);
  PostResume();
}

void StreamConnection::HoldIntake(bool hold) {
  reader_.Hold(hold);
  if (!hold) PostResume();
}

void StreamConnection::PostResume() {
  if (resume_posted_) return;
  resume_posted_ = true;
  // On a fresh stack: this may run inside the lane's handling of another
  // connection's frame, which must not see this one's frames now.
  boost::asio::post(executor_, [keep = shared_from_this(), this] {
    resume_posted_ = false;
    if (!open_ || closing() || reader_.paused()) return;
    Pump();  // frames already buffered
  });
}

}  // namespace rackhub::net
