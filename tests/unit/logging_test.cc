// Unit tests for rackhubd's log set-up (server/daemon/logging.cc): the spdlog
// level -> journal priority mapping, when stderr counts as the journal's
// stream, and the two line formats.
#include <fcntl.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <spdlog/details/log_msg.h>

#include "logging.h"

namespace rackhub::server {
namespace {

std::string Format(spdlog::formatter& f, spdlog::level::level_enum level, std::string_view text) {
  spdlog::details::log_msg msg("rackhubd", level, spdlog::string_view_t(text.data(), text.size()));
  spdlog::memory_buf_t buf;
  f.format(msg, buf);
  return std::string(buf.data(), buf.size());
}

TEST(JournalPriorityTest, EveryLevelMapsToItsSyslogPriority) {
  EXPECT_EQ(JournalPriority(spdlog::level::trace), LOG_DEBUG);
  EXPECT_EQ(JournalPriority(spdlog::level::debug), LOG_DEBUG);
  EXPECT_EQ(JournalPriority(spdlog::level::info), LOG_INFO);
  EXPECT_EQ(JournalPriority(spdlog::level::warn), LOG_WARNING);
  EXPECT_EQ(JournalPriority(spdlog::level::err), LOG_ERR);
  EXPECT_EQ(JournalPriority(spdlog::level::critical), LOG_CRIT);
  // The numbers journald reads from "<N>" (sd-daemon(3)).
  EXPECT_EQ(LOG_DEBUG, 7);
  EXPECT_EQ(LOG_INFO, 6);
  EXPECT_EQ(LOG_WARNING, 4);
  EXPECT_EQ(LOG_ERR, 3);
  EXPECT_EQ(LOG_CRIT, 2);
}

class StreamIsJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/rackhub_logging_test_XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0);
    unlink(path);
    struct stat st {};
    ASSERT_EQ(fstat(fd_, &st), 0);
    dev_ = static_cast<unsigned long long>(st.st_dev);
    ino_ = static_cast<unsigned long long>(st.st_ino);
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
  }
  int fd_ = -1;
  unsigned long long dev_ = 0, ino_ = 0;
};

TEST_F(StreamIsJournalTest, MatchesOnlyTheSameDeviceAndInode) {
  const std::string mine = std::to_string(dev_) + ":" + std::to_string(ino_);
  EXPECT_TRUE(StreamIsJournal(mine.c_str(), fd_));
  EXPECT_FALSE(StreamIsJournal(nullptr, fd_));  // not under systemd
  EXPECT_FALSE(StreamIsJournal((std::to_string(dev_) + ":" + std::to_string(ino_ + 1)).c_str(), fd_));
  EXPECT_FALSE(StreamIsJournal((std::to_string(dev_ + 1) + ":" + std::to_string(ino_)).c_str(), fd_));
  // A pipe (as when a unit's stderr goes elsewhere) is another file.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_FALSE(StreamIsJournal(mine.c_str(), pipe_fds[1]));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_FALSE(StreamIsJournal(mine.c_str(), -1));
}

TEST_F(StreamIsJournalTest, MalformedValuesDoNotMatch) {
  const std::string d = std::to_string(dev_), i = std::to_string(ino_);
  for (const std::string& bad : {std::string(""), d, d + ":", ":" + i, d + ":" + i + "x",
                                 d + ":" + i + ":1", "x" + d + ":" + i, d + " :" + i,
                                 "-" + d + ":" + i}) {
    EXPECT_FALSE(StreamIsJournal(bad.c_str(), fd_)) << "'" << bad << "'";
  }
}

TEST(LogFormatterTest, JournalLinesArePriorityAndMessage) {
  auto f = MakeLogFormatter(true);
  EXPECT_EQ(Format(*f, spdlog::level::info, "rackhubd 1.0 starting"), "<6>rackhubd 1.0 starting\n");
  EXPECT_EQ(Format(*f, spdlog::level::warn, "w"), "<4>w\n");
  EXPECT_EQ(Format(*f, spdlog::level::err, "e"), "<3>e\n");
  EXPECT_EQ(Format(*f, spdlog::level::critical, "c"), "<2>c\n");
  EXPECT_EQ(Format(*f, spdlog::level::debug, "d"), "<7>d\n");
  EXPECT_EQ(Format(*f, spdlog::level::trace, "t"), "<7>t\n");
  // A message cannot start a second line, so it cannot forge a priority.
  const std::string forged = Format(*f, spdlog::level::info, "x\n<0>forged");
  EXPECT_EQ(forged.rfind("<6>x", 0), 0u) << forged;
  EXPECT_EQ(forged.find('\n'), forged.size() - 1) << forged;
  // The clone (one per sink) keeps the form.
  EXPECT_EQ(Format(*f->clone(), spdlog::level::err, "e"), "<3>e\n");
}

TEST(LogFormatterTest, TerminalLinesHaveTimeAndLevelAndTheSameMessage) {
  auto f = MakeLogFormatter(false);
  const std::string line = Format(*f, spdlog::level::warn, "disk is slow");
  EXPECT_NE(line.find(" warning disk is slow\n"), std::string::npos) << line;
  EXPECT_EQ(line.find('<'), std::string::npos) << line;
  ASSERT_GT(line.size(), 23u);
  EXPECT_EQ(line[4], '-');
  EXPECT_EQ(line[10], 'T');
}

}  // namespace
}  // namespace rackhub::server
