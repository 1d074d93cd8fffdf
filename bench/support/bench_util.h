// Helpers shared by the benchmarks that run real rackhubd processes
// (rackhub-durability-bench, rackhub-noisy-bench): statistics, a rackhubd
// child process (HubProcess) and Die, which kills every hub still running.
// Threading: HubProcess from one thread; Die from any.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace rackhub::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
inline double WallMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
inline double Percentile(std::vector<double> v, double q) {  // nearest rank
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}
inline double Max(const std::vector<double>& v) {
  return v.empty() ? NAN : *std::max_element(v.begin(), v.end());
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Hubs started here and still running: killed (SIGKILL) when the bench dies.
inline std::mutex g_children_mu;
inline std::vector<pid_t> g_children;

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  {
    std::lock_guard l(g_children_mu);
    for (pid_t pid : g_children) kill(pid, SIGKILL);
  }
  std::_Exit(1);
}

// ---- a rackhubd child process ----

class HubProcess {
 public:
  HubProcess(std::string bin, std::string dir, std::string name, std::vector<std::string> extra)
      : bin_(std::move(bin)),
        dir_(std::move(dir)),
        name_(std::move(name)),
        extra_(std::move(extra)) {
    fs::create_directories(dir_);
  }
  HubProcess(const HubProcess&) = delete;
  HubProcess& operator=(const HubProcess&) = delete;
  // A benchmark's hubs are thrown away with their state: SIGKILL, no
  // shutdown checkpoint to wait for.
  ~HubProcess() {
    if (pid_ > 0) Stop(SIGKILL);
  }

  std::string state_dir() const { return dir_ + "/state"; }
  const std::string& log_path() const { return log_; }
  pid_t pid() const { return pid_; }
  std::string admin, data;  // HOST:PORT, fixed after the first start
  double exec_wall_ms = 0;  // this start's posix_spawn, wall clock
  Clock::time_point exec_at, ready_at;

  // Starts (again, on the same ports and state directory) and waits for the
  // ready file.
  void Start() {
    const std::string ready = dir_ + "/ready";
    fs::remove(ready);
    log_ = dir_ + "/" + name_ + "-" + std::to_string(++starts_) + ".log";
    std::vector<std::string> argv = {bin_,
                                     "--admin-listen",
                                     admin.empty() ? "127.0.0.1:0" : admin,
                                     "--data-listen",
                                     data.empty() ? "127.0.0.1:0" : data,
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--ready-file",
                                     ready,
                                     "--state-dir",
                                     state_dir(),
                                     "--log-level",
                                     "info"};
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    exec_wall_ms = WallMs();
    exec_at = Clock::now();
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) Die("cannot start " + bin_ + ": " + std::strerror(rc));
    {
      std::lock_guard l(g_children_mu);
      g_children.push_back(pid_);
    }
    const auto deadline = exec_at + std::chrono::seconds(120);
    while (Clock::now() < deadline) {
      std::istringstream in(ReadAll(ready));
      std::string what, addr, a, d;
      while (in >> what >> addr) {
        if (what == "admin") a = addr;
        if (what == "data") d = addr;
      }
      if (!a.empty() && !d.empty()) {
        ready_at = Clock::now();
        admin = a;
        data = d;
        return;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        {
          std::lock_guard l(g_children_mu);
          std::erase(g_children, pid_);
        }
        pid_ = -1;
        Die("rackhubd (" + name_ + ") exited at start-up:\n" + ReadAll(log_));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Die("rackhubd (" + name_ + ") not ready in 120 s:\n" + ReadAll(log_));
  }

  // Sends `sig` and waits for the exit; returns the ms it took.
  double Stop(int sig) {
    const auto t0 = Clock::now();
    kill(pid_, sig);
    int status;
    waitpid(pid_, &status, 0);
    {
      std::lock_guard l(g_children_mu);
      std::erase(g_children, pid_);
    }
    pid_ = -1;
    return Ms(Clock::now() - t0);
  }

  // CPU time (utime + stime, clock ticks) of the process so far.
  long CpuTicks() const {
    const std::string stat = ReadAll("/proc/" + std::to_string(pid_) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream in(stat.substr(close + 2));
    std::vector<std::string> f;
    std::string s;
    while (in >> s) f.push_back(s);
    return f.size() > 12 ? std::stol(f[11]) + std::stol(f[12]) : -1;
  }

  bool WritingCheckpoint() const {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(state_dir() + "/checkpoints", ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().extension() == ".tmp") return true;
    }
    return false;
  }

  // Waits until the hub has used no CPU for 250 ms and writes no checkpoint
  // (the trigger thread looks every 100 ms), at most 30 s.
  void WaitQuiet() const {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    long last = CpuTicks();
    int quiet = 0;
    while (quiet < 5 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const long now = CpuTicks();
      quiet = (now - last <= 0 && !WritingCheckpoint()) ? quiet + 1 : 0;
      last = now;
    }
  }

 private:
  std::string bin_, dir_, name_, log_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

}  // namespace rackhub::bench
