// LogLimiter: keeps a flood of similar log lines (refused connections, failed
// accepts: anything a remote peer can trigger at will) from flooding the log.
// At most `burst` lines per `window`; the first line let through after some
// were held back reports how many (Warn writes it so).
//
// Threading: none of its own; one thread uses an instance (or guards it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

namespace rackhub::server {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  LogLimiter(size_t burst, Clock::duration window) : burst_(burst), window_(window) {}

  // True if a line may be written now; then *suppressed holds the number of
  // lines held back since the last one written (0 if none).
  bool Allow(uint64_t* suppressed, Clock::time_point now = Clock::now()) {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++held_;
      return false;
    }
    ++in_window_;
    *suppressed = held_;
    held_ = 0;
    return true;
  }

  // Writes `line` as a warning if Allow lets it through, with the count of
  // lines held back before it.
  void Warn(const std::string& line) {
    uint64_t held = 0;
    if (!Allow(&held)) return;
    spdlog::warn(held > 0 ? line + " (" + std::to_string(held) +
                                " similar warnings held back before this one)"
                          : line);
  }

 private:
  const size_t burst_;
  const Clock::duration window_;
  Clock::time_point window_start_{};
  size_t in_window_ = 0;
  uint64_t held_ = 0;
};

}  // namespace rackhub::server
