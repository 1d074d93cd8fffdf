// Bounded and async tenants spanning racks (issue 31, item 3;
// docs/consistency.md "Across racks"), with real hubs on loopback. Such a
// tenant behaves as one hub holding every rack's workers: each chunk lives
// at its home hub, the other racks' hubs relay their workers' frames there.
//  - 2 and 3 racks, bounded:1 and async, integer gradients whose every sum
//    is exact: the final parameters equal a reference computed from the
//    inputs and one flat hub serving every rack, bit for bit; every reply's
//    (updates, slowest) suffix satisfies the guarantee with W = all racks'
//    workers;
//  - a worker of another rack counts at a home once connected (its hub's
//    notice), before any request of its own;
//  - the bound holds across racks: a rack-1 worker that stops pushing holds
//    a rack-0 worker's reply (answered only after the slow one pushes), and
//    the straggler timeout's WORKER_LOST names "rack 1 rank 0";
//  - a worker of the other rack whose connection dies releases the held
//    replies (member-gone notice, and locally);
//  - a lost hub link: relayed requests to a killed home fail with
//    WORKER_LOST naming the rack, and the job goes on after a Pull when the
//    hub is back; a killed non-home hub releases the replies its workers held;
//  - a from_client key is INITed by rank 0 of rack 0 through the relay;
//  (The relay frames on the hub links themselves: multi_rack_relay_link_test.)
#include <map>

#include "multi_rack_bounded.h"

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support


// Every worker of every rack pushes `iterations` times each chunk (one
// round per iteration: all pushes, then all replies); the final parameters
// (Pulled by every worker, which must agree) are returned.
std::vector<float> RunJob(Racks& racks, uint32_t rack_count, Mode mode, uint32_t workers,
                          uint32_t chunks, uint64_t iterations) {
  for (uint32_t h = 0; h < racks.hubs(); ++h) CreateTenant(racks.hub(h).admin_address(), mode, workers, chunks);
  const uint32_t all = rack_count * workers;
  std::vector<Worker> ws;
  for (uint32_t r = 0; r < rack_count; ++r) {
    for (uint32_t k = 0; k < workers; ++k) ws.push_back(Connect(racks, r, k));
  }
  // Each worker Pulls every chunk first: it counts at every home from its
  // first request there (its hub announces it; docs/consistency.md).
  for (auto& w : ws) {
    for (uint32_t c = 0; c < chunks; ++c) w.Pull(c);
    for (uint32_t c = 0; c < chunks; ++c) EXPECT_EQ(ParamsOf(w.On(c).Receive()).clock, 0u);
  }
  for (uint64_t i = 0; i < iterations; ++i) {
    for (auto& w : ws) {
      for (uint32_t c = 0; c < chunks; ++c) {
        w.Push(c, i, testing::Floats(Gradient(all, w.rack, w.rank, i, c)));
      }
    }
    for (auto& w : ws) {
      for (uint32_t c = 0; c < chunks; ++c) {
        const Reply r = ParamsOf(w.On(c).Receive());
        EXPECT_EQ(r.clock, i + 1) << "rack " << w.rack << " rank " << w.rank;
        ExpectBound(r, mode, all);
      }
    }
  }
  return PullAll(ws, chunks, uint64_t{all} * iterations);
}

// With 2 lanes, 12 chunks: tenant chunk g is homed on rack (g / 2) % R, so
// every rack is home to chunks of both lanes (relays on the owner lane's
// link, per-lane member notices).
TEST(MultiRackBoundedTest, ExactSumsEqualTheReferenceAndOneFlatHub) {
  constexpr uint32_t kWorkers = 2;
  constexpr uint64_t kIterations = 3;
  for (const uint32_t lanes : {1u, 2u}) {
    const uint32_t chunks = lanes == 1 ? 4 : 12;
    for (const uint32_t rack_count : {2u, 3u}) {
      for (const Mode mode : {kBounded1, kAsync}) {
        SCOPED_TRACE(std::to_string(rack_count) + " racks, " + std::to_string(lanes) +
                     " lane(s), " + mode.name);
        const auto reference = Reference(rack_count, kWorkers, chunks, kIterations);
        std::vector<float> hierarchical, flat;
        {
          Racks racks(rack_count, false, {}, {}, lanes);
          hierarchical = RunJob(racks, rack_count, mode, kWorkers, chunks, kIterations);
        }
        {
          Racks racks(rack_count, true, {}, {}, lanes);
          flat = RunJob(racks, rack_count, mode, kWorkers, chunks, kIterations);
        }
        EXPECT_TRUE(testing::SameBits(hierarchical, reference)) << "hierarchical vs reference";
        EXPECT_TRUE(testing::SameBits(flat, reference)) << "flat vs reference";
      }
    }
  }
}

// Two racks of one worker; key "w" has 2 chunks: chunk 0 homed on rack 0,
// chunk 1 on rack 1. Both workers Pull both chunks first, so each counts
// as live at both homes (the one on the other rack via its hub's notice).
struct TwoRacks {
  explicit TwoRacks(Mode mode, std::vector<std::string> extra = {})
      : racks(2, false, std::move(extra)) {
    for (uint32_t h = 0; h < 2; ++h) CreateTenant(racks.hub(h).admin_address(), mode, 1, 2);
    a = Connect(racks, 0, 0);
    b = Connect(racks, 1, 0);
    for (Worker* w : {&a, &b}) {
      w->Pull(0);
      w->Pull(1);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(ParamsOf(w->link->Receive()).clock, 0u);
    }
  }
  // `w` pushes both chunks at `iteration` (ones).
  static void PushBoth(Worker& w, uint64_t iteration) {
    for (uint32_t c = 0; c < 2; ++c) w.Push(c, iteration, testing::Floats(kElems, 1.0f));
  }
  static void ExpectHeld(Worker& w) { bounded_test::ExpectHeld(w, 2); }
  Racks racks;
  Worker a, b;
};

TEST(MultiRackBoundedTest, TheBoundCountsTheSlowestOfEveryRack) {
  TwoRacks t(kBounded1, {"--straggler-timeout-ms", "1500"});
  TwoRacks::PushBoth(t.a, 0);  // a at 1 <= 0 + 1: answered
  for (int i = 0; i < 2; ++i) ExpectBound(ParamsOf(t.a.link->Receive()), kBounded1, 2);
  TwoRacks::PushBoth(t.a, 1);  // a at 2 > 0 + 1: held by b (rack 1)
  TwoRacks::ExpectHeld(t.a);
  TwoRacks::PushBoth(t.b, 0);  // b catches up: b answered, a's held replies released
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ParamsOf(t.b.link->Receive()).clock, 1u);
  for (int i = 0; i < 2; ++i) {
    const Reply r = ParamsOf(t.a.link->Receive());
    EXPECT_EQ(r.clock, 2u);
    EXPECT_EQ(r.slowest, 1u);
    EXPECT_EQ(r.updates, 3u);
    ExpectBound(r, kBounded1, 2);
  }
  // a runs ahead again; b stays put: the straggler timeout names b.
  TwoRacks::PushBoth(t.a, 2);
  for (int i = 0; i < 2; ++i) {
    ExpectError(t.a.link->Receive(std::chrono::seconds(15)), net::WireError::kWorkerLost,
                "waiting for rack 1 rank 0 at 1", false);
  }
}

// A worker that only connected (no request yet) counts at the other rack's
// home once its hub's notice is there (the home logs the relayed member).
TEST(MultiRackBoundedTest, AConnectedWorkerOfTheOtherRackIsWaitedFor) {
  Racks racks(2, false);
  for (uint32_t h = 0; h < 2; ++h) CreateTenant(racks.hub(h).admin_address(), kBounded0, 1, 2);
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  for (uint32_t h = 0; h < 2; ++h) {
    const std::string other = std::to_string(1 - h);
    ASSERT_TRUE(testing::WaitForLog(racks.hub(h), "tenant 't' rack " + other + " rank 0 " +
                                                      "(generation 0) connected on lane 0 from " +
                                                      "rack " + other + "'s hub"));
  }
  TwoRacks::PushBoth(a, 0);  // a at 1 > 0 + 0: held by b on both chunks
  TwoRacks::ExpectHeld(a);
  TwoRacks::PushBoth(b, 0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 1u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 1u);
}

// A from_client key: rank 0 of rack 0 INITs every chunk, the one homed on
// rack 1 through its hub; a rack-1 worker's PULL waits for the values at
// the home; its INIT (relayed to rack 0's hub) is refused by name, fatally,
// as on one hub.
TEST(MultiRackBoundedTest, FromClientInitCrossesRacks) {
  Racks racks(2, false);
  for (uint32_t h = 0; h < 2; ++h) {
    CreateTenant(racks.hub(h).admin_address(), kBounded1, 1, 2, pb::FROM_CLIENT);
  }
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  const uint64_t waiting = b.Pull(0);  // homed on rack 0: relayed, held there
  for (uint32_t c = 0; c < 2; ++c) {
    FrameHeader init = a.Header(net::Opcode::kInit, c);
    a.link->Send(init, testing::Floats(kElems, 2.0f + static_cast<float>(c)));
  }
  // (INIT replies and PULLs answered by an INIT carry no versions suffix,
  // as on one hub.)
  const auto plain = [](const std::optional<Frame>& f) {
    EXPECT_TRUE(f && f->h.opcode == net::Opcode::kParams) << Describe(f);
    return f && f->payload.size() >= 4 * kElems
               ? testing::AsFloats(f->payload.substr(0, 4 * kElems))
               : std::vector<float>();
  };
  std::vector<float> got[2];
  for (uint32_t c = 0; c < 2; ++c) {
    const auto f = a.link->Receive();
    if (f) got[f->h.chunk % 2] = plain(f);
  }
  EXPECT_EQ(got[0], std::vector<float>(kElems, 2.0f));
  EXPECT_EQ(got[1], std::vector<float>(kElems, 3.0f));
  const auto pulled = b.link->Receive();
  EXPECT_TRUE(pulled && pulled->h.request_id == waiting) << Describe(pulled);
  EXPECT_EQ(plain(pulled), std::vector<float>(kElems, 2.0f)) << "rack 0's INIT, from its home";
  b.Pull(1);
  EXPECT_EQ(ParamsOf(b.link->Receive()).params, std::vector<float>(kElems, 3.0f))
      << "chunk 1's values came to rack 1's hub through the relay";
  b.link->Send(b.Header(net::Opcode::kInit, 0), testing::Floats(kElems, 5.0f));
  ExpectError(b.link->Receive(), net::WireError::kInvalidArgument,
              "only rank 0 of rack 0 may INIT a key of a tenant spanning racks (this is rank 0 "
              "of rack 1");
  EXPECT_TRUE(b.link->ClosedByPeer());
}

// A relayed PULL of a from_client key waits at the home for the INIT; past
// the relay deadline (straggler timeout 100 ms + 10 s) it fails at the
// worker's hub, and the worker Pulls again: the home drops the expired
// waiter (its answer would only be dropped by rack 1's hub), and the INIT
// answers the new PULL.
TEST(MultiRackBoundedTest, AnExpiredRelayedPullStopsWaitingForTheInit) {
  Racks racks(2, false, {"--straggler-timeout-ms", "100"});
  for (uint32_t h = 0; h < 2; ++h) {
    CreateTenant(racks.hub(h).admin_address(), kAsync, 1, 2, pb::FROM_CLIENT);
  }
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  const uint64_t first = b.Pull(0);  // homed on rack 0: waits there
  const auto failed = b.link->Receive(std::chrono::seconds(30));
  ExpectError(failed, net::WireError::kWorkerLost,
              "no answer from the hub of rack 0 within 10 s; rack 0's hub is home to chunk 0",
              false);
  EXPECT_TRUE(failed && failed->h.request_id == first) << Describe(failed);
  const uint64_t again = b.Pull(0);
  ASSERT_TRUE(testing::WaitForLog(racks.hub(0), "dropped 1 relayed PULL(s) of key 'w' chunk 0"));
  a.link->Send(a.Header(net::Opcode::kInit, 0), testing::Floats(kElems, 2.0f));
  EXPECT_EQ(a.link->Receive()->h.opcode, net::Opcode::kParams);
  const auto pulled = b.link->Receive();
  ASSERT_TRUE(pulled && pulled->h.opcode == net::Opcode::kParams) << Describe(pulled);
  EXPECT_EQ(pulled->h.request_id, again);
  EXPECT_EQ(testing::AsFloats(pulled->payload.substr(0, 4 * kElems)),
            std::vector<float>(kElems, 2.0f));
}

TEST(MultiRackBoundedTest, ALostWorkerOfTheOtherRackReleasesHeldReplies) {
  TwoRacks t(kBounded0);
  TwoRacks::PushBoth(t.a, 0);  // a at 1 > 0 + 0: held by b on both chunks
  TwoRacks::ExpectHeld(t.a);
  t.b.link.reset();  // b's connection dies (as its process's would under kill -9)
  for (int i = 0; i < 2; ++i) {
    const Reply r = ParamsOf(t.a.link->Receive(std::chrono::seconds(10)));
    EXPECT_EQ(r.clock, 1u) << "released by b's loss (at its home and as a relayed member)";
  }
}

TEST(MultiRackBoundedTest, AKilledNonHomeHubReleasesTheRepliesItsWorkersHeld) {
  TwoRacks t(kBounded0);
  t.a.Push(0, 0, testing::Floats(kElems, 1.0f));  // chunk 0, homed here: held by b
  const uint64_t pull = t.a.Pull(0);
  EXPECT_EQ(ParamsOf(t.a.link->Receive()).request, pull) << "the push is held";
  EXPECT_EQ(t.racks.hub(1).Stop(SIGKILL), 128 + SIGKILL);
  const Reply r = ParamsOf(t.a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(r.clock, 1u) << "released when the link of rack 1's hub was lost";
}

// A home stopped (SIGTERM) while a worker of another rack is relayed to it:
// the lane closes the relayed connection too and reports itself drained, so
// the stop does not wait out its grace period for it (both rank 0s, its own
// rack's and the relayed one of rack 0, say they disconnected). Before, the
// relayed connection's close was posted through the lane's gate, closed by
// then: it never ran.
TEST(MultiRackBoundedTest, AHomeStoppedWithARelayedWorkerClosesItsConnection) {
  TwoRacks t(kBounded0);  // a's PULL of chunk 1 was relayed to rack 1's hub
  EXPECT_EQ(t.racks.hub(1).Stop(SIGTERM), 0);
  const std::string log = t.racks.hub(1).Log();
  size_t closed = 0;
  for (size_t at = log.find("tenant 't' rank 0 lane 0 disconnected"); at != std::string::npos;
       at = log.find("tenant 't' rank 0 lane 0 disconnected", at + 1)) {
    ++closed;
  }
  EXPECT_EQ(closed, 2u) << log;
}

TEST(MultiRackBoundedTest, AKilledHomeFailsRelayedRequestsAndThePullResumes) {
  TwoRacks t(kBounded1);
  EXPECT_EQ(t.racks.hub(1).Stop(SIGKILL), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  t.a.Push(1, 0, testing::Floats(kElems, 1.0f));  // chunk 1's home was rack 1
  ExpectError(t.a.link->Receive(std::chrono::seconds(15)), net::WireError::kWorkerLost,
              "rack 1", false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "a lost home is an error within a bounded time, not a hang";
  // Rack 1's hub comes back (without state: the tenant is created again);
  // a Pulls, then goes on from the count the home tells it.
  t.racks.Start(1);
  CreateTenant(t.racks.hub(1).admin_address(), kBounded1, 1, 2);
  t.a.Pull(1);
  const Reply pulled = ParamsOf(t.a.link->Receive(std::chrono::seconds(10)));
  t.a.Push(1, pulled.clock, testing::Floats(kElems, 1.0f));
  const Reply pushed = ParamsOf(t.a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(pushed.clock, pulled.clock + 1);
  EXPECT_EQ(pushed.params[0], pulled.params[0] - 0.5f) << "ones over 2 workers, lr 1";
}

// A from_client key whose chunk 1's home (rack 1's hub) restarts without
// state: no other hub keeps the values, so a's relayed PULL waits there
// and its relayed PUSH gets a non-fatal NOT_READY naming the home (a's
// connection to its own hub stays open); rank 0 of rack 0 INITs the chunk
// again, the PULL is answered with those values and the push goes on.
TEST(MultiRackBoundedTest, AHomeRestartedWithoutStateWantsTheInitAgain) {
  Racks racks(2, false);
  for (uint32_t h = 0; h < 2; ++h) {
    CreateTenant(racks.hub(h).admin_address(), kAsync, 1, 2, pb::FROM_CLIENT);
  }
  Worker a = Connect(racks, 0, 0);
  a.link->Send(a.Header(net::Opcode::kInit, 1), testing::Floats(kElems, 2.0f));
  EXPECT_EQ(a.link->Receive()->h.opcode, net::Opcode::kParams);
  EXPECT_EQ(racks.hub(1).Stop(SIGKILL), 128 + SIGKILL);
  racks.Start(1);
  CreateTenant(racks.hub(1).admin_address(), kAsync, 1, 2, pb::FROM_CLIENT);
  const uint64_t pull = a.Pull(1);  // relayed; waits at the home for an INIT
  a.Push(1, 0, testing::Floats(kElems, 1.0f));
  const auto refused = a.link->Receive(std::chrono::seconds(10));
  ExpectError(refused, net::WireError::kNotReady,
              "key: 'w' has no initial values at chunk 1's home, rack 1's hub (rank 0 of rack 0 "
              "must INIT it, again if that hub restarted without state)",
              false);
  a.link->Send(a.Header(net::Opcode::kInit, 1), testing::Floats(kElems, 4.0f));
  std::map<uint64_t, std::optional<Frame>> replies;
  for (int i = 0; i < 2; ++i) {
    auto f = a.link->Receive(std::chrono::seconds(10));
    ASSERT_TRUE(f) << "the INIT's reply and the waiting PULL's";
    replies[f->h.request_id] = std::move(f);
  }
  ASSERT_TRUE(replies.count(pull));
  EXPECT_EQ(testing::AsFloats(replies[pull]->payload.substr(0, 4 * kElems)),
            std::vector<float>(kElems, 4.0f));
  a.Push(1, 0, testing::Floats(kElems, 1.0f));
  const Reply pushed = ParamsOf(a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(pushed.clock, 1u);
  EXPECT_EQ(pushed.params[0], 4.0f - 0.5f) << "a one over 2 workers, lr 1, from the new INIT";
}

}  // namespace
}  // namespace rackhub
