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
  // The played rack: accepts hub `rack`'s link to it and authenticates it
  // (links of other hubs that dial meanwhile are kept open, unanswered).
  std::unique_ptr<RawClient> AcceptLinkFrom(uint32_t rack) {
    for (;;) {
      pollfd p{listener_, POLLIN, 0};
      EXPECT_EQ(poll(&p, 1, 10000), 1) << "rack " << rack << "'s hub did not link";
      if (p.revents == 0) return nullptr;
      auto link = std::make_unique<RawClient>(
          RawClient::Adopt{accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)});
      auto hello = link->Receive();
      data::v1::HubHello h;
      if (hello && hello->h.opcode == net::Opcode::kHubHello &&
          h.ParseFromString(hello->payload) && h.rack() != rack) {
        others_.push_back(std::move(link));
        continue;
      }
      EXPECT_TRUE(testing::AcceptHubLink(
          *link, std::string(48, 's'),
          {rack, *played_, 0, static_cast<uint32_t>(interhub_.size()), 1}, std::move(hello)));
      return link;
    }
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
  std::vector<std::unique_ptr<RawClient>> others_;  // links AcceptLinkFrom passed over

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

// Key `name` of `chunks` 4-KiB chunks of tenant "t", on one hub.
inline void CreateKey(const std::string& admin, const std::string& name, uint32_t chunks,
                      pb::InitMode init = pb::ZEROS) {
  pb::CreateKeyRequest key;
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
  CreateKey(admin, "w", chunks, init);
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

// `session`: the HELLO's (an elastic tenant needs one; 0: none).
inline Worker Connect(Racks& racks, uint32_t rack, uint32_t rank, uint64_t session = 0) {
  Worker w;
  w.rack = rack;
  w.rank = rank;
  w.link = std::make_unique<RawClient>(racks.hub(rack).data_address());
  data::v1::Hello hello;
  hello.set_tenant("t");
  hello.set_token(kToken);
  hello.set_rank(rank);
  hello.set_rack(rack);
  if (session != 0) hello.set_session(session);
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

}  // namespace rackhub::bounded_test
