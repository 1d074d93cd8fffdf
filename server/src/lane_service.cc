#include "lane_service.h"

#include <spdlog/spdlog.h>

#include "data_plane.h"
#include "rackhub/net/tcp/connection.h"
#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

namespace asio = boost::asio;
namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

namespace {

constexpr auto kStragglerCheckPeriod = std::chrono::milliseconds(250);
// A second connection for a (tenant, rank, lane) that is still connected is
// re-examined this often, up to kReconnectRetries times (1 s), before it is
// refused as a duplicate.
constexpr auto kReconnectRetryPeriod = std::chrono::milliseconds(20);
constexpr int kReconnectRetries = 50;

aggregation::ElementType ElementTypeOf(WireDType d) {
  return static_cast<aggregation::ElementType>(static_cast<uint8_t>(d));
}
net::DType NetDTypeOf(WireDType d) { return static_cast<net::DType>(static_cast<uint8_t>(d)); }

}  // namespace

LaneService::LaneService(uint32_t lane, uint32_t lanes, const Config& config,
                         Registry* registry, DataPlane* plane, asio::io_context* io)
    : lane_(lane),
      lanes_(lanes),
      config_(config.data),
      topology_(config.topology),
      racks_(config.topology.rack_count()),
      exchange_(config.topology.multi_rack_exchange()),
      links_(config.topology.rack_count()),
      registry_(registry),
      plane_(plane),
      io_(io),
      straggler_timer_(*io) {
  asio::post(*io_, [this] { ArmStragglerTimer(); });
}

LaneService::~LaneService() = default;

size_t LaneService::connection_count() const {
  size_t n = 0;
  for (const auto& [h, t] : tenants_) n += t.conns.size();
  return n;
}

LaneService::Tenant* LaneService::FindTenant(uint32_t handle) {
  const auto it = tenants_.find(handle);
  return it == tenants_.end() ? nullptr : &it->second;
}

void LaneService::AdoptTcp(asio::ip::tcp::socket socket, net::ConnectionIdentity id,
                           uint64_t seq) {
  Adopt(std::make_shared<net::tcp::TcpConnection>(this, std::move(socket), std::move(id)), seq,
        kReconnectRetries);
}

void LaneService::Adopt(std::shared_ptr<net::Connection> conn, uint64_t seq, int retries_left) {
  const net::ConnectionIdentity& id = conn->id();
  if (shut_down_) {
    conn->SendError(WireError::kShuttingDown, "the hub is shutting down", 0, true);
    conn->Start();
    return;
  }
  Tenant* t = FindTenant(id.tenant_handle);
  if (!t) {
    TenantInfo info;
    if (!registry_->GetTenantByHandle(id.tenant_handle, &info).ok()) {
      conn->SendError(WireError::kTenantGone, "tenant: '" + id.tenant + "' was deleted", 0, true);
      conn->Start();
      return;
    }
    t = &tenants_[id.tenant_handle];
    t->info = std::move(info);
  }
  const uint32_t member = Member(*t, id);
  if (auto it = t->conns.find(member); it != t->conns.end() && it->second->open()) {
    if (retries_left > 0) {
      // A worker that reconnects right after closing: its old connection's
      // BYE or EOF may still be queued on this lane. Look again shortly.
      auto timer = std::make_shared<asio::steady_timer>(*io_, kReconnectRetryPeriod);
      timer->async_wait([this, timer, conn, seq, retries_left](const boost::system::error_code&) {
        Adopt(conn, seq, retries_left - 1);
      });
      return;
    }
    conn->SendError(WireError::kInvalidArgument,
                    "rank: rank " + std::to_string(id.rank) + " of tenant '" + id.tenant +
                        "' is already connected on lane " + std::to_string(lane_) + " from " +
                        it->second->id().peer,
                    0, true);
    conn->Start();
    return;
  }
  t->conns[member] = conn;
  t->conn_seq[member] = seq;
  t->lost.erase(member);
  if (lane_ == 0) t->info.counters->workers_connected.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("data: tenant '{}' rack {} rank {} connected on lane {} from {}", id.tenant, id.rack,
               id.rank, lane_, id.peer);
  FrameHeader h;
  h.opcode = Opcode::kWelcome;
  h.tenant = id.tenant_handle;
  conn->SendOwned(h, WelcomePayload(*t));
  conn->Start();
}

LaneService::Key* LaneService::FindKey(Tenant& t, uint32_t key_id) {
  if (auto it = t.keys.find(key_id); it != t.keys.end()) return &it->second;
  KeyInfo info;
  if (!registry_->GetKeyById(t.info.handle, key_id, &info).ok()) return nullptr;
  Key& k = t.keys[key_id];
  k.info = std::move(info);
  k.runtime = plane_->KeyRuntimeFor(t.info.handle, key_id);
  return &k;
}

LaneService::Chunk& LaneService::GetChunk(Tenant& t, Key& key, uint32_t chunk) {
  auto& slot = t.chunks[ChunkId(key.info.id, chunk)];
  if (!slot) {
    const uint64_t first = uint64_t{chunk} * key.info.chunk_elements;
    const uint32_t n =
        static_cast<uint32_t>(std::min<uint64_t>(key.info.chunk_elements, key.info.elements - first));
    // Created with the optimizer schedule the key's other chunks follow, so
    // a change announced for a later update applies here at the same update.
    const OptimizerSchedule& sched = key.info.schedule;
    slot = std::make_unique<Chunk>(Chunk{
        aggregation::ChunkState(n, t.info.workers_per_rack, sched.base,
                                ElementTypeOf(key.info.dtype)),
        key.info.id, chunk, {}, {}, {}, {}, 0, 0, {}});
    if (sched.from_update != 0) slot->state.SetOptimizer(sched.latest, sched.from_update);
    if (key.info.init == InitMode::kZeros) slot->state.MarkInitialized();
    if (MultiRack(t)) InitMultiRackChunk(t, key, *slot, key.info.placement.first_chunk + chunk);
  }
  return *slot;
}

net::FrameHandler::Verdict LaneService::Refuse(net::Connection& conn, WireError code,
                                                const std::string& text, uint64_t request_id) {
  if (Tenant* t = FindTenant(conn.id().tenant_handle)) {
    t->info.counters->errors.fetch_add(1, std::memory_order_relaxed);
  }
  conn.SendError(code, text, request_id, false);
  return Verdict::kDiscard;
}

net::FrameHandler::Verdict LaneService::Reject(net::Connection& conn, WireError code,
                                         const std::string& text, uint64_t request_id) {
  if (Tenant* t = FindTenant(conn.id().tenant_handle)) {
    t->info.counters->errors.fetch_add(1, std::memory_order_relaxed);
  }
  spdlog::warn("data: tenant '{}' rank {} lane {} ({}): {}: {}; closing", conn.id().tenant,
               conn.id().rank, conn.id().lane, conn.id().peer, net::WireErrorName(code), text);
  conn.SendError(code, text, request_id, true);
  return Verdict::kReject;
}

net::FrameHandler::Verdict LaneService::AcceptHeader(net::Connection& conn, const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  if (conn.id().hub) return AcceptPeerHeader(conn, h);
  switch (h.opcode) {
    case Opcode::kHeartbeat:
    case Opcode::kBye:
      return Verdict::kAccept;
    case Opcode::kPush:
    case Opcode::kInit:
    case Opcode::kPull:
    case Opcode::kDeclare:
    case Opcode::kSetOptimizer:
      break;
    default:
      return Reject(conn, WireError::kMalformed,
                    "opcode: " + std::to_string(static_cast<int>(h.opcode)) +
                        " is not a request a client may send after HELLO",
                    rid);
  }
  if (h.tenant != conn.id().tenant_handle) {
    return Reject(conn, WireError::kMalformed,
                  "tenant: frame names tenant handle " + std::to_string(h.tenant) +
                      " but this connection belongs to " + std::to_string(conn.id().tenant_handle),
                  rid);
  }
  Tenant* t = FindTenant(h.tenant);
  if (!t) return Reject(conn, WireError::kTenantGone, "tenant: was deleted", rid);
  if (h.opcode == Opcode::kDeclare || h.opcode == Opcode::kSetOptimizer) return Verdict::kAccept;

  Key* key = FindKey(*t, h.key);
  if (!key) {
    return Reject(conn, WireError::kUnknownKey,
                  "key: id " + std::to_string(h.key) + " does not exist in tenant '" +
                      t->info.name + "'",
                  rid);
  }
  const KeyInfo& k = key->info;
  if (h.chunk >= k.placement.chunk_count) {
    return Reject(conn, WireError::kBadChunk,
                  "chunk: " + std::to_string(h.chunk) + " is out of range; key '" + k.name +
                      "' has " + std::to_string(k.placement.chunk_count) + " chunks",
                  rid);
  }
  const uint32_t owner = static_cast<uint32_t>((k.placement.first_chunk + h.chunk) % lanes_);
  if (owner != lane_) {
    return Reject(conn, WireError::kBadChunk,
                  "chunk: " + std::to_string(h.chunk) + " of key '" + k.name + "' lives on lane " +
                      std::to_string(owner) + ", not lane " + std::to_string(lane_),
                  rid);
  }
  if (h.opcode == Opcode::kPull) {
    if (h.payload_bytes != 0) {
      return Reject(conn, WireError::kMalformed, "payload_bytes: PULL carries no payload", rid);
    }
    return Verdict::kAccept;
  }
  // PUSH and INIT carry one chunk in the key's wire dtype.
  if (h.dtype != NetDTypeOf(k.dtype)) {
    return Reject(conn, WireError::kBadDType,
                  std::string("dtype: key '") + k.name + "' is " + WireDTypeName(k.dtype) +
                      ", the frame says " + net::DTypeName(h.dtype),
                  rid);
  }
  Chunk& c = GetChunk(*t, *key, h.chunk);
  aggregation::ChunkState& stage = Stage(c, conn.id().rack);
  const size_t want = stage.wire_bytes();
  if (h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "payload_bytes: chunk " + std::to_string(h.chunk) + " of key '" + k.name +
                      "' needs " + std::to_string(want) + " bytes, got " +
                      std::to_string(h.payload_bytes),
                  rid);
  }
  const uint32_t rank = conn.id().rank;
  if (h.opcode == Opcode::kInit) {
    if (MultiRack(*t)) {
      return Refuse(conn, WireError::kInvalidArgument,
                    "key: INIT is not supported for tenants spanning racks yet; create keys "
                    "with init = zeros",
                    rid);
    }
    if (rank != 0) {
      return Reject(conn, WireError::kInvalidArgument, "rank: only rank 0 may INIT a key", rid);
    }
    // Not fatal: rank 0 re-running against an existing key can Pull instead.
    if (k.init != InitMode::kFromClient) {
      return Refuse(conn, WireError::kInvalidArgument,
                    "key: '" + k.name + "' starts at zeros (init = zeros); INIT is for keys "
                    "declared with init = from_client",
                    rid);
    }
    if (c.state.initialized()) {
      return Refuse(conn, WireError::kInvalidArgument,
                    "chunk: " + std::to_string(h.chunk) + " of key '" + k.name +
                        "' is already initialized (Pull its values instead)",
                    rid);
    }
    return Verdict::kAccept;
  }
  // PUSH.
  if (!t->lost.empty()) {
    // Not fatal: this worker did nothing wrong; it may retry once the lost
    // rank is back.
    return Refuse(conn, WireError::kWorkerLost,
                  "worker lost: rank " + std::to_string(t->lost.begin()->first) + " (" +
                      t->lost.begin()->second + ") has not reconnected; push again once it has",
                  rid);
  }
  if (!stage.initialized()) {
    return Reject(conn, WireError::kNotReady,
                  "key: '" + k.name + "' has no initial values yet (rank 0 must INIT it first)",
                  rid);
  }
  if (h.iteration != stage.version()) {
    return Reject(conn, WireError::kBadIteration,
                  "iteration: " + std::to_string(h.iteration) + " for chunk " +
                      std::to_string(h.chunk) + " of key '" + k.name + "', the hub expects " +
                      std::to_string(stage.version()) +
                      (h.iteration < stage.version() ? " (stale)" : " (ahead)"),
                  rid);
  }
  if (stage.has_contributed(rank)) {
    return Reject(conn, WireError::kDuplicatePush,
                  "iteration: rank " + std::to_string(rank) + " already pushed chunk " +
                      std::to_string(h.chunk) + " of key '" + k.name + "' for iteration " +
                      std::to_string(h.iteration),
                  rid);
  }
  return Verdict::kAccept;
}

void LaneService::HandleFrame(net::Connection& conn, const FrameHeader& h,
                              std::span<const std::byte> payload) {
  if (conn.id().hub) {
    HandlePeerFrame(conn, h, payload);
    return;
  }
  if (h.opcode == Opcode::kBye) {
    auto keep = conn.shared_from_this();
    keep->Close("said BYE");
    return;
  }
  if (h.opcode == Opcode::kHeartbeat) {
    FrameHeader r;
    r.opcode = Opcode::kHeartbeat;
    r.tenant = conn.id().tenant_handle;
    r.request_id = h.request_id;
    conn.SendOwned(r, {});
    return;
  }
  Tenant* t = FindTenant(h.tenant);
  if (!t) {
    Reject(conn, WireError::kTenantGone, "tenant: was deleted", h.request_id);
    return;
  }
  switch (h.opcode) {
    case Opcode::kPush: HandlePush(conn, *t, h, payload); break;
    case Opcode::kInit: HandleInit(conn, *t, h, payload); break;
    case Opcode::kPull: HandlePull(conn, *t, h); break;
    case Opcode::kDeclare: HandleDeclare(conn, *t, h, payload); break;
    case Opcode::kSetOptimizer: HandleSetOptimizer(conn, *t, h, payload); break;
    default: break;  // AcceptHeader let nothing else through
  }
}

void LaneService::SendParams(net::Connection& conn, const Chunk& c, uint64_t version,
                             uint64_t request_id, bool copy) {
  const auto wire = c.state.wire_params(version);
  const Key* key = nullptr;
  if (Tenant* t = FindTenant(conn.id().tenant_handle)) {
    if (auto it = t->keys.find(c.key_id); it != t->keys.end()) key = &it->second;
  }
  FrameHeader r;
  r.opcode = Opcode::kParams;
  r.tenant = conn.id().tenant_handle;
  r.key = c.key_id;
  r.chunk = c.index_in_key;
  r.dtype = key ? NetDTypeOf(key->info.dtype) : net::DType::kFp32;
  r.iteration = version;
  r.request_id = request_id;
  r.payload_bytes = static_cast<uint32_t>(wire.size());
  if (copy) {
    conn.SendOwned(r, std::string(reinterpret_cast<const char*>(wire.data()), wire.size()));
  } else {
    // Safe without a copy: the buffer of `version` stays unchanged until
    // version + 2 is computed, which needs this worker's next push, which it
    // sends only after receiving this reply (ChunkState double buffering).
    conn.SendBorrowed(r, wire);
  }
}

void LaneService::HandlePush(net::Connection& conn, Tenant& t, const FrameHeader& h,
                             std::span<const std::byte> payload) {
  Key* key = FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  Chunk& c = GetChunk(t, *key, h.chunk);
  aggregation::ChunkState& stage = Stage(c, conn.id().rack);
  if (h.iteration != stage.version() || stage.has_contributed(conn.id().rank)) {
    // State moved while the payload was read (a worker was lost meanwhile).
    Reject(conn, WireError::kBadIteration, "iteration: no longer current", h.request_id);
    return;
  }
  const auto result = stage.Contribute(conn.id().rank, payload);
  auto& counters = *t.info.counters;
  counters.pushes.fetch_add(1, std::memory_order_relaxed);
  counters.bytes_in.fetch_add(payload.size() + net::kHeaderBytes, std::memory_order_relaxed);
  if (result != aggregation::ChunkState::AddResult::kAccepted &&
      result != aggregation::ChunkState::AddResult::kComplete) {
    Reject(conn, WireError::kInternal, "chunk: contribution refused", h.request_id);
    return;
  }
  if (c.pushes.empty()) {
    c.first_contribution = std::chrono::steady_clock::now();
    t.pending.insert(ChunkId(c.key_id, c.index_in_key));
  }
  c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id});
  if (result != aggregation::ChunkState::AddResult::kComplete) return;
  if (MultiRack(t)) {
    stage.Update();  // the rack's sum (sum-only stage)
    OnRackSum(t, *key, c, conn.id().rack, h.iteration);
    return;
  }

  c.state.Update();
  const uint64_t v = c.state.version();
  t.pending.erase(ChunkId(c.key_id, c.index_in_key));
  if (c.index_in_key == 0) {
    key->runtime->version.store(v, std::memory_order_relaxed);
    counters.iterations_completed.fetch_add(1, std::memory_order_relaxed);
  }
  for (const Waiter& w : c.pushes) {
    if (auto wc = w.conn.lock(); wc && wc->open()) SendParams(*wc, c, v, w.request_id, false);
  }
  c.pushes.clear();
}

void LaneService::HandleInit(net::Connection& conn, Tenant& t, const FrameHeader& h,
                             std::span<const std::byte> payload) {
  Key* key = FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  Chunk& c = GetChunk(t, *key, h.chunk);
  if (c.state.initialized() || !c.state.SetInitial(payload)) {
    Reject(conn, WireError::kInvalidArgument, "chunk: cannot be initialized now", h.request_id);
    return;
  }
  t.info.counters->bytes_in.fetch_add(payload.size() + net::kHeaderBytes,
                                      std::memory_order_relaxed);
  plane_->ChunkInitialized(t.info.handle, key->info.id, key->info.placement.chunk_count);
  SendParams(conn, c, 0, h.request_id, true);
  for (const Waiter& w : c.pulls) {
    if (auto wc = w.conn.lock(); wc && wc->open()) SendParams(*wc, c, 0, w.request_id, true);
  }
  c.pulls.clear();
}

void LaneService::HandlePull(net::Connection& conn, Tenant& t, const FrameHeader& h) {
  Key* key = FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  Chunk& c = GetChunk(t, *key, h.chunk);
  if (MultiRack(t)) {
    const auto& bytes = c.replies[c.version & 1];
    FrameHeader r;
    r.opcode = Opcode::kParams;
    r.tenant = t.info.handle;
    r.key = c.key_id;
    r.chunk = c.index_in_key;
    r.dtype = NetDTypeOf(key->info.dtype);
    r.iteration = c.version;
    r.request_id = h.request_id;
    conn.SendOwned(r, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    return;
  }
  if (!c.state.initialized()) {
    c.pulls.push_back(Waiter{conn.weak_from_this(), h.request_id});
    return;
  }
  // A pull is not part of the push discipline that protects borrowed
  // buffers, so its reply owns a copy.
  SendParams(conn, c, c.state.version(), h.request_id, true);
}

void LaneService::OnBytesSent(net::Connection& conn, size_t bytes) {
  if (conn.id().hub) {
    plane_->CountRackBytes(conn.id().rack, bytes, 0);
    return;
  }
  if (Tenant* t = FindTenant(conn.id().tenant_handle)) {
    t->info.counters->bytes_out.fetch_add(bytes, std::memory_order_relaxed);
  }
}

void LaneService::OnConnectionClosed(net::Connection& conn, const std::string& why) {
  if (conn.id().hub) {
    OnPeerClosed(conn, why);
    return;
  }
  Tenant* t = FindTenant(conn.id().tenant_handle);
  if (!t) return;
  const uint32_t member = Member(*t, conn.id());
  const auto it = t->conns.find(member);
  if (it == t->conns.end() || it->second.get() != &conn) return;  // a refused duplicate
  auto keep = it->second;
  t->conns.erase(it);
  if (lane_ == 0) t->info.counters->workers_connected.fetch_sub(1, std::memory_order_relaxed);
  spdlog::info("data: tenant '{}' rank {} lane {} disconnected: {}", conn.id().tenant,
               conn.id().rank, lane_, why);
  if (shut_down_) return;
  plane_->WorkerLost(conn.id().tenant_handle, member,
                     (racks_ > 1 ? "rack " + std::to_string(conn.id().rack) + " " : std::string()) +
                         "rank " + std::to_string(conn.id().rank) + " lane " +
                         std::to_string(lane_) + ": " + why);
}

void LaneService::OnWorkerLost(uint32_t handle, uint32_t rank, uint64_t before_seq,
                               const std::string& why) {
  Tenant* t = FindTenant(handle);
  if (!t) return;
  if (auto it = t->conns.find(rank); it != t->conns.end() && t->conn_seq[rank] < before_seq) {
    auto keep = it->second;
    keep->SendError(WireError::kWorkerLost,
                    "worker: another connection of this worker closed (" + why + ")", 0, true);
  }
  if (!t->conns.count(rank)) t->lost[rank] = why;
  FailPending(*t, WireError::kWorkerLost,
              "worker lost: " + why + "; this iteration's partial sums were discarded");
}

void LaneService::FailPending(Tenant& t, WireError code, const std::string& why) {
  for (uint64_t id : t.pending) {
    auto it = t.chunks.find(id);
    if (it == t.chunks.end()) continue;
    Chunk& c = *it->second;
    for (const Waiter& w : c.pushes) {
      if (auto wc = w.conn.lock(); wc && wc->open()) wc->SendError(code, why, w.request_id, false);
    }
    c.pushes.clear();
    c.state.DiscardPending();
    for (auto& stage : c.stages) {
      if (stage) stage->DiscardPending();
    }
  }
  if (!t.pending.empty()) {
    spdlog::warn("data: tenant '{}' lane {}: failed {} pending chunk update(s): {}", t.info.name,
                 lane_, t.pending.size(), why);
  }
  t.pending.clear();
}

void LaneService::ArmStragglerTimer() {
  straggler_timer_.expires_after(kStragglerCheckPeriod);
  straggler_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || shut_down_) return;
    CheckStragglers();
    ArmStragglerTimer();
  });
}

void LaneService::CheckStragglers() {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::milliseconds(config_.straggler_timeout_ms);
  for (auto& [handle, t] : tenants_) {
    bool expired = false;
    std::string missing;
    for (uint64_t id : t.pending) {
      const Chunk& c = *t.chunks.at(id);
      if (now - c.first_contribution <= limit) continue;
      expired = true;
      if (!c.stages.empty()) {
        missing = "of some rack";
        break;
      }
      for (uint32_t r = 0; r < c.state.workers(); ++r) {
        if (c.state.has_contributed(r)) continue;
        if (!missing.empty()) missing += ',';
        missing += std::to_string(r);
      }
      break;
    }
    if (expired) {
      FailPending(t, WireError::kWorkerLost,
                  "straggler: rank(s) " + missing + " did not push within " +
                      std::to_string(config_.straggler_timeout_ms) +
                      " ms (data.straggler_timeout_ms); partial sums were discarded");
    }
  }
}

void LaneService::Shutdown() {
  shut_down_ = true;
  straggler_timer_.cancel();
  for (auto& [handle, t] : tenants_) {
    FailPending(t, WireError::kShuttingDown, "the hub is shutting down");
    const auto conns = t.conns;
    for (auto& [rank, conn] : conns) {
      conn->SendError(WireError::kShuttingDown, "the hub is shutting down", 0, true);
    }
  }
}

}  // namespace rackhub::server
