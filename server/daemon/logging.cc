#include "logging.h"

#include <sys/stat.h>

#include <charconv>
#include <cstdlib>
#include <syslog.h>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "rackhub/common/log_safe.h"

namespace rackhub::server {
namespace {

// The backstop behind SafeForLog at the sources: every log record becomes
// exactly one line of at most kMaxLogMessageBytes (escaped), whatever text a
// message carries, so no client string can forge a line (or a journal
// priority prefix) or flood the log.
class OneLineFormatter final : public spdlog::formatter {
 public:
  static constexpr size_t kMaxLogMessageBytes = 8192;

  OneLineFormatter(std::string pattern, bool journal)
      : pattern_(std::move(pattern)),
        journal_(journal),
        inner_(std::make_unique<spdlog::pattern_formatter>(pattern_)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    if (journal_) {
      // sd-daemon(3): "<N>" at the start of the line.
      const char prefix[] = {'<', static_cast<char>('0' + JournalPriority(msg.level)), '>'};
      dest.append(prefix, prefix + sizeof prefix);
    }
    const std::string_view text(msg.payload.data(), msg.payload.size());
    bool plain = text.size() <= kMaxLogMessageBytes;
    for (size_t i = 0; plain && i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      plain = c >= 0x20 && c < 0x7f;
    }
    if (plain) return inner_->format(msg, dest);
    const std::string safe = SafeForLog(text, kMaxLogMessageBytes);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(safe.data(), safe.size());
    inner_->format(copy, dest);
    msg.color_range_start = copy.color_range_start;  // mutable: read by the color sink
    msg.color_range_end = copy.color_range_end;
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<OneLineFormatter>(pattern_, journal_);
  }

 private:
  std::string pattern_;
  bool journal_;
  std::unique_ptr<spdlog::pattern_formatter> inner_;
};

}  // namespace

int JournalPriority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug: return LOG_DEBUG;
    case spdlog::level::info: return LOG_INFO;
    case spdlog::level::warn: return LOG_WARNING;
    case spdlog::level::err: return LOG_ERR;
    case spdlog::level::critical: return LOG_CRIT;
    default: return LOG_INFO;  // off: never logged
  }
}

bool StreamIsJournal(const char* journal_stream, int fd) {
  if (!journal_stream) return false;
  const std::string_view text(journal_stream);
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return false;
  unsigned long long device = 0, inode = 0;
  const char* end = text.data() + text.size();
  const auto d = std::from_chars(text.data(), text.data() + colon, device);
  const auto i = std::from_chars(text.data() + colon + 1, end, inode);
  if (d.ec != std::errc() || d.ptr != text.data() + colon || i.ec != std::errc() || i.ptr != end ||
      colon == 0 || colon + 1 == text.size()) {
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == device &&
         static_cast<unsigned long long>(st.st_ino) == inode;
}

std::unique_ptr<spdlog::formatter> MakeLogFormatter(bool journal) {
  // The journal adds the time and shows the priority itself.
  return std::make_unique<OneLineFormatter>(
      journal ? "%v" : "%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v", journal);
}

void SetUpLogging(const std::string& level) {
  // systemd's protocol variable, read once here (systemd.exec(5)).
  const bool journal = StreamIsJournal(std::getenv("JOURNAL_STREAM"), 2);
  auto logger = spdlog::stderr_color_mt("rackhubd");
  spdlog::set_default_logger(logger);
  spdlog::set_formatter(MakeLogFormatter(journal));
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
  // libprotobuf's own messages go through this log at debug level, not raw
  // to stderr: a peer's HELLO with a non-UTF-8 string made it print an ERROR
  // line per connection, past this log's format (the refusal itself is
  // logged by the acceptor). Found by fuzz/control/control_fuzz.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string& message) {
        spdlog::debug("protobuf: {}", SafeForLog(message));
      });
}

}  // namespace rackhub::server
