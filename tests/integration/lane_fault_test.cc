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
  to_rank1.Update([](FaultPlan& p) {  // now the worker itself does not read
    p.stall = false;
    p.stop_reading = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(ranks[1].lanes[0]->Receive(100ms).has_value());
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
  // Rank 0 pushes iteration 0 again; with rank 1's late push that completes it.
  r0.lanes[0]->Send(Push(r0, key, 0, 0), Gradient(0, 0, 0, 1024));
  for (Worker* w : {&r0, &r1}) {
    const auto f = w->lanes[0]->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams);
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
  std::this_thread::sleep_for(50ms);
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

}  // namespace
}  // namespace rackhub
