#include "daemon.h"

#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "hub.h"
#include "lanes.h"
#include "logging.h"

#ifndef RACKHUB_VERSION
#define RACKHUB_VERSION "0.0.0"
#endif

namespace rackhub::server {
namespace {

// Writes the ready file atomically (temp file + rename) so readers never see
// a partial one.
bool WriteReadyFile(const std::string& path, const std::string& admin, const std::string& data,
                    const std::string& metrics) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "admin " << admin << "\n" << "data " << data << "\n";
    if (!metrics.empty()) f << "metrics " << metrics << "\n";
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int RunDaemon(const Config& config, const std::vector<std::string>& notices) {
  // Block the stop signals before any thread starts: every thread inherits the
  // mask and only the main thread takes them, with sigtimedwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A peer closing a socket must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  SetUpLogging(config.log_level);
  spdlog::info("rackhubd {} starting", RACKHUB_VERSION);
  for (const std::string& notice : notices) spdlog::info("{}", notice);

  Hub hub(config);
  if (Status s = hub.Start(); !s.ok()) {
    spdlog::critical("{}", s.message());
    hub.Stop(std::chrono::milliseconds(0));
    return s.code() == StatusCode::kFailedPrecondition ? kExitConfigError : kExitRuntimeError;
  }
  const std::string& admin_address = hub.admin_address();
  const std::string& data_address = hub.data_address();
  if (!config.ready_file.empty() &&
      !WriteReadyFile(config.ready_file, admin_address, data_address, hub.metrics_address())) {
    spdlog::error("ready_file: cannot write '{}'", config.ready_file);
  }
  sd_notifyf(0, "READY=1\nSTATUS=serving: admin %s, data %s, %u lanes", admin_address.c_str(),
             data_address.c_str(), hub.lane_count());

  // Watchdog: ping at half the interval systemd asked for, and only while
  // every lane thread ticks (a wedged lane must get us restarted).
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  const auto wait_step = watchdog ? std::chrono::microseconds(watchdog_usec / 2)
                                  : std::chrono::microseconds(std::chrono::seconds(1));
  const auto lane_max_age = std::max<std::chrono::steady_clock::duration>(
      std::chrono::microseconds(watchdog_usec / 2), 10 * LaneSet::kHeartbeatPeriod);
  if (watchdog) spdlog::info("systemd watchdog every {} ms", watchdog_usec / 2000);

  int signal_number = 0;
  while (signal_number <= 0) {
    timespec ts{};
    ts.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(wait_step).count();
    ts.tv_nsec = (std::chrono::duration_cast<std::chrono::nanoseconds>(wait_step) -
                  std::chrono::seconds(ts.tv_sec))
                     .count();
    signal_number = sigtimedwait(&stop_signals, nullptr, &ts);
    if (signal_number < 0 && errno != EAGAIN && errno != EINTR) {
      spdlog::critical("sigtimedwait: {}", std::strerror(errno));
      break;
    }
    if (watchdog && signal_number <= 0) {
      if (hub.lanes().AllLanesAlive(lane_max_age)) {
        sd_notify(0, "WATCHDOG=1");
      } else {
        spdlog::error("a lane stopped ticking: withholding the watchdog ping");
      }
    }
  }

  spdlog::info("received {}, draining", signal_number > 0 ? strsignal(signal_number) : "error");
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  hub.Stop();
  spdlog::info("stopped");
  return signal_number > 0 ? kExitOk : kExitRuntimeError;
}

}  // namespace rackhub::server
