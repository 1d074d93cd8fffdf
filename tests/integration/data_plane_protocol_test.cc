// The data-plane wire protocol frame by frame, over every transport (an
// in-process hub with in-memory links, a real rackhubd over TCP, and over
// RDMA where a verbs device exists; see hub_under_test.h): every malformed field and protocol violation gets a
// clear ERROR and closes only that connection, while another tenant's
// training goes on; lost and straggling workers fail the others' pending
// pushes within a bounded time; shutdown tells connected workers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <functional>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connection_link.h"
#include "hub_under_test.h"
#include "process.h"
#include "raw_client.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/channel_connection.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/shm/channel.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;
using testing::DaemonProcess;
using testing::DataLink;
using testing::ExpectError;
using testing::Frame;
using testing::HubUnderTest;
using testing::RawClient;
using testing::Transport;

using testing::AsFloats;
using testing::Floats;

class DataPlaneProtocolTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    std::string why;
    // The straggler timeout scales with the transport like every other bound:
    // in the Soft-RoCE VM a DISCONNECTED event can take longer than 400 ms.
    hub_ = HubUnderTest::Start(
        GetParam(), {"--lanes", "2", "--straggler-timeout-ms", std::to_string(StragglerMs())},
        &why);
    if (!hub_ && GetParam() == Transport::kRdma) GTEST_SKIP() << why;
    ASSERT_TRUE(hub_) << why;
    channel_ = grpc::CreateChannel(hub_->admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel_);
    keys_ = pb::KeyService::NewStub(channel_);
  }

  // Creates a tenant (SGD lr 0.5, sum reduction, 1024-element chunks) and
  // returns its token.
  std::string CreateTenant(const std::string& name, uint32_t workers) {
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
    return resp.token();
  }
  pb::Key CreateKey(const std::string& tenant, const std::string& name, uint64_t elements,
                    pb::DType dtype = pb::FP32) {
    grpc::ClientContext ctx;
    pb::CreateKeyRequest req;
    req.set_tenant(tenant);
    req.set_name(name);
    req.set_elements(elements);
    req.set_dtype(dtype);
    pb::Key k;
    EXPECT_TRUE(keys_->CreateKey(&ctx, req, &k).ok());
    return k;
  }

  // A bystander tenant with one worker: one full push/pull round trip must
  // keep working whatever other connections do.
  void ExpectBystanderWorks() {
    if (bystander_token_.empty()) {
      bystander_token_ = CreateTenant("bystander", 1);
      bystander_key_ = CreateKey("bystander", "w", 4);
    }
    auto c = Connect();
    const auto w = c->Hello("bystander", bystander_token_, 0, 0);
    ASSERT_NE(w.tenant_handle(), 0u);
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = w.tenant_handle();
    h.key = bystander_key_.id();
    h.dtype = net::DType::kFp32;
    h.iteration = bystander_iteration_;
    h.request_id = 99;
    c->Send(h, Floats({1, 2, 3, 4}));
    const auto f = c->Receive();
    ASSERT_TRUE(f && f->h.opcode == Opcode::kParams) << "bystander got no PARAMS";
    EXPECT_EQ(f->h.iteration, ++bystander_iteration_);
    EXPECT_EQ(f->h.request_id, 99u);
    const auto p = AsFloats(f->payload);
    ASSERT_EQ(p.size(), 4u);
    const float step = -0.5f * static_cast<float>(bystander_iteration_);
    EXPECT_EQ(p[0], step * 1);
    EXPECT_EQ(p[3], step * 4);
    // A clean leave (BYE): not a lost worker, so the next check's push is
    // not refused while the tenant recovers.
    FrameHeader bye;
    bye.opcode = Opcode::kBye;
    bye.tenant = w.tenant_handle();
    c->Send(bye);
    EXPECT_TRUE(c->ClosedByPeer());
  }

  std::unique_ptr<DataLink> Connect() { return hub_->Connect(); }
  int StragglerMs() const { return 400 * HubUnderTest::TimeScale(GetParam()); }
  // Timing bounds scale with the transport (emulated RDMA is slow).
  std::chrono::milliseconds Ms(int ms) const {
    return std::chrono::milliseconds(ms * hub_->time_scale());
  }

  std::unique_ptr<HubUnderTest> hub_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
  std::string bystander_token_;
  pb::Key bystander_key_;
  uint64_t bystander_iteration_ = 0;
};

TEST_P(DataPlaneProtocolTest, HelloIsAuthenticatedAndValidated) {
  const std::string token = CreateTenant("t", 2);
  struct Case {
    std::string tenant, token;
    uint32_t rank, lane;
    WireError code;
    std::string text;
    bool fatal = true;  // a wrong iteration is not: the ERROR tells where the hub is
  } cases[] = {
      {"t", "rhk_wrong", 0, 0, WireError::kUnauthenticated, "token"},
      {"nobody", token, 0, 0, WireError::kUnauthenticated, "token"},
      {"t", token, 2, 0, WireError::kInvalidArgument, "rank: 2 is out of range"},
      {"t", token, 0, 7, WireError::kInvalidArgument, "lane: 7 is out of range"},
  };
  for (const auto& c : cases) {
    // Over RDMA the connect request itself names the lane: a lane the hub
    // does not have is refused by rdma_cm (rdma_reject(3)) before any frame
    // flows (docs/errors.md), which rdma_data_plane_test covers.
    if (GetParam() == Transport::kRdma && c.lane >= 2) continue;
    auto client = Connect();
    std::optional<Frame> reply;
    client->Hello(c.tenant, c.token, c.rank, c.lane, &reply);
    ExpectError(reply, c.code, c.text);
    EXPECT_TRUE(client->ClosedByPeer());
    ExpectBystanderWorks();
  }
  auto ok = Connect();
  const auto w = ok->Hello("t", token, 1, 1);
  EXPECT_NE(w.tenant_handle(), 0u);
  EXPECT_EQ(w.lanes(), 2u);
  EXPECT_EQ(w.workers(), 2u);
  EXPECT_EQ(w.chunk_elements(), 1024u);
  // A second connection claiming the same rank and lane is refused while
  // the first stays connected (after a grace period for reconnects).
  auto twin = Connect();
  std::optional<Frame> reply;
  twin->Hello("t", token, 1, 1, &reply);
  ASSERT_TRUE(reply && reply->h.opcode == Opcode::kError) << "no refusal";
  ExpectError(reply, WireError::kInvalidArgument, "rank 1 of tenant 't' is already connected");
  // Once the first one is gone, the rank may connect again right away.
  ok.reset();
  auto again = Connect();
  EXPECT_NE(again->Hello("t", token, 1, 1).tenant_handle(), 0u);
}

TEST_P(DataPlaneProtocolTest, MalformedHeadersBeforeHello) {
  if (!Connect()->SupportsRawBytes()) {
    GTEST_SKIP() << "malformed bytes before HELLO exercise the TCP acceptor's header parsing; "
                    "in-memory and RDMA links carry whole frames (the same CheckHelloHeader "
                    "runs for them: see HelloIsAuthenticatedAndValidated)";
  }
  FrameHeader good;
  good.opcode = Opcode::kHello;
  struct Case {
    std::function<void(FrameHeader&)> corrupt;
    std::string text;
  } cases[] = {
      {[](FrameHeader& h) { h.magic = 0xdeadbeef; }, "magic"},
      {[](FrameHeader& h) { h.version = 9; }, "version: 9"},
      {[](FrameHeader& h) { h.opcode = static_cast<Opcode>(200); }, "opcode: unknown opcode 200"},
      {[](FrameHeader& h) { h.opcode = Opcode::kPush; h.dtype = net::DType::kFp32; },
       "opcode: the first frame must be HELLO"},
      {[](FrameHeader& h) { h.dtype = static_cast<net::DType>(9); }, "dtype: unknown dtype 9"},
      {[](FrameHeader& h) { h.payload_bytes = 0x7fffffff; }, "payload_bytes"},
  };
  for (const auto& c : cases) {
    auto client = Connect();
    FrameHeader h = good;
    c.corrupt(h);
    std::array<std::byte, net::kHeaderBytes> buf;
    net::EncodeHeader(h, buf);
    client->SendRaw(std::string(reinterpret_cast<const char*>(buf.data()), buf.size()));
    ExpectError(client->Receive(), WireError::kMalformed, c.text);
    EXPECT_TRUE(client->ClosedByPeer());
  }
  // Garbage that is not even a header, and a HELLO whose payload is not protobuf.
  {
    auto client = Connect();
    client->SendRaw(std::string(net::kHeaderBytes, 'x'));
    ExpectError(client->Receive(), WireError::kMalformed, "magic");
  }
  {
    auto client = Connect();
    client->Send(good, std::string("\xff\xff\xff", 3));
    ExpectError(client->Receive(), WireError::kMalformed, "HELLO is not a Hello");
  }
  ExpectBystanderWorks();
}

TEST_P(DataPlaneProtocolTest, BadFramesCloseOnlyTheirConnection) {
  const std::string token = CreateTenant("t", 2);
  const pb::Key k = CreateKey("t", "w", 2500);  // chunks 0,1 (1024) and 2 (452): lanes 0,1,0
  const pb::Key half = CreateKey("t", "h", 8, pb::BF16);
  FrameHeader push;
  push.opcode = Opcode::kPush;
  push.key = k.id();
  push.dtype = net::DType::kFp32;
  push.request_id = 7;
  struct Case {
    std::function<void(FrameHeader&, std::string&)> make;
    WireError code;
    std::string text;
    bool fatal = true;  // a wrong iteration is not: the ERROR tells where the hub is
  } cases[] = {
      {[&](FrameHeader& h, std::string&) { h.key = 999; }, WireError::kUnknownKey,
       "key: id 999 does not exist"},
      {[&](FrameHeader& h, std::string&) { h.chunk = 3; }, WireError::kBadChunk,
       "chunk: 3 is out of range"},
      {[&](FrameHeader& h, std::string&) { h.chunk = 1; }, WireError::kBadChunk,
       "lives on lane 1, not lane 0"},
      {[&](FrameHeader& h, std::string&) { h.dtype = net::DType::kFp16; }, WireError::kBadDType,
       "dtype: key 'w' is fp32"},
      {[&](FrameHeader&, std::string& p) { p = Floats(1000, 1.0f); }, WireError::kBadChunk,
       "payload_bytes: chunk 0 of key 'w' needs 4096 bytes, got 4000"},
      {[&](FrameHeader& h, std::string& p) { h.chunk = 2; p = Floats(1024, 1.0f); },
       WireError::kBadChunk, "needs 1808 bytes"},
      {[&](FrameHeader& h, std::string&) { h.iteration = 5; }, WireError::kBadIteration,
       "iteration: 5 for chunk 0 of key 'w', the hub expects 0 (ahead)", false},
      {[&](FrameHeader& h, std::string&) { h.tenant = 4242; }, WireError::kMalformed,
       "tenant: frame names tenant handle 4242"},
      {[&](FrameHeader& h, std::string&) { h.opcode = Opcode::kParams; }, WireError::kMalformed,
       "is not a request a client may send"},
      {[&](FrameHeader& h, std::string& p) {
         h.key = half.id();
         h.dtype = net::DType::kBf16;
         p = std::string(15, '\0');
       },
       WireError::kMalformed, "not a whole number of bf16 elements"},
  };
  for (const auto& c : cases) {
    auto client = Connect();
    const auto w = client->Hello("t", token, 0, 0);
    ASSERT_NE(w.tenant_handle(), 0u);
    FrameHeader h = push;
    h.tenant = w.tenant_handle();
    std::string payload = Floats(1024, 1.0f);
    c.make(h, payload);
    client->Send(h, payload);
    auto error = client->Receive();
    // The previous case's fatal close aborted the tenant's iteration; while
    // that recovery runs (milliseconds, longer on a loaded machine) a push
    // is refused with a non-fatal "recovering" WORKER_LOST: push again, as
    // a client would.
    for (int retry = 0; retry < 200 && error && error->h.opcode == Opcode::kError &&
                        testing::Describe(error).find("WORKER_LOST: recovering:") !=
                            std::string::npos;
         ++retry) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      client->Send(h, payload);
      error = client->Receive();
    }
    ExpectError(error, c.code, c.text, c.fatal);
    if (c.fatal) {
      EXPECT_TRUE(client->ClosedByPeer()) << c.text;
    } else {
      ASSERT_TRUE(error.has_value());
      EXPECT_EQ(error->h.iteration, 0u) << "the ERROR carries the hub's iteration";
      EXPECT_EQ(error->h.key, k.id());
      EXPECT_FALSE(client->ClosedByPeer(std::chrono::milliseconds(100))) << c.text;
    }
    ExpectBystanderWorks();
  }
}

TEST_P(DataPlaneProtocolTest, PushImpliesPullAndDuplicatePushIsRefused) {
  const std::string token = CreateTenant("t", 2);
  const pb::Key k = CreateKey("t", "w", 3);
  auto r0 = Connect(), r1 = Connect();
  const auto w = r0->Hello("t", token, 0, 0);
  ASSERT_NE(r1->Hello("t", token, 1, 0).tenant_handle(), 0u);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = w.tenant_handle();
  h.key = k.id();
  h.dtype = net::DType::kFp32;
  h.request_id = 1;
  r0->Send(h, Floats({1, 2, 3}));
  {
    // 100 ms on every transport (links scale their waits by time_scale()):
    // well below the straggler timeout (400 ms, scaled).
    const auto early = r0->Receive(std::chrono::milliseconds(100) / hub_->time_scale());
    EXPECT_FALSE(early.has_value()) << "no reply before every worker pushed; got "
                                    << testing::Describe(early);
  }
  h.request_id = 2;
  r1->Send(h, Floats({10, 20, 30}));
  for (DataLink* c : {r0.get(), r1.get()}) {
    const auto f = c->Receive();
    ASSERT_TRUE(f && f->h.opcode == Opcode::kParams) << testing::Describe(f);
    EXPECT_EQ(f->h.iteration, 1u);
    EXPECT_EQ(AsFloats(f->payload), (std::vector<float>{-5.5f, -11.0f, -16.5f}));  // -0.5 * sum
  }
  // Iteration 1: rank 0 pushes twice.
  h.iteration = 1;
  r0->Send(h, Floats({1, 1, 1}));
  r0->Send(h, Floats({1, 1, 1}));
  ExpectError(r0->Receive(), WireError::kDuplicatePush, "rank 0 already pushed chunk 0");
  EXPECT_TRUE(r0->ClosedByPeer());
  // Rank 0's connection closing is a lost worker: its partial sum is
  // discarded and rank 1's push of iteration 1 fails (while the tenant
  // recovers, or once the straggler timeout finds rank 0 still missing)
  // instead of waiting forever; nothing advanced.
  r1->Send(h, Floats({1, 1, 1}));
  ExpectError(r1->Receive(), WireError::kWorkerLost, "", false);
  ExpectBystanderWorks();
}

// Fixed summation order: whatever order the pushes arrive in, the hub sums
// rank 0, 1, 2, 3 and every order gives the same bits. The gradients are
// chosen so that float addition in another order gives different results.
TEST_P(DataPlaneProtocolTest, ArrivalOrderDoesNotChangeTheBits) {
  const std::vector<std::vector<float>> grads = {
      {1e8f, 1.0f, 3.3f, -7.1f}, {1.0f, 1e8f, -3.3f, 0.1f}, {-1e8f, -1e8f, 1e-3f, 7.0f},
      {0.5f, 0.25f, 2e7f, 1e-7f}};
  auto as_string = [](const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  const std::vector<std::vector<int>> orders = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1},
                                                {1, 3, 0, 2}};
  std::vector<std::string> results;
  for (size_t o = 0; o < orders.size(); ++o) {
    const std::string tenant = "order" + std::to_string(o);
    const std::string token = CreateTenant(tenant, 4);
    const pb::Key k = CreateKey(tenant, "w", 4);
    std::vector<std::unique_ptr<DataLink>> ranks;
    uint32_t handle = 0;
    for (uint32_t r = 0; r < 4; ++r) {
      ranks.push_back(Connect());
      handle = ranks.back()->Hello(tenant, token, r, 0).tenant_handle();
      ASSERT_NE(handle, 0u);
    }
    std::string first;
    uint64_t pushes = 0;
    for (uint64_t it = 0; it < 3; ++it) {
      for (int r : orders[o]) {
        FrameHeader h;
        h.opcode = Opcode::kPush;
        h.tenant = handle;
        h.key = k.id();
        h.dtype = net::DType::kFp32;
        h.iteration = it;
        ranks[r]->Send(h, as_string(grads[r]));
        // This push is in its sum before the next rank's is sent.
        ASSERT_TRUE(testing::WaitForPushes(hub_->admin_address(), tenant, ++pushes));
      }
      for (int r = 0; r < 4; ++r) {
        const auto f = ranks[r]->Receive();
        ASSERT_TRUE(f && f->h.opcode == Opcode::kParams);
        if (r == 0) first = f->payload;
        EXPECT_EQ(f->payload, first) << "every rank gets the same bits";
      }
    }
    results.push_back(first);
  }
  for (size_t o = 1; o < results.size(); ++o) {
    EXPECT_EQ(results[o], results[0]) << "order " << o << " changed the result";
  }
  // The reference: rank-order fp32 sum, SGD lr 0.5 (sum reduction), 3 steps.
  std::vector<float> p(4, 0.0f);
  for (int it = 0; it < 3; ++it) {
    for (int i = 0; i < 4; ++i) {
      float sum = grads[0][i];
      for (int r = 1; r < 4; ++r) sum += grads[r][i];
      p[i] = p[i] - 0.5f * sum;
    }
  }
  EXPECT_EQ(AsFloats(results[0]), p);
  // And a different order of float addition really would differ here.
  float reversed = grads[3][0];
  for (int r = 2; r >= 0; --r) reversed += grads[r][0];
  EXPECT_NE(reversed, grads[0][0] + grads[1][0] + grads[2][0] + grads[3][0]);
}

// A learning-rate change announced for a later iteration applies exactly
// there, also on chunks the hub first touches after the announcement.
TEST_P(DataPlaneProtocolTest, OptimizerChangeAppliesFromItsIteration) {
  const std::string token = CreateTenant("t", 1);
  const pb::Key k = CreateKey("t", "w", 1024 + 4);  // chunk 0 on lane 0, chunk 1 on lane 1
  auto lane0 = Connect(), lane1 = Connect();
  const auto w = lane0->Hello("t", token, 0, 0);
  ASSERT_NE(lane1->Hello("t", token, 0, 1).tenant_handle(), 0u);
  dpb::OptimizerUpdate update;
  update.mutable_optimizer()->set_learning_rate(0.25);  // type kept: SGD, sum reduction
  update.mutable_optimizer()->set_reduction(pb::SUM);
  FrameHeader so;
  so.opcode = Opcode::kSetOptimizer;
  so.tenant = w.tenant_handle();
  so.key = k.id();
  so.iteration = 2;  // from iteration 2 on
  lane0->Send(so, update.SerializeAsString());
  const auto ack = lane0->Receive();
  ASSERT_TRUE(ack && ack->h.opcode == Opcode::kAck);
  // Only now does lane 1 see chunk 1 for the first time.
  float p0 = 0, p1 = 0;
  for (uint64_t it = 0; it < 4; ++it) {
    for (uint32_t chunk : {0u, 1u}) {
      DataLink* c = chunk == 0 ? lane0.get() : lane1.get();
      FrameHeader h;
      h.opcode = Opcode::kPush;
      h.tenant = w.tenant_handle();
      h.key = k.id();
      h.chunk = chunk;
      h.dtype = net::DType::kFp32;
      h.iteration = it;
      c->Send(h, Floats(chunk == 0 ? 1024 : 4, 1.0f));
      const auto f = c->Receive();
      ASSERT_TRUE(f && f->h.opcode == Opcode::kParams);
      float& p = chunk == 0 ? p0 : p1;
      p = p - (it < 2 ? 0.5f : 0.25f) * 1.0f;
      EXPECT_EQ(AsFloats(f->payload)[0], p) << "chunk " << chunk << " iteration " << it;
    }
  }
}

// Shared memory: the worker can write anything anywhere in its region. Every
// kind of garbage (a head beyond the ring, an unknown record kind, a record
// whose size disagrees with its frame, a record overrunning the ring, a pad
// record in the middle, a bogus tail of the hub's own send ring) closes that
// worker's connection only: the hub answers a fatal MALFORMED when it still
// can, keeps running and serves another tenant.
TEST_P(DataPlaneProtocolTest, GarbageInTheSharedRegionClosesOnlyThatConnection) {
  if (GetParam() != Transport::kShm) GTEST_SKIP() << "shared-memory regions only";
  const std::string token = CreateTenant("t", 1);
  const pb::Key key = CreateKey("t", "k", 4);
  namespace shm = net::shm;
  struct Case {
    const char* name;
    std::function<void(shm::Channel&)> inject;
  };
  const auto record = [](uint32_t kind, uint32_t bytes, uint32_t payload_bytes) {
    std::string r(64, '\0');
    std::memcpy(r.data(), &kind, 4);
    std::memcpy(r.data() + 4, &bytes, 4);
    FrameHeader h;
    h.opcode = Opcode::kHeartbeat;
    h.payload_bytes = payload_bytes;
    std::array<std::byte, net::kHeaderBytes> hb{};
    net::EncodeHeader(h, hb);
    std::memcpy(r.data() + shm::kRecordPrefixBytes, hb.data(), hb.size());
    return r;
  };
  constexpr uint32_t kFrame = 0x46524543, kPad = 0x44444150;
  const std::vector<Case> cases = {
      {"head beyond the ring",
       [](shm::Channel& c) { c.WriteRawForTesting({}, uint64_t{c.ring_bytes()} * 3); }},
      {"unknown record kind",
       [&](shm::Channel& c) {
         const std::string r = record(0xdeadbeef, 64, 0);
         c.WriteRawForTesting(std::as_bytes(std::span(r)), 64);
       }},
      {"record size disagrees with its frame",
       [&](shm::Channel& c) {
         const std::string r = record(kFrame, 64, 1u << 20);
         c.WriteRawForTesting(std::as_bytes(std::span(r)), 64);
       }},
      {"record overruns the bytes written",
       [&](shm::Channel& c) {
         const std::string r = record(kFrame, c.ring_bytes(), 0);
         c.WriteRawForTesting(std::as_bytes(std::span(r)), 64);
       }},
      {"pad record in the middle",
       [&](shm::Channel& c) {
         const std::string r = record(kPad, 128, 0);
         c.WriteRawForTesting(std::as_bytes(std::span(r)), 128);
       }},
      {"bogus tail of the hub's send ring",
       [](shm::Channel& c) {
         // Ring 1 (hub to worker) control: tail at offset 512 + 64.
         const uint64_t bogus = uint64_t{1} << 40;
         std::memcpy(c.RegionForTesting().data() + 512 + 64, &bogus, sizeof bogus);
       }},
  };
  uint64_t iteration = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto link = Connect();
    const auto w = link->Hello("t", token, 0, 0);
    ASSERT_NE(w.tenant_handle(), 0u);
    auto* conn_link = dynamic_cast<testing::ConnectionLink*>(link.get());
    ASSERT_NE(conn_link, nullptr);
    conn_link->RunOnIo([&] {
      auto* conn =
          static_cast<net::ChannelConnection<shm::Channel>*>(conn_link->connection().get());
      c.inject(conn->channel());
    });
    // The bogus tail shows when the hub next writes to us: ask for a reply.
    FrameHeader push;
    push.opcode = Opcode::kPush;
    push.tenant = w.tenant_handle();
    push.key = key.id();
    push.dtype = net::DType::kFp32;
    push.iteration = iteration;
    push.request_id = 7;
    link->Send(push, Floats({1, 2, 3, 4}));
    EXPECT_TRUE(link->ClosedByPeer()) << "the hub kept the connection";
    ExpectBystanderWorks();
  }
  ASSERT_EQ(kill(hub_->daemon()->pid(), 0), 0) << "the hub died";
  EXPECT_TRUE(testing::WaitForLog(*hub_->daemon(), "shared-memory ring"));
}

TEST_P(DataPlaneProtocolTest, KilledWorkerFailsTheOthersAtOnce) {
  const std::string token = CreateTenant("t", 3);
  const pb::Key k = CreateKey("t", "w", 1024);
  auto r0 = Connect(), r1 = Connect();
  const auto w = r0->Hello("t", token, 0, 0);
  ASSERT_NE(r1->Hello("t", token, 1, 0).tenant_handle(), 0u);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = w.tenant_handle();
  h.key = k.id();
  h.dtype = net::DType::kFp32;
  {
    auto r2 = Connect();
    ASSERT_NE(r2->Hello("t", token, 2, 0).tenant_handle(), 0u);
    r0->Send(h, Floats(1024, 1.0f));
    r1->Send(h, Floats(1024, 1.0f));
    // Both pushes are pending at the hub before rank 2 leaves: nothing orders
    // frames and closes of different connections, and a loss seen first
    // would refuse the pushes as "recovering" instead.
    ASSERT_TRUE(testing::WaitForPushes(hub_->admin_address(), "t", 2));
  }  // rank 2 goes away without pushing
  const auto start = std::chrono::steady_clock::now();
  // Named as a closed connection, not as a straggler ("rank(s) 2 did not
  // push"): the bound below is then only about promptness.
  ExpectError(r0->Receive(), WireError::kWorkerLost, "worker lost: rank 2 lane 0: ", false);
  ExpectError(r1->Receive(), WireError::kWorkerLost, "worker lost: rank 2 lane 0: ", false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Ms(300))
      << "a closed connection is noticed at once, well before the straggler timeout";
}

TEST_P(DataPlaneProtocolTest, StragglerTimesOut) {
  const std::string token = CreateTenant("t", 2);
  const pb::Key k = CreateKey("t", "w", 16);
  auto r0 = Connect(), r1 = Connect();
  const auto w = r0->Hello("t", token, 0, 0);
  ASSERT_NE(r1->Hello("t", token, 1, 0).tenant_handle(), 0u);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = w.tenant_handle();
  h.key = k.id();
  h.dtype = net::DType::kFp32;
  const auto start = std::chrono::steady_clock::now();
  r0->Send(h, Floats(16, 1.0f));  // rank 1 stays silent but connected
  ExpectError(r0->Receive(std::chrono::seconds(3)), WireError::kWorkerLost,
              "straggler: rank(s) 1 did not push within " + std::to_string(StragglerMs()) + " ms",
              false);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(StragglerMs()));
  EXPECT_LT(waited, Ms(1500));
  // The partial sum was discarded: after a Pull (held until the tenant is
  // consistent again; docs/durability.md) both push iteration 0 again.
  FrameHeader pull;
  pull.opcode = Opcode::kPull;
  pull.tenant = h.tenant;
  pull.key = h.key;
  pull.request_id = 5;
  r0->Send(pull);
  const auto pulled = r0->Receive();
  ASSERT_TRUE(pulled && pulled->h.opcode == Opcode::kParams) << testing::Describe(pulled);
  EXPECT_EQ(pulled->h.iteration, 0u);
  r0->Send(h, Floats(16, 1.0f));
  r1->Send(h, Floats(16, 2.0f));
  const auto f = r0->Receive();
  ASSERT_TRUE(f && f->h.opcode == Opcode::kParams);
  EXPECT_EQ(f->h.iteration, 1u);
  EXPECT_EQ(AsFloats(f->payload)[0], -1.5f);
}

TEST_P(DataPlaneProtocolTest, InitBroadcastsToPullers) {
  const std::string token = CreateTenant("t", 2);
  dpb::KeyDeclaration decl;
  decl.set_name("emb");
  decl.set_elements(4);
  decl.set_init(pb::FROM_CLIENT);
  auto r0 = Connect(), r1 = Connect();
  const auto w = r0->Hello("t", token, 0, 0);
  ASSERT_NE(r1->Hello("t", token, 1, 0).tenant_handle(), 0u);
  FrameHeader d;
  d.opcode = Opcode::kDeclare;
  d.tenant = w.tenant_handle();
  d.request_id = 5;
  r1->Send(d, decl.SerializeAsString());
  auto info = r1->Receive();
  ASSERT_TRUE(info && info->h.opcode == Opcode::kKeyInfo);
  dpb::KeyEntry entry;
  ASSERT_TRUE(entry.ParseFromString(info->payload));
  EXPECT_EQ(entry.name(), "emb");
  // The same declaration from rank 0 returns the same key; a conflicting one is refused.
  r0->Send(d, decl.SerializeAsString());
  info = r0->Receive();
  ASSERT_TRUE(info && info->h.opcode == Opcode::kKeyInfo);
  dpb::KeyEntry entry0;
  entry0.ParseFromString(info->payload);
  EXPECT_EQ(entry0.id(), entry.id());
  decl.set_elements(5);
  r0->Send(d, decl.SerializeAsString());
  ExpectError(r0->Receive(), WireError::kInvalidArgument, "already exists with 4", false);

  // INIT of a zeros key is refused without closing the connection.
  {
    CreateKey("t", "pad", 4);                          // chunk index 1 (lane 1)
    const pb::Key zeros = CreateKey("t", "zeros", 4);  // chunk index 2: lane 0
    FrameHeader bad;
    bad.opcode = Opcode::kInit;
    bad.tenant = w.tenant_handle();
    bad.key = zeros.id();
    bad.dtype = net::DType::kFp32;
    r0->Send(bad, Floats({1, 1, 1, 1}));
    ExpectError(r0->Receive(), WireError::kInvalidArgument, "starts at zeros", false);
  }
  // Rank 1 pulls before rank 0 initialized: the reply waits for INIT.
  FrameHeader pull;
  pull.opcode = Opcode::kPull;
  pull.tenant = w.tenant_handle();
  pull.key = entry.id();
  pull.request_id = 8;
  r1->Send(pull);
  EXPECT_FALSE(r1->Receive(std::chrono::milliseconds(100)).has_value());
  FrameHeader init = pull;
  init.opcode = Opcode::kInit;
  init.dtype = net::DType::kFp32;
  r0->Send(init, Floats({4, 3, 2, 1}));
  for (DataLink* c : {r0.get(), r1.get()}) {
    const auto f = c->Receive();
    ASSERT_TRUE(f && f->h.opcode == Opcode::kParams);
    EXPECT_EQ(f->h.iteration, 0u);
    EXPECT_EQ(AsFloats(f->payload), (std::vector<float>{4, 3, 2, 1}));
  }
  // A second INIT is refused, the connection stays usable.
  r0->Send(init, Floats({9, 9, 9, 9}));
  ExpectError(r0->Receive(), WireError::kInvalidArgument, "already initialized", false);
  r0->Send(pull);
  const auto again = r0->Receive();
  ASSERT_TRUE(again && again->h.opcode == Opcode::kParams);
  EXPECT_EQ(AsFloats(again->payload), (std::vector<float>{4, 3, 2, 1}));
  // The registry now reports the key ready.
  grpc::ClientContext ctx;
  pb::GetKeyRequest get;
  get.set_tenant("t");
  get.set_name("emb");
  pb::Key k;
  ASSERT_TRUE(keys_->GetKey(&ctx, get, &k).ok());
  EXPECT_TRUE(k.ready());
}

TEST_P(DataPlaneProtocolTest, ShutdownNoticeReachesWorkers) {
  const std::string token = CreateTenant("t", 1);
  auto connected = Connect();
  ASSERT_NE(connected->Hello("t", token, 0, 0).tenant_handle(), 0u);
  hub_->BeginShutdown();
  ExpectError(connected->Receive(), WireError::kShuttingDown, "shutting down");
  EXPECT_TRUE(connected->ClosedByPeer());
  EXPECT_EQ(hub_->FinishShutdown(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, DataPlaneProtocolTest,
                         ::testing::ValuesIn(testing::AllTransports()),
                         testing::TransportParamName);

TEST(DataPlaneHelloTimeoutTest, SilentConnectionIsClosed) {
  // hello_timeout_ms is 10 s by default; a config shortens it here.
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/c.toml", "[data]\nhello_timeout_ms = 300\n");
  DaemonProcess quick({"--lanes", "1", "--config", dir + "/c.toml"});
  ASSERT_TRUE(quick.started());
  RawClient silent(quick.data_address());
  const auto start = std::chrono::steady_clock::now();
  ExpectError(silent.Receive(std::chrono::seconds(3)), WireError::kMalformed, "no HELLO");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace rackhub
