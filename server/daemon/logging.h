// rackhubd's log: spdlog to stderr, one line per record (OneLineFormatter:
// control characters escaped, at most 8 KiB of message). When stderr is the
// journal's stream — systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the
// stream it connects to stderr (systemd.exec(5)) — each line is the
// sd-daemon(3) priority prefix "<N>" and the message, nothing else: journald
// strips the prefix, stores the record with priority N (`journalctl -p`)
// and adds its own timestamp. Otherwise lines are
// "2024-01-02T03:04:05.678 info message". The message text is the same.
//
// SetUpLogging: once, from the main thread, before other threads start.
// The rest are plain functions, any thread.
#pragma once

#include <memory>
#include <string>

#include <spdlog/formatter.h>
#include <spdlog/common.h>

namespace rackhub::server {

// The syslog(3) priority (LOG_DEBUG .. LOG_CRIT, as sd-daemon(3) prefixes
// use) of a spdlog level: trace and debug 7, info 6, warn 4, error 3,
// critical 2 (spdlog's own systemd_sink maps them the same way).
int JournalPriority(spdlog::level::level_enum level);

// True when `journal_stream` (JOURNAL_STREAM's value; nullptr when unset)
// is "DEVICE:INODE" in decimal and names the file open on `fd` (fstat(2)).
// A stderr redirected elsewhere by the unit or a shell does not match, so
// a file or a terminal never gets the prefixes.
bool StreamIsJournal(const char* journal_stream, int fd);

// The formatter of every record: the "<N>" journal form or the timestamped
// form, both one line per record.
std::unique_ptr<spdlog::formatter> MakeLogFormatter(bool journal);

// Installs the default logger "rackhubd" on stderr at `level` (a valid
// log_level) in the journal form when StreamIsJournal(JOURNAL_STREAM, 2),
// and routes libprotobuf's messages into it.
void SetUpLogging(const std::string& level);

}  // namespace rackhub::server
