// Test support: waiting for an event instead of a fixed time
// (docs/testing.md, "Flakiness rules"). A test names what it waits for (a
// log line, a counter of the hub, a state); the deadline is generous, so
// only an event that never comes ends the wait, and then the failure says
// which. Single-threaded use from a test body.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::testing {

// Long enough for any event on a loaded 2-core machine; what takes longer
// is a bug.
inline constexpr std::chrono::milliseconds kEventTimeout{30000};

// Polls `done` until it is true. Fails (naming `what`) once `timeout`
// passed without it.
inline ::testing::AssertionResult WaitUntil(
    const std::string& what, const std::function<bool()>& done,
    std::chrono::milliseconds timeout = kEventTimeout,
    std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return ::testing::AssertionFailure()
             << "waited " << timeout.count() << " ms for " << what << ": it never happened";
    }
    std::this_thread::sleep_for(poll);
  }
  return ::testing::AssertionSuccess();
}

// Waits until the daemon's log holds `needle` `times` times or more; the
// failure shows the log.
inline ::testing::AssertionResult WaitForLog(const DaemonProcess& daemon, const std::string& needle,
                                             int times = 1,
                                             std::chrono::milliseconds timeout = kEventTimeout) {
  const auto count = [&] {
    const std::string log = daemon.Log();
    int n = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
      ++n;
    }
    return n;
  };
  auto r = WaitUntil(
      "the log line '" + needle + "' (" + std::to_string(times) + "x)",
      [&] { return count() >= times; }, timeout, std::chrono::milliseconds(20));
  if (!r) r << "\n--- log:\n" << daemon.Log();
  return r;
}

// The hub's own figures (StatsService.GetStats through the admin API at
// `admin`): what a test can watch for the data plane's events, on every
// transport. An empty response when the call fails (the wait goes on).
inline admin::v1::GetStatsResponse HubStats(const std::string& admin,
                                            const std::string& tenant = "") {
  auto stub = admin::v1::StatsService::NewStub(
      grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  admin::v1::GetStatsRequest req;
  req.set_tenant(tenant);
  admin::v1::GetStatsResponse resp;
  if (!stub->GetStats(&ctx, req, &resp).ok()) return {};
  return resp;
}

// One tenant's figures (a default TenantStats when it is unknown).
inline admin::v1::TenantStats TenantStatsOf(const std::string& admin, const std::string& tenant) {
  const auto resp = HubStats(admin, tenant);
  return resp.tenants_size() > 0 ? resp.tenants(0) : admin::v1::TenantStats();
}

// Waits until the hub at `admin` counted `pushes` PUSH frames of `tenant`
// into a sum (a push is counted on the lane as it joins its update).
inline ::testing::AssertionResult WaitForPushes(const std::string& admin, const std::string& tenant,
                                                uint64_t pushes) {
  uint64_t seen = 0;
  auto r = WaitUntil(std::to_string(pushes) + " pushes of tenant '" + tenant + "' at the hub", [&] {
    seen = TenantStatsOf(admin, tenant).pushes();
    return seen >= pushes;
  });
  if (!r) r << " (it counted " << seen << ")";
  return r;
}

}  // namespace rackhub::testing
