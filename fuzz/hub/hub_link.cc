#include "hub_link.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>

#include "hello_check.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/testing/memory_connection.h"

namespace rackhub::fuzz {

namespace srv = rackhub::server;
namespace dpb = rackhub::data::v1;
namespace pb = rackhub::admin::v1;
using net::FrameHeader;
using net::Opcode;
using namespace std::chrono_literals;

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "hub_lane_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

// ---------------------------------------------------------------------------
// LinkIo

LinkIo::LinkIo() : guard_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}

LinkIo::~LinkIo() {
  guard_.reset();
  io_.stop();
  thread_.join();
}

void LinkIo::Run(std::function<void()> fn) {
  std::promise<void> done;
  boost::asio::post(io_, [&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// ---------------------------------------------------------------------------
// Link

bool Link::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

uint32_t Link::last_declared() const {
  std::lock_guard lock(mu_);
  return last_declared_;
}

bool Link::WaitHeartbeat(uint64_t request_id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    return closed_ ||
           std::find(heartbeats_.begin(), heartbeats_.end(), request_id) != heartbeats_.end();
  });
}

bool Link::WaitClosed(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return closed_; });
}

net::FrameHandler::Verdict Link::AcceptHeader(net::Connection&, const FrameHeader& h) {
  // What a hub may send a worker, for this worker's tenant.
  Require(h.opcode == Opcode::kWelcome || h.opcode == Opcode::kParams ||
              h.opcode == Opcode::kError || h.opcode == Opcode::kKeyInfo ||
              h.opcode == Opcode::kAck || h.opcode == Opcode::kHeartbeat,
          "the hub sends a worker only replies");
  Require(h.tenant == handle_ || h.tenant == 0, "every reply names the worker's tenant");
  return Verdict::kAccept;
}

void Link::HandleFrame(net::Connection&, const FrameHeader& h,
                       std::span<const std::byte> payload) {
  std::lock_guard lock(mu_);
  switch (h.opcode) {
    case Opcode::kError: {
      const Result<net::ErrorBody> body = net::DecodeErrorBody(payload);
      Require(body.ok(), "an ERROR body decodes");
      Require(!body->text.empty(), "an ERROR says why");
      break;
    }
    case Opcode::kKeyInfo: {
      dpb::KeyEntry e;
      Require(e.ParseFromArray(payload.data(), static_cast<int>(payload.size())),
              "KEY_INFO is a KeyEntry");
      Require(e.id() == h.key, "KEY_INFO names its key in the header");
      last_declared_ = e.id();
      break;
    }
    case Opcode::kWelcome: {
      dpb::Welcome w;
      Require(w.ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
                  w.tenant_handle() == handle_ && w.lanes() == 2,
              "WELCOME names the tenant and the lanes");
      break;
    }
    case Opcode::kHeartbeat: heartbeats_.push_back(h.request_id); break;
    default: break;
  }
  cv_.notify_all();
}

void Link::OnConnectionClosed(net::Connection&, const std::string&) {
  std::lock_guard lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

// ---------------------------------------------------------------------------
// Session

Session::Session(srv::DataPlane& plane, LinkIo& io, const srv::TenantInfo& tenant,
                 std::string token, uint32_t victim_handle)
    : plane_(plane),
      io_(io),
      tenant_(tenant),
      token_(std::move(token)),
      victim_handle_(victim_handle) {}

Session::~Session() {
  // Release the client ends on their thread, then the handlers.
  io_.Run([this] {
    for (auto& [where, link] : links_) {
      link->conn->Close("fuzz input done");
      link->conn.reset();
    }
    for (auto& link : old_links_) {
      link->conn->Close("fuzz input done");
      link->conn.reset();
    }
  });
}

void Session::AddKey(const std::string& name, uint64_t elements, srv::WireDType dtype,
                     srv::InitMode init) {
  srv::KeySpec spec;
  spec.tenant = tenant_.name;
  spec.name = name;
  spec.elements = elements;
  spec.dtype = dtype;
  spec.init = init;
  srv::KeyInfo info;
  Require(plane_.registry().CreateKey(spec, &info).ok(), "key created");
  keys_.push_back(info);
}

Link& Session::LinkFor(uint32_t rank, uint32_t lane) {
  auto& slot = links_[{rank, lane}];
  if (slot && !slot->closed()) return *slot;
  if (slot) old_links_.push_back(slot);
  slot = std::make_shared<Link>(tenant_.handle);
  // The in-memory acceptor (as tests/support/hub_under_test.cc): the HELLO
  // checks of every transport, then the hub's end goes to the lane.
  dpb::Hello hello;
  hello.set_tenant(tenant_.name);
  hello.set_token(token_);
  hello.set_rank(rank);
  hello.set_lane(lane);
  const std::string bytes = hello.SerializeAsString();
  FrameHeader h;
  h.opcode = Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(bytes.size());
  Require(srv::CheckHelloHeader(h).ok(), "HELLO header");
  const srv::HelloResult checked =
      srv::CheckHello(std::as_bytes(std::span(bytes.data(), bytes.size())), plane_.registry(),
                      plane_.config().topology, plane_.lane_count());
  Require(checked.ok, "HELLO accepted");
  net::ConnectionIdentity id{tenant_.handle, tenant_.name, rank, lane, "in-memory", 0, false};
  net::ConnectionIdentity client_id;
  client_id.peer = "hub";
  srv::Lane& hub_lane = plane_.lane(lane);
  auto pair = net::testing::MakeMemoryPair(hub_lane.io(), hub_lane.worker_handler(), id,
                                           io_.io(), slot.get(), client_id);
  slot->conn = pair.b;
  const uint64_t seq = plane_.NextSeq();
  plane_.OnLane(lane, [hub_end = pair.a, seq](srv::Lane& l) { l.AdoptWorker(hub_end, seq); });
  boost::asio::post(io_.io(), [client = pair.b] { client->Start(); });
  return *slot;
}

void Session::Send(Link& link, const FrameHeader& h, std::string payload) {
  boost::asio::post(io_.io(), [conn = link.conn, h, payload = std::move(payload)]() mutable {
    if (conn->open()) conn->SendOwned(h, std::move(payload));
  });
}

std::string Session::Payload(const Op& op, const srv::KeyInfo* key, const FrameHeader& h) {
  const bool control = op.opcode == Opcode::kDeclare || op.opcode == Opcode::kSetOptimizer;
  if (op.size == Op::Size::kNone) return {};
  if (op.size == Op::Size::kLength || (control && op.raw_control)) {
    return std::string(op.length, static_cast<char>(op.fill));
  }
  if (op.opcode == Opcode::kDeclare) {
    static const char* const kNames[] = {"k0", "k1", "k2", "not a key name!"};
    dpb::KeyDeclaration d;
    d.set_name(kNames[op.fill & 3]);
    d.set_elements(1 + 37ull * op.length);
    d.set_dtype(static_cast<pb::DType>(op.dtype));
    d.set_init((op.fill & 4) ? pb::FROM_CLIENT : pb::ZEROS);
    if (op.fill & 8) d.mutable_optimizer()->set_type(static_cast<pb::OptimizerType>(op.fill >> 4));
    return d.SerializeAsString();
  }
  if (op.opcode == Opcode::kSetOptimizer) {
    dpb::OptimizerUpdate u;
    u.mutable_optimizer()->set_type(static_cast<pb::OptimizerType>(op.fill >> 5));
    u.mutable_optimizer()->set_learning_rate(op.length / 100.0);
    return u.SerializeAsString();
  }
  // A chunk's worth of elements in the header's dtype (256 per chunk).
  uint64_t elements = 256;
  if (key) {
    const uint64_t first = uint64_t{h.chunk} * 256;
    elements = first < key->elements ? std::min<uint64_t>(256, key->elements - first) : 256;
  }
  const uint32_t width = h.dtype == net::DType::kNone ? 4 : net::DTypeBytes(h.dtype);
  return std::string(elements * width, static_cast<char>(op.fill));
}

void Session::Play(const Op& op) {
  for (const auto& [where, link] : links_) {
    if (const uint32_t id = link->last_declared()) declared_ = id;
  }
  // The key the operation names, if it is one of ours.
  const srv::KeyInfo* key = nullptr;
  uint32_t key_id = op.raw;
  if (op.key_slot < 2) {
    key = &keys_[op.key_slot];
    key_id = key->id;
  } else if (op.key_slot == 2) {
    key_id = declared_;
  }
  const uint32_t lane = op.owner_lane && key
                            ? static_cast<uint32_t>((key->placement.first_chunk + op.chunk) % 2)
                            : op.lane;
  const uint32_t rank = op.rank % tenant_.workers_per_rack;
  switch (op.kind) {
    case Op::Kind::kDeleteKey:
      if (key) (void)plane_.registry().DeleteKey(tenant_.name, key->name);
      return;
    case Op::Kind::kSetOptimizer:
      if (key) {
        aggregation::OptimizerConfig c = tenant_.default_optimizer;
        c.learning_rate = op.length / 100.0;
        srv::KeyInfo out;
        (void)plane_.registry().SetOptimizer(tenant_.name, key->name, c, true, &out, op.raw);
      }
      return;
    case Op::Kind::kClose: {
      auto it = links_.find({rank, lane});
      if (it != links_.end()) {
        io_.Run([conn = it->second->conn] { conn->Close("fuzz: worker lost"); });
      }
      return;
    }
    case Op::Kind::kSync: ExpectLive(); return;
    case Op::Kind::kFrame: break;
  }
  Link& link = LinkFor(rank, lane);
  FrameHeader h;
  h.opcode = op.opcode;
  h.tenant = op.tenant == Op::TenantField::kOwn      ? tenant_.handle
             : op.tenant == Op::TenantField::kVictim ? victim_handle_
                                                     : op.raw;
  h.key = key_id;
  h.chunk = op.chunk;
  h.dtype = op.dtype != 0 ? static_cast<net::DType>(op.dtype)
            : key         ? static_cast<net::DType>(static_cast<uint8_t>(key->dtype))
                          : net::DType::kNone;
  uint64_t& next = next_iteration_[{rank, key_id, op.chunk}];
  h.iteration = op.relative_iteration
                    ? static_cast<uint64_t>(std::max<int64_t>(0, int64_t(next) + op.iteration))
                    : static_cast<uint64_t>(op.iteration);
  if (op.opcode == Opcode::kPush) next = h.iteration + 1;
  h.request_id = (++request_ << 8) | op.raw;
  Send(link, h, Payload(op, key, h));
}

void Session::ExpectLive() {
  for (auto& [where, link] : links_) {
    if (link->closed()) continue;
    FrameHeader h;
    h.opcode = Opcode::kHeartbeat;
    h.tenant = tenant_.handle;
    h.request_id = (uint64_t{1} << 63) | ++request_;
    Send(*link, h, {});
    Require(link->WaitHeartbeat(h.request_id, 10s),
            "a HEARTBEAT is answered within 10 s (the lane is stuck)");
  }
}

void Session::ExpectAllClosed() {
  for (auto& [where, link] : links_) {
    Require(link->WaitClosed(10s), "a deleted tenant's connections close within 10 s");
  }
}

}  // namespace rackhub::fuzz
