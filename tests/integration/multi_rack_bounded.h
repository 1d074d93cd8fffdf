// Test support for bounded/async tenants spanning racks
// (multi_rack_bounded_test, multi_rack_relay_link_test): R racks' hubs on
// loopback (or one flat hub; or a rack whose hub the test plays), tenant
// "t" with key "w" of 4-KiB fp32 chunks, raw workers, and PARAMS replies
// with their versions suffix. Each object owns its processes and sockets;
// single-threaded use from a test body (a Worker's link may be written by
// one thread while another reads it).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <string>
#include <vector>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "hub_link_auth.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "raw_client.h"
#include "wait.h"

namespace rackhub::bounded_test {

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

// R racks' hubs (hierarchical, L lanes: tenant chunk g's home is rack
// (g / L) % R, on lane g % L), or one flat hub serving all R racks.
class Racks {
 public:
  // `played`: a rack whose hub the test plays (a listening socket, no hub).
  Racks(uint32_t racks, bool flat, std::vector<std::string> extra = {},
        std::optional<uint32_t> played = {}, uint32_t lanes = 1)
      : flat_(flat), lanes_(lanes), extra_(std::move(extra)), played_(played) {
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
  // The played rack: accepts hub `rack`'s link of lane `lane` to it and
  // authenticates it (links of other hubs or lanes that dial meanwhile are
  // kept open, unanswered).
  std::unique_ptr<RawClient> AcceptLinkFrom(uint32_t rack, uint32_t lane = 0) {
    for (;;) {
      // One passed over before (another lane's turn), or a new one.
      auto passed = std::find_if(others_.begin(), others_.end(), [&](const Passed& o) {
        return o.rack == rack && o.lane == lane;
      });
      Passed link;
      if (passed != others_.end()) {
        link = std::move(*passed);
        others_.erase(passed);
      } else {
        pollfd p{listener_, POLLIN, 0};
        EXPECT_EQ(poll(&p, 1, 10000), 1) << "rack " << rack << "'s hub did not link";
        if (p.revents == 0) return nullptr;
        link.link = std::make_unique<RawClient>(
            RawClient::Adopt{accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)});
        link.hello = link.link->Receive();
        data::v1::HubHello h;
        if (link.hello && link.hello->h.opcode == net::Opcode::kHubHello &&
            h.ParseFromString(link.hello->payload) && (h.rack() != rack || h.lane() != lane)) {
          link.rack = h.rack();
          link.lane = h.lane();
          others_.push_back(std::move(link));
          continue;
        }
      }
      EXPECT_TRUE(testing::AcceptHubLink(
          *link.link, std::string(48, 's'),
          {rack, *played_, lane, static_cast<uint32_t>(interhub_.size()), lanes_},
          std::move(link.hello)));
      return std::move(link.link);
    }
  }
  void Start(uint32_t rack) {
    std::vector<std::string> args = {"--lanes", std::to_string(lanes_), "--racks", spec_, "--rack",
                                     std::to_string(rack), "--hub-secret-file", secret_};
    if (flat_) args.insert(args.end(), {"--topology-mode", "flat"});
    args.insert(args.end(), extra_.begin(), extra_.end());
    hubs_[rack] = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(hubs_[rack]->started());
  }
  DaemonProcess& hub(uint32_t rack) { return *hubs_[flat_ ? 0 : rack]; }
  uint32_t hubs() const { return static_cast<uint32_t>(hubs_.size()); }
  uint32_t lanes() const { return lanes_; }
  const std::string& interhub(uint32_t rack) const { return interhub_[rack]; }

 private:
  bool flat_;
  uint32_t lanes_;
  std::vector<std::string> extra_;
  std::string spec_, secret_;
  std::vector<std::string> interhub_;
  std::vector<std::unique_ptr<DaemonProcess>> hubs_;
  std::optional<uint32_t> played_;
  int listener_ = -1;
  struct Passed {  // a link AcceptLinkFrom passed over (unanswered), and its HUB_HELLO
    std::unique_ptr<RawClient> link;
    std::optional<Frame> hello;
    uint32_t rack = 0, lane = 0;
  };
  std::vector<Passed> others_;

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

// Key `name` of `chunks` 4-KiB chunks of tenant "t", on one hub (`topk`:
// its top-k ratio, 0 for dense pushes only).
inline void CreateKey(const std::string& admin, const std::string& name, uint32_t chunks,
                      pb::InitMode init = pb::ZEROS, float topk = 0) {
  pb::CreateKeyRequest key;
  key.set_topk_ratio(topk);
  key.set_tenant("t");
  key.set_name(name);
  key.set_elements(uint64_t{kElems} * chunks);
  key.set_init(init);
  grpc::ClientContext ctx;
  pb::Key k;
  const grpc::Status s =
      pb::KeyService::NewStub(grpc::CreateChannel(admin, grpc::InsecureChannelCredentials()))
          ->CreateKey(&ctx, key, &k);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// Tenant "t" (`workers` per rack, 4096-byte chunks, SGD with learning rate
// 1 and a mean) in `mode`, with key "w" of `chunks` chunks, on one hub.
inline void CreateTenant(const std::string& admin, Mode mode, uint32_t workers, uint32_t chunks,
                         pb::InitMode init = pb::ZEROS, float topk = 0) {
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
  CreateKey(admin, "w", chunks, init, topk);
}

// One worker: a raw connection to each lane of its rack's hub (`link`:
// lane 0; `more`: lanes 1..L-1). Chunk c travels on lane
// (first_chunk + c) % L.
struct Worker {
  std::unique_ptr<RawClient> link;
  std::vector<std::unique_ptr<RawClient>> more;
  uint32_t rack = 0, rank = 0, handle = 0, key = 0;  // key: "w" unless Use chose another
  uint64_t first_chunk = 0;                            // of `key`
  uint64_t next_request = 1;
  std::map<std::string, std::pair<uint32_t, uint64_t>> keys;  // name -> (id, first_chunk)

  // Slot `slot` of a test over keys of `chunks` chunks each (KeyName):
  // its key becomes `key`; returns its chunk.
  uint32_t Use(uint32_t slot, uint32_t chunks);

  // The connection chunk `chunk` of key "w" travels on.
  RawClient& On(uint32_t chunk) {
    const uint64_t lane = (first_chunk + chunk) % (more.size() + 1);
    return lane == 0 ? *link : *more[lane - 1];
  }
  uint64_t Push(uint32_t chunk, uint64_t iteration, const std::string& grad) {
    FrameHeader h = Header(net::Opcode::kPush, chunk);
    h.iteration = iteration;
    On(chunk).Send(h, grad);
    return h.request_id;
  }
  uint64_t Pull(uint32_t chunk) {
    const FrameHeader h = Header(net::Opcode::kPull, chunk);
    On(chunk).Send(h);
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

// Key k of a test over several keys: "w", then "v1", "v2", ...
inline std::string KeyName(uint32_t k) { return k == 0 ? "w" : "v" + std::to_string(k); }
inline uint32_t Worker::Use(uint32_t slot, uint32_t chunks) {
  const auto it = keys.find(KeyName(slot / chunks));
  EXPECT_NE(it, keys.end()) << "key " << KeyName(slot / chunks) << " not in the WELCOME";
  if (it != keys.end()) std::tie(key, first_chunk) = it->second;
  return slot % chunks;
}

// Worker (rack, rank) of tenant "t" on every lane of the hub at `address`.
// `session`: the HELLO's (an elastic tenant needs one; 0: none).
inline Worker Connect(const std::string& address, uint32_t lanes, uint32_t rack, uint32_t rank,
                      uint64_t session = 0) {
  Worker w;
  w.rack = rack;
  w.rank = rank;
  for (uint32_t lane = 0; lane < lanes; ++lane) {
    auto link = std::make_unique<RawClient>(address);
    data::v1::Hello hello;
    hello.set_tenant("t");
    hello.set_token(kToken);
    hello.set_rank(rank);
    hello.set_rack(rack);
    hello.set_lane(lane);
    if (session != 0) hello.set_session(session);
    FrameHeader h;
    h.opcode = net::Opcode::kHello;
    link->Send(h, hello.SerializeAsString());
    const auto f = link->Receive();
    data::v1::Welcome welcome;
    EXPECT_TRUE(f && f->h.opcode == net::Opcode::kWelcome) << Describe(f);
    if (f) welcome.ParseFromString(f->payload);
    EXPECT_GT(welcome.keys_size(), 0);
    EXPECT_EQ(welcome.lanes(), lanes);
    if (lane == 0) {
      w.handle = welcome.tenant_handle();
      for (const auto& k : welcome.keys()) w.keys[k.name()] = {k.id(), k.first_chunk()};
      if (w.keys.count("w")) std::tie(w.key, w.first_chunk) = w.keys["w"];
      w.link = std::move(link);
    } else {
      w.more.push_back(std::move(link));
    }
  }
  return w;
}
inline Worker Connect(Racks& racks, uint32_t rack, uint32_t rank, uint64_t session = 0) {
  return Connect(racks.hub(rack).data_address(), racks.lanes(), rack, rank, session);
}

// A PARAMS reply of a bounded/async tenant: parameters and suffix.
struct Reply {
  uint64_t request = 0, clock = 0, updates = 0, slowest = 0;
  std::vector<float> params;
};
inline Reply ParamsOf(const std::optional<Frame>& f) {
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

// `w`'s pushes are held at every home: a Pull of each of the `slots`
// slots (Worker::Use, keys of `chunks` chunks) sent after them is answered
// before any of them (a chunk's frames reach its home in order, relayed or
// not, and its answers come back in order).
inline void ExpectHeld(Worker& w, uint32_t slots, uint32_t chunks = 0) {
  if (chunks == 0) chunks = slots;
  std::map<uint64_t, uint32_t> pulls;
  for (uint32_t s = 0; s < slots; ++s) pulls[w.Pull(w.Use(s, chunks))] = s;
  for (const auto& [request, slot] : pulls) {
    const auto f = w.On(w.Use(slot, chunks)).Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << Describe(f);
    EXPECT_TRUE(pulls.count(f->h.request_id))
        << "rack " << w.rack << " rank " << w.rank
        << ": a held push was answered before a later Pull: " << Describe(f);
  }
  w.Use(0, chunks);
}

// A whole frame's bytes, and the 16-byte relay prefix (wire-protocol.md 7d).
inline std::string RawFrame(FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}
// The KEY_BIND of key `name` (`chunks` chunks from tenant chunk
// `first_chunk`, id `key_id`) of tenant "t" (one
// worker per rack) in `mode`, as a hub the test plays sends it.
inline data::v1::KeyBind KeyBindOf(Mode mode, uint32_t key_id, uint32_t chunks,
                                   const std::string& name = "w", uint32_t first_chunk = 0) {
  data::v1::KeyBind bind;
  bind.set_tenant("t");
  bind.set_key(name);
  bind.set_key_id(key_id);
  bind.set_elements(uint64_t{chunks} * kElems);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(first_chunk);
  bind.set_chunk_elements(kElems);
  bind.set_workers_per_rack(1);
  bind.set_init(pb::ZEROS);
  bind.set_consistency(mode.consistency);
  bind.set_staleness(mode.staleness);
  return bind;
}
// The frame a RACK_RELAY_REPLY on `replies` (a home's link to the rack the
// test plays) carries for relay `relay_id` (KEY_BINDs and notices skipped).
inline std::optional<Frame> RelayAnswer(RawClient& replies, uint64_t relay_id,
                                        std::chrono::milliseconds timeout =
                                            testing::kReceiveTimeout) {
  auto f = replies.Receive(timeout);
  while (f && f->h.opcode != net::Opcode::kRackRelayReply && f->h.opcode != net::Opcode::kError) {
    f = replies.Receive(timeout);
  }
  EXPECT_TRUE(f && f->h.opcode == net::Opcode::kRackRelayReply) << Describe(f);
  std::optional<Frame> inner;
  if (!f || f->payload.size() < net::kHeaderBytes) return inner;
  EXPECT_EQ(f->h.request_id, relay_id);
  inner = Frame{net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
                    reinterpret_cast<const std::byte*>(f->payload.data()), net::kHeaderBytes)),
                f->payload.substr(net::kHeaderBytes)};
  return inner;
}
inline std::string RelayPrefix(net::RelayKind kind, net::Opcode op, uint32_t rank,
                               uint64_t session = 0) {
  return net::EncodeRelayPrefix({kind, op, rank, session});
}

// docs/consistency.md: a reply leaving its worker at count c is released
// only when c <= slowest + S, and includes every worker's first c - S
// contributions: updates >= W * c - (W - 1) * S (W: every rack's workers).
inline void ExpectBound(const Reply& r, Mode mode, uint32_t all_workers) {
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
inline std::vector<float> Gradient(uint32_t all_workers, uint32_t rack, uint32_t rank,
                                   uint64_t iteration, uint32_t chunk) {
  std::vector<float> g(kElems);
  for (uint32_t e = 0; e < kElems; ++e) {
    const int v = static_cast<int>((rack * 7 + rank * 3 + iteration * 5 + chunk * 11 + e) % 9) - 4;
    g[e] = static_cast<float>(v * static_cast<int>(all_workers));
  }
  return g;
}

// The gradient worker (rack, rank) pushes on `chunk` at `iteration`, with
// `all` workers in every rack together.
using GradientFn = std::function<std::vector<float>(uint32_t all, uint32_t rack, uint32_t rank,
                                                    uint64_t iteration, uint32_t chunk)>;

// The parameters after every worker of `racks` x `workers` pushed its
// `gradient` at iterations 0..iterations-1 on every chunk, computed from
// the inputs alone: zeros minus every contribution's mean (lr 1).
inline std::vector<float> Reference(uint32_t racks, uint32_t workers, uint32_t chunks,
                                    uint64_t iterations, const GradientFn& gradient = Gradient) {
  const uint32_t all = racks * workers;
  std::vector<float> reference(size_t{kElems} * chunks, 0.0f);
  for (uint32_t r = 0; r < racks; ++r) {
    for (uint32_t k = 0; k < workers; ++k) {
      for (uint64_t i = 0; i < iterations; ++i) {
        for (uint32_t c = 0; c < chunks; ++c) {
          const auto g = gradient(all, r, k, i, c);
          for (uint32_t e = 0; e < kElems; ++e) {
            reference[size_t{c} * kElems + e] -= g[e] / static_cast<float>(all);
          }
        }
      }
    }
  }
  return reference;
}

// Every worker Pulls every one of `slots` slots (Worker::Use, keys of
// `chunks` chunks); each must have `updates` updates and every worker must
// see the same bits, which are returned (slot by slot).
inline std::vector<float> PullAll(std::vector<Worker>& ws, uint32_t slots, uint64_t updates,
                                  uint32_t chunks = 0) {
  if (chunks == 0) chunks = slots;
  std::vector<float> final_params;
  for (auto& w : ws) {
    std::map<uint64_t, uint32_t> slot_of;
    for (uint32_t s = 0; s < slots; ++s) slot_of[w.Pull(w.Use(s, chunks))] = s;
    std::vector<float> mine(size_t{kElems} * slots);
    for (const auto& [request, slot] : slot_of) {
      const Reply r = ParamsOf(w.On(w.Use(slot, chunks)).Receive());
      EXPECT_EQ(r.updates, updates);
      if (r.params.size() == kElems && slot_of.count(r.request)) {
        std::memcpy(mine.data() + size_t{slot_of[r.request]} * kElems, r.params.data(),
                    4 * kElems);
      }
    }
    w.Use(0, chunks);
    if (final_params.empty()) final_params = mine;
    EXPECT_TRUE(testing::SameBits(mine, final_params))
        << "rack " << w.rack << " rank " << w.rank << " sees other parameters";
  }
  return final_params;
}

}  // namespace rackhub::bounded_test
