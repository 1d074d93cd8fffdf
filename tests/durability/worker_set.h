// Test support for the worker kill loops (kill_loop_test.cc, WorkerKill9Loop)
// and the cross-rack recovery tests (cross_rack_recovery_test.cc): a set of
// rackhub-durability-worker processes, one current process per (rack, rank)
// member, each generation writing its own output file, and the reading of
// those files (worker_main.cc's line format).
//
// Ownership: a WorkerSet owns its processes (killed with SIGKILL when it is
// destroyed) and names their files under `dir`. Single-threaded use from a
// test body; the processes are the concurrency.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "process.h"

namespace rackhub::testing {

// One line of a worker's output (worker_main.cc). A last line without its
// newline (a worker killed while writing it) is not read.
struct WorkerLine {
  std::string kind;  // transport | pull | iter | bound | resync | error
  uint64_t iteration = 0;
  std::string hash;
  std::string text;               // resync, error, transport: the rest of the line
  std::string dump;               // pull with --dump-pulls: the parameters' hex
  uint64_t updates = 0, slowest = 0;  // bound
};

std::vector<WorkerLine> ReadWorkerOut(const std::string& path);
WorkerLine ParseWorkerLine(const std::string& line);

class WorkerSet {
 public:
  struct Setup {
    std::string dir;                 // output files go here
    std::string tenant, token;
    std::vector<std::string> hubs;   // data address of each rack's hub
    std::vector<std::string> args;   // e.g. {"--elements", "1048576"}
    int64_t bound = -1;              // bounded:S tenant ("bound" lines; no hash check)
  };
  // A member: (rack, rank).
  using Member = std::pair<uint32_t, uint32_t>;

  explicit WorkerSet(Setup setup) : setup_(std::move(setup)) {}

  // A new process (generation) for the member, with its own output file.
  void Start(uint32_t rank, uint32_t rack = 0);
  // SIGKILL, and the process reaped.
  void Kill(uint32_t rank, uint32_t rack = 0);
  ChildProcess* Process(uint32_t rank, uint32_t rack = 0);
  // Waits up to `limit` for the member's current process; its exit code or -1.
  int Wait(uint32_t rank, uint32_t rack, std::chrono::milliseconds limit);

  // Highest iteration any member of any generation completed.
  uint64_t MaxIteration() const;
  // Highest version any member of any generation reached (PushPull or Pull).
  uint64_t MaxVersion() const;
  // Lowest iteration completed by the current processes (0 if one has none).
  uint64_t MinCurrent() const;
  // The current processes that exited, with their exit code and last lines
  // ("" while all run).
  std::string Exited();
  // Empty if every member is alive and every iteration has one hash over
  // every member and generation (PushPull results and Pulls alike).
  std::string Problems();
  // The transports the workers of every generation connected over, e.g. "shm".
  std::set<std::string> Transports() const;
  size_t Resyncs() const;
  // Every generation's file with its member, in start order.
  const std::vector<std::pair<Member, std::string>>& files() const { return files_; }
  // The complete lines of one of its files so far (read incrementally: only
  // what was appended since the last call is parsed).
  const std::vector<WorkerLine>& Lines(const std::string& file) const;
  // The last lines of the member's current file and log (long lines cut).
  std::string Tail(uint32_t rank, uint32_t rack = 0) const;

 private:
  static std::string Name(const Member& m);
  // Highest iteration of the lines of these kinds in every file.
  uint64_t Newest(const std::set<std::string>& kinds) const;

  struct Cached {
    size_t offset = 0;     // bytes of the file read so far
    std::string partial;   // a line not complete yet
    std::vector<WorkerLine> lines;
  };

  const Setup setup_;
  mutable std::map<std::string, Cached> cache_;
  std::vector<std::pair<Member, std::string>> files_;
  std::map<Member, std::string> current_;
  std::map<Member, std::unique_ptr<ChildProcess>> procs_;
};

}  // namespace rackhub::testing
