// A bounded tenant spanning racks whose one hub goes silent (issue 31;
// docs/consistency.md "Across racks", docs/cluster.md "Limits"), with real
// hubs that find each other in a real etcd (lease TTL 2 s) on loopback.
// Rack 2's hub is frozen with SIGSTOP: its TCP links stay open (the kernel
// still acknowledges and answers keepalive probes), so only its etcd
// lease's expiry tells (RackLost):
//  - the other racks' replies held by rack 2's worker are released at
//    their homes (PARAMS, not the straggler timeout's WORKER_LOST);
//  - a relay to rack 2's hub fails with a non-fatal WORKER_LOST naming the
//    rack and its lease;
//  - once the hub runs again and is back in etcd, the job goes on after a
//    Pull.
#include <signal.h>

#include <chrono>

#include "cluster_fixture.h"
#include "multi_rack_bounded.h"

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support
using namespace std::chrono_literals;

constexpr uint32_t kChunks = 3;  // one lane: chunk c is homed on rack c

TEST(MultiRackBoundedLeaseTest, ASilentHubsLeaseExpiryReleasesAndFailsItsRack) {
  testing::EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.started());
  testing::Cluster cluster(etcd.endpoints(), 3);  // straggler timeout 20 s
  ASSERT_TRUE(cluster.started());
  // One registry: created on rack 0's hub, known to every hub.
  CreateTenant(cluster.hub(0).admin_address(), kBounded1, 1, kChunks);
  for (int h = 1; h < 3; ++h) {
    ASSERT_TRUE(testing::WaitUntil("key 'w' on hub " + std::to_string(h), [&] {
      return testing::Layout(cluster.hub(h).admin_address(), "t").count("w") == 1;
    }));
  }
  std::vector<Worker> ws;
  for (uint32_t r = 0; r < 3; ++r) ws.push_back(Connect(cluster.hub(r).data_address(), 1, r, 0));
  for (auto& w : ws) {  // each counts at every home
    for (uint32_t c = 0; c < kChunks; ++c) w.Pull(c);
    for (uint32_t c = 0; c < kChunks; ++c) EXPECT_EQ(ParamsOf(w.link->Receive()).clock, 0u);
  }
  Worker &a = ws[0], &b = ws[1];
  // a and b step twice on chunks 0 and 1 (homed on racks 0 and 1): the
  // second step, at 2 > 0 + 1, is held by rack 2's worker at both homes.
  for (uint64_t i = 0; i < 2; ++i) {
    for (Worker* w : {&a, &b}) {
      for (uint32_t c = 0; c < 2; ++c) w->Push(c, i, testing::Floats(kElems, 1.0f));
      if (i == 0) {
        for (int k = 0; k < 2; ++k) EXPECT_EQ(ParamsOf(w->link->Receive()).clock, 1u);
      } else {
        ExpectHeld(*w, 2);
      }
    }
  }
  // Rack 2's hub freezes; a relays a push to it (chunk 2's home).
  ASSERT_EQ(kill(cluster.hub(2).pid(), SIGSTOP), 0);
  ASSERT_TRUE(testing::WaitUntil("rack 2's hub stopped", [&] { return testing::StoppedBySignal(cluster.hub(2).pid()); }));
  const uint64_t relayed = a.Push(2, 0, testing::Floats(kElems, 1.0f));
  for (Worker* w : {&a, &b}) {
    for (int k = 0; k < (w == &a ? 3 : 2); ++k) {
      // Within the lease's expiry and its notice (TTL 2 s), well before the
      // straggler timeout (20 s) or the relay deadline (30 s).
      auto f = w->link->Receive(15s);
      if (f && f->h.request_id == relayed) {
        ExpectError(f, net::WireError::kWorkerLost,
                    "the hub of rack 2 left the cluster (its etcd lease is gone); rack 2's hub "
                    "is home to chunk 2 of key 'w'",
                    false);
        continue;
      }
      const Reply r = ParamsOf(f);
      EXPECT_EQ(r.clock, 2u) << "a held reply, released: rack 2's worker is gone at its home";
      EXPECT_EQ(r.slowest, 2u);
    }
  }
  EXPECT_TRUE(testing::WaitForLog(cluster.hub(0), "the hub of rack 2 left etcd"));
  // It runs again and is back in etcd: every worker Pulls chunk 2 and goes
  // on from the count its home tells it (a's relayed push may have been
  // applied there when the hub woke up).
  ASSERT_EQ(kill(cluster.hub(2).pid(), SIGCONT), 0);
  for (int h = 0; h < 2; ++h) {
    EXPECT_TRUE(testing::WaitForLog(cluster.hub(h), "the hub of rack 2 is back in etcd"));
  }
  std::vector<uint64_t> pulled;
  for (auto& w : ws) {
    w.Pull(2);
    pulled.push_back(ParamsOf(w.link->Receive(15s)).clock);
  }
  EXPECT_EQ(pulled[1], 0u);
  EXPECT_EQ(pulled[2], 0u);
  // b and c first (to 1), then a (to at most 2 <= 1 + 1: never held).
  for (uint32_t k : {1u, 2u, 0u}) {
    ws[k].Push(2, pulled[k], testing::Floats(kElems, 1.0f));
    const Reply r = ParamsOf(ws[k].link->Receive(15s));
    EXPECT_EQ(r.clock, pulled[k] + 1) << "rack " << k;
    ExpectBound(r, kBounded1, 3);
  }
}

}  // namespace
}  // namespace rackhub
