// WorkerProtocol: adopting worker connections (a rank reconnecting waits
// for its old connection), the header checks before a payload is read,
// refusals, and HandleFrame's dispatch by opcode. PUSH / INIT / PULL:
// worker_data.cc; closed connections, lost workers and generations:
// worker_lost.cc; DECLARE, SET_OPTIMIZER and WELCOME: worker_control.cc.
#include "worker_protocol.h"

#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/aggregation/topk.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "wire_names.h"

namespace rackhub::server {

namespace {

// A second connection for a (tenant, rank, lane) that is still connected is
// re-examined this often, up to kReconnectRetries times (1 s), before it is
// refused as a duplicate.
constexpr auto kReconnectRetryPeriod = std::chrono::milliseconds(20);
constexpr int kReconnectRetries = 50;

// A relayed member's generation at the home (AdoptOrRetry).
std::shared_ptr<WorkerGeneration> RelayedGeneration(uint64_t session) {
  auto own = std::make_shared<WorkerGeneration>();
  own->session = session;
  return own;
}

}  // namespace

net::SendLimits WorkerSendLimits(const DataConfig& config, uint32_t chunk_bytes) {
  // Room for a few of the tenant's replies whatever the setting: a single
  // 64 MiB chunk must not trip a 64 MiB limit.
  const uint64_t floor = 4 * (uint64_t{chunk_bytes} + net::kHeaderBytes);
  net::SendLimits l;
  l.max_bytes = static_cast<size_t>(std::max(config.max_queued_bytes_per_connection, floor));
  l.pause_bytes = l.max_bytes / 2;
  l.setting = "data.max_queued_bytes_per_connection";
  return l;
}

WorkerProtocol::WorkerProtocol(const DataConfig& config, ChunkTable* table, Registry* registry,
                               LaneHost* host, LaneGate* gate, RackExchange* exchange)
    : config_(config),
      table_(table),
      registry_(registry),
      host_(host),
      gate_(gate),
      exchange_(exchange),
      pacer_(static_cast<size_t>(config.intake_lead_bytes),
             std::chrono::milliseconds(config.straggler_timeout_ms)) {
  if (config.scheduler == "fair") {
    scheduler_ = std::make_unique<FairScheduler>(gate, [table](uint32_t handle) -> uint32_t {
          const LaneTenant* t = table->FindTenant(handle);
          return t ? t->info.counters->weight.load(std::memory_order_relaxed) : 0;
        });
  }
}

void WorkerProtocol::Adopt(std::shared_ptr<net::Connection> conn, uint64_t seq) {
  AdoptOrRetry(std::move(conn), seq, kReconnectRetries);
}

void WorkerProtocol::AdoptOrRetry(std::shared_ptr<net::Connection> conn, uint64_t seq,
                                  int retries_left) {
  const net::ConnectionIdentity& id = conn->id();
  const uint32_t lane = table_->lane();
  if (gate_->closed()) {
    conn->SendError(WireError::kShuttingDown, "the hub is shutting down", 0, true);
    conn->Start();
    return;
  }
  LaneTenant* t = table_->LoadTenant(id.tenant_handle);
  if (!t) {
    conn->SendError(WireError::kTenantGone, "tenant: '" + id.tenant + "' was deleted", 0, true);
    conn->Start();
    return;
  }
  const uint32_t member = ChunkTable::Member(*t, id);
  if (auto it = t->conns.find(member); it != t->conns.end() && it->second->open()) {
    if (retries_left > 0) {
      // A worker that reconnects right after closing: its old connection's
      // BYE or EOF may still be queued on this lane. Look again shortly.
      gate_->After(kReconnectRetryPeriod, [this, conn, seq, retries_left] {
        AdoptOrRetry(conn, seq, retries_left - 1);
      });
      return;
    }
    conn->SendError(WireError::kInvalidArgument,
                    "rank: rank " + Num(id.rank) + " of tenant '" + id.tenant +
                        "' is already connected on lane " + Num(lane) + " from " +
                        it->second->id().peer,
                    0, true);
    conn->Start();
    return;
  }
  conn->SetSendLimits(WorkerSendLimits(config_, t->info.chunk_bytes));
  if (scheduler_) conn->SetDeliveryScheduler(scheduler_.get());
  // Its process's generation (docs/durability.md, "Worker generations"). A
  // new session of the rank ends the one before, which must not contribute
  // any more (it is normally over already: its connection here closed).
  // Across racks the worker's own hub owns its generations: at the home a
  // relayed member's connection is a generation of its own, never
  // replacing nor replaced by another (its member notices and sessions
  // decide, rack_relay.cc).
  std::shared_ptr<WorkerGeneration> replaced;
  const std::shared_ptr<WorkerGeneration> gen =
      table_->RelayedWorker(id) ? RelayedGeneration(id.session)
                                : t->runtime->Enter(member, id.session, &replaced);
  t->conns[member] = conn;
  t->conn_seq[member] = seq;
  t->gens[member] = gen;
  if (replaced) {
    EndGeneration(*t, member, replaced,
                  "rank " + Num(id.rank) + " generation " + Num(replaced->number) +
                      " was replaced by a new process (generation " + Num(gen->number) + ")",
                  true);
  }
  const bool counted = lane == 0 && !table_->RelayedWorker(id);
  if (counted) t->info.counters->workers_connected.fetch_add(1, std::memory_order_relaxed);
  t->metrics->EnsureRank(member);
  if (t->info.elastic) ElasticAdopted(*t, member, *gen);
  if (t->info.consistency != Consistency::kSync) {
    UnsyncedMemberBack(*t, member);
    // Across racks: live at every other rack's home too (rack_relay.cc).
    if (table_->exchange() && !table_->RelayedWorker(id)) exchange_->RelayMemberBack(*t, *conn);
  }
  spdlog::info("data: tenant '{}' rack {} rank {} (generation {}) connected on lane {} from {}",
               id.tenant, id.rack, id.rank, gen->number, lane, id.peer);
  FrameHeader h;
  h.opcode = Opcode::kWelcome;
  h.tenant = id.tenant_handle;
  conn->SendOwned(h, WelcomePayload(*t, gen->number));
  conn->Start();
}

Verdict WorkerProtocol::Refuse(net::Connection& conn, WireError code, const std::string& text,
                               uint64_t request_id) {
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) t->CountError(code);
  conn.SendError(code, text, request_id, false);
  return Verdict::kDiscard;
}

Verdict WorkerProtocol::Reject(net::Connection& conn, WireError code, const std::string& text,
                               uint64_t request_id) {
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) t->CountError(code);
  spdlog::warn("data: tenant '{}' rank {} lane {} ({}): {}: {}; closing", conn.id().tenant,
               conn.id().rank, conn.id().lane, conn.id().peer, net::WireErrorName(code), text);
  conn.SendError(code, text, request_id, true);
  return Verdict::kReject;
}

Verdict WorkerProtocol::AcceptHeader(net::Connection& conn, const FrameHeader& h) {
  switch (h.opcode) {
    case Opcode::kHeartbeat:
    case Opcode::kBye:
      return Verdict::kAccept;
    case Opcode::kPush:
    case Opcode::kInit:
    case Opcode::kPull:
    case Opcode::kDeclare:
    case Opcode::kSetOptimizer:
    case Opcode::kPushRows:
    case Opcode::kPullRows:
    case Opcode::kCommit:
    case Opcode::kRollback:
      break;
    default:
      return Reject(conn, WireError::kMalformed,
                    "opcode: " + Num(static_cast<int>(h.opcode)) +
                        " is not a request a client may send after HELLO",
                    h.request_id);
  }
  if (h.tenant != conn.id().tenant_handle) {
    return Reject(conn, WireError::kMalformed,
                  "tenant: frame names tenant handle " + Num(h.tenant) +
                      " but this connection belongs to " + Num(conn.id().tenant_handle),
                  h.request_id);
  }
  LaneTenant* t = table_->FindTenant(h.tenant);
  if (!t) return Reject(conn, WireError::kTenantGone, "tenant: was deleted", h.request_id);
  if (h.opcode == Opcode::kDeclare || h.opcode == Opcode::kSetOptimizer ||
      h.opcode == Opcode::kCommit || h.opcode == Opcode::kRollback) {
    return Verdict::kAccept;
  }
  if (h.opcode == Opcode::kPush || h.opcode == Opcode::kInit || h.opcode == Opcode::kPushRows) {
    // A generation that ended contributes nothing more (checked again when
    // the payload is in: it may end meanwhile).
    const auto* gen = GenerationOf(*t, conn);
    if (!gen || !(*gen)->live()) return RefuseEnded(conn, *t, h);
  }
  return CheckChunkFrame(conn, *t, h);
}

// PUSH, INIT and PULL name a chunk this lane owns.
Verdict WorkerProtocol::CheckChunkFrame(net::Connection& conn, LaneTenant& t,
                                        const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  LaneKey* key = table_->FindKey(t, h.key);
  if (!key) {
    return Reject(conn, WireError::kUnknownKey,
                  "key: id " + Num(h.key) + " does not exist in tenant '" + t.info.name + "'",
                  rid);
  }
  const KeyInfo& k = key->info;
  if (h.chunk >= k.placement.chunk_count) {
    return Reject(conn, WireError::kBadChunk,
                  "chunk: " + Num(h.chunk) + " is out of range; key '" + k.name + "' has " +
                      Num(k.placement.chunk_count) + " chunks",
                  rid);
  }
  const uint32_t owner = table_->OwnerLane(k, h.chunk);
  if (owner != table_->lane()) {
    return Reject(conn, WireError::kBadChunk,
                  "chunk: " + Num(h.chunk) + " of key '" + k.name + "' lives on lane " +
                      Num(owner) + ", not lane " + Num(table_->lane()),
                  rid);
  }
  const bool row_frame = h.opcode == Opcode::kPushRows || h.opcode == Opcode::kPullRows;
  if (row_frame != k.table()) {
    return Refuse(conn, WireError::kInvalidArgument,
                  std::string("key: '") + k.name + "' is " +
                      (k.table() ? "a row-sparse table: use PUSH_ROWS / PULL_ROWS, not "
                                 : "dense: row frames are for tables, not ") +
                      net::OpcodeName(h.opcode),
                  rid);
  }
  if (row_frame) {
    if (h.dtype != static_cast<net::DType>(static_cast<uint8_t>(k.dtype))) {
      return Reject(conn, WireError::kBadDType,
                    std::string("dtype: table '") + k.name + "' is " + WireDTypeName(k.dtype) +
                        ", the frame says " + net::DTypeName(h.dtype),
                    rid);
    }
    return CheckRowsFrame(conn, t, *key, table_->GetChunk(t, *key, h.chunk), h);
  }
  if (h.opcode == Opcode::kPull) {
    if (h.payload_bytes != 0) {
      return Reject(conn, WireError::kMalformed, "payload_bytes: PULL carries no payload", rid);
    }
    return Verdict::kAccept;
  }
  // PUSH and INIT carry one chunk in the key's wire dtype.
  if (h.dtype != static_cast<net::DType>(static_cast<uint8_t>(k.dtype))) {
    return Reject(conn, WireError::kBadDType,
                  std::string("dtype: key '") + k.name + "' is " + WireDTypeName(k.dtype) +
                      ", the frame says " + net::DTypeName(h.dtype),
                  rid);
  }
  const size_t want = size_t{ChunkTable::ChunkElements(k, h.chunk)} * WireDTypeBytes(k.dtype);
  if (h.opcode == Opcode::kPush && (h.flags & net::kFlagSparse)) {
    // Its contents are checked once read (OnPush); none of it is fatal.
    if (k.topk_ratio <= 0) {
      return Refuse(conn, WireError::kInvalidArgument,
                    "flags: key '" + k.name + "' was not declared with top-k compression "
                    "(topk_ratio 0): push its chunks dense",
                    rid);
    }
    if (h.payload_bytes > want) {
      return Refuse(conn, WireError::kInvalidArgument,
                    "payload_bytes: a sparse PUSH of " + Num(h.payload_bytes) + " bytes for chunk " +
                        Num(h.chunk) + " of key '" + k.name + "' is larger than the chunk dense (" +
                        Num(want) + " bytes): push it dense",
                    rid);
    }
  } else if (h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "payload_bytes: chunk " + Num(h.chunk) + " of key '" + k.name + "' needs " +
                      Num(want) + " bytes, got " + Num(h.payload_bytes),
                  rid);
  }
  // A bounded/async chunk homed on another rack: its home checks the rest.
  if (table_->Relayed(t, k, h.chunk)) return Verdict::kAccept;
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  if (h.opcode == Opcode::kInit) return CheckInit(conn, k, c, h);
  if (c.unsynced) return CheckUnsyncedPush(conn, t, k, c, h);
  return CheckPush(conn, t, k, c, h);
}

Verdict WorkerProtocol::CheckInit(net::Connection& conn, const KeyInfo& k, Chunk& c,
                                  const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  if (conn.id().rank != 0) {
    return Reject(conn, WireError::kInvalidArgument, "rank: only rank 0 may INIT a key", rid);
  }
  if (conn.id().rack != 0) {  // a tenant spanning racks: rank 0 of rack 0 initializes
    return Reject(conn, WireError::kInvalidArgument,
                  "rank: only rank 0 of rack 0 may INIT a key of a tenant spanning racks "
                  "(this is rank 0 of rack " + Num(conn.id().rack) + "; Pull the values instead)",
                  rid);
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
                  "chunk: " + Num(h.chunk) + " of key '" + k.name +
                      "' is already initialized (Pull its values instead)",
                  rid);
  }
  return Verdict::kAccept;
}

Verdict WorkerProtocol::CheckPush(net::Connection& conn, LaneTenant& t, const KeyInfo& k,
                                  Chunk& c, const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  aggregation::ChunkState& stage = c.Stage(conn.id().rack);
  const uint32_t rank = conn.id().rank;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  // A paused elastic tenant says so even while a recovery runs (the pause
  // is committed before the recovery ends).
  if (t.info.elastic && CurrentMembership(t).paused) return CheckMember(conn, t, h);
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    // Not fatal: the tenant is being brought back to one version per key
    // after an aborted iteration (milliseconds). Pull, then push again.
    return RefuseRecovering(conn, t, h, "key");
  }
  if (t.info.elastic) {
    if (const Verdict v = CheckMember(conn, t, h); v != Verdict::kAccept) return v;
    if (const Verdict v = CheckFence(conn, t, c, h); v != Verdict::kAccept) return v;
  }
  if (!stage.initialized()) {
    return Reject(conn, WireError::kNotReady,
                  "key: '" + k.name + "' has no initial values yet (rank 0 must INIT it first)",
                  rid);
  }
  if (h.iteration != stage.version()) {
    if (AnswerCountedRetry(conn, t, c, h) || WaitCountedAcrossRacks(conn, t, c, h)) {
      return Verdict::kDiscard;
    }
    // Not fatal: after a recovery, a restore or a hub restart the worker is
    // behind or ahead; the ERROR's iteration field tells it where the hub is.
    RefuseIteration(conn, t, h, stage.version(),
                    "iteration: " + Num(h.iteration) + " for chunk " + Num(h.chunk) +
                        " of key '" + k.name + "', the hub expects " + Num(stage.version()) +
                        (h.iteration < stage.version() ? " (stale)" : " (ahead)") +
                        "; Pull the key to resynchronize");
    return Verdict::kDiscard;
  }
  if (stage.has_contributed(rank) &&
      !t.runtime->PushFailedAt(member, conn.id().session, h.key, h.iteration)) {
    return Reject(conn, WireError::kDuplicatePush,
                  "iteration: rank " + Num(rank) + " already pushed chunk " + Num(h.chunk) +
                      " of key '" + k.name + "' for iteration " + Num(h.iteration),
                  rid);
  }
  return Verdict::kAccept;
}

void WorkerProtocol::HandleFrame(net::Connection& conn, const FrameHeader& h,
                                 std::span<const std::byte> payload) {
  if (h.opcode == Opcode::kBye) {
    // A clean leave (docs/durability.md, Job lifecycle): not a lost worker.
    // Its generation ends: a contribution it left in an unfinished update
    // is discarded (the replacement contributes instead), and its frames
    // still arriving on other lanes are not counted.
    if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) {
      const uint32_t member = ChunkTable::Member(*t, conn.id());
      t->leaving.insert(member);
      if (const auto* gen = GenerationOf(*t, conn)) {
        EndGeneration(*t, member, *gen,
                      "rank " + Num(conn.id().rank) + " generation " + Num((*gen)->number) +
                          " left (BYE)",
                      false);
      }
    }
    auto keep = conn.shared_from_this();
    keep->Close("said BYE");
    return;
  }
  if (h.opcode == Opcode::kHeartbeat) {
    OnHeartbeat(conn, h);
    return;
  }
  LaneTenant* t = table_->FindTenant(h.tenant);
  if (!t) {
    Reject(conn, WireError::kTenantGone, "tenant: was deleted", h.request_id);
    return;
  }
  if (h.opcode == Opcode::kPush || h.opcode == Opcode::kInit || h.opcode == Opcode::kPull) {
    // A bounded/async chunk homed on another rack goes there (rack_relay.cc).
    if (LaneKey* key = table_->FindKey(*t, h.key); key && table_->Relayed(*t, key->info, h.chunk)) {
      exchange_->Relay(conn, *t, *key, h, payload);
      return;
    }
  }
  switch (h.opcode) {
    case Opcode::kPush: OnPush(conn, *t, h, payload); break;
    case Opcode::kInit: OnInit(conn, *t, h, payload); break;
    case Opcode::kPull: OnPull(conn, *t, h); break;
    case Opcode::kDeclare: OnDeclare(conn, *t, h, payload); break;
    case Opcode::kSetOptimizer: OnSetOptimizer(conn, *t, h, payload); break;
    case Opcode::kPushRows: OnPushRows(conn, *t, h, payload); break;
    case Opcode::kPullRows: OnPullRows(conn, *t, h, payload); break;
    case Opcode::kCommit:
    case Opcode::kRollback: OnCommitFrame(conn, *t, h); break;
    default: break;  // AcceptHeader let nothing else through
  }
}

void WorkerProtocol::OnBytesSent(net::Connection& conn, size_t bytes) {
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) {
    t->metrics->bytes_out.Add(bytes);
  }
}

void WorkerProtocol::RefuseIteration(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                     uint64_t current, const std::string& text) {
  t.CountError(WireError::kBadIteration);
  t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
  net::ErrorFrame e =
      net::MakeErrorFrame(WireError::kBadIteration, text, t.info.handle, h.request_id, false);
  e.header.key = h.key;
  e.header.chunk = h.chunk;
  e.header.iteration = current;  // where the hub is
  conn.SendOwned(e.header, std::move(e.body));
}

}  // namespace rackhub::server
