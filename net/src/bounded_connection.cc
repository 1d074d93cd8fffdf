#include "rackhub/net/bounded_connection.h"

#include <utility>

namespace rackhub::net {

void BoundedConnection::SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                                   std::shared_ptr<const void> owner) {
  Submit(QueuedFrame::Shared(header, payload, std::move(owner)));
}

void BoundedConnection::SendOwned(const FrameHeader& header, std::string payload) {
  Submit(QueuedFrame::Owned(header, std::move(payload)));
}

void BoundedConnection::SendError(WireError code, const std::string& text, uint64_t request_id,
                                  bool fatal) {
  if (!open() || closing_) return;
  QueuedFrame f = QueuedFrame::Error(code, text, id_.tenant_handle, request_id, fatal);
  if (!fatal) return Submit(std::move(f));
  closing_ = true;
  fatal_ = std::string(WireErrorName(code)) + ": " + text;
  StopIntake();
  budget_.Add(f.size());  // the last frame: never fails the connection again
  Push(std::move(f));
  Flush();
}

void BoundedConnection::Submit(QueuedFrame frame) {
  // Nothing goes out after a fatal ERROR: do not hold it either.
  if (!open() || closing_) return;
  const bool over = budget_.Add(frame.size());
  Push(std::move(frame));
  Counted(over);
  Flush();
}

bool BoundedConnection::Reserve(size_t bytes) {
  if (!open() || closing_) return false;
  if (budget_.WouldExceed(bytes)) {
    budget_.Add(bytes);  // for the error text
    FailOverLimit();
    return false;
  }
  Counted(budget_.Add(bytes));
  return true;
}

void BoundedConnection::Counted(bool over) {
  if (!open()) return;  // Push may have closed a channel
  if (over && !closing_) {
    FailOverLimit();
    return;
  }
  if (budget_.paused()) PauseIntake();
}

void BoundedConnection::Uncounted(size_t bytes) {
  if (budget_.Remove(bytes) && open()) ResumeIntake();
}

// Past the limit: what is not being written yet goes now (with its memory),
// and a fatal QUOTA_EXCEEDED follows the frames in flight.
void BoundedConnection::FailOverLimit() {
  const std::string text = budget_.OverLimitText();
  budget_.Remove(DropUnsent());
  SendError(WireError::kQuotaExceeded, text, 0, true);
}

}  // namespace rackhub::net
