// The test side of the elastic tenant tests (elastic_test,
// multi_rack_elastic_test; docs/elastic.md): the forked workers of one test
// (elastic_worker.h), each driven over its socketpair, and the checks of
// their replies against a reference. A test owns one WorkerPool; it names
// its workers by an id of its own (the rank; across racks the global rank)
// and says how each id connects (WorkerConfig) and what to print with a
// failure (the hubs' logs). The pool owns the children and their sockets:
// KillAll (or its destructor) kills and reaps those left. One thread (the
// test's). Every wait is for an event: a worker's report (at most
// kReportTimeout), a child's exit. Header-only test code.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "elastic_worker.h"

namespace rackhub::testing::elastic {

// A report is waited for this long: a survivor that waited for the straggler
// timeout (60 s in these tests) fails.
constexpr auto kReportTimeout = std::chrono::milliseconds(30000);
// The tests' keys have 1 KiB chunks: 256 floats.
constexpr uint32_t kChunkElements = 256;

// How often `needle` occurs in `log`.
inline int CountOf(const std::string& log, const std::string& needle) {
  int n = 0;
  for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
  return n;
}

class WorkerPool {
 public:
  // `config`: how worker `id` connects; `logs`: appended to a failure.
  WorkerPool(std::function<WorkerConfig(uint32_t id)> config, std::function<std::string()> logs)
      : config_(std::move(config)), logs_(std::move(logs)) {}
  ~WorkerPool() { KillAll(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Forks worker `id` (not waiting for it to be ready).
  void Spawn(uint32_t id) {
    const WorkerConfig cfg = config_(id);
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(sv[0]);
      WorkerMain(cfg, sv[1]);
    }
    ::close(sv[1]);
    workers_[id] = Child{pid, sv[0]};
  }

  // The next report of worker `id`, or a failure after kReportTimeout.
  ::testing::AssertionResult Next(uint32_t id, Report* out) {
    const Child& w = workers_.at(id);
    pollfd p{w.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kReportTimeout.count())) <= 0) {
      return ::testing::AssertionFailure() << "rank " << id << " reported nothing within "
                                           << kReportTimeout.count() << " ms" << logs_();
    }
    if (!ReadAll(w.fd, out, sizeof *out)) {
      return ::testing::AssertionFailure() << "rank " << id << " died";
    }
    if (out->kind == kFailed) {
      return ::testing::AssertionFailure() << "rank " << id << " failed: " << out->message
                                           << logs_();
    }
    return ::testing::AssertionSuccess();
  }

  // Spawns `ids` and waits until each is ready (a member, or held by a
  // paused tenant until the last of them makes the quorum).
  void Join(const std::vector<uint32_t>& ids) {
    for (uint32_t id : ids) Spawn(id);
    for (uint32_t id : ids) {
      Report rep;
      ASSERT_TRUE(Next(id, &rep));
      ASSERT_EQ(rep.kind, kReady);
    }
  }

  // SIGKILL and reap (the exit is the event).
  void Kill(uint32_t id) {
    Reap(workers_.at(id));
    workers_.erase(id);
  }
  void KillAll() {
    for (auto& [id, w] : workers_) Reap(w);
    workers_.clear();
  }

  bool Has(uint32_t id) const { return workers_.count(id) > 0; }
  // The ids alive, ascending.
  std::vector<uint32_t> Alive() const {
    std::vector<uint32_t> out;
    for (const auto& [id, w] : workers_) out.push_back(id);
    return out;
  }

  void SendStep(uint32_t id, uint32_t step) {
    Command c{kCmdStep, step};
    ASSERT_TRUE(WriteAll(workers_.at(id).fd, &c, sizeof c));
  }

  // Runs `step` on every alive worker: their reports (a worker's
  // kPausedSeen is skipped: its push is held until the tenant resumes).
  std::vector<Report> RunStep(uint32_t step) {
    const std::vector<uint32_t> alive = Alive();
    for (uint32_t id : alive) SendStep(id, step);
    std::vector<Report> reports;
    for (uint32_t id : alive) {
      Report rep;
      EXPECT_TRUE(Next(id, &rep));
      while (rep.kind == kPausedSeen) EXPECT_TRUE(Next(id, &rep));
      EXPECT_EQ(rep.kind, kStepDone);
      EXPECT_EQ(rep.step, step);
      reports.push_back(rep);
    }
    return reports;
  }

  // The step reports of `ids` (a kPausedSeen before one is skipped): all
  // of them, or fewer after a failure (named).
  std::vector<Report> Collect(const std::vector<uint32_t>& ids) {
    std::vector<Report> reports;
    for (uint32_t id : ids) {
      Report rep;
      ::testing::AssertionResult got = Next(id, &rep);
      while (got && rep.kind == kPausedSeen) got = Next(id, &rep);
      if (!got || rep.kind != kStepDone) {
        ADD_FAILURE() << "rank " << id << ": " << got.message() << rep.message;
        break;
      }
      reports.push_back(rep);
    }
    return reports;
  }

  // kill -9 of `victim` in the middle of `step` at `point` (0: before it got
  // the step, 1: right after, 2: once a survivor completed it): the
  // survivors' reports (empty after a failure).
  std::vector<Report> KillDuringStep(uint32_t victim, uint32_t point, uint32_t step) {
    std::vector<uint32_t> after = Alive();
    after.erase(std::find(after.begin(), after.end(), victim));
    for (uint32_t id : after) SendStep(id, step);
    std::vector<Report> reports;
    if (point >= 1) SendStep(victim, step);
    if (point == 2) {
      Report first;
      if (!Next(after[0], &first) || first.kind != kStepDone) {
        ADD_FAILURE() << "kill point 2: rank " << after[0] << ": " << first.message;
        return {};
      }
      reports.push_back(first);
    }
    Kill(victim);
    for (size_t i = reports.size(); i < after.size(); ++i) {
      Report rep;
      const ::testing::AssertionResult got = Next(after[i], &rep);
      if (!got || rep.kind != kStepDone) {
        ADD_FAILURE() << "kill point " << point << ": " << got.message() << rep.message;
        return {};
      }
      reports.push_back(rep);
    }
    return reports;
  }

 private:
  struct Child {
    pid_t pid = -1;
    int fd = -1;
  };
  static void Reap(Child& w) {
    if (w.pid <= 0) return;
    ::kill(w.pid, SIGKILL);
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    ::close(w.fd);
    w.pid = -1;
  }

  const std::function<WorkerConfig(uint32_t)> config_;
  const std::function<std::string()> logs_;
  std::map<uint32_t, Child> workers_;  // by id
};

// One key's replies of a step: every rank names `members` members and the
// same generation (> 0, not mixed), and the values equal `want` bit for bit.
inline void CheckReplies(const std::vector<Report>& reports, bool mean_key,
                         const std::vector<float>& want, size_t members, uint32_t step) {
  const char* name = mean_key ? "mean" : "sum";
  for (const Report& r : reports) {
    const KeyResult& k = mean_key ? r.mean : r.sum;
    EXPECT_EQ(k.members, members) << "key " << name << " rank " << r.rank << " step " << step
                                  << " version " << k.version << " generation " << k.generation
                                  << " retries " << r.retries;
    EXPECT_EQ(k.mixed, 0u) << "key " << name << " rank " << r.rank;
    EXPECT_EQ(k.generation, (mean_key ? reports[0].mean : reports[0].sum).generation)
        << "key " << name << " step " << step << ": ranks " << r.rank << " and "
        << reports[0].rank << " name different membership generations";
    EXPECT_GT(k.generation, 0u);
    size_t bad = 0;
    for (uint32_t i = 0; i < kElements; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &k.values[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (a != b && bad++ < 3) {
        ADD_FAILURE() << "key " << name << " step " << step << " rank " << r.rank << " element "
                      << i << ": " << k.values[i] << ", reference " << want[i] << " over "
                      << members << " members";
      }
    }
    EXPECT_EQ(bad, 0u) << "key " << name << " rank " << r.rank << " step " << step;
  }
}

// The replies of a step during which a member was killed: every chunk of
// every reply equals the reference `with` it (the update completed before
// the kill) or `without` it (aborted, retried without it), bit for bit.
inline void CheckWithOrWithout(const std::vector<Report>& reports, bool mean_key,
                               const std::vector<float>& with, const std::vector<float>& without,
                               const std::string& what) {
  for (const Report& r : reports) {
    const KeyResult& k = mean_key ? r.mean : r.sum;
    for (uint32_t c = 0; c * kChunkElements < kElements; ++c) {
      const size_t from = c * kChunkElements;
      const size_t n = std::min<size_t>(kChunkElements, kElements - from);
      const bool is_with = std::memcmp(&k.values[from], &with[from], n * 4) == 0;
      const bool is_without = std::memcmp(&k.values[from], &without[from], n * 4) == 0;
      EXPECT_TRUE(is_with || is_without)
          << (mean_key ? "mean" : "sum") << " chunk " << c << " of rank " << r.rank << " ("
          << what << ", retries " << r.retries << "): neither the sum with nor without the victim";
    }
  }
}

}  // namespace rackhub::testing::elastic
