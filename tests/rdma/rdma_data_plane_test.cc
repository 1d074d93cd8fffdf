// The data plane over every available transport (CTest label `rdma`): the
// real rackhubd, tenants made with the real rackhubctl, librackhub clients.
// RDMA cases need a verbs device (natively, or inside the Soft-RoCE VM of
// tests/rdma/run.sh); without one they are reported SKIPPED, never passed.
//
//  - the same training run over TCP and over RDMA gives bitwise-identical
//    parameters (fp32 + adam and fp16 + momentum, keys over several lanes);
//  - a client writing with a bogus rkey, out of the ring's bounds, or with a
//    bogus immediate loses only its own connection; another tenant's client
//    on the same lane goes on;
//  - a worker that disconnects fails the pending requests of the others
//    (WORKER_LOST) at once, and the lane keeps serving;
//  - a hub that dies fails the client's pending tickets (no hang).
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "process.h"
#include "rdma_env.h"
#include "rackhub/client/client.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/rdma/device.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using testing::BinPath;
using testing::DaemonProcess;
using testing::RunCommand;
namespace rdma = net::rdma;

constexpr uint32_t kChunkBytes = 1024;  // 256 fp32 per chunk: keys span lanes
// Soft-RoCE under TCG emulation is slow; be generous.
constexpr auto kConnectTimeout = 60s;
constexpr auto kOpTimeout = 60s;

// One rackhubd with TCP and (if `rdma`) RDMA on a fixed port of `ip`.
class Hub {
 public:
  Hub(bool rdma, const std::string& ip, std::vector<std::string> extra = {}) {
    static int instance = 0;
    // Distinct ports per daemon of this process; rdma_cm ports are not
    // reported in the ready file.
    rdma_address_ = ip + ":" + std::to_string(20000 + (getpid() % 2000) * 8 + instance++ % 8);
    std::vector<std::string> args = {"--lanes", "2", "--no-pin-lanes", "--transport",
                                     rdma ? "rdma" : "tcp"};
    if (rdma) {
      args.push_back("--rdma-listen");
      args.push_back(rdma_address_);
    }
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(args);
  }
  DaemonProcess& daemon() { return *daemon_; }
  const std::string& rdma_address() const { return rdma_address_; }

  std::string CreateTenant(const std::string& name, uint32_t workers) {
    const auto r = RunCommand({BinPath("rackhubctl"), "--admin", daemon_->admin_address(), "tenant",
                               "create", name, "--workers", std::to_string(workers),
                               "--chunk-bytes", std::to_string(kChunkBytes)});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string token = testing::OutputField(r.out, "data-plane token");
    EXPECT_FALSE(token.empty()) << "no token line in:\n" << r.out;
    return token;
  }

  client::Options Options(bool rdma, const std::string& tenant, const std::string& token,
                          uint32_t rank) {
    client::Options o;
    o.hub = daemon_->data_address();
    o.transport = rdma ? client::Transport::kRdma : client::Transport::kTcp;
    o.rdma_hub = rdma_address_;
    // The smallest ring (64 slots): replies wrap around it and the hub waits
    // for credits every iteration, so wrap-around and flow control are exercised.
    o.rdma_ring_bytes = rdma::kMinRingBytes;
    o.tenant = tenant;
    o.token = token;
    o.rank = rank;
    o.connect_timeout = kConnectTimeout;
    o.op_timeout = kOpTimeout;
    return o;
  }

 private:
  std::unique_ptr<DaemonProcess> daemon_;
  std::string rdma_address_;
};

#define REQUIRE_RDMA(ip)                           \
  std::string ip, skip_why_;                       \
  if (!testing::HaveRdma(&ip, &skip_why_)) GTEST_SKIP() << skip_why_

float Gradient(uint32_t rank, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + rank * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(rank);
}

std::unique_ptr<Client> MustConnect(const client::Options& o) {
  client::Error e;
  auto c = Client::Connect(o, &e);
  EXPECT_TRUE(c) << client::ErrorCodeName(e.code) << ": " << e.message;
  return c;
}

// Two workers, two keys, `iterations` synchronous steps; returns every
// parameter bit pattern both ranks saw after every iteration.
std::vector<uint32_t> Train(Hub& hub, bool rdma, int iterations) {
  const std::string token = hub.CreateTenant("job", 2);
  std::vector<std::vector<uint32_t>> seen(2);
  auto worker = [&](uint32_t rank) {
    auto c = MustConnect(hub.Options(rdma, "job", token, rank));
    if (!c) return;
    client::KeyDecl a{"dense", 3000, client::DType::kFp32,
                      client::OptimizerSpec{"adam", 0.01, 0, 0, 0.9, 0.999, 1e-8, 0, ""},
                      client::Init::kZeros};
    client::KeyDecl b{"half", 1100, client::DType::kFp16,
                      client::OptimizerSpec{"momentum", 0.05, 0.9, 0, 0, 0, 0, 0, ""},
                      client::Init::kZeros};
    client::KeyId ka = 0, kb = 0;
    ASSERT_TRUE(c->DeclareKey(a, &ka).ok());
    ASSERT_TRUE(c->DeclareKey(b, &kb).ok());
    std::vector<float> ga(3000), gb(1100), pa(3000), pb(1100);
    for (int it = 0; it < iterations; ++it) {
      for (size_t i = 0; i < ga.size(); ++i) ga[i] = Gradient(rank, it, i);
      for (size_t i = 0; i < gb.size(); ++i) gb[i] = Gradient(rank, it, i + 7);
      const auto ta = c->PushPull(ka, ga, pa);
      const auto tb = c->PushPull(kb, gb, pb);
      const auto ea = c->Wait(ta), eb = c->Wait(tb);
      ASSERT_TRUE(ea.ok()) << ea.message;
      ASSERT_TRUE(eb.ok()) << eb.message;
      for (float f : pa) seen[rank].push_back(std::bit_cast<uint32_t>(f));
      for (float f : pb) seen[rank].push_back(std::bit_cast<uint32_t>(f));
    }
    c->Close();
  };
  std::thread t1(worker, 1);
  worker(0);
  t1.join();
  EXPECT_EQ(seen[0], seen[1]) << "ranks disagree";
  return seen[0];
}

TEST(RdmaDataPlaneTest, TcpAndRdmaGiveBitwiseIdenticalParameters) {
  REQUIRE_RDMA(ip);
  constexpr int kIterations = 4;
  std::vector<uint32_t> over_tcp, over_rdma;
  {
    Hub hub(false, ip);
    ASSERT_TRUE(hub.daemon().started());
    over_tcp = Train(hub, false, kIterations);
  }
  {
    Hub hub(true, ip);
    ASSERT_TRUE(hub.daemon().started());
    over_rdma = Train(hub, true, kIterations);
    EXPECT_NE(hub.daemon().Log().find("RDMA data plane on"), std::string::npos)
        << hub.daemon().Log();
  }
  ASSERT_EQ(over_tcp.size(), size_t{kIterations} * 4100);
  ASSERT_EQ(over_tcp.size(), over_rdma.size());
  size_t differ = 0;
  for (size_t i = 0; i < over_tcp.size(); ++i) differ += over_tcp[i] != over_rdma[i];
  EXPECT_EQ(differ, 0u) << "parameters differ between TCP and RDMA";
}

// A raw RDMA connection that authenticated as `rank` of `tenant` on lane 0.
struct RawWorker {
  std::shared_ptr<rdma::Channel> channel;
  boost::asio::io_context io;
  bool closed = false;
  std::string why;
  int frames = 0;

  bool Connect(const std::string& rdma_hub, const std::string& tenant, const std::string& token,
               uint32_t rank) {
    const Result<net::Endpoint> ep = net::ParseEndpoint(rdma_hub);
    EXPECT_TRUE(ep.ok()) << ep.status().message();
    if (!ep.ok()) return false;
    rdma::ChannelOptions o;
    o.ring_bytes = 1u << 20;
    Result<std::shared_ptr<rdma::Channel>> connected =
        rdma::Channel::Connect(*ep, 0, o, std::chrono::steady_clock::now() + kConnectTimeout);
    EXPECT_TRUE(connected.ok()) << connected.status().message();
    if (!connected.ok()) return false;
    channel = *std::move(connected);
    rdma::Channel::Callbacks cb;
    cb.on_frame = [this](const net::FrameHeader&, std::span<const std::byte>) { ++frames; };
    cb.on_closed = [this](const std::string& w) {
      closed = true;
      why = w;
    };
    channel->Attach(io, std::move(cb));
    data::v1::Hello hello;
    hello.set_tenant(tenant);
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_lane(0);
    Send(net::Opcode::kHello, hello.SerializeAsString());
    RunUntil([&] { return frames > 0 || closed; }, kConnectTimeout);  // WELCOME
    return frames > 0 && !closed;
  }
  void Send(net::Opcode op, std::string payload) {
    net::FrameHeader h;
    h.opcode = op;
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    rdma::OutgoingFrame f;
    net::EncodeHeader(h, f.header);
    f.owned = std::move(payload);
    channel->Send(std::move(f));
  }
  template <typename Pred>
  void RunUntil(Pred done, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_one_for(100ms);
      if (io.stopped()) io.restart();
    }
  }
};

class RdmaFaultTest : public ::testing::TestWithParam<int> {};

TEST_P(RdmaFaultTest, BadWriterLosesOnlyItsOwnConnection) {
  REQUIRE_RDMA(ip);
  Hub hub(true, ip);
  ASSERT_TRUE(hub.daemon().started());
  const std::string good_token = hub.CreateTenant("good", 1);
  const std::string bad_token = hub.CreateTenant("bad", 1);
  auto good = MustConnect(hub.Options(true, "good", good_token, 0));
  ASSERT_TRUE(good);
  client::KeyId key = 0;
  ASSERT_TRUE(good->DeclareKey({"k", 2048, client::DType::kFp32, std::nullopt,
                                client::Init::kZeros},
                               &key)
                  .ok());
  std::vector<float> g(2048, 0.5f), p(2048);
  auto step = [&] {
    const auto e = good->Wait(good->PushPull(key, g, p));
    EXPECT_TRUE(e.ok()) << e.message;
  };
  step();

  RawWorker bad;
  ASSERT_TRUE(bad.Connect(hub.rdma_address(), "bad", bad_token, 0));
  const uint32_t ring = bad.channel->peer().slots * rdma::kSlotBytes;
  switch (GetParam()) {
    case 0: bad.channel->InjectFaultForTesting(0x5a5a5a5a, 0); break;          // bogus rkey
    case 1: bad.channel->InjectFaultForTesting(0, ring - 512); break;          // past the ring's end
    case 2: bad.channel->InjectFaultForTesting(0, 0, ring / 1024 + 7); break;  // bogus slot index
  }
  bad.Send(net::Opcode::kHeartbeat, std::string(4000, 'x'));
  bad.RunUntil([&] { return bad.closed; }, 60s);
  EXPECT_TRUE(bad.closed) << "the bad writer's connection should be closed";
  std::cout << "bad writer's side: " << bad.why << "\n";
  // The good client, same lane, other tenant: unaffected.
  step();
  step();
  EXPECT_EQ(hub.daemon().Stop(SIGTERM), 0) << hub.daemon().Log();
  // The hub closed the bad connection (and said why), nothing else.
  const std::string log = hub.daemon().Log();
  std::istringstream lines(log);
  bool bad_closed = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("'bad'") != std::string::npos) std::cout << "hub: " << line << "\n";
    bad_closed |= line.find("tenant 'bad' rank 0 lane 0 disconnected") != std::string::npos;
    EXPECT_EQ(line.find("tenant 'good' rank 0 lane 0 disconnected: rdma"), std::string::npos)
        << line;
  }
  EXPECT_TRUE(bad_closed) << log;
  if (GetParam() == 2) {
    EXPECT_NE(log.find("immediate names slot"), std::string::npos) << log;
  }
}

std::string FaultName(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"BogusRkey", "OutOfBoundsOffset", "BogusImmediate"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Faults, RdmaFaultTest, ::testing::Values(0, 1, 2), FaultName);

TEST(RdmaDataPlaneTest, DisconnectFailsPendingRequestsWithoutHangingTheLane) {
  REQUIRE_RDMA(ip);
  Hub hub(true, ip, {"--straggler-timeout-ms", "120000"});
  ASSERT_TRUE(hub.daemon().started());
  const std::string token = hub.CreateTenant("pair", 2);
  auto rank1 = MustConnect(hub.Options(true, "pair", token, 1));
  ASSERT_TRUE(rank1);
  client::KeyId key = 0;
  ASSERT_TRUE(
      rank1->DeclareKey({"k", 1000, client::DType::kFp32, std::nullopt, client::Init::kZeros}, &key)
          .ok());
  RawWorker rank0;
  ASSERT_TRUE(rank0.Connect(hub.rdma_address(), "pair", token, 0));
  std::vector<float> g(1000, 1.0f), p(1000);
  const auto ticket = rank1->PushPull(key, g, p);  // waits for rank 0
  EXPECT_EQ(rank1->WaitFor(ticket, 2s).code, client::ErrorCode::kTimeout);
  const auto t0 = std::chrono::steady_clock::now();
  rank0.channel->Close("test: rank 0 goes away");  // rdma_disconnect, no BYE
  const auto e = rank1->Wait(ticket);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(e.code, client::ErrorCode::kServer) << e.message;
  EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
  EXPECT_LT(took, 30s) << "failed only after the straggler timeout?";
  // The lanes still serve: a single-worker tenant trains on them.
  const std::string solo_token = hub.CreateTenant("solo", 1);
  auto solo = MustConnect(hub.Options(true, "solo", solo_token, 0));
  ASSERT_TRUE(solo);
  client::KeyId sk = 0;
  ASSERT_TRUE(
      solo->DeclareKey({"s", 1000, client::DType::kFp32, std::nullopt, client::Init::kZeros}, &sk)
          .ok());
  EXPECT_TRUE(solo->Wait(solo->PushPull(sk, g, p)).ok());
}

TEST(RdmaDataPlaneTest, DeadHubFailsPendingTickets) {
  REQUIRE_RDMA(ip);
  Hub hub(true, ip);
  ASSERT_TRUE(hub.daemon().started());
  const std::string token = hub.CreateTenant("pair", 2);
  auto rank0 = MustConnect(hub.Options(true, "pair", token, 0));
  ASSERT_TRUE(rank0);
  client::KeyId key = 0;
  ASSERT_TRUE(
      rank0->DeclareKey({"k", 1000, client::DType::kFp32, std::nullopt, client::Init::kZeros}, &key)
          .ok());
  std::vector<float> g(1000, 1.0f), p(1000);
  const auto ticket = rank0->PushPull(key, g, p);  // rank 1 never comes
  EXPECT_EQ(rank0->WaitFor(ticket, 1s).code, client::ErrorCode::kTimeout);
  kill(hub.daemon().pid(), SIGKILL);
  const auto e = rank0->Wait(ticket);
  EXPECT_EQ(e.code, client::ErrorCode::kConnectionLost) << e.message;
}

}  // namespace
}  // namespace rackhub
