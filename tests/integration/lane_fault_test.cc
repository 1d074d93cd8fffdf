// Transport faults against a hub running in this process: worker links are
// in-memory connection pairs (net/testing) with a fault injector, so a fault
// lands at an exact byte of the stream. Each fault must end in the error
// docs/errors.md documents ("Transport faults"), for the right connections
// and nothing else: the victim's tenant peers get WORKER_LOST (non-fatal) and
// stay connected, a bystander tenant trains on bit for bit.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "connection_link.h"
#include "hub_under_test.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/net/testing/memory_connection.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using net::testing::FaultPlan;
using net::testing::MemoryConnection;
using testing::DataLink;
using testing::ExpectError;
using testing::Frame;
using testing::HubUnderTest;
using testing::Transport;
using namespace std::chrono_literals;

constexpr uint32_t kElements = 3000;  // chunks of 1024, 1024, 952 on lanes 0, 1, 0

std::string Gradient(uint32_t rank, uint64_t iteration, uint32_t first, uint32_t n) {
  std::vector<float> g(n);
  for (uint32_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>((first + i) * 7 % 101) / 64.0f + 0.01f * static_cast<float>(rank) -
           0.003f * static_cast<float>(iteration);
  }
  return std::string(reinterpret_cast<const char*>(g.data()), n * sizeof(float));
}

class LaneFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    hub_ = HubUnderTest::Start(Transport::kMemory,
                               {"--lanes", "2", "--straggler-timeout-ms", "600"}, &why);
    ASSERT_TRUE(hub_) << why;
    auto channel = grpc::CreateChannel(hub_->admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel);
    keys_ = pb::KeyService::NewStub(channel);
  }

  // A tenant with `workers` ranks (SGD lr 0.5, sum, 1024-element chunks) and
  // one fp32 key of kElements; returns the token and sets *key.
  std::string MakeTenant(const std::string& name, uint32_t workers, uint32_t* key) {
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(4096);
    req.mutable_default_optimizer()->set_type(pb::SGD);
    req.mutable_default_optimizer()->set_learning_rate(0.5);
    req.mutable_default_optimizer()->set_reduction(pb::SUM);
    pb::CreateTenantResponse resp;
    EXPECT_TRUE(tenants_->CreateTenant(&ctx, req, &resp).ok());
    grpc::ClientContext kctx;
    pb::CreateKeyRequest kreq;
    kreq.set_tenant(name);
    kreq.set_name("w");
    kreq.set_elements(kElements);
    kreq.set_dtype(pb::FP32);
    pb::Key k;
    EXPECT_TRUE(keys_->CreateKey(&kctx, kreq, &k).ok());
    *key = k.id();
    return resp.token();
  }

  // One worker: a link per lane (lane 0 holds chunks 0 and 2, lane 1 chunk 1).
  struct Worker {
    std::vector<std::unique_ptr<DataLink>> lanes;
    uint32_t handle = 0;
    std::shared_ptr<MemoryConnection> conn(uint32_t lane) {
      auto* link = dynamic_cast<testing::ConnectionLink*>(lanes[lane].get());
      return std::dynamic_pointer_cast<MemoryConnection>(link->connection());
    }
  };
  Worker Join(const std::string& tenant, const std::string& token, uint32_t rank) {
    Worker w;
    for (uint32_t lane = 0; lane < 2; ++lane) {
      w.lanes.push_back(hub_->Connect());
      w.handle = w.lanes.back()->Hello(tenant, token, rank, lane).tenant_handle();
      EXPECT_NE(w.handle, 0u) << tenant << " rank " << rank << " lane " << lane;
    }
    return w;
  }
  static net::FrameHeader Push(const Worker& w, uint32_t key, uint32_t chunk, uint64_t it) {
    net::FrameHeader h;
    h.opcode = net::Opcode::kPush;
    h.tenant = w.handle;
    h.key = key;
    h.chunk = chunk;
    h.dtype = net::DType::kFp32;
    h.iteration = it;
    h.request_id = it * 10 + chunk;
    return h;
  }
  // A HEARTBEAT round trip: every frame sent before it on that link was
  // handled by the lane.
  static void SyncWithLane(Worker& w, uint32_t lane) {
    net::FrameHeader hb;
    hb.opcode = net::Opcode::kHeartbeat;
    hb.tenant = w.handle;
    hb.request_id = 4242;
    w.lanes[lane]->Send(hb);
    const auto f = w.lanes[lane]->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kHeartbeat && f->h.request_id == 4242);
  }
  static uint32_t LaneOf(uint32_t chunk) { return chunk % 2; }
  static uint32_t First(uint32_t chunk) { return chunk * 1024; }
  static uint32_t Size(uint32_t chunk) { return chunk < 2 ? 1024 : kElements - 2048; }

  // Every rank pushes every chunk of iteration `it`; returns the parameter
  // bytes all ranks received (checked identical), chunk by chunk.
  std::string Step(std::vector<Worker>& ranks, uint32_t key, uint64_t it) {
    for (uint32_t r = 0; r < ranks.size(); ++r) {
      for (uint32_t c = 0; c < 3; ++c) {
        ranks[r].lanes[LaneOf(c)]->Send(Push(ranks[r], key, c, it),
                                        Gradient(r, it, First(c), Size(c)));
      }
    }
    std::string params;
    for (uint32_t r = 0; r < ranks.size(); ++r) {
      std::string mine(kElements * sizeof(float), '\0');
      for (uint32_t got = 0; got < 3; ++got) {
        // Lane 0 answers chunks 0 and 2 in completion order.
        const uint32_t lane = got < 2 ? 0 : 1;
        const auto f = ranks[r].lanes[lane]->Receive();
        if (!f || f->h.opcode != net::Opcode::kParams) {
          ADD_FAILURE() << "rank " << r << " iteration " << it << ": no PARAMS on lane " << lane;
          return "";
        }
        EXPECT_EQ(f->h.iteration, it + 1);
        std::memcpy(mine.data() + First(f->h.chunk) * sizeof(float), f->payload.data(),
                    f->payload.size());
      }
      if (r == 0) params = mine;
      EXPECT_EQ(mine, params) << "rank " << r << " got other bits";
    }
    return params;
  }
  // `iterations` steps of a fresh tenant; the parameters after each.
  std::vector<std::string> Train(const std::string& tenant, uint32_t workers, int iterations,
                                 const std::function<void(std::vector<Worker>&)>& faults) {
    uint32_t key = 0;
    const std::string token = MakeTenant(tenant, workers, &key);
    std::vector<Worker> ranks;
    for (uint32_t r = 0; r < workers; ++r) ranks.push_back(Join(tenant, token, r));
    if (faults) faults(ranks);
    std::vector<std::string> out;
    for (int it = 0; it < iterations; ++it) out.push_back(Step(ranks, key, it));
    return out;
  }

  std::unique_ptr<HubUnderTest> hub_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
};

// Short reads and writes of every size around the header, both directions,
// and a delay on every step: the same bits as a clean run.
TEST_F(LaneFaultTest, ShortReadsWritesAndDelaysKeepTheBits) {
  const auto reference = Train("clean", 2, 3, nullptr);
  ASSERT_EQ(reference.size(), 3u);
  int n = 0;
  for (size_t step : {1, 7, 39, 40, 41, 4097}) {
    const auto faulty = Train("short" + std::to_string(n++), 2, 3, [step](auto& ranks) {
      for (auto& w : ranks) {
        for (uint32_t lane = 0; lane < 2; ++lane) {
          auto c = w.conn(lane);
          c->faults().Update([step](FaultPlan& p) {
            p.max_write_bytes = step;
            p.max_read_bytes = step + 3;
          });
          c->incoming_faults().Update([step](FaultPlan& p) {
            p.max_write_bytes = step + 1;
            p.max_read_bytes = step;
          });
        }
      }
    });
    EXPECT_EQ(faulty, reference) << "short steps of " << step << " bytes";
  }
  const auto delayed = Train("delayed", 2, 3, [](auto& ranks) {
    for (auto& w : ranks) {
      w.conn(0)->faults().Update([](FaultPlan& p) { p.delay = 2ms; });
      w.conn(1)->incoming_faults().Update([](FaultPlan& p) { p.delay = 3ms; });
    }
  });
  EXPECT_EQ(delayed, reference);
}

// A worker's stream ends (cleanly or by reset) in the middle of a PUSH: only
// its connection closes; its tenant's other ranks get WORKER_LOST for the
// pending update (non-fatal: they stay connected) and a bystander tenant
// trains on with the same bits.
TEST_F(LaneFaultTest, StreamEndingInsideAFrameFailsOnlyThatTenantsUpdate) {
  const auto reference = Train("reference", 1, 2, nullptr);
  for (const bool reset : {false, true}) {
    const std::string tenant = reset ? "reset" : "eof";
    uint32_t key = 0;
    const std::string token = MakeTenant(tenant, 2, &key);
    Worker r0 = Join(tenant, token, 0), r1 = Join(tenant, token, 1);
    const std::string bystander = "bystander-" + tenant;
    uint32_t bkey = 0;
    const std::string btoken = MakeTenant(bystander, 1, &bkey);
    std::vector<Worker> b;
    b.push_back(Join(bystander, btoken, 0));

    r0.lanes[0]->Send(Push(r0, key, 0, 0), Gradient(0, 0, 0, 1024));
    SyncWithLane(r0, 0);  // rank 0's push is in
    // Rank 1's lane-0 stream stops 100 bytes into its PUSH's payload.
    auto victim = r1.conn(0);
    const uint64_t at = victim->faults().delivered_bytes() + net::kHeaderBytes + 100;
    victim->faults().Update([&](FaultPlan& p) {
      if (reset) {
        p.reset_after_bytes = at;
      } else {
        p.eof_after_bytes = at;
      }
    });
    r1.lanes[0]->Send(Push(r1, key, 0, 0), Gradient(1, 0, 0, 1024));
    ExpectError(r0.lanes[0]->Receive(), net::WireError::kWorkerLost,
                reset ? "rank 1 lane 0: connection reset by peer"
                      : "rank 1 lane 0: peer closed the connection inside a frame",
                false);
    EXPECT_TRUE(r1.lanes[0]->ClosedByPeer());
    // Rank 1's other connection is closed by the hub (the worker is gone);
    // rank 0's connections stay open and answer.
    ExpectError(r1.lanes[1]->Receive(), net::WireError::kWorkerLost,
                "another connection of this worker closed", true);
    net::FrameHeader hb;
    hb.opcode = net::Opcode::kHeartbeat;
    hb.tenant = r0.handle;
    r0.lanes[1]->Send(hb);
    const auto pong = r0.lanes[1]->Receive();
    ASSERT_TRUE(pong && pong->h.opcode == net::Opcode::kHeartbeat) << "rank 0 lost its link";
    // The bystander's bits are those of a run without faults.
    for (int it = 0; it < 2; ++it) EXPECT_EQ(Step(b, bkey, it), reference[it]);
  }
}

// The hub's replies to one worker are held (the link stalls, then the worker
// stops reading): everybody else is answered meanwhile; once the worker reads
// again it gets every reply intact.
TEST_F(LaneFaultTest, StalledAndSlowReadersHoldOnlyTheirOwnReplies) {
  const auto reference = Train("reference", 2, 2, nullptr);
  uint32_t key = 0;
  const std::string token = MakeTenant("slow", 2, &key);
  std::vector<Worker> ranks;
  ranks.push_back(Join("slow", token, 0));
  ranks.push_back(Join("slow", token, 1));
  uint32_t bkey = 0;
  const std::string btoken = MakeTenant("bystander", 1, &bkey);
  std::vector<Worker> b;
  b.push_back(Join("bystander", btoken, 0));

  auto to_rank1 = ranks[1].conn(0)->incoming_faults();
  to_rank1.Stall(true);
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint32_t c = 0; c < 3; ++c) {
      ranks[r].lanes[LaneOf(c)]->Send(Push(ranks[r], key, c, 0), Gradient(r, 0, First(c), Size(c)));
    }
  }
  // Rank 0 is answered on both lanes, the bystander trains.
  for (uint32_t got = 0; got < 3; ++got) {
    const auto f = ranks[0].lanes[got < 2 ? 0 : 1]->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams);
  }
  EXPECT_TRUE(Step(b, bkey, 0).size() == kElements * sizeof(float));
  EXPECT_FALSE(ranks[1].lanes[0]->Receive(200ms).has_value()) << "a stalled link delivered";
  const uint64_t delivered = to_rank1.delivered_bytes();
  to_rank1.Update([](FaultPlan& p) {  // now the worker itself does not read
    p.stall = false;
    p.stop_reading = true;
  });
  // The hub works on meanwhile (both lanes answer the bystander), and still
  // nothing reaches the worker that does not read.
  EXPECT_TRUE(Step(b, bkey, 1).size() == kElements * sizeof(float));
  EXPECT_FALSE(ranks[1].lanes[0]->Receive(100ms).has_value());
  EXPECT_EQ(to_rank1.delivered_bytes(), delivered) << "a worker that does not read took bytes";
  to_rank1.StopReading(false);
  std::string mine(kElements * sizeof(float), '\0');
  for (uint32_t got = 0; got < 3; ++got) {
    const auto f = ranks[1].lanes[got < 2 ? 0 : 1]->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << "held replies lost";
    std::memcpy(mine.data() + First(f->h.chunk) * sizeof(float), f->payload.data(),
                f->payload.size());
  }
  EXPECT_EQ(mine, reference[0]);
  EXPECT_EQ(Step(ranks, key, 1), reference[1]);
}

// A worker whose PUSH stalls half-way (the network holds it) is a straggler:
// after data.straggler_timeout_ms the others get WORKER_LOST naming it and
// the partial sum is discarded. When the stream resumes, the late push is the
// first contribution of the retried iteration: the tenant recovers without
// any reconnect.
TEST_F(LaneFaultTest, PushStalledMidFrameIsAStraggler) {
  uint32_t key = 0;
  const std::string token = MakeTenant("stall", 2, &key);
  Worker r0 = Join("stall", token, 0), r1 = Join("stall", token, 1);
  auto from_rank1 = r1.conn(0)->faults();
  r0.lanes[0]->Send(Push(r0, key, 0, 0), Gradient(0, 0, 0, 1024));
  // Rank 1's push crawls: 104 bytes every 400 ms (its 4136 bytes would take
  // 16 s), so the straggler timeout (600 ms) fires inside its payload.
  const uint64_t before = from_rank1.delivered_bytes();
  from_rank1.Update([](FaultPlan& p) {
    p.max_write_bytes = net::kHeaderBytes + 64;
    p.delay = 400ms;
  });
  r1.lanes[0]->Send(Push(r1, key, 0, 0), Gradient(1, 0, 0, 1024));
  ExpectError(r0.lanes[0]->Receive(3s), net::WireError::kWorkerLost,
              "straggler: rank(s) 1 did not push within 600 ms", false);
  EXPECT_LT(from_rank1.delivered_bytes() - before, net::kHeaderBytes + 4096)
      << "the push was not held inside its payload";
  from_rank1.Update([](FaultPlan& p) {
    p.max_write_bytes = 0;
    p.delay = {};
  });
  // Both follow the trainer contract: after an error, Pull (held until the
  // tenant's recovery has finished: an event, not a delay) and push the
  // iteration again. Rank 0 does so now; rank 1's late push is counted if it
  // was read after the recovery, else refused (its payload may finish while
  // the recovery still runs, as under a CPU hog) and rank 1 retries. Either
  // way iteration 0 completes with both pushes, without a reconnect.
  const auto pull_and_push = [&](Worker& w, uint32_t rank) {
    net::FrameHeader pull;
    pull.opcode = net::Opcode::kPull;
    pull.tenant = w.handle;
    pull.key = key;
    pull.chunk = 0;
    pull.request_id = 500;
    w.lanes[0]->Send(pull);
    const auto p = w.lanes[0]->Receive();
    ASSERT_TRUE(p && p->h.opcode == net::Opcode::kParams && p->h.request_id == 500)
        << "rank " << rank << "'s Pull: " << testing::Describe(p);
    EXPECT_EQ(p->h.iteration, 0u);
    w.lanes[0]->Send(Push(w, key, 0, 0), Gradient(rank, 0, 0, 1024));
  };
  pull_and_push(r0, 0);
  const auto r1_reply = r1.lanes[0]->Receive();
  ASSERT_TRUE(r1_reply) << "rank 1 got no answer to its late push";
  if (r1_reply->h.opcode != net::Opcode::kParams) {
    ASSERT_EQ(r1_reply->h.opcode, net::Opcode::kError) << testing::Describe(r1_reply);
    pull_and_push(r1, 1);
  }
  for (Worker* w : {&r0, &r1}) {
    const auto f = w == &r1 && r1_reply->h.opcode == net::Opcode::kParams
                       ? r1_reply
                       : w->lanes[0]->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << testing::Describe(f);
    EXPECT_EQ(f->h.iteration, 1u);
  }
}

// Shutdown with work of every kind in flight: a pending update, a held
// reply, a reconnect waiting for its rank's old connection (a lane timer),
// the straggler timer. Every worker gets SHUTTING_DOWN, the hub stops well
// within its grace period, and nothing the lanes scheduled runs afterwards
// (the gates are idle: DataPlane::Shutdown logs an error otherwise, and a
// handler touching a destroyed lane would crash this process).
TEST_F(LaneFaultTest, ShutdownWithWorkInFlightIsPromptAndClean) {
  uint32_t key = 0;
  const std::string token = MakeTenant("busy", 2, &key);
  Worker r0 = Join("busy", token, 0), r1 = Join("busy", token, 1);
  r0.lanes[0]->Send(Push(r0, key, 0, 0), Gradient(0, 0, 0, 1024));  // pending update
  r1.conn(1)->incoming_faults().Stall(true);                          // held replies
  SyncWithLane(r0, 0);
  auto twin = hub_->Connect();  // rank 0 again on lane 0: waits on a lane timer
  net::FrameHeader hello;
  hello.opcode = net::Opcode::kHello;
  data::v1::Hello h;
  h.set_tenant("busy");
  h.set_token(token);
  h.set_rank(0);
  h.set_lane(0);
  twin->Send(hello, h.SerializeAsString());
  // The twin's hand-over was posted to lane 0 before this HEARTBEAT: once
  // it is answered, the twin waits on the lane's reconnect timer.
  SyncWithLane(r0, 0);
  const auto start = std::chrono::steady_clock::now();
  hub_->BeginShutdown();
  ExpectError(r0.lanes[0]->Receive(), net::WireError::kShuttingDown, "shutting down", false);
  ExpectError(r0.lanes[0]->Receive(), net::WireError::kShuttingDown, "shutting down", true);
  EXPECT_TRUE(r0.lanes[0]->ClosedByPeer());
  ExpectError(r1.lanes[0]->Receive(), net::WireError::kShuttingDown, "shutting down", true);
  EXPECT_EQ(hub_->FinishShutdown(), 0);
  // The stalled link could not take its SHUTTING_DOWN frame: the hub closed
  // it at the end of the grace period (2 s). Its close, like a TCP FIN, waits
  // behind the held bytes until the network delivers again.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  r1.conn(1)->incoming_faults().Stall(false);
  EXPECT_TRUE(r1.lanes[1]->ClosedByPeer(1s));
  EXPECT_TRUE(twin->ClosedByPeer(1s));
}

// --- worker generations (issue 26) ------------------------------------------
//
// A client process names itself in HELLO (`session`); the hub gives each new
// session of a rank a new generation and never counts a contribution of one
// that ended (a lost connection, a BYE, a new session of the rank adopted).
// Here a PUSH of rank 1's old session (A) is held by the network until its
// replacement (session B, rank 1) was welcomed: it must be refused or its
// connection closed, and chunk 0 must complete with exactly rank 0's and
// session B's gradients.

constexpr uint64_t kSessionRank0 = 0x5e5510000000000aULL;
constexpr uint64_t kSessionA = 0x5e551000000000a1ULL;
constexpr uint64_t kSessionB = 0x5e551000000000b1ULL;
// Each process's gradient values are its own: integers salt * 256 + (0..100),
// so sums are exact and two processes' values differ at every element.
constexpr uint32_t kSaltRank0 = 3, kSaltA = 40, kSaltB = 500;

std::string SessionGradient(uint32_t salt, uint32_t first, uint32_t n) {
  std::vector<float> g(n);
  for (uint32_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(salt * 256 + (first + i) * 7 % 101);
  }
  return std::string(reinterpret_cast<const char*>(g.data()), n * sizeof(float));
}

class WorkerGenerationTest : public LaneFaultTest {
 protected:
  // Session A's PUSH of chunk 0, iteration 0.
  static constexpr uint64_t kOldPushRequest = 77;
  static net::FrameHeader OldPush(const Worker& a, uint32_t key) {
    net::FrameHeader h = Push(a, key, 0, 0);
    h.request_id = kOldPushRequest;
    return h;
  }
  // HELLO of `rank` on `lane` naming `session`; the WELCOME's tenant handle,
  // 0 (with *reply saying what came instead) if not welcomed.
  uint32_t HelloAs(DataLink& link, const std::string& tenant, const std::string& token,
                   uint32_t rank, uint32_t lane, uint64_t session, std::optional<Frame>* reply) {
    data::v1::Hello hello;
    hello.set_tenant(tenant);
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_lane(lane);
    hello.set_session(session);
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    link.Send(h, hello.SerializeAsString());
    *reply = link.Receive();
    data::v1::Welcome w;
    if (!*reply || (*reply)->h.opcode != net::Opcode::kWelcome ||
        !w.ParseFromString((*reply)->payload)) {
      return 0;
    }
    return w.tenant_handle();
  }
  // Rank `rank` of the process `session`, one link per lane; fails the test
  // (naming `who`) unless every HELLO is welcomed.
  Worker JoinAs(const std::string& who, const std::string& tenant, const std::string& token,
                uint32_t rank, uint64_t session) {
    Worker w;
    for (uint32_t lane = 0; lane < 2; ++lane) {
      w.lanes.push_back(hub_->Connect());
      std::optional<Frame> reply;
      w.handle = HelloAs(*w.lanes.back(), tenant, token, rank, lane, session, &reply);
      EXPECT_NE(w.handle, 0u) << who << " (rank " << rank << ", session " << std::hex << session
                              << std::dec << ") was not welcomed on lane " << lane << ": "
                              << testing::Describe(reply);
    }
    return w;
  }

  // After rank 1's old session's frames were released: its lane-0 link got
  // an ERROR for the PUSH (request `push_rid`) or was closed by the hub;
  // never PARAMS, and never a HEARTBEAT reply (request 4242, sent behind the
  // PUSH) without a refusal before it (the PUSH taken silently).
  static void ExpectOldPushRefusedOrClosed(DataLink& old_lane0, uint64_t push_rid) {
    bool refused = false;
    while (const auto f = old_lane0.Receive()) {
      EXPECT_NE(f->h.opcode, net::Opcode::kParams)
          << "the old session's PUSH was answered: " << testing::Describe(f);
      if (f->h.opcode == net::Opcode::kError && f->h.request_id == push_rid) refused = true;
      if (f->h.opcode == net::Opcode::kHeartbeat && f->h.request_id == 4242) {
        EXPECT_TRUE(refused) << "the hub took the old session's PUSH (its HEARTBEAT behind it "
                                "was answered) without refusing it";
        return;
      }
    }
    EXPECT_TRUE(old_lane0.ClosedByPeer(0ms))
        << "the old session's link got neither a refusal of its PUSH nor a close in 5 s";
  }

  // Rank 0 (salt kSaltRank0) and rank 1's new session B (salt kSaltB) Pull
  // every chunk (version 0, zeros: nothing was completed), then push
  // iteration 0: every element of every chunk either receives is
  // -0.5 * (g0 + gB) (SGD lr 0.5 from zeros; exact), never with session A's
  // gradient in place of B's.
  void ExpectNewGenerationStep(Worker& r0, Worker& b, uint32_t key) {
    const std::vector<std::pair<Worker*, const char*>> ranks = {{&r0, "rank 0"},
                                                                {&b, "rank 1 (session B)"}};
    for (const auto& [w, who] : ranks) {
      for (uint32_t c = 0; c < 3; ++c) {
        net::FrameHeader pull;
        pull.opcode = net::Opcode::kPull;
        pull.tenant = w->handle;
        pull.key = key;
        pull.chunk = c;
        pull.request_id = 100 + c;
        w->lanes[LaneOf(c)]->Send(pull);
      }
      for (uint32_t got = 0; got < 3; ++got) {
        const uint32_t lane = got < 2 ? 0 : 1;
        const auto f = w->lanes[lane]->Receive();
        ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams)
            << who << ": Pull on lane " << lane << ": " << testing::Describe(f);
        EXPECT_EQ(f->h.iteration, 0u) << who << " chunk " << f->h.chunk;
      }
    }
    for (uint32_t c = 0; c < 3; ++c) {
      r0.lanes[LaneOf(c)]->Send(Push(r0, key, c, 0),
                                SessionGradient(kSaltRank0, First(c), Size(c)));
      b.lanes[LaneOf(c)]->Send(Push(b, key, c, 0), SessionGradient(kSaltB, First(c), Size(c)));
    }
    for (const auto& [w, who] : ranks) {
      for (uint32_t got = 0; got < 3; ++got) {
        const uint32_t lane = got < 2 ? 0 : 1;
        const auto f = w->lanes[lane]->Receive();
        ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams)
            << who << ": push of iteration 0 on lane " << lane << ": " << testing::Describe(f);
        EXPECT_EQ(f->h.iteration, 1u) << who << " chunk " << f->h.chunk;
        const uint32_t c = f->h.chunk;
        ASSERT_LT(c, 3u);
        ASSERT_EQ(f->payload.size(), Size(c) * sizeof(float)) << who << " chunk " << c;
        std::vector<float> got_values(Size(c));
        std::memcpy(got_values.data(), f->payload.data(), f->payload.size());
        const std::string g0 = SessionGradient(kSaltRank0, First(c), Size(c));
        const std::string gb = SessionGradient(kSaltB, First(c), Size(c));
        const std::string ga = SessionGradient(kSaltA, First(c), Size(c));
        int reported = 0;
        for (uint32_t i = 0; i < Size(c) && reported < 3; ++i) {
          const auto at = [i](const std::string& g) {
            float v;
            std::memcpy(&v, g.data() + i * sizeof(float), sizeof v);
            return v;
          };
          const float want = -0.5f * (at(g0) + at(gb));
          if (got_values[i] == want) continue;
          ++reported;
          ADD_FAILURE() << who << " chunk " << c << " element " << First(c) + i << ": expected "
                        << want << " (rank 0 + session B), got " << got_values[i]
                        << (got_values[i] == -0.5f * (at(g0) + at(ga))
                                ? ": session A's gradient was counted in place of session B's"
                                : "");
        }
      }
    }
  }
};

// Session A leaves (BYE) while its lane-0 link is slow: its BYE on lane 1 is
// read, its PUSH of chunk 0 (a HEARTBEAT behind it) and its BYE on lane 0 are
// held by the network. Session B is welcomed as rank 1 on lane 1; then A's
// PUSH arrives. The BYE ended A's generation: its PUSH is refused, not
// counted (before issue 26 it was taken silently, and chunk 0 completed with
// A's gradient in place of B's).
TEST_F(WorkerGenerationTest, PushHeldBehindAByeIsNotCountedForTheReplacement) {
  uint32_t key = 0;
  const std::string token = MakeTenant("gen-bye", 2, &key);
  Worker r0 = JoinAs("rank 0", "gen-bye", token, 0, kSessionRank0);
  Worker a = JoinAs("rank 1 (session A)", "gen-bye", token, 1, kSessionA);
  auto from_a = a.conn(0)->faults();
  from_a.Stall(true);
  a.lanes[0]->Send(OldPush(a, key), SessionGradient(kSaltA, First(0), Size(0)));
  net::FrameHeader hb;
  hb.opcode = net::Opcode::kHeartbeat;
  hb.tenant = a.handle;
  hb.request_id = 4242;
  a.lanes[0]->Send(hb);
  net::FrameHeader bye;
  bye.opcode = net::Opcode::kBye;
  bye.tenant = a.handle;
  a.lanes[0]->Send(bye);
  a.lanes[1]->Send(bye);
  ASSERT_TRUE(a.lanes[1]->ClosedByPeer()) << "session A's BYE on lane 1 did not close it";
  Worker b;
  b.lanes.push_back(nullptr);  // lane 0: once A's link there is gone
  b.lanes.push_back(hub_->Connect());
  std::optional<Frame> reply;
  b.handle = HelloAs(*b.lanes[1], "gen-bye", token, 1, 1, kSessionB, &reply);
  ASSERT_NE(b.handle, 0u) << "session B was not welcomed on lane 1: " << testing::Describe(reply);
  from_a.Stall(false);
  ExpectOldPushRefusedOrClosed(*a.lanes[0], kOldPushRequest);
  ASSERT_TRUE(a.lanes[0]->ClosedByPeer()) << "session A's BYE on lane 0 did not close it";
  b.lanes[0] = hub_->Connect();
  ASSERT_NE(HelloAs(*b.lanes[0], "gen-bye", token, 1, 0, kSessionB, &reply), 0u)
      << "session B was not welcomed on lane 0: " << testing::Describe(reply);
  ExpectNewGenerationStep(r0, b, key);
}

// Session A of rank 1 is connected on lane 0 only (say its lane-1 connect
// is still on the way) and has pushed chunk 0 when session B of rank 1 is
// welcomed on lane 1: B replaces A. A's connection is closed with a fatal
// INVALID_ARGUMENT naming the replacement (a client does not reconnect after
// it), A's contribution to chunk 0 is discarded with the aborted iteration,
// and the step of rank 0 and B has exactly their contributions.
TEST_F(WorkerGenerationTest, NewSessionReplacesAnOldOneStillConnectedElsewhere) {
  uint32_t key = 0;
  const std::string token = MakeTenant("gen-replace", 2, &key);
  Worker r0 = JoinAs("rank 0", "gen-replace", token, 0, kSessionRank0);
  Worker a;
  a.lanes.push_back(hub_->Connect());
  std::optional<Frame> reply;
  a.handle = HelloAs(*a.lanes[0], "gen-replace", token, 1, 0, kSessionA, &reply);
  ASSERT_NE(a.handle, 0u) << "session A was not welcomed on lane 0: " << testing::Describe(reply);
  a.lanes[0]->Send(OldPush(a, key), SessionGradient(kSaltA, First(0), Size(0)));
  SyncWithLane(a, 0);  // A's push of chunk 0 is counted (rank 0 has not pushed it)

  Worker b;
  b.lanes.push_back(nullptr);  // lane 0: once A's connection there is closed
  b.lanes.push_back(hub_->Connect());
  b.handle = HelloAs(*b.lanes[1], "gen-replace", token, 1, 1, kSessionB, &reply);
  ASSERT_NE(b.handle, 0u) << "session B was not welcomed on lane 1: " << testing::Describe(reply);

  const auto f = a.lanes[0]->Receive();
  ASSERT_TRUE(f && f->h.opcode == net::Opcode::kError)
      << "session A got no ERROR when B replaced it: " << testing::Describe(f);
  const Result<net::ErrorBody> body = net::DecodeErrorBody(std::as_bytes(std::span(f->payload)));
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const net::WireError code = body->code;
  const std::string& text = body->text;
  EXPECT_EQ(code, net::WireError::kInvalidArgument) << text;
  EXPECT_NE(text.find("replaced by a new process (generation 2)"), std::string::npos) << text;
  EXPECT_TRUE(a.lanes[0]->ClosedByPeer()) << "session A's connection stayed open";

  b.lanes[0] = hub_->Connect();
  ASSERT_NE(HelloAs(*b.lanes[0], "gen-replace", token, 1, 0, kSessionB, &reply), 0u)
      << "session B was not welcomed on lane 0: " << testing::Describe(reply);
  ExpectNewGenerationStep(r0, b, key);
}

}  // namespace
}  // namespace rackhub
