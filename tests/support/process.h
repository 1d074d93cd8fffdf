// Test support: start real rackhub processes and run commands.
//
// DaemonProcess starts build/bin/rackhubd on ephemeral loopback ports with a
// fresh state directory (--state-dir under its temp dir), waits for its ready
// file (written once every listener is bound) and stops it with SIGTERM on
// destruction. It can be killed (SIGKILL: a crash) and restarted on the same
// ports and state directory, to test what survives a restart. RunCommand runs a program to completion with a
// timeout and captures its output. Single-threaded use from a test body.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace rackhub::testing {

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  bool timed_out = false;
  std::string out;
  std::string err;
};

// Runs `argv` (argv[0] is a path) with optional stdin text; kills it after
// `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_text = "",
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Path of a built executable, e.g. BinPath("rackhubd").
std::string BinPath(const std::string& name);
// A fresh private directory under /tmp, removed by the caller if wanted.
std::string MakeTempDir();
void WriteFile(const std::string& path, const std::string& content);
std::string ReadFile(const std::string& path);
// The value of the first line "  NAME: VALUE" of a command's human output
// (leading and trailing blanks removed), e.g. OutputField(out,
// "data-plane token") on `rackhubctl tenant create`'s; "" when there is none.
std::string OutputField(const std::string& out, const std::string& name);
// Whether every thread of process `pid` is stopped by a signal (state T in
// /proc/PID/task/TID/stat). kill(SIGSTOP) returns before they all are: a
// test that freezes a process waits for this before it counts on silence.
bool StoppedBySignal(pid_t pid);

class DaemonProcess {
 public:
  // Starts rackhubd with "--admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0
  // --ready-file <tmp> --state-dir <tmp>/state" followed by `extra_args`
  // (--state-dir is left out when `extra_args` has one; pass --in-memory when
  // the test does not need durable state). Fails the current test (and
  // leaves started() false) if the daemon does not become ready in 20 s.
  // `wait_ready` false: only starts it; call WaitReady (hubs that find each
  // other through etcd become ready together).
  explicit DaemonProcess(std::vector<std::string> extra_args = {}, bool wait_ready = true);
  bool WaitReady();
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool started() const { return started_; }
  pid_t pid() const { return pid_; }
  // "127.0.0.1:PORT" of the admin gRPC server and the data plane.
  const std::string& admin_address() const { return admin_address_; }
  const std::string& data_address() const { return data_address_; }
  // "127.0.0.1:PORT" of /metrics ("" when started with --no-metrics).
  const std::string& metrics_address() const { return metrics_address_; }
  // The daemon's stderr (its log) so far.
  std::string Log() const;
  // Sends `sig` and waits up to `timeout` for exit. Returns the exit status
  // (128+signal if killed by a signal), or -1 on timeout (then SIGKILLs).
  int Stop(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // SIGKILL, like a crash: no shutdown path runs. Returns 128 + 9.
  int Kill() { return Stop(9); }
  // Starts the daemon again (after Stop or Kill) with the same arguments, on
  // the same admin and data ports and the same state directory. Fails the
  // current test and returns false if it does not become ready in 20 s.
  // `wait_ready` false: only starts it (true if it was started); call
  // WaitReady (hubs that wait for each other, all restarted at once).
  bool Restart(bool wait_ready = true);
  // The --state-dir given to the daemon (under the temp dir unless the
  // caller passed one).
  const std::string& state_dir() const { return state_dir_; }

 private:
  // Starts the process with argv_ (plus `ports` if not empty) and waits for
  // the ready file (unless `wait` is false).
  void Launch(const std::vector<std::string>& ports, bool wait = true);

  std::string dir_;
  std::string state_dir_;
  std::vector<std::string> args_;  // after the listen flags
  int starts_ = 0;
  pid_t pid_ = -1;
  bool started_ = false;
  std::string admin_address_;
  std::string data_address_;
  std::string metrics_address_;
};


// A child process started without waiting for it (e.g. a test worker). The
// destructor SIGKILLs and reaps it if it is still running.
class ChildProcess {
 public:
  // fork+exec of `argv` (argv[0] is a path); stdout and stderr go to
  // `log_path` (or are inherited if empty). Fails the current test if fork fails.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path = "");
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Waits up to `timeout` for exit; returns the exit code (128+signal if
  // killed by a signal) or -1 on timeout (the child keeps running).
  int Wait(std::chrono::milliseconds timeout);
  // Sends `sig` (e.g. SIGKILL); does not wait.
  void Kill(int sig);

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

}  // namespace rackhub::testing
