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
//  - 2 x 2000 relays of two workers at once with 1 MiB per connection: the
//    hub links do not stall (a home answers on its own link);
//  - bad relay frames on an authenticated link are refused by name (a rank
//    the tenant lacks, a chunk homed elsewhere, an opcode not relayed, a
//    relay id never issued, a key never declared, a short payload), and a
//    good one is served like a worker's PULL, its answer on the home's own
//    link to the relaying rack (the test plays rack 1's hub).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "hub_link_auth.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "raw_client.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::DaemonProcess;
using testing::Describe;
using testing::ExpectError;
using testing::Frame;
using net::FrameHeader;
using testing::RawClient;

constexpr uint32_t kElems = 1024;  // per chunk: 4096-byte fp32 chunks

struct Mode {
  pb::Consistency consistency;
  uint32_t staleness;
  const char* name;
};
constexpr Mode kBounded1{pb::BOUNDED, 1, "bounded:1"};
constexpr Mode kBounded0{pb::BOUNDED, 0, "bounded:0"};
constexpr Mode kAsync{pb::ASYNC, 0, "async"};

const std::string kToken(40, 'k');

// R racks' hubs (hierarchical, one lane: chunk g's home is rack g % R), or
// one flat hub serving all R racks.
class Racks {
 public:
  // `played`: a rack whose hub the test plays (a listening socket, no hub).
  Racks(uint32_t racks, bool flat, std::vector<std::string> extra = {},
        std::optional<uint32_t> played = {})
      : flat_(flat), extra_(std::move(extra)), played_(played) {
    for (uint32_t r = 0; r < racks; ++r) {
      const int port = played_ == r ? Listen() : testing::FreeLoopbackPort();
      interhub_.push_back("127.0.0.1:" + std::to_string(port));
      spec_ += (r ? "," : "") + std::string("127.0.0.1:0=") + interhub_.back();
    }
    secret_ = testing::MakeTempDir() + "/hub.secret";
    testing::WriteFile(secret_, std::string(48, 's') + "\n");
    hubs_.resize(flat ? 1 : racks);
    for (uint32_t r = 0; r < hubs_.size(); ++r) {
      if (played_ != r) Start(r);
    }
  }
  ~Racks() {
    if (listener_ >= 0) close(listener_);
  }
  // The played rack: accepts hub `rack`'s link to it and authenticates it.
  std::unique_ptr<RawClient> AcceptLinkFrom(uint32_t rack) {
    pollfd p{listener_, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 10000), 1) << "rack " << rack << "'s hub did not link";
    auto link = std::make_unique<RawClient>(
        RawClient::Adopt{accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)});
    EXPECT_TRUE(testing::AcceptHubLink(*link, std::string(48, 's'),
                                       {rack, *played_, 0, static_cast<uint32_t>(interhub_.size()), 1}));
    return link;
  }
  void Start(uint32_t rack) {
    std::vector<std::string> args = {"--lanes", "1", "--racks", spec_, "--rack",
                                     std::to_string(rack), "--hub-secret-file", secret_};
    if (flat_) args.insert(args.end(), {"--topology-mode", "flat"});
    args.insert(args.end(), extra_.begin(), extra_.end());
    hubs_[rack] = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(hubs_[rack]->started());
  }
  DaemonProcess& hub(uint32_t rack) { return *hubs_[flat_ ? 0 : rack]; }
  uint32_t hubs() const { return static_cast<uint32_t>(hubs_.size()); }
  const std::string& interhub(uint32_t rack) const { return interhub_[rack]; }

 private:
  bool flat_;
  std::vector<std::string> extra_;
  std::string spec_, secret_;
  std::vector<std::string> interhub_;
  std::vector<std::unique_ptr<DaemonProcess>> hubs_;
  std::optional<uint32_t> played_;
  int listener_ = -1;

  int Listen() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(listen(listener_, 8), 0);
    socklen_t len = sizeof sa;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&sa), &len);
    return ntohs(sa.sin_port);
  }
};

// Tenant "t" (`workers` per rack, 4096-byte chunks, SGD with learning rate
// 1 and a mean) in `mode`, with key "w" of `chunks` chunks, on one hub.
void CreateTenant(const std::string& admin, Mode mode, uint32_t workers, uint32_t chunks,
                  pb::InitMode init = pb::ZEROS) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  pb::CreateTenantRequest req;
  req.set_name("t");
  req.set_workers_per_rack(workers);
  req.set_chunk_bytes(4 * kElems);
  req.set_token(kToken);
  req.set_consistency(mode.consistency);
  req.set_staleness(mode.staleness);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(1.0);
  pb::CreateTenantResponse resp;
  const grpc::Status s = pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  grpc::ClientContext kctx;
  pb::CreateKeyRequest key;
  key.set_tenant("t");
  key.set_name("w");
  key.set_elements(uint64_t{kElems} * chunks);
  key.set_init(init);
  pb::Key k;
  ASSERT_TRUE(pb::KeyService::NewStub(channel)->CreateKey(&kctx, key, &k).ok());
}

// One worker (a raw connection to its rack's hub, lane 0).
struct Worker {
  std::unique_ptr<RawClient> link;
  uint32_t rack = 0, rank = 0, handle = 0, key = 0;
  uint64_t next_request = 1;

  uint64_t Push(uint32_t chunk, uint64_t iteration, const std::string& grad) {
    FrameHeader h = Header(net::Opcode::kPush, chunk);
    h.iteration = iteration;
    link->Send(h, grad);
    return h.request_id;
  }
  uint64_t Pull(uint32_t chunk) {
    const FrameHeader h = Header(net::Opcode::kPull, chunk);
    link->Send(h);
    return h.request_id;
  }
  FrameHeader Header(net::Opcode op, uint32_t chunk) {
    FrameHeader h;
    h.opcode = op;
    h.tenant = handle;
    h.key = key;
    h.chunk = chunk;
    h.dtype = net::DType::kFp32;
    h.request_id = next_request++;
    return h;
  }
};

Worker Connect(Racks& racks, uint32_t rack, uint32_t rank) {
  Worker w;
  w.rack = rack;
  w.rank = rank;
  w.link = std::make_unique<RawClient>(racks.hub(rack).data_address());
  data::v1::Hello hello;
  hello.set_tenant("t");
  hello.set_token(kToken);
  hello.set_rank(rank);
  hello.set_rack(rack);
  FrameHeader h;
  h.opcode = net::Opcode::kHello;
  w.link->Send(h, hello.SerializeAsString());
  const auto f = w.link->Receive();
  data::v1::Welcome welcome;
  EXPECT_TRUE(f && f->h.opcode == net::Opcode::kWelcome) << Describe(f);
  if (f) welcome.ParseFromString(f->payload);
  EXPECT_GT(welcome.keys_size(), 0);
  w.handle = welcome.tenant_handle();
  if (welcome.keys_size() > 0) w.key = welcome.keys(0).id();
  return w;
}

// A PARAMS reply of a bounded/async tenant: parameters and suffix.
struct Reply {
  uint64_t request = 0, clock = 0, updates = 0, slowest = 0;
  std::vector<float> params;
};
Reply ParamsOf(const std::optional<Frame>& f) {
  Reply r;
  EXPECT_TRUE(f && f->h.opcode == net::Opcode::kParams) << Describe(f);
  if (!f || f->h.opcode != net::Opcode::kParams) return r;
  EXPECT_TRUE(f->h.flags & net::kFlagVersions);
  EXPECT_EQ(f->payload.size(), 4 * kElems + net::kVersionsSuffixBytes);
  if (f->payload.size() != 4 * kElems + net::kVersionsSuffixBytes) return r;
  r.request = f->h.request_id;
  r.clock = f->h.iteration;
  r.params = testing::AsFloats(f->payload.substr(0, 4 * kElems));
  std::memcpy(&r.updates, f->payload.data() + 4 * kElems, 8);
  std::memcpy(&r.slowest, f->payload.data() + 4 * kElems + 8, 8);
  return r;
}

// docs/consistency.md: a reply leaving its worker at count c is released
// only when c <= slowest + S, and includes every worker's first c - S
// contributions: updates >= W * c - (W - 1) * S (W: every rack's workers).
void ExpectBound(const Reply& r, Mode mode, uint32_t all_workers) {
  if (mode.consistency != pb::BOUNDED) return;
  const uint64_t s = mode.staleness;
  EXPECT_LE(r.clock, r.slowest + s) << "request " << r.request;
  if (r.clock >= s) {
    EXPECT_GE(r.updates + (all_workers - 1) * s, all_workers * r.clock)
        << "request " << r.request << " at count " << r.clock << ": " << r.updates
        << " updates";
  }
}

// Worker (rack, rank)'s gradient of `chunk` at `iteration`: integers times
// the worker count, so that each mean (gradient / W) is an exact integer
// and every sum of them is exact in any order.
std::vector<float> Gradient(uint32_t all_workers, uint32_t rack, uint32_t rank,
                            uint64_t iteration, uint32_t chunk) {
  std::vector<float> g(kElems);
  for (uint32_t e = 0; e < kElems; ++e) {
    const int v = static_cast<int>((rack * 7 + rank * 3 + iteration * 5 + chunk * 11 + e) % 9) - 4;
    g[e] = static_cast<float>(v * static_cast<int>(all_workers));
  }
  return g;
}

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
    for (uint32_t c = 0; c < chunks; ++c) EXPECT_EQ(ParamsOf(w.link->Receive()).clock, 0u);
  }
  for (uint64_t i = 0; i < iterations; ++i) {
    for (auto& w : ws) {
      for (uint32_t c = 0; c < chunks; ++c) {
        w.Push(c, i, testing::Floats(Gradient(all, w.rack, w.rank, i, c)));
      }
    }
    for (auto& w : ws) {
      for (uint32_t c = 0; c < chunks; ++c) {
        const Reply r = ParamsOf(w.link->Receive());
        EXPECT_EQ(r.clock, i + 1) << "rack " << w.rack << " rank " << w.rank;
        ExpectBound(r, mode, all);
      }
    }
  }
  std::vector<float> final_params;
  for (auto& w : ws) {
    std::map<uint64_t, uint32_t> chunk_of;
    for (uint32_t c = 0; c < chunks; ++c) chunk_of[w.Pull(c)] = c;
    std::vector<float> mine(size_t{kElems} * chunks);
    for (uint32_t c = 0; c < chunks; ++c) {
      const Reply r = ParamsOf(w.link->Receive());
      EXPECT_EQ(r.updates, all * iterations);
      if (r.params.size() == kElems && chunk_of.count(r.request)) {
        std::memcpy(mine.data() + size_t{chunk_of[r.request]} * kElems, r.params.data(),
                    4 * kElems);
      }
    }
    if (final_params.empty()) final_params = mine;
    EXPECT_TRUE(testing::SameBits(mine, final_params))
        << "rack " << w.rack << " rank " << w.rank << " sees other parameters";
  }
  return final_params;
}

TEST(MultiRackBoundedTest, ExactSumsEqualTheReferenceAndOneFlatHub) {
  constexpr uint32_t kWorkers = 2, kChunks = 4;
  constexpr uint64_t kIterations = 3;
  for (const uint32_t rack_count : {2u, 3u}) {
    for (const Mode mode : {kBounded1, kAsync}) {
      SCOPED_TRACE(std::to_string(rack_count) + " racks, " + mode.name);
      // The reference: zeros minus every contribution's mean (lr 1).
      const uint32_t all = rack_count * kWorkers;
      std::vector<float> reference(size_t{kElems} * kChunks, 0.0f);
      for (uint32_t r = 0; r < rack_count; ++r) {
        for (uint32_t k = 0; k < kWorkers; ++k) {
          for (uint64_t i = 0; i < kIterations; ++i) {
            for (uint32_t c = 0; c < kChunks; ++c) {
              const auto g = Gradient(all, r, k, i, c);
              for (uint32_t e = 0; e < kElems; ++e) {
                reference[size_t{c} * kElems + e] -= g[e] / static_cast<float>(all);
              }
            }
          }
        }
      }
      std::vector<float> hierarchical, flat;
      {
        Racks racks(rack_count, false);
        hierarchical = RunJob(racks, rack_count, mode, kWorkers, kChunks, kIterations);
      }
      {
        Racks racks(rack_count, true);
        flat = RunJob(racks, rack_count, mode, kWorkers, kChunks, kIterations);
      }
      EXPECT_TRUE(testing::SameBits(hierarchical, reference)) << "hierarchical vs reference";
      EXPECT_TRUE(testing::SameBits(flat, reference)) << "flat vs reference";
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
  // `w`'s pushes are held: a Pull of each chunk sent after them is answered
  // first (a relayed frame reaches its home in order, a local one is
  // handled in order), while they are not.
  static void ExpectHeld(Worker& w) {
    const uint64_t p0 = w.Pull(0), p1 = w.Pull(1);
    for (int i = 0; i < 2; ++i) {
      const auto f = w.link->Receive();
      ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << Describe(f);
      EXPECT_TRUE(f->h.request_id == p0 || f->h.request_id == p1)
          << "a held push was answered before a later Pull: " << Describe(f);
    }
  }
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

// Relays put bulk on the hub links both ways: each direction on its own
// link (a home answers on its outgoing link to the worker's rack), so no
// link stalls with both of its ends paused on their send backlogs. With
// 1 MiB per connection (links pause reading at 512 KiB), two workers push
// 2000 4-KiB chunks twice, all at once (half of each worker's relayed):
// every reply comes, and every chunk ends at the reference (-4 * 1 / 2).
TEST(MultiRackBoundedTest, ManyRelaysAtOnceDoNotStallTheLinks) {
  constexpr uint32_t kChunks = 2000, kPushes = 2;
  Racks racks(2, false, {"--max-queued-bytes-per-connection", "1048576"});
  for (uint32_t h = 0; h < 2; ++h) CreateTenant(racks.hub(h).admin_address(), kAsync, 1, kChunks);
  std::vector<Worker> ws;
  ws.push_back(Connect(racks, 0, 0));
  ws.push_back(Connect(racks, 1, 0));
  // Both count at every home before anyone pushes (a member that joins
  // later starts at the slowest other's count; docs/consistency.md).
  for (auto& w : ws) {
    for (uint32_t c = 0; c < kChunks; ++c) w.Pull(c);
    for (uint32_t c = 0; c < kChunks; ++c) {
      EXPECT_EQ(ParamsOf(w.link->Receive(std::chrono::seconds(30))).clock, 0u);
    }
  }
  const std::string grad = testing::Floats(kElems, 1.0f);
  std::vector<std::thread> threads;
  std::array<size_t, 2> answered{};
  for (size_t i = 0; i < ws.size(); ++i) {
    // The worker's requests: made up front (FrameHeader's ids), sent by
    // one thread while another reads the replies.
    std::vector<FrameHeader> pushes;
    for (uint32_t k = 0; k < kPushes; ++k) {
      for (uint32_t c = 0; c < kChunks; ++c) {
        pushes.push_back(ws[i].Header(net::Opcode::kPush, c));
        pushes.back().iteration = k;
      }
    }
    threads.emplace_back([&, i, pushes] {
      for (const auto& h : pushes) ws[i].link->Send(h, grad);
    });
    threads.emplace_back([&, i] {
      for (size_t n = 0; n < kPushes * kChunks; ++n) {
        const auto f = ws[i].link->Receive(std::chrono::seconds(30));
        if (!f || f->h.opcode != net::Opcode::kParams) {
          ADD_FAILURE() << "worker " << i << ": reply " << n << ": " << Describe(f);
          return;
        }
        ++answered[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered[0], kPushes * kChunks);
  EXPECT_EQ(answered[1], kPushes * kChunks);
  for (uint32_t c = 0; c < kChunks; ++c) ws[1].Pull(c);
  for (uint32_t c = 0; c < kChunks; ++c) {
    const Reply r = ParamsOf(ws[1].link->Receive(std::chrono::seconds(30)));
    EXPECT_EQ(r.updates, 2u * kPushes);
    ASSERT_EQ(r.params.size(), kElems);
    EXPECT_EQ(r.params[0], -2.0f);
    EXPECT_EQ(r.params[kElems - 1], -2.0f);
  }
}

// Frames on an authenticated link from "rack 1" to rack 0's hub.
std::string RawFrame(FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}
std::string RelayPrefix(net::RelayKind kind, net::Opcode op, uint32_t rank) {
  std::string p(net::kRelayPrefixBytes, '\0');
  p[0] = static_cast<char>(kind);
  p[1] = static_cast<char>(op);
  std::memcpy(p.data() + 4, &rank, 4);
  return p;
}

TEST(MultiRackBoundedTest, BadRelayFramesAreRefusedByName) {
  Racks racks(2, false, {}, 1);  // the test plays rack 1's hub
  const auto replies = racks.AcceptLinkFrom(0);  // where rack 0's hub answers relays
  CreateTenant(racks.hub(0).admin_address(), kBounded1, 1, 2);
  Worker a = Connect(racks, 0, 0);  // for the key's id
  RawClient link(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(link, std::string(48, 's'), {1, 0, 0, 2, 1}));
  data::v1::KeyBind bind;
  bind.set_tenant("t");
  bind.set_key("w");
  bind.set_key_id(a.key);
  bind.set_elements(2 * kElems);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(0);
  bind.set_chunk_elements(kElems);
  bind.set_workers_per_rack(1);
  bind.set_init(pb::ZEROS);
  FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 77;
  kb.key = a.key;
  FrameHeader relay;
  relay.opcode = net::Opcode::kRackRelay;
  relay.tenant = 77;
  relay.key = a.key;
  relay.dtype = net::DType::kFp32;
  // Whose answer is a RACK_RELAY_REPLY holding an ERROR (or a PARAMS), on
  // rack 0's hub's own link to rack 1 (its KEY_BINDs and member notices
  // skipped).
  const auto answer = [&](uint64_t relay_id,
                          std::chrono::milliseconds timeout = testing::kReceiveTimeout) {
    auto f = replies->Receive(timeout);
    while (f && f->h.opcode != net::Opcode::kRackRelayReply &&
           f->h.opcode != net::Opcode::kError) {
      f = replies->Receive(timeout);
    }
    EXPECT_TRUE(f && f->h.opcode == net::Opcode::kRackRelayReply) << Describe(f);
    std::optional<Frame> inner;
    if (!f || f->payload.size() < net::kHeaderBytes) return inner;
    EXPECT_EQ(f->h.request_id, relay_id);
    inner = Frame{net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
                      reinterpret_cast<const std::byte*>(f->payload.data()), net::kHeaderBytes)),
                  f->payload.substr(net::kHeaderBytes)};
    return inner;
  };
  // A rank the tenant does not have (one worker per rack).
  relay.request_id = 1;
  link.SendRaw(RawFrame(kb, bind.SerializeAsString()) +
               RawFrame(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 5)));
  ExpectError(answer(1), net::WireError::kInvalidArgument,
              "RACK_RELAY: rank 5 of rack 1 is not a worker of tenant 't'", false);
  // A chunk homed on rack 1, not here.
  relay.request_id = 2;
  relay.chunk = 1;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0));
  ExpectError(answer(2), net::WireError::kInvalidArgument,
              "RACK_RELAY: chunk 1 of key 'w' is not homed on rack 0's hub", false);
  // An opcode that is not relayed.
  relay.request_id = 3;
  relay.chunk = 0;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kDeclare, 0));
  ExpectError(answer(3), net::WireError::kInvalidArgument,
              "RACK_RELAY: opcode 10 is not PUSH, INIT or PULL", false);
  // A relay id rack 0's hub never issued.
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = 4242;
  link.Send(reply, std::string(net::kHeaderBytes, '\0'));
  ExpectError(link.Receive(), net::WireError::kInvalidArgument,
              "RACK_RELAY_REPLY: relay id 4242 was never issued by rack 0's hub", false);
  // A well-formed relayed PULL is served like a worker's.
  relay.request_id = 5;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0));
  const auto pulled = answer(5);
  EXPECT_TRUE(pulled && pulled->h.opcode == net::Opcode::kParams) << Describe(pulled);
  // A key rack 0's hub never declares: parked for 5 s, then answered.
  data::v1::KeyBind other = bind;
  other.set_key("nokey");
  other.set_key_id(a.key + 1);
  kb.key = a.key + 1;
  relay.key = a.key + 1;
  relay.request_id = 7;
  link.SendRaw(RawFrame(kb, other.SerializeAsString()) +
               RawFrame(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0)));
  ExpectError(answer(7, std::chrono::seconds(15)), net::WireError::kUnknownKey,
              "key: id " + std::to_string(a.key + 1) + " was never declared on rack 0's hub",
              false);
  relay.key = a.key;
  // A payload shorter than the relay prefix closes the link.
  relay.request_id = 6;
  link.Send(relay, "abc");
  ExpectError(link.Receive(), net::WireError::kMalformed,
              "RACK_RELAY: 3 bytes, shorter than its 16-byte prefix");
  EXPECT_TRUE(link.ClosedByPeer());
}

// An answer to a relay must come from the hub it went to: rack 0's hub
// relays a's push of chunk 1 to rack 1's hub (held there by b); a hub link
// from "rack 2" answering that relay id is refused by name and closed, and
// the real answer still comes when b pushes.
TEST(MultiRackBoundedTest, AReplyFromAHubThatIsNotTheHomeIsRefused) {
  Racks racks(3, false);
  for (uint32_t h = 0; h < 3; ++h) CreateTenant(racks.hub(h).admin_address(), kBounded0, 1, 3);
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  b.Pull(1);
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 0u);
  a.Pull(1);  // relay id 1
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u);
  a.Push(1, 0, testing::Floats(kElems, 3.0f));  // relay id 2: held by b at rack 1's hub
  const uint64_t pull = a.Pull(1);               // relay id 3
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, pull) << "the push is held";
  RawClient forged(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(forged, std::string(48, 's'), {2, 0, 0, 3, 1}));
  FrameHeader params;
  params.opcode = net::Opcode::kParams;
  params.dtype = net::DType::kFp32;
  params.request_id = 2;
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = 2;
  forged.Send(reply, RawFrame(params, testing::Floats(kElems, 9.0f)));
  ExpectError(forged.Receive(), net::WireError::kInvalidArgument,
              "RACK_RELAY_REPLY: relay id 2 went to rack 1's hub (the chunk's home), not to "
              "rack 2's");
  EXPECT_TRUE(forged.ClosedByPeer());
  b.Push(1, 0, testing::Floats(kElems, 1.0f));
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 1u);
  const Reply released = ParamsOf(a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(released.clock, 1u);
  EXPECT_EQ(released.updates, 2u);
  EXPECT_EQ(released.params[0], -(3.0f + 1.0f) / 3.0f) << "the forged values were not taken";
}

}  // namespace
}  // namespace rackhub
