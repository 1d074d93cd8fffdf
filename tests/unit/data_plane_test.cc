// Tests of the DataPlane's hub-wide state (server/lanes/data_plane.h) on a hub
// running in this process: what it keeps per tenant goes with the tenant.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "data_plane.h"
#include "hub.h"
#include "registry.h"

namespace rackhub::server {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Hub> StartHub() {
  std::vector<const char*> argv = {"rackhubd", "--admin-listen", "127.0.0.1:0", "--data-listen",
                                   "127.0.0.1:0", "--no-pin-lanes", "--no-metrics", "--in-memory", "--lanes", "2",
                                   "--transport", "tcp"};
  const ParseResult parsed = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(parsed.ok());
  auto hub = std::make_unique<Hub>(parsed.config);
  const Status s = hub->Start();
  EXPECT_TRUE(s.ok()) << s.message();
  return hub;
}

// Runs an empty task on every lane and waits for them: what the lanes were
// given before has run. False if a lane did not get to it in 30 s.
bool DrainLanes(DataPlane& plane) {
  std::vector<std::future<void>> done;
  for (uint32_t i = 0; i < plane.lane_count(); ++i) {
    auto marker = std::make_shared<std::promise<void>>();
    done.push_back(marker->get_future());
    plane.OnLane(i, [marker](Lane&) { marker->set_value(); });
  }
  for (auto& d : done) {
    if (d.wait_for(30s) != std::future_status::ready) return false;
  }
  return true;
}

// Lanes make a tenant's runtimes on first use (a WELCOME, a DECLARE, a lost
// worker's recovery) while a deletion erases them from the admin thread. One
// made just after the tenant or key was deleted (e.g. a worker's close that
// raced with the deletion) must not stay behind for good: it did, a leak per
// deletion, found by fuzz/hub/hub_lane_fuzz under LeakSanitizer.
TEST(DataPlaneTest, RuntimesMadeAfterADeletionDoNotStay) {
  auto hub = StartHub();
  ASSERT_TRUE(hub);
  Registry& registry = hub->registry();
  DataPlane& plane = hub->data_plane();
  TenantSpec spec;
  spec.name = "job";
  spec.workers_per_rack = 2;
  TenantInfo tenant;
  std::string token;
  ASSERT_TRUE(registry.CreateTenant(spec, &tenant, &token).ok());
  KeyInfo keys[2];
  for (int i = 0; i < 2; ++i) {
    KeySpec key;
    key.tenant = "job";
    key.name = "w" + std::to_string(i);
    key.elements = 5000;
    ASSERT_TRUE(registry.CreateKey(key, &keys[i]).ok());
  }
  const uint32_t h = tenant.handle;
  plane.KeyRuntimeFor(h, keys[0].id);  // as a WELCOME would
  EXPECT_TRUE(plane.HasRuntimes(h, keys[0].id));

  // A key deleted, then looked up by a lane that had not heard yet.
  ASSERT_TRUE(registry.DeleteKey("job", "w0").ok());
  EXPECT_NE(plane.KeyRuntimeFor(h, keys[0].id), nullptr);
  EXPECT_FALSE(plane.HasRuntimes(h, keys[0].id));
  EXPECT_TRUE(plane.HasRuntimes(h));

  // The tenant deleted, then a lane's late lookups and a lost worker's recovery.
  ASSERT_TRUE(registry.DeleteTenant("job").ok());
  EXPECT_FALSE(plane.HasRuntimes(h));
  EXPECT_NE(plane.TenantRuntimeFor(h), nullptr);
  EXPECT_NE(plane.KeyRuntimeFor(h, keys[1].id), nullptr);
  EXPECT_FALSE(plane.HasRuntimes(h));
  plane.WorkerLost(h, 1, "rank 1 lane 0: peer closed the connection", 0);
  // The recovery's lane work is three rounds over every lane, each posted by
  // the round before (DataPlane::Recover): three drains run after all of it.
  for (int round = 0; round < 3; ++round) ASSERT_TRUE(DrainLanes(plane)) << "round " << round;
  EXPECT_FALSE(plane.HasRuntimes(h));
  hub->Stop(0ms);
}

}  // namespace
}  // namespace rackhub::server
