// The retry of a failed PushPull whose earlier push of one chunk was counted
// in an update that completed before the retry (docs/durability.md,
// "Recovery after a lost worker"), frame by frame against a real hub (in
// process over in-memory links, and rackhubd over TCP): the retry of that
// chunk is answered with the update's result, not refused as stale, so the
// retrying rank stays at the others' iteration. Before the fix its push was
// refused with BAD_ITERATION, the rank Pulled and was one iteration ahead on
// the chunk, and its next push waited for the straggler timeout.
//
// The interleaving, made deterministic with raw frames: rank 0's push of
// chunk 1 is pending when rank 2 is lost (the recovery fails it:
// WORKER_LOST); after the recovery rank 0's push of chunk 0 (the rest of
// that PushPull, which a client sends at once) is counted and the others
// complete chunk 0; then rank 0 Pulls and pushes the iteration again.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hub_under_test.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;
using testing::AsFloats;
using testing::DataLink;
using testing::Describe;
using testing::ExpectError;
using testing::Floats;
using testing::Frame;
using testing::HubUnderTest;
using testing::Transport;

constexpr uint32_t kChunkElements = 1024;  // 4 KiB chunks


class CountedRetryTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    std::string why;
    // A straggler timeout far beyond the test: a push that waits for it is
    // a failure (Receive gives up after 5 s), not a slow pass.
    hub_ = HubUnderTest::Start(GetParam(), {"--lanes", "2", "--straggler-timeout-ms", "600000"},
                               &why);
    ASSERT_TRUE(hub_) << why;
    auto channel =
        grpc::CreateChannel(hub_->admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel);
    keys_ = pb::KeyService::NewStub(channel);
  }

  // One process of a rank: a connection per lane, all naming `session`.
  struct Rank {
    uint32_t rank = 0;
    uint32_t handle = 0;
    std::vector<std::unique_ptr<DataLink>> lanes;
  };
  Rank Join(uint32_t rank, uint64_t session) {
    Rank r;
    r.rank = rank;
    for (uint32_t lane = 0; lane < 2; ++lane) {
      auto link = hub_->Connect();
      dpb::Hello hello;
      hello.set_tenant("t");
      hello.set_token(token_);
      hello.set_rank(rank);
      hello.set_lane(lane);
      hello.set_session(session);
      FrameHeader h;
      h.opcode = Opcode::kHello;
      link->Send(h, hello.SerializeAsString());
      const std::optional<Frame> f = link->Receive();
      EXPECT_TRUE(f && f->h.opcode == Opcode::kWelcome) << Describe(f);
      dpb::Welcome w;
      if (f) w.ParseFromString(f->payload);
      r.handle = w.tenant_handle();
      r.lanes.push_back(std::move(link));
    }
    return r;
  }
  // The connection that serves chunk `c` of the key (chunk c is on lane
  // (first_chunk + c) % lanes).
  DataLink& Lane(Rank& r, uint32_t c) { return *r.lanes[(key_.first_chunk() + c) % 2]; }
  FrameHeader Header(const Rank& r, Opcode op, uint32_t c, uint64_t iteration, uint64_t rid) {
    FrameHeader h;
    h.opcode = op;
    h.tenant = r.handle;
    h.key = key_.id();
    h.chunk = c;
    h.dtype = net::DType::kFp32;
    h.iteration = iteration;
    h.request_id = rid;
    return h;
  }
  void Push(Rank& r, uint32_t c, uint64_t iteration, float g, uint64_t rid) {
    Lane(r, c).Send(Header(r, Opcode::kPush, c, iteration, rid), Floats(kChunkElements, g));
  }
  // Expects PARAMS of chunk `c` at `version` answering `rid`, every element
  // `value`.
  static void ExpectParams(const std::optional<Frame>& f, uint32_t c, uint64_t version,
                           uint64_t rid, float value) {
    ASSERT_TRUE(f && f->h.opcode == Opcode::kParams) << Describe(f);
    EXPECT_EQ(f->h.chunk, c);
    EXPECT_EQ(f->h.iteration, version);
    EXPECT_EQ(f->h.request_id, rid);
    const std::vector<float> p = AsFloats(f->payload);
    ASSERT_EQ(p.size(), kChunkElements);
    for (float x : p) ASSERT_EQ(x, value);
  }

  void CreateTenantAndKey() {
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    req.set_name("t");
    req.set_workers_per_rack(3);
    req.set_chunk_bytes(kChunkElements * 4);
    req.mutable_default_optimizer()->set_type(pb::SGD);
    req.mutable_default_optimizer()->set_learning_rate(0.5);
    req.mutable_default_optimizer()->set_reduction(pb::SUM);
    pb::CreateTenantResponse resp;
    ASSERT_TRUE(tenants_->CreateTenant(&ctx, req, &resp).ok());
    token_ = resp.token();
    grpc::ClientContext kctx;
    pb::CreateKeyRequest kreq;
    kreq.set_tenant("t");
    kreq.set_name("w");
    kreq.set_elements(2 * kChunkElements);
    kreq.set_dtype(pb::FP32);
    ASSERT_TRUE(keys_->CreateKey(&kctx, kreq, &key_).ok());
    ASSERT_EQ(key_.chunk_count(), 2u);
  }

  std::unique_ptr<HubUnderTest> hub_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
  std::string token_;
  pb::Key key_;
};

TEST_P(CountedRetryTest, ARetryOfAChunkCountedInACompletedUpdateGetsItsResult) {
  ASSERT_NO_FATAL_FAILURE(CreateTenantAndKey());
  Rank r0 = Join(0, 1001), r1 = Join(1, 1002);
  ASSERT_NE(r0.handle, 0u);
  // The gradients of ranks 0, 1 and 2 (the replacement): SGD, lr 0.5, sum:
  // after one update every parameter is -0.5 * (1 + 2 + 4) = -3.5 exactly.
  const float g0 = 1, g1 = 2, g2 = 4;
  const float expected = -0.5f * (g0 + g1 + g2);
  {
    Rank lost = Join(2, 1003);
    Push(r0, 1, 0, g0, 10);  // pending: waits for ranks 1 and 2
    ASSERT_TRUE(testing::WaitForPushes(hub_->admin_address(), "t", 1));
  }  // rank 2's process is lost: the recovery fails rank 0's pending push
  ExpectError(Lane(r0, 1).Receive(), WireError::kWorkerLost, "worker lost: rank 2", false);

  // A Pull is held until the recovery is over: then chunk 0 is at 0 still.
  Lane(r0, 0).Send(Header(r0, Opcode::kPull, 0, 0, 11));
  ExpectParams(Lane(r0, 0).Receive(), 0, 0, 11, 0.0f);

  // The rest of rank 0's failed PushPull, chunk 0, arrives after the
  // recovery and is counted; the others (rank 2's replacement included)
  // complete chunk 0.
  Push(r0, 0, 0, g0, 12);
  Rank r2 = Join(2, 2003);
  Push(r1, 0, 0, g1, 20);
  Push(r2, 0, 0, g2, 30);
  ExpectParams(Lane(r0, 0).Receive(), 0, 1, 12, expected);
  ExpectParams(Lane(r1, 0).Receive(), 0, 1, 20, expected);
  ExpectParams(Lane(r2, 0).Receive(), 0, 1, 30, expected);
  Push(r1, 1, 0, g1, 21);
  Push(r2, 1, 0, g2, 31);

  // Rank 0 was told its PushPull failed: it pushes iteration 0 again.
  // Chunk 0 is answered with the result its counted push is part of;
  // chunk 1 completes with its push.
  Push(r0, 0, 0, g0, 13);
  ExpectParams(Lane(r0, 0).Receive(), 0, 1, 13, expected);
  Push(r0, 1, 0, g0, 14);
  ExpectParams(Lane(r0, 1).Receive(), 1, 1, 14, expected);
  ExpectParams(Lane(r1, 1).Receive(), 1, 1, 21, expected);
  ExpectParams(Lane(r2, 1).Receive(), 1, 1, 31, expected);

  // Everyone is at iteration 1 on both chunks: the next iteration completes
  // without waiting for anyone (-3.5 twice).
  for (Rank* r : {&r0, &r1, &r2}) {
    const float g = r == &r0 ? g0 : r == &r1 ? g1 : g2;
    for (uint32_t c = 0; c < 2; ++c) Push(*r, c, 1, g, 40 + r->rank * 2 + c);
  }
  for (Rank* r : {&r0, &r1, &r2}) {
    for (uint32_t c = 0; c < 2; ++c) {
      ExpectParams(Lane(*r, c).Receive(), c, 2, 40 + r->rank * 2 + c, 2 * expected);
    }
  }
}

// What is not such a retry stays refused: a push one version behind from a
// rank whose push of the chunk did not fail (a worker that is simply
// behind), and one whose failed push is of another iteration.
TEST_P(CountedRetryTest, AStalePushThatIsNoRetryIsRefused) {
  ASSERT_NO_FATAL_FAILURE(CreateTenantAndKey());
  Rank r0 = Join(0, 1001), r1 = Join(1, 1002), r2 = Join(2, 1003);
  for (Rank* r : {&r0, &r1, &r2}) Push(*r, 0, 0, 1.0f, 50 + r->rank);
  for (Rank* r : {&r0, &r1, &r2}) ExpectParams(Lane(*r, 0).Receive(), 0, 1, 50 + r->rank, -1.5f);
  Push(r0, 0, 0, 1.0f, 60);
  const std::optional<Frame> f = Lane(r0, 0).Receive();
  ExpectError(f, WireError::kBadIteration, "(stale)", false);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->h.iteration, 1u) << "the ERROR names the hub's version";
}

INSTANTIATE_TEST_SUITE_P(Transports, CountedRetryTest,
                         ::testing::Values(Transport::kMemory, Transport::kTcp),
                         testing::TransportParamName);

}  // namespace
}  // namespace rackhub
