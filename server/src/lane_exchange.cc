// LaneService, part 2: the rack exchange (DESIGN.md §2 step 6).
//
// A tenant spans R racks with W workers each. Chunk g (tenant-wide index) has
// its home at rack (g / lanes) % R and lives on lane g % lanes of every hub.
// Each hub sums its own rack's W pushes in rank order (a sum-only stage); a
// non-home hub sends that fp32 rack sum to the home hub on its lane's link;
// the home hub adds the rack sums in rack order (the cross-rack stage),
// applies the optimizer (mean = sum / (R * W)), and sends the new parameters
// back; every hub answers its own workers. In flat mode one hub serves every
// rack's workers and runs both stages locally: the same additions in the
// same order, so both modes give the same bits.
#include <set>

#include <spdlog/spdlog.h>

#include "data_plane.h"
#include "lane_service.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/tcp/connection.h"

namespace rackhub::server {

namespace asio = boost::asio;
namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

namespace {

// A link to another hub that is down is retried this often.
constexpr auto kPeerRetryPeriod = std::chrono::milliseconds(200);
// Frames for a hub that is not connected (yet) wait this long for the link
// before the updates waiting on them fail with WORKER_LOST.
constexpr auto kPeerWaitLimit = std::chrono::seconds(5);
// Frames for a key the peer bound before this hub's workers declared it are
// retried this often (for at most kPeerWaitLimit).
constexpr auto kParkedRetryPeriod = std::chrono::milliseconds(10);

aggregation::OptimizerConfig SumOnly() {
  aggregation::OptimizerConfig c;
  c.type = aggregation::OptimizerType::kSumOnly;
  c.learning_rate = 0;
  c.reduction = aggregation::Reduction::kSum;
  return c;
}

std::span<const std::byte> Bytes(std::span<const float> f) {
  return {reinterpret_cast<const std::byte*>(f.data()), f.size() * sizeof(float)};
}

}  // namespace

void LaneService::InitMultiRackChunk(Tenant& t, Key& key, Chunk& c, uint64_t global_index) {
  const uint32_t self = topology_.rack;
  c.home = exchange_ ? static_cast<uint32_t>((global_index / lanes_) % racks_) : self;
  const uint32_t n = c.state.elements();
  const auto wire = static_cast<aggregation::ElementType>(static_cast<uint8_t>(key.info.dtype));
  c.stages.resize(racks_);
  for (uint32_t r = 0; r < racks_; ++r) {
    if (exchange_ && r != self) continue;  // that rack's workers use their own hub
    c.stages[r] = std::make_unique<aggregation::ChunkState>(n, t.info.workers_per_rack, SumOnly(),
                                                            wire);
    c.stages[r]->MarkInitialized();
  }
  // The cross-rack stage takes fp32 rack sums: rebuild `state` for that.
  const OptimizerSchedule& sched = key.info.schedule;
  c.state = aggregation::ChunkState(n, racks_, sched.base, aggregation::ElementType::kFp32);
  if (sched.from_update != 0) c.state.SetOptimizer(sched.latest, sched.from_update);
  c.state.set_mean_divisor(racks_ * t.info.workers_per_rack);
  c.state.MarkInitialized();
  const size_t wire_bytes = size_t{n} * WireDTypeBytes(key.info.dtype);
  c.replies[0].assign(wire_bytes, std::byte{0});  // version 0: zeros
  c.replies[1].assign(wire_bytes, std::byte{0});
}

void LaneService::OnRackSum(Tenant& t, Key& key, Chunk& c, uint32_t rack, uint64_t iteration) {
  aggregation::ChunkState& stage = *c.stages[rack];
  const auto sum = Bytes(stage.params(stage.version()));
  if (c.home == topology_.rack || !exchange_) {
    if (c.state.contributions() == 0) {
      c.first_contribution = std::chrono::steady_clock::now();
      t.pending.insert(ChunkId(c.key_id, c.index_in_key));
    }
    if (c.state.Contribute(rack, sum) == aggregation::ChunkState::AddResult::kComplete) {
      FinishCrossRack(t, key, c);
    }
    return;
  }
  // To the home hub. The sum stays valid until this stage's version + 2,
  // which needs our workers' next pushes, which need the home's answer.
  FrameHeader h;
  h.opcode = Opcode::kRackSum;
  h.tenant = t.info.handle;
  h.key = c.key_id;
  h.chunk = c.index_in_key;
  h.dtype = net::DType::kFp32;
  h.iteration = iteration;
  SendToPeer(c.home, t, key, h, sum);
}

void LaneService::FinishCrossRack(Tenant& t, Key& key, Chunk& c) {
  c.state.Update();
  const uint64_t v = c.state.version();
  auto& out = c.replies[v & 1];
  aggregation::CopyOut(out.data(), c.state.params(v).data(), c.state.elements(),
                       static_cast<aggregation::ElementType>(static_cast<uint8_t>(key.info.dtype)));
  c.version = v;
  t.pending.erase(ChunkId(c.key_id, c.index_in_key));
  if (c.index_in_key == 0) {
    key.runtime->version.store(v, std::memory_order_relaxed);
    t.info.counters->iterations_completed.fetch_add(1, std::memory_order_relaxed);
  }
  if (exchange_) {
    FrameHeader h;
    h.opcode = Opcode::kRackParams;
    h.tenant = t.info.handle;
    h.key = c.key_id;
    h.chunk = c.index_in_key;
    h.dtype = static_cast<net::DType>(static_cast<uint8_t>(key.info.dtype));
    h.iteration = v;
    for (uint32_t r = 0; r < racks_; ++r) {
      if (r != topology_.rack) SendToPeer(r, t, key, h, out);
    }
  }
  AnswerMultiRack(c, key);
}

void LaneService::AnswerMultiRack(Chunk& c, const Key& key) {
  const auto& bytes = c.replies[c.version & 1];
  for (const Waiter& w : c.pushes) {
    auto wc = w.conn.lock();
    if (!wc || !wc->open()) continue;
    FrameHeader r;
    r.opcode = Opcode::kParams;
    r.tenant = wc->id().tenant_handle;
    r.key = c.key_id;
    r.chunk = c.index_in_key;
    r.dtype = static_cast<net::DType>(static_cast<uint8_t>(key.info.dtype));
    r.iteration = c.version;
    r.request_id = w.request_id;
    r.payload_bytes = static_cast<uint32_t>(bytes.size());
    // Borrowed: replies[v & 1] is rewritten at version v + 2 only.
    wc->SendBorrowed(r, bytes);
  }
  c.pushes.clear();
}

void LaneService::SendToPeer(uint32_t rack, Tenant& t, Key& key, const FrameHeader& h,
                             std::span<const std::byte> payload) {
  PeerLink& link = links_[rack];
  if (!link.out || !link.out->open()) {
    // Not connected (yet): hold the frame for a while. The payload stays
    // valid: the chunk cannot advance before this frame is answered.
    if (link.queued.empty()) {
      const uint64_t generation = ++link.queue_generation;
      auto timer = std::make_shared<asio::steady_timer>(*io_, kPeerWaitLimit);
      timer->async_wait([this, rack, generation, timer](const boost::system::error_code&) {
        GiveUpOnPeer(rack, generation);
      });
    }
    link.queued.push_back({t.info.handle, key.info.id, h, payload});
    ConnectPeer(rack);
    return;
  }
  const uint64_t bind_id = (uint64_t{t.info.handle} << 32) | key.info.id;
  if (!link.bound.count(bind_id)) {
    dpb::KeyBind bind;
    bind.set_tenant(t.info.name);
    bind.set_key(key.info.name);
    bind.set_key_id(key.info.id);
    bind.set_elements(key.info.elements);
    bind.set_dtype(static_cast<pb::DType>(key.info.dtype));
    bind.set_first_chunk(key.info.placement.first_chunk);
    bind.set_chunk_elements(key.info.chunk_elements);
    bind.set_workers_per_rack(t.info.workers_per_rack);
    FrameHeader b;
    b.opcode = Opcode::kKeyBind;
    b.tenant = t.info.handle;
    b.key = key.info.id;
    link.out->SendOwned(b, bind.SerializeAsString());
    link.bound.insert(bind_id);
  }
  FrameHeader f = h;
  f.payload_bytes = static_cast<uint32_t>(payload.size());
  link.out->SendBorrowed(f, payload);
  plane_->CountRackChunkBytes(rack, net::kHeaderBytes + payload.size());
}

void LaneService::StartPeerLinks() {
  if (!exchange_) return;
  if (!topology_.secret_file.empty()) hub_secret_ = plane_->hub_secret();
  for (uint32_t r = 0; r < racks_; ++r) {
    if (r != topology_.rack) ConnectPeer(r);
  }
}

void LaneService::ConnectPeer(uint32_t rack) {
  PeerLink& link = links_[rack];
  if (shut_down_ || link.connecting || (link.out && link.out->open())) return;
  link.connecting = true;
  const net::Endpoint& ep = topology_.racks[rack].interhub;
  auto socket = std::make_shared<asio::ip::tcp::socket>(*io_);
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(*io_);
  resolver->async_resolve(
      ep.host, std::to_string(ep.port),
      [this, rack, socket, resolver](const boost::system::error_code& ec,
                                     asio::ip::tcp::resolver::results_type results) {
        auto retry = [this, rack](const std::string& why) {
          PeerLink& l = links_[rack];
          l.connecting = false;
          if (!l.warned) {
            spdlog::warn("rack link: lane {} cannot reach rack {}'s hub ({}); retrying", lane_,
                         rack, why);
            l.warned = true;
          }
          auto timer = std::make_shared<asio::steady_timer>(*io_, kPeerRetryPeriod);
          timer->async_wait([this, rack, timer](const boost::system::error_code&) {
            ConnectPeer(rack);
          });
        };
        if (ec) return retry(ec.message());
        asio::async_connect(
            *socket, results,
            [this, rack, socket, retry](const boost::system::error_code& cec, const auto&) {
              if (cec || shut_down_) return retry(cec ? cec.message() : "shutting down");
              boost::system::error_code ignored;
              socket->set_option(asio::ip::tcp::no_delay(true), ignored);
              net::ConnectionIdentity id;
              id.hub = true;
              id.rack = rack;
              id.lane = lane_;
              id.peer = topology_.racks[rack].interhub.ToString();
              auto conn = std::make_shared<net::tcp::TcpConnection>(this, std::move(*socket), id);
              dpb::HubHello hello;
              hello.set_rack(topology_.rack);
              hello.set_lane(lane_);
              hello.set_secret(hub_secret_);
              hello.set_racks(racks_);
              hello.set_lanes(lanes_);
              FrameHeader h;
              h.opcode = Opcode::kHubHello;
              conn->SendOwned(h, hello.SerializeAsString());
              PeerLink& l = links_[rack];
              l.out = conn;
              l.bound.clear();
              l.connecting = false;
              l.warned = false;
              spdlog::info("rack link: lane {} connected to rack {}'s hub at {}", lane_, rack,
                           id.peer);
              conn->Start();
              FlushPeerQueue(rack);
            });
      });
}

void LaneService::FlushPeerQueue(uint32_t rack) {
  auto queued = std::move(links_[rack].queued);
  links_[rack].queued.clear();
  ++links_[rack].queue_generation;  // cancels the pending give-up
  for (const auto& q : queued) {
    Tenant* t = FindTenant(q.tenant);
    Key* key = t ? FindKey(*t, q.key) : nullptr;
    if (key) SendToPeer(rack, *t, *key, q.header, q.payload);
  }
}

void LaneService::GiveUpOnPeer(uint32_t rack, uint64_t generation) {
  PeerLink& link = links_[rack];
  if (link.queue_generation != generation || link.queued.empty()) return;
  std::set<uint32_t> tenants;
  for (const auto& q : link.queued) tenants.insert(q.tenant);
  link.queued.clear();
  for (uint32_t handle : tenants) {
    if (Tenant* t = FindTenant(handle)) {
      FailPending(*t, WireError::kWorkerLost,
                  "rack link: the hub of rack " + std::to_string(rack) + " (" +
                      topology_.racks[rack].interhub.ToString() + ") is unreachable");
    }
  }
}

void LaneService::AdoptPeer(asio::ip::tcp::socket socket, net::ConnectionIdentity id) {
  auto conn = std::make_shared<net::tcp::TcpConnection>(this, std::move(socket), id);
  std::erase_if(peer_in_, [](const auto& c) { return !c->open(); });
  peer_in_.push_back(conn);
  spdlog::info("rack link: lane {} accepted rack {}'s hub from {}", lane_, id.rack, id.peer);
  conn->Start();
}

net::FrameHandler::Verdict LaneService::AcceptPeerHeader(net::Connection& conn,
                                                         const FrameHeader& h) {
  switch (h.opcode) {
    case Opcode::kError:  // an answer on a link we opened
    case Opcode::kKeyBind:
      return Verdict::kAccept;
    case Opcode::kRackSum:
    case Opcode::kRackParams: {
      Tenant* t = nullptr;
      // Not bound yet: accept, HandlePeerFrame parks it until the key exists.
      if (!PeerKey(conn.id().rack, h, &t)) return Verdict::kAccept;
      return CheckPeerFrame(conn, h);
    }
    default:
      return Reject(conn, WireError::kMalformed,
                    "opcode: " + std::to_string(static_cast<int>(h.opcode)) +
                        " is not valid on a hub link",
                    h.request_id);
  }
}

LaneService::Key* LaneService::PeerKey(uint32_t peer, const FrameHeader& h, Tenant** tenant) {
  auto bound = peer_tenants_.find({peer, h.tenant});
  if (bound == peer_tenants_.end()) {
    const auto pending = pending_binds_.find({peer, h.tenant, h.key});
    std::string problem;
    if (pending == pending_binds_.end() || !TryBind(peer, h.tenant, pending->second, &problem)) {
      return nullptr;
    }
    bound = peer_tenants_.find({peer, h.tenant});
  }
  *tenant = FindTenant(bound->second);
  return *tenant ? FindKey(**tenant, h.key) : nullptr;
}

net::FrameHandler::Verdict LaneService::CheckPeerFrame(net::Connection& conn,
                                                       const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  const uint32_t peer = conn.id().rack;
  Tenant* t = nullptr;
  Key* key = PeerKey(peer, h, &t);
  if (!key) {
    SendPeerError(conn, h.tenant, "key: id " + std::to_string(h.key) + " is not bound");
    return Verdict::kDiscard;
  }
  if (h.chunk >= key->info.placement.chunk_count ||
      (key->info.placement.first_chunk + h.chunk) % lanes_ != lane_) {
    return Reject(conn, WireError::kBadChunk, "chunk: not one of this lane's", rid);
  }
  Chunk& c = GetChunk(*t, *key, h.chunk);
  const bool sum = h.opcode == Opcode::kRackSum;
  const size_t want =
      size_t{c.state.elements()} * (sum ? 4u : WireDTypeBytes(key->info.dtype));
  if (h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "payload_bytes: " + std::to_string(h.payload_bytes) + ", expected " +
                      std::to_string(want),
                  rid);
  }
  if (sum != (c.home == topology_.rack)) {
    return Reject(conn, WireError::kInvalidArgument,
                  std::string(sum ? "RACK_SUM to" : "RACK_PARAMS from") +
                      " a hub that is not the chunk's home",
                  rid);
  }
  const uint64_t expected = sum ? c.state.version() : c.version + 1;
  if (h.iteration != expected || (sum && c.state.has_contributed(peer))) {
    SendPeerError(conn, h.tenant,
                  "iteration: " + std::to_string(h.iteration) + " of chunk " +
                      std::to_string(h.chunk) + ", expected " + std::to_string(expected));
    return Verdict::kDiscard;
  }
  return Verdict::kAccept;
}

void LaneService::SendPeerError(net::Connection& conn, uint32_t peer_tenant,
                                const std::string& text) {
  net::ErrorFrame e = net::MakeErrorFrame(WireError::kInvalidArgument, text, peer_tenant, 0, false);
  conn.SendOwned(e.header, std::move(e.body));
}

bool LaneService::TryBind(uint32_t peer, uint32_t peer_tenant, const std::string& bind_bytes,
                          std::string* problem) {
  dpb::KeyBind bind;
  TenantInfo tenant;
  KeyInfo key;
  if (!bind.ParseFromString(bind_bytes)) {
    *problem = "payload: not a KeyBind";
    return false;
  }
  if (!registry_->GetTenant(bind.tenant(), &tenant).ok() ||
      !registry_->GetKey(bind.tenant(), bind.key(), &key).ok()) {
    return false;  // not here yet
  }
  if (key.id != bind.key_id() || key.elements != bind.elements() ||
      key.placement.first_chunk != bind.first_chunk() ||
      static_cast<int>(key.dtype) != static_cast<int>(bind.dtype()) ||
      key.chunk_elements != bind.chunk_elements() ||
      tenant.workers_per_rack != bind.workers_per_rack()) {
    *problem = "key '" + bind.key() + "' of tenant '" + bind.tenant() +
               "' is laid out differently on the two racks (create the tenant with the same "
               "settings and its keys in the same order on every hub)";
    return false;
  }
  peer_tenants_[{peer, peer_tenant}] = tenant.handle;
  pending_binds_.erase({peer, peer_tenant, bind.key_id()});
  if (!FindTenant(tenant.handle)) tenants_[tenant.handle].info = tenant;
  return true;
}

void LaneService::HandlePeerFrame(net::Connection& conn, const FrameHeader& h,
                                  std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  plane_->CountRackBytes(peer, 0, net::kHeaderBytes + payload.size());
  if (h.opcode == Opcode::kError) {
    WireError code{};
    std::string text;
    net::DecodeErrorBody(payload, &code, &text);
    spdlog::error("rack link: rack {}'s hub refused: {}: {}", peer, net::WireErrorName(code),
                  text);
    if (Tenant* t = FindTenant(h.tenant)) {
      FailPending(*t, WireError::kInvalidArgument, "rack " + std::to_string(peer) + ": " + text);
    }
    return;
  }
  if (h.opcode == Opcode::kKeyBind) {
    const std::string bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
    std::string problem;
    if (!TryBind(peer, h.tenant, bytes, &problem)) {
      if (!problem.empty()) {
        SendPeerError(conn, h.tenant, problem);
      } else {
        pending_binds_[{peer, h.tenant, h.key}] = bytes;
      }
    }
    return;
  }
  Tenant* t = nullptr;
  if (!PeerKey(peer, h, &t)) {
    // The key is not declared here yet: keep the frame and retry shortly.
    parked_.push_back({conn.weak_from_this(), h, {payload.begin(), payload.end()},
                       std::chrono::steady_clock::now()});
    if (!parked_timer_armed_) {
      parked_timer_armed_ = true;
      auto timer = std::make_shared<asio::steady_timer>(*io_, kParkedRetryPeriod);
      timer->async_wait([this, timer](const boost::system::error_code&) { RetryParked(); });
    }
    return;
  }
  ProcessPeerData(peer, h, payload);
}

void LaneService::RetryParked() {
  parked_timer_armed_ = false;
  auto parked = std::move(parked_);
  parked_.clear();
  for (auto& p : parked) {
    auto conn = p.conn.lock();
    if (!conn || !conn->open()) continue;
    Tenant* t = nullptr;
    if (!PeerKey(conn->id().rack, p.header, &t)) {
      if (std::chrono::steady_clock::now() - p.since > kPeerWaitLimit) {
        SendPeerError(*conn, p.header.tenant,
                      "key: id " + std::to_string(p.header.key) + " was never declared on rack " +
                          std::to_string(topology_.rack) + "'s hub");
      } else {
        parked_.push_back(std::move(p));
      }
      continue;
    }
    if (CheckPeerFrame(*conn, p.header) == Verdict::kAccept) {
      ProcessPeerData(conn->id().rack, p.header, p.payload);
    }
  }
  if (!parked_.empty() && !parked_timer_armed_) {
    parked_timer_armed_ = true;
    auto timer = std::make_shared<asio::steady_timer>(*io_, kParkedRetryPeriod);
    timer->async_wait([this, timer](const boost::system::error_code&) { RetryParked(); });
  }
}

void LaneService::ProcessPeerData(uint32_t peer, const FrameHeader& h,
                                  std::span<const std::byte> payload) {
  Tenant* tp = nullptr;
  Key& key = *PeerKey(peer, h, &tp);
  Tenant& t = *tp;
  Chunk& c = GetChunk(t, key, h.chunk);
  if (h.opcode == Opcode::kRackSum) {
    if (c.state.contributions() == 0) {
      c.first_contribution = std::chrono::steady_clock::now();
      t.pending.insert(ChunkId(c.key_id, c.index_in_key));
    }
    if (c.state.Contribute(peer, payload) == aggregation::ChunkState::AddResult::kComplete) {
      FinishCrossRack(t, key, c);
    }
    return;
  }
  // RACK_PARAMS from the home hub.
  c.version = h.iteration;
  std::memcpy(c.replies[c.version & 1].data(), payload.data(), payload.size());
  t.pending.erase(ChunkId(c.key_id, c.index_in_key));
  if (c.index_in_key == 0) {
    key.runtime->version.store(c.version, std::memory_order_relaxed);
    t.info.counters->iterations_completed.fetch_add(1, std::memory_order_relaxed);
  }
  AnswerMultiRack(c, key);
}

void LaneService::OnPeerClosed(net::Connection& conn, const std::string& why) {
  const uint32_t peer = conn.id().rack;
  PeerLink& link = links_[peer];
  const bool outgoing = link.out.get() == &conn;
  if (outgoing) {
    link.out.reset();
    link.bound.clear();
  }
  if (shut_down_) return;
  spdlog::warn("rack link: lane {} lost its {} link with rack {}'s hub: {}", lane_,
               outgoing ? "outgoing" : "incoming", peer, why);
  // Every multi-rack update in flight may wait for that hub: fail them now.
  for (auto& [handle, t] : tenants_) {
    FailPending(t, WireError::kWorkerLost,
                "rack link: lost the hub of rack " + std::to_string(peer) + " (" + why + ")");
  }
  if (outgoing) ConnectPeer(peer);
}

}  // namespace rackhub::server
