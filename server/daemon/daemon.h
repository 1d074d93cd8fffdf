// rackhubd's process lifecycle: builds the registry, lanes, admin server and
// data-plane listener from a validated Config, reports readiness to systemd,
// feeds the watchdog while the lanes make progress, and drains on SIGTERM or
// SIGINT. Run() is called once, from the main thread.
#pragma once

#include "config.h"

namespace rackhub::server {

// Exit codes of rackhubd.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;  // e.g. cannot bind a listen address
inline constexpr int kExitConfigError = 78;  // EX_CONFIG: systemd should not restart

// REQUIRES: config passed ValidateConfig. `notices` are logged once logging
// is set up (ParseResult::notices). Returns the process exit code.
int RunDaemon(const Config& config, const std::vector<std::string>& notices = {});

}  // namespace rackhub::server
