#include "process.h"

#include "etcd_cluster.h"  // FreeLoopbackPort

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace rackhub::testing {
namespace {

std::vector<char*> ArgvOf(const std::vector<std::string>& args) {
  std::vector<char*> v;
  for (const auto& a : args) v.push_back(const_cast<char*>(a.c_str()));
  v.push_back(nullptr);
  return v;
}

// Waits for `pid` up to `timeout`; returns the wait status or nullopt.
bool WaitFor(pid_t pid, std::chrono::milliseconds timeout, int* status) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::string BinPath(const std::string& name) { return std::string(RACKHUB_BIN_DIR) + "/" + name; }

std::string MakeTempDir() {
  std::string tmpl = "/tmp/rackhub-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    return "/tmp";
  }
  return tmpl;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << content;
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool StoppedBySignal(pid_t pid) {
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    const std::string stat = ReadFile((task.path() / "stat").string());
    const auto at = stat.rfind(')');
    if (at == std::string::npos || at + 2 >= stat.size() || stat[at + 2] != 'T') return false;
    any = true;
  }
  return any && !ec;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_text,
                         std::chrono::milliseconds timeout) {
  CommandResult result;
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0 ||
      pipe2(err_pipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return result;
  }
  auto args = ArgvOf(argv);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execv(args[0], args.data());
    std::fprintf(stderr, "execv %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (!stdin_text.empty()) {
    // Small inputs only: fits the pipe buffer.
    ssize_t ignored = write(in_pipe[1], stdin_text.data(), stdin_text.size());
    (void)ignored;
  }
  close(in_pipe[1]);

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = result.timed_out ? -1 : ExitCodeOf(status);
  return result;
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_args, bool wait_ready) {
  dir_ = MakeTempDir();
  args_ = {"--ready-file", dir_ + "/ready"};
  bool has_state_dir = false;
  for (size_t i = 0; i < extra_args.size(); ++i) {
    const std::string& a = extra_args[i];
    if (a == "--state-dir" && i + 1 < extra_args.size()) {
      state_dir_ = extra_args[i + 1];
      has_state_dir = true;
    } else if (a.rfind("--state-dir=", 0) == 0) {
      state_dir_ = a.substr(12);
      has_state_dir = true;
    }
  }
  if (!has_state_dir) {
    state_dir_ = dir_ + "/state";
    args_.insert(args_.end(), {"--state-dir", state_dir_});
  }
  args_.insert(args_.end(), extra_args.begin(), extra_args.end());
  // Ports outside the kernel's ephemeral range (FreeLoopbackPort): Restart
  // listens on the same ones, and an ephemeral port could meanwhile become
  // another process's source port ("address in use"). Port 0 where there
  // is no room below that range.
  const auto port = [] { return "127.0.0.1:" + std::to_string(FreeLoopbackPort(false)); };
  Launch({"--admin-listen", port(), "--data-listen", port(), "--metrics-listen", port()},
         wait_ready);
}

bool DaemonProcess::Restart(bool wait_ready) {
  if (pid_ > 0) {
    ADD_FAILURE() << "DaemonProcess::Restart: rackhubd is still running (Stop or Kill it first)";
    return false;
  }
  if (admin_address_.empty() || data_address_.empty()) {
    ADD_FAILURE() << "DaemonProcess::Restart: the first start never became ready";
    return false;
  }
  std::vector<std::string> ports = {"--admin-listen", admin_address_, "--data-listen",
                                    data_address_};
  if (!metrics_address_.empty()) ports.insert(ports.end(), {"--metrics-listen", metrics_address_});
  Launch(ports, wait_ready);
  return wait_ready ? started_ : pid_ > 0;
}

void DaemonProcess::Launch(const std::vector<std::string>& ports, bool wait) {
  started_ = false;
  const std::string ready = dir_ + "/ready";
  std::remove(ready.c_str());
  std::vector<std::string> argv = {BinPath("rackhubd")};
  argv.insert(argv.end(), ports.begin(), ports.end());
  argv.insert(argv.end(), args_.begin(), args_.end());
  auto args = ArgvOf(argv);
  const std::string log = dir_ + "/rackhubd.log";
  // A restart appends: Log() shows every run.
  const int flags = O_WRONLY | O_CREAT | (starts_++ == 0 ? O_TRUNC : O_APPEND);
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log.c_str(), flags, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  if (wait) WaitReady();
}

bool DaemonProcess::WaitReady() {
  if (started_) return true;
  if (pid_ <= 0) return false;
  const std::string ready = dir_ + "/ready";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      ADD_FAILURE() << "rackhubd exited early with " << ExitCodeOf(status) << ":\n" << Log();
      pid_ = -1;
      return false;
    }
    const std::string text = ReadFile(ready);
    // The ready file holds "admin HOST:PORT" and "data HOST:PORT" lines, and
    // "metrics HOST:PORT" unless metrics are off.
    if (!text.empty() && text.back() == '\n') {
      std::istringstream in(text);
      std::string what, addr;
      while (in >> what >> addr) {
        if (what == "admin") admin_address_ = addr;
        if (what == "data") data_address_ = addr;
        if (what == "metrics") metrics_address_ = addr;
      }
      started_ = !admin_address_.empty();
      if (started_) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "rackhubd did not become ready in 20 s:\n" << Log();
  return false;
}

std::string DaemonProcess::Log() const { return ReadFile(dir_ + "/rackhubd.log"); }

int DaemonProcess::Stop(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int status = 0;
  const pid_t pid = pid_;
  if (WaitFor(pid, timeout, &status)) {
    pid_ = -1;
    return ExitCodeOf(status);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  pid_ = -1;
  return -1;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Stop(SIGTERM);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}


ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  auto args = ArgvOf(argv);
  pid_ = fork();
  if (pid_ == 0) {
    if (!log_path.empty()) {
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
    }
    execv(args[0], args.data());
    std::fprintf(stderr, "execv %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  if (pid_ < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return exit_code_;
  int status = 0;
  if (!WaitFor(pid_, timeout, &status)) return -1;
  pid_ = -1;
  exit_code_ = ExitCodeOf(status);
  return exit_code_;
}

void ChildProcess::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

std::string OutputField(const std::string& out, const std::string& name) {
  const std::string prefix = name + ":";
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, prefix.size(), prefix) == 0) {
      const std::string v = line.substr(first + prefix.size());
      const size_t s = v.find_first_not_of(" \t");
      if (s == std::string::npos) return "";
      return v.substr(s, v.find_last_not_of(" \t\r") + 1 - s);
    }
    pos = end + 1;
  }
  return "";
}

}  // namespace rackhub::testing
