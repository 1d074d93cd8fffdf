// Hub-to-hub links over RDMA (CTest label `rdma`): two real rackhubd with
// data.transport = rdma in a hierarchical topology on the RDMA interface's
// address, real librackhub workers over RDMA (2 racks x 2 workers).
//
//  - every iteration's parameters, as every worker saw them, are bit for bit
//    those of one flat hub serving all four workers (the hierarchical exchange
//    adds in the same order);
//  - the hubs' logs say the hub links are RDMA ("connected to rack N's hub ...
//    (rdma)", "accepted rack N's hub from rdma:..."), and GetStats counts
//    the chunk bytes they carried;
//  - killing the other rack's hub fails the workers' pending updates with
//    WORKER_LOST within seconds (link lost), and later updates too (the
//    RDMA reconnects fail, the queued frames are given up); then the hub still
//    shuts down promptly while its lanes keep trying to reconnect.
// And the RDMA listener's hub-link handshake, with a raw rdma::Channel playing
// the other hub: a HUB_PROOF under a wrong secret, or a HUB_HELLO naming
// another lane than the connect request, is refused with a fatal ERROR; a
// right one gets HUB_ACCEPT with the hub's proof and is adopted.
// Needs a verbs device (natively, or the Soft-RoCE VM of tests/rdma/run.sh);
// without one the case is SKIPPED, never passed.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "hub_link_auth.h"
#include "process.h"
#include "rdma_env.h"
#include "wait.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/client/client.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/rdma/device.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using testing::DaemonProcess;
namespace pb = rackhub::admin::v1;
namespace rdma = net::rdma;

constexpr uint32_t kWorkersPerRack = 2;
constexpr uint32_t kRacks = 2;
constexpr uint32_t kLanes = 2;
constexpr uint32_t kChunkBytes = 1024;  // 256 fp32 per chunk: keys span lanes and homes
constexpr int kIterations = 5;
// Soft-RoCE under TCG emulation is slow; be generous (but the hub's own
// WORKER_LOST must come well before op_timeout).
constexpr auto kConnectTimeout = 60s;
constexpr auto kOpTimeout = 60s;

// A TCP port free on `ip` right now. rdma_cm has its own port space (on
// RoCE/InfiniBand), where it is all but certainly free too.
uint16_t FreePort(const std::string& ip) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  socklen_t len = sizeof sa;
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// One rackhubd over RDMA (workers on `rdma_listen`), in `topology`.
struct RdmaHub {
  RdmaHub(const std::string& rdma_listen, const std::string& config_file,
          std::vector<std::string> topology)
      : rdma_address(rdma_listen) {
    std::vector<std::string> args = {"--config",      config_file, "--lanes",       "2",
                                     "--no-pin-lanes", "--transport", "rdma", "--rdma-listen",
                                     rdma_listen};
    args.insert(args.end(), topology.begin(), topology.end());
    daemon = std::make_unique<DaemonProcess>(args);
  }
  std::unique_ptr<DaemonProcess> daemon;
  std::string rdma_address;
};

// Tenant `name` (2 workers per rack, kChunkBytes chunks) with `token`.
void CreateTenant(const std::string& admin, const std::string& name, const std::string& token) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::CreateTenantRequest req;
  req.set_name(name);
  req.set_workers_per_rack(kWorkersPerRack);
  req.set_chunk_bytes(kChunkBytes);
  req.set_token(token);
  pb::CreateTenantResponse resp;
  const grpc::Status s = pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << admin << ": " << s.error_message();
}

// Chunk bytes this hub queued on its hub links so far (GetStats rack_links).
uint64_t RackLinkChunkBytes(const std::string& admin) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::GetStatsResponse resp;
  const grpc::Status s = pb::StatsService::NewStub(channel)->GetStats(&ctx, {}, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  uint64_t total = 0;
  for (const auto& l : resp.daemon().rack_links()) total += l.chunk_bytes_out();
  return total;
}

client::Options WorkerOptions(const RdmaHub& hub, const std::string& tenant,
                              const std::string& token, uint32_t rack, uint32_t rank) {
  client::Options o;
  o.hub = hub.daemon->data_address();
  o.transport = client::Transport::kRdma;
  o.rdma_hub = hub.rdma_address;
  o.rdma_ring_bytes = rdma::kMinRingBytes;
  o.tenant = tenant;
  o.token = token;
  o.rack = rack;
  o.rank = rank;
  o.connect_timeout = kConnectTimeout;
  o.op_timeout = kOpTimeout;
  return o;
}

float Gradient(uint32_t member, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + member * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(member);
}

const client::KeyDecl kDense{"dense", 3000, client::DType::kFp32,
                             client::OptimizerSpec{"adam", 0.01, 0, 0, 0.9, 0.999, 1e-8, 0, ""},
                             client::Init::kZeros};
const client::KeyDecl kHalf{"half", 1100, client::DType::kFp16,
                            client::OptimizerSpec{"momentum", 0.05, 0.9, 0, 0, 0, 0, 0, ""},
                            client::Init::kZeros};

// Every worker (rack r, rank i: member r * W + i) trains kIterations on two
// keys; returns, by member, the bit pattern of every parameter it saw after
// every iteration. `hub_of(rack)` is the hub that rack's workers use.
std::vector<std::vector<uint32_t>> Train(const std::function<const RdmaHub&(uint32_t)>& hub_of,
                                         const std::string& token) {
  std::vector<std::vector<uint32_t>> seen(kRacks * kWorkersPerRack);
  auto worker = [&](uint32_t rack, uint32_t rank) {
    const uint32_t member = rack * kWorkersPerRack + rank;
    client::Error e;
    auto c = Client::Connect(WorkerOptions(hub_of(rack), "job", token, rack, rank), &e);
    if (!c) {
      ADD_FAILURE() << "member " << member << ": " << client::ErrorCodeName(e.code) << ": "
                    << e.message;
      return;
    }
    client::KeyId ka = 0, kb = 0;
    const client::Error da = c->DeclareKey(kDense, &ka);
    const client::Error db = da.ok() ? c->DeclareKey(kHalf, &kb) : da;
    if (!db.ok()) {
      ADD_FAILURE() << "member " << member << ": " << db.message;
      return;
    }
    std::vector<float> ga(kDense.elements), gb(kHalf.elements), pa(ga.size()), pb(gb.size());
    for (int it = 0; it < kIterations; ++it) {
      for (size_t i = 0; i < ga.size(); ++i) ga[i] = Gradient(member, it, i);
      for (size_t i = 0; i < gb.size(); ++i) gb[i] = Gradient(member, it, i + 7);
      const auto ta = c->PushPull(ka, ga, pa);
      const auto tb = c->PushPull(kb, gb, pb);
      const auto ea = c->Wait(ta), eb = c->Wait(tb);
      if (!ea.ok() || !eb.ok()) {
        ADD_FAILURE() << "member " << member << " iteration " << it << ": " << ea.message << " / "
                      << eb.message;
        return;
      }
      for (float f : pa) seen[member].push_back(std::bit_cast<uint32_t>(f));
      for (float f : pb) seen[member].push_back(std::bit_cast<uint32_t>(f));
    }
    c->Close();
  };
  std::vector<std::thread> threads;
  for (uint32_t rack = 0; rack < kRacks; ++rack) {
    for (uint32_t rank = 0; rank < kWorkersPerRack; ++rank) threads.emplace_back(worker, rack, rank);
  }
  for (auto& t : threads) t.join();
  return seen;
}

size_t CountMatches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Prints the log lines mentioning `what` (for the test's output).
void ShowLines(const std::string& who, const std::string& log, const std::string& what) {
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(what) != std::string::npos) std::cout << who << ": " << line << "\n";
  }
}

TEST(RdmaMultiRackTest, HubLinksOverRdmaGiveTheFlatBitsAndFailFastWhenAHubDies) {
  std::string ip, why;
  if (!testing::HaveRdma(&ip, &why)) GTEST_SKIP() << why;

  const std::string dir = testing::MakeTempDir();
  const std::string secret_file = dir + "/hub.secret";
  testing::WriteFile(secret_file, std::string(48, 's') + "\n");
  // Small hub rings (64 slots): the hub links wait for credits every
  // iteration, so their flow control is exercised.
  const std::string config_file = dir + "/rackhubd.toml";
  testing::WriteFile(config_file, "[data]\nrdma_ring_bytes = \"64KiB\"\n");
  // Every rack's data=interhub. The interhub ports carry TCP and rdma_cm
  // hub links alike; here only rdma_cm is used.
  std::string racks;
  for (uint32_t r = 0; r < kRacks; ++r) {
    racks += (r ? "," : "") + ip + ":0=" + ip + ":" + std::to_string(FreePort(ip));
  }
  const std::string token(40, 'k');
  auto rdma_listen = [&] { return ip + ":" + std::to_string(FreePort(ip)); };

  // Reference: one flat hub serving every rack's workers.
  std::vector<std::vector<uint32_t>> flat;
  {
    RdmaHub hub(rdma_listen(), config_file,
                {"--racks", racks, "--rack", "0", "--topology-mode", "flat", "--hub-secret-file",
                 secret_file});
    ASSERT_TRUE(hub.daemon->started());
    CreateTenant(hub.daemon->admin_address(), "job", token);
    flat = Train([&](uint32_t) -> const RdmaHub& { return hub; }, token);
    EXPECT_EQ(hub.daemon->Stop(SIGTERM), 0) << hub.daemon->Log();
  }

  // Hierarchical: one hub per rack, hub links over RDMA.
  std::vector<std::unique_ptr<RdmaHub>> hubs;
  for (uint32_t r = 0; r < kRacks; ++r) {
    hubs.push_back(std::make_unique<RdmaHub>(
        rdma_listen(), config_file,
        std::vector<std::string>{"--racks", racks, "--rack", std::to_string(r),
                                 "--hub-secret-file", secret_file}));
    ASSERT_TRUE(hubs.back()->daemon->started());
  }
  for (auto& h : hubs) CreateTenant(h->daemon->admin_address(), "job", token);
  const auto t_train = std::chrono::steady_clock::now();
  const auto hier = Train([&](uint32_t rack) -> const RdmaHub& { return *hubs[rack]; }, token);
  std::cout << "hierarchical run over RDMA hub links: " << kIterations << " iterations in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - t_train)
                   .count()
            << " ms\n";

  // (a) Bit for bit, every iteration, every worker.
  const size_t per_member = size_t{kIterations} * (kDense.elements + kHalf.elements);
  for (uint32_t m = 0; m < kRacks * kWorkersPerRack; ++m) {
    ASSERT_EQ(flat[m].size(), per_member) << "flat member " << m;
    ASSERT_EQ(hier[m].size(), per_member) << "hierarchical member " << m;
    size_t differ = 0;
    for (size_t i = 0; i < per_member; ++i) differ += flat[m][i] != hier[m][i];
    EXPECT_EQ(differ, 0u) << "member " << m << ": hierarchical (RDMA hub links) and flat differ";
    EXPECT_EQ(hier[m], hier[0]) << "member " << m << " disagrees with member 0";
  }
  std::cout << "verified: " << kRacks * kWorkersPerRack << " workers x " << kIterations
            << " iterations x " << kDense.elements + kHalf.elements
            << " parameters bit for bit equal to the flat hub\n";

  // (b) The links are RDMA: both lanes of each hub dialed the other hub over
  // rdma_cm and accepted its links over rdma_cm; they carried the chunks.
  for (uint32_t r = 0; r < kRacks; ++r) {
    const uint32_t peer = 1 - r;
    const std::string log = hubs[r]->daemon->Log();
    const std::string who = "hub " + std::to_string(r);
    ShowLines(who, log, "rack link");
    ShowLines(who, log, "rack exchange");
    EXPECT_EQ(CountMatches(log, "rack link: lane [0-9]+ connected to rack " +
                                    std::to_string(peer) + "'s hub at [^\n]* \\(rdma\\)"),
              size_t{kLanes})
        << log;
    EXPECT_EQ(CountMatches(log, "rack link: lane [0-9]+ accepted rack " + std::to_string(peer) +
                                    "'s hub from rdma:"),
              size_t{kLanes})
        << log;
    EXPECT_EQ(log.find("(tcp)"), std::string::npos) << log;
    EXPECT_NE(log.find("hub links over RDMA"), std::string::npos) << log;
    const uint64_t chunk_bytes = RackLinkChunkBytes(hubs[r]->daemon->admin_address());
    std::cout << who << ": GetStats rack_links chunk_bytes_out " << chunk_bytes << "\n";
    EXPECT_GT(chunk_bytes, 0u);
  }

  // (c) Rack 1's hub dies while rack 0's workers wait on it (rack 1's
  // workers are gone: every chunk waits for rack 1's sum or its answer).
  std::vector<std::unique_ptr<Client>> rack0;
  std::vector<client::KeyId> keys;
  for (uint32_t rank = 0; rank < kWorkersPerRack; ++rank) {
    client::Error e;
    auto c = Client::Connect(WorkerOptions(*hubs[0], "job", token, 0, rank), &e);
    ASSERT_TRUE(c) << client::ErrorCodeName(e.code) << ": " << e.message;
    client::KeyId k = 0;
    ASSERT_TRUE(c->DeclareKey(kDense, &k).ok());
    keys.push_back(k);
    rack0.push_back(std::move(c));
  }
  std::vector<std::vector<float>> grads(kWorkersPerRack, std::vector<float>(kDense.elements, 0.25f));
  std::vector<std::vector<float>> outs(kWorkersPerRack, std::vector<float>(kDense.elements));
  auto push_all = [&] {
    std::vector<client::Ticket> tickets;
    for (uint32_t i = 0; i < kWorkersPerRack; ++i) {
      tickets.push_back(rack0[i]->PushPull(keys[i], grads[i], outs[i]));
    }
    return tickets;
  };
  auto expect_worker_lost = [&](const std::vector<client::Ticket>& tickets,
                                std::chrono::steady_clock::time_point since, const char* what) {
    for (uint32_t i = 0; i < kWorkersPerRack; ++i) {
      const client::Error e = rack0[i]->Wait(tickets[i]);
      const auto took = std::chrono::steady_clock::now() - since;
      std::cout << what << ": rank " << i << " got " << client::ErrorCodeName(e.code) << " "
                << client::WireErrorName(e.wire) << " after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                << " ms: " << e.message << "\n";
      EXPECT_EQ(e.code, client::ErrorCode::kServer) << e.message;
      EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
      EXPECT_LT(took, 15s) << what << ": WORKER_LOST only after " << took.count() << " ns";
    }
  };
  // Pending: every chunk needs rack 1's sum or its home's answer.
  const auto pending = push_all();
  EXPECT_EQ(rack0[0]->WaitFor(pending[0], 2s).code, client::ErrorCode::kTimeout);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(hubs[1]->daemon->Stop(SIGKILL), 128 + SIGKILL);
  expect_worker_lost(pending, killed, "in flight when the hub died");
  // Later updates (a fresh key, so no iteration is in doubt): the lanes'
  // RDMA reconnects fail, the frames queued for rack 1 are given up
  // (RackExchange::kPeerWaitLimit).
  client::KeyDecl late = kDense;
  late.name = "late";
  for (uint32_t i = 0; i < kWorkersPerRack; ++i) {
    const client::Error e = rack0[i]->DeclareKey(late, &keys[i]);
    ASSERT_TRUE(e.ok()) << e.message;
  }
  const auto again = std::chrono::steady_clock::now();
  expect_worker_lost(push_all(), again, "pushed after the hub died");
  for (auto& c : rack0) c->Close();
  EXPECT_TRUE(testing::WaitForLog(*hubs[0]->daemon, "lost its outgoing link with rack 1's hub"));
  const std::string log0 = hubs[0]->daemon->Log();
  ShowLines("hub 0", log0, "lost its");
  ShowLines("hub 0", log0, "cannot reach");
  // Shutdown does not hang on RDMA connects in flight to the dead hub.
  const auto stop = std::chrono::steady_clock::now();
  EXPECT_EQ(hubs[0]->daemon->Stop(SIGTERM, 20s), 0) << hubs[0]->daemon->Log();
  std::cout << "hub 0 stopped in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - stop)
                   .count()
            << " ms\n";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A raw RDMA connection to a hub, opening a hub link as rack 1's hub would
// (the handshake of tests/support/hub_link_auth.h under `secret`).
struct RawHubLink {
  std::shared_ptr<rdma::Channel> channel;
  boost::asio::io_context io;
  bool closed = false;
  net::WireError error_code{};
  std::string error_text;
  int errors = 0;
  bool fatal = false;
  bool accepted = false;        // a HUB_ACCEPT came
  bool accept_matches = false;  // ... carrying the reference acceptor proof
  std::string mine, theirs;     // the nonces

  void SendFrame(net::Opcode op, std::string payload) {
    net::FrameHeader h;
    h.opcode = op;
    rdma::OutgoingFrame f;
    f.owned = std::move(payload);
    h.payload_bytes = static_cast<uint32_t>(f.owned.size());
    net::EncodeHeader(h, f.header);
    channel->Send(std::move(f));
  }

  // Connects for `connect_lane` and opens a link as rack 1 of 2, `hello_lane`.
  void Run(const std::string& to, uint32_t connect_lane, uint32_t hello_lane,
           const std::string& secret) {
    const auto ep = net::ParseEndpoint(to);
    ASSERT_TRUE(ep.ok());
    rdma::ChannelOptions o;
    o.ring_bytes = rdma::kMinRingBytes;
    Result<std::shared_ptr<rdma::Channel>> connected = rdma::Channel::Connect(
        *ep, connect_lane, o, std::chrono::steady_clock::now() + kConnectTimeout);
    ASSERT_TRUE(connected.ok()) << connected.status().message();
    channel = *std::move(connected);
    const testing::HubLinkRef link{1, 0, hello_lane, kRacks, kLanes};
    mine = testing::RandomNonce();
    rdma::Channel::Callbacks cb;
    cb.on_frame = [this, link, secret](const net::FrameHeader& h,
                                       std::span<const std::byte> payload) {
      const std::string bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
      if (h.opcode == net::Opcode::kHubChallenge) {
        data::v1::HubChallenge c;
        c.ParseFromString(bytes);
        theirs = c.nonce();
        SendFrame(net::Opcode::kHubProof,
                  testing::ProofPayload(testing::RefHubProof(secret, true, mine, theirs, link)));
        return;
      }
      if (h.opcode == net::Opcode::kHubAccept) {
        data::v1::HubProof p;
        p.ParseFromString(bytes);
        accepted = true;
        accept_matches = p.proof() == testing::RefHubProof(secret, false, mine, theirs, link);
        return;
      }
      if (h.opcode != net::Opcode::kError) return;
      ++errors;
      fatal = (h.flags & net::kFlagFatal) != 0;
      if (Result<net::ErrorBody> e = net::DecodeErrorBody(payload); e.ok()) {
        error_code = e->code;
        error_text = e->text;
      }
    };
    cb.on_closed = [this](const std::string&) { closed = true; };
    channel->Attach(io, std::move(cb));
    SendFrame(net::Opcode::kHubHello, testing::HubHelloPayload(link, mine));
  }
  // Runs the channel until closed or `limit`.
  void RunFor(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!closed && std::chrono::steady_clock::now() < deadline) {
      io.run_one_for(100ms);
      if (io.stopped()) io.restart();
    }
  }
};

TEST(RdmaMultiRackTest, HubHelloIsCheckedOverRdma) {
  std::string ip, why;
  if (!testing::HaveRdma(&ip, &why)) GTEST_SKIP() << why;
  const std::string dir = testing::MakeTempDir();
  const std::string secret(48, 's');
  testing::WriteFile(dir + "/hub.secret", secret + "\n");
  testing::WriteFile(dir + "/rackhubd.toml", "[data]\nrdma_ring_bytes = \"64KiB\"\n");
  const std::string interhub0 = ip + ":" + std::to_string(FreePort(ip));
  // Rack 1's hub does not run: only our raw links speak for it.
  const std::string racks = ip + ":0=" + interhub0 + "," + ip + ":0=" + ip + ":" +
                            std::to_string(FreePort(ip));
  RdmaHub hub(ip + ":" + std::to_string(FreePort(ip)), dir + "/rackhubd.toml",
              {"--racks", racks, "--rack", "0", "--hub-secret-file", dir + "/hub.secret"});
  ASSERT_TRUE(hub.daemon->started());

  {
    RawHubLink wrong_secret;
    ASSERT_NO_FATAL_FAILURE(wrong_secret.Run(interhub0, 0, 0, std::string(48, 'x')));
    wrong_secret.RunFor(kConnectTimeout);
    EXPECT_TRUE(wrong_secret.closed);
    EXPECT_TRUE(wrong_secret.fatal);
    EXPECT_EQ(wrong_secret.errors, 1);
    EXPECT_EQ(wrong_secret.error_code, net::WireError::kUnauthenticated)
        << wrong_secret.error_text;
    EXPECT_NE(wrong_secret.error_text.find("wrong hub secret"), std::string::npos)
        << wrong_secret.error_text;
  }
  {
    RawHubLink wrong_lane;
    ASSERT_NO_FATAL_FAILURE(wrong_lane.Run(interhub0, 0, 1, secret));
    wrong_lane.RunFor(kConnectTimeout);
    // Fatal: the hub closes the link once the ERROR is out (checked above for
    // the wrong secret; here the emulated device once lost the DISCONNECTED
    // event in ~1 of 4 VM runs, so only the refusal itself is required).
    EXPECT_TRUE(wrong_lane.fatal);
    EXPECT_EQ(wrong_lane.error_code, net::WireError::kInvalidArgument) << wrong_lane.error_text;
    EXPECT_NE(wrong_lane.error_text.find("set up for lane 0"), std::string::npos)
        << wrong_lane.error_text;
  }
  {
    RawHubLink good;
    ASSERT_NO_FATAL_FAILURE(good.Run(interhub0, 1, 1, secret));
    good.RunFor(3s);  // adopted: stays open, no ERROR
    EXPECT_FALSE(good.closed);
    EXPECT_EQ(good.errors, 0) << good.error_text;
    EXPECT_TRUE(good.accepted) << "the hub answers a right HUB_PROOF with HUB_ACCEPT";
    EXPECT_TRUE(good.accept_matches) << "... carrying its proof of the secret";
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (hub.daemon->Log().find("lane 1 accepted rack 1's hub from rdma:") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      good.RunFor(200ms);
    }
    EXPECT_NE(hub.daemon->Log().find("lane 1 accepted rack 1's hub from rdma:"), std::string::npos)
        << hub.daemon->Log();
  }
  const std::string log = hub.daemon->Log();
  ShowLines("hub 0", log, "refused RDMA");
  ShowLines("hub 0", log, "accepted rack");
  EXPECT_EQ(hub.daemon->Stop(SIGTERM, 20s), 0) << log;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace rackhub
