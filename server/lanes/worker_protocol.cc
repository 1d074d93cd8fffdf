// WorkerProtocol, part 1: adoption, header checks, PUSH / INIT / PULL and
// connection events. DECLARE, SET_OPTIMIZER and WELCOME: worker_control.cc.
#include "worker_protocol.h"

#include <malloc.h>

#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/aggregation/topk.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"

namespace rackhub::server {

using net::FrameHeader;
using net::Opcode;
using net::WireError;
using Verdict = net::FrameHandler::Verdict;

namespace {

// A second connection for a (tenant, rank, lane) that is still connected is
// re-examined this often, up to kReconnectRetries times (1 s), before it is
// refused as a duplicate.
constexpr auto kReconnectRetryPeriod = std::chrono::milliseconds(20);
constexpr int kReconnectRetries = 50;
// PULLs held per tenant and lane during a recovery, at most (each also
// reserves its reply's bytes on its connection: Connection::Reserve).
constexpr size_t kMaxParkedPulls = 65536;
// A connection closing with at least this much queued is a big release.
constexpr size_t kTrimAfterBacklog = 1u << 20;
constexpr auto kTrimDelay = std::chrono::milliseconds(500);

void CountError(LaneTenant& t, WireError code) { t.metrics->CountError(static_cast<uint32_t>(code)); }

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
      exchange_(exchange) {
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
  std::shared_ptr<WorkerGeneration> replaced;
  const std::shared_ptr<WorkerGeneration> gen = t->runtime->Enter(member, id.session, &replaced);
  t->conns[member] = conn;
  t->conn_seq[member] = seq;
  t->gens[member] = gen;
  if (replaced) {
    EndGeneration(*t, member, replaced,
                  "rank " + Num(id.rank) + " generation " + Num(replaced->number) +
                      " was replaced by a new process (generation " + Num(gen->number) + ")",
                  true);
  }
  if (lane == 0) t->info.counters->workers_connected.fetch_add(1, std::memory_order_relaxed);
  t->metrics->EnsureRank(member);
  if (t->info.consistency != Consistency::kSync) UnsyncedMemberBack(*t, member);
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
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) CountError(*t, code);
  conn.SendError(code, text, request_id, false);
  return Verdict::kDiscard;
}

Verdict WorkerProtocol::Reject(net::Connection& conn, WireError code, const std::string& text,
                               uint64_t request_id) {
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) CountError(*t, code);
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
  if (h.opcode == Opcode::kDeclare || h.opcode == Opcode::kSetOptimizer) return Verdict::kAccept;
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
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  aggregation::ChunkState& stage = c.Stage(conn.id().rack);
  const size_t want = stage.wire_bytes();
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
  if (h.opcode == Opcode::kInit) return CheckInit(conn, k, c, h);
  if (c.unsynced) return CheckUnsyncedPush(conn, t, k, c, h);
  return CheckPush(conn, t, k, stage, h);
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
                                  aggregation::ChunkState& stage, const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  const uint32_t rank = conn.id().rank;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    // Not fatal: the tenant is being brought back to one version per key
    // after an aborted iteration (milliseconds). Pull, then push again.
    t.runtime->PushFailed(member, conn.id().session, h.key, h.iteration);
    return Refuse(conn, WireError::kWorkerLost,
                  "recovering: the tenant's iteration in progress was aborted (" +
                      t.runtime->cause() + "); Pull the key and push the next iteration",
                  rid);
  }
  if (!stage.initialized()) {
    return Reject(conn, WireError::kNotReady,
                  "key: '" + k.name + "' has no initial values yet (rank 0 must INIT it first)",
                  rid);
  }
  if (h.iteration != stage.version()) {
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
  switch (h.opcode) {
    case Opcode::kPush: OnPush(conn, *t, h, payload); break;
    case Opcode::kInit: OnInit(conn, *t, h, payload); break;
    case Opcode::kPull: OnPull(conn, *t, h); break;
    case Opcode::kDeclare: OnDeclare(conn, *t, h, payload); break;
    case Opcode::kSetOptimizer: OnSetOptimizer(conn, *t, h, payload); break;
    case Opcode::kPushRows: OnPushRows(conn, *t, h, payload); break;
    case Opcode::kPullRows: OnPullRows(conn, *t, h, payload); break;
    default: break;  // AcceptHeader let nothing else through
  }
}

void WorkerProtocol::OnHeartbeat(net::Connection& conn, const FrameHeader& h) {
  FrameHeader r;
  r.opcode = Opcode::kHeartbeat;
  r.tenant = conn.id().tenant_handle;
  r.request_id = h.request_id;
  conn.SendOwned(r, {});
}

void WorkerProtocol::OnPush(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                            std::span<const std::byte> payload) {
  LaneKey* key = table_->FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  const auto* gen = GenerationOf(t, conn);
  if (!gen || !(*gen)->live()) {  // ended while the payload was read
    RefuseEnded(conn, t, h);
    return;
  }
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  aggregation::ChunkState& stage = c.Stage(conn.id().rack);
  net::SparsePayload sparse;
  const bool is_sparse = (h.flags & net::kFlagSparse) != 0;
  if (is_sparse) {
    const uint32_t n = stage.elements();
    Result<net::SparsePayload> parsed = net::ParseSparsePayload(
        payload, n, aggregation::TopKCount(key->info.topk_ratio, n), h.dtype);
    if (!parsed.ok()) {
      Refuse(conn, WireError::kInvalidArgument,
             "sparse PUSH of chunk " + Num(h.chunk) + " of key '" + key->info.name +
                 "': " + parsed.status().message() + "; nothing was applied",
             h.request_id);
      return;
    }
    sparse = *parsed;
  }
  if (c.unsynced) {
    OnUnsyncedPush(conn, t, *key, c, h, payload, is_sparse ? &sparse : nullptr);
    return;
  }
  const uint32_t member = ChunkTable::Member(t, conn.id());
  const bool again = stage.has_contributed(conn.id().rank);
  if (h.iteration != stage.version() ||
      (again && !t.runtime->PushFailedAt(member, conn.id().session, h.key, h.iteration)) ||
      t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    // State moved while the payload was read (a recovery meanwhile).
    RefuseIteration(conn, t, h, stage.version(),
                    "iteration: " + Num(h.iteration) +
                        " is no longer current (the iteration was aborted while this push "
                        "was read); Pull the key to resynchronize");
    return;
  }
  if (again) {
    // The rank pushes again after a failed PushPull whose earlier push of
    // this chunk is already counted: that one stays, this one gets the result.
    c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, {}});
    return;
  }
  const auto result =
      is_sparse ? stage.ContributeSparse(conn.id().rank, {sparse.count, sparse.indices,
                                                          sparse.values})
                : stage.Contribute(conn.id().rank, payload);
  if (result != aggregation::ChunkState::AddResult::kAccepted &&
      result != aggregation::ChunkState::AddResult::kComplete) {
    Reject(conn, WireError::kInternal, "chunk: contribution refused", h.request_id);
    return;
  }
  c.NoteContributor(member, *gen);
  t.metrics->pushes.Add(1);
  t.metrics->bytes_in.Add(payload.size() + net::kHeaderBytes);
  // How long the update's first contributor waited for this rank.
  const auto now = std::chrono::steady_clock::now();
  table_->MarkPending(t, c, now);
  if (LatencyHistogram* late = t.metrics->rank(member)) late->Observe(now - c.first_contribution);
  c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, {}});
  if (result != aggregation::ChunkState::AddResult::kComplete) return;
  if (!ContributorsLive(t, c, conn.id().rack, stage.workers())) return;
  if (c.multi_rack()) {
    stage.Update();  // the rack's sum (sum-only stage)
    exchange_->OnRackSum(t, *key, c, conn.id().rack, h.iteration);
    return;
  }
  c.state.Update();
  const uint64_t v = c.state.version();
  table_->Completed(t, *key, c, v);
  AnswerPushes(c, v);
}

void WorkerProtocol::OnInit(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                            std::span<const std::byte> payload) {
  LaneKey* key = table_->FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  const bool set = c.multi_rack() ? table_->SetInitialMultiRack(*key, c, payload)
                                  : !c.state.initialized() && c.state.SetInitial(payload);
  if (!set) {
    Reject(conn, WireError::kInvalidArgument, "chunk: cannot be initialized now", h.request_id);
    return;
  }
  t.metrics->bytes_in.Add(payload.size() + net::kHeaderBytes);
  host_->ChunkInitialized(t.info.handle, key->info.id, key->info.placement.chunk_count);
  SendParams(conn, c, 0, h.request_id);
  AnswerPulls(c, 0);
  // Several racks: the values go to the chunk's home, which passes them on.
  if (c.multi_rack()) exchange_->OnInitialized(t, *key, c, conn.id().rack);
}

void WorkerProtocol::OnPull(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  LaneKey* key = table_->FindKey(t, h.key);
  if (!key) {
    Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
    return;
  }
  // A PULL held for later reserves its reply's bytes on the connection now,
  // so held PULLs pause reading and count against the connection's limit
  // like queued replies (a refused reservation means the connection is
  // failing: QUOTA_EXCEEDED).
  const size_t reply_bytes =
      net::kHeaderBytes + size_t{key->info.chunk_elements} * WireDTypeBytes(key->info.dtype);
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    // Answered once every chunk is at its key's version again (ReleaseParked).
    if (t.parked.size() >= kMaxParkedPulls) {
      Refuse(conn, WireError::kWorkerLost, "recovering: too many PULLs held; retry", h.request_id);
      return;
    }
    if (!conn.Reserve(reply_bytes)) return;
    t.parked.push_back(ParkedPull{conn.weak_from_this(), h, {}, reply_bytes});
    return;
  }
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  if (c.unsynced && c.state.initialized()) {
    SendVersionedParams(conn, c, c.unsynced->clock[ChunkTable::Member(t, conn.id())],
                        h.request_id);
    return;
  }
  if (!c.state.initialized()) {  // a from_client chunk before its INIT
    if (!conn.Reserve(reply_bytes)) return;
    c.pulls.push_back(Waiter{conn.weak_from_this(), h.request_id, reply_bytes, {}});
    return;
  }
  SendParams(conn, c, c.current_version(), h.request_id);
}

void WorkerProtocol::OnBytesSent(net::Connection& conn, size_t bytes) {
  if (LaneTenant* t = table_->FindTenant(conn.id().tenant_handle)) {
    t->metrics->bytes_out.Add(bytes);
  }
}

void WorkerProtocol::OnConnectionClosed(net::Connection& conn, const std::string& why) {
  LaneTenant* t = table_->FindTenant(conn.id().tenant_handle);
  if (!t) return;
  const uint32_t member = ChunkTable::Member(*t, conn.id());
  const auto it = t->conns.find(member);
  if (it == t->conns.end() || it->second.get() != &conn) return;  // a refused duplicate
  auto keep = it->second;
  t->conns.erase(it);
  std::shared_ptr<WorkerGeneration> gen;
  if (auto g = t->gens.find(member); g != t->gens.end()) {
    gen = std::move(g->second);
    t->gens.erase(g);
  }
  // Its queue goes with the connection, soon after this returns.
  if (conn.backlog_bytes() >= kTrimAfterBacklog) TrimMemorySoon();
  const uint32_t lane = table_->lane();
  if (lane == 0) t->info.counters->workers_connected.fetch_sub(1, std::memory_order_relaxed);
  const bool left = t->leaving.erase(member) > 0;
  // A connection closed for not reading its replies is the hub defending
  // itself: worth a warning.
  const bool over_limit = why.find("QUOTA_EXCEEDED") != std::string::npos;
  spdlog::log(over_limit ? spdlog::level::warn : spdlog::level::info,
              "data: tenant '{}' rank {} lane {} {}: {}", conn.id().tenant, conn.id().rank, lane,
              left ? "left" : "disconnected", why);
  if (gate_->closed() || host_->stopping()) {
    // (A lane that has not closed its gate yet reports itself drained when
    // it does.)
    if (gate_->closed() && table_->connection_count() == 0) host_->LaneDrained(lane);
    return;
  }
  if (t->info.consistency != Consistency::kSync) {
    // Nothing to abort: the member stops counting as the slowest here
    // (docs/consistency.md, Lost workers).
    if (!left && lane == 0) t->info.counters->workers_lost.fetch_add(1, std::memory_order_relaxed);
    UnsyncedMemberGone(*t, member);
    return;
  }
  // A clean leave aborts nothing: an update still missing this rank waits
  // for it (or a replacement) like for a rank that has not connected yet,
  // bounded by the straggler timeout. (Its contributions to unfinished
  // updates were dealt with when its generation ended at the BYE.)
  if (left) return;
  // A connection of a generation that ended already (lost on another lane,
  // said BYE there, or replaced) is no new loss: that end was handled.
  if (gen && !gen->End()) return;
  t->info.counters->workers_lost.fetch_add(1, std::memory_order_relaxed);
  const uint32_t handle = conn.id().tenant_handle;
  const std::string what =
      (table_->racks() > 1 ? "rack " + Num(conn.id().rack) + " " : std::string()) + "rank " +
      Num(conn.id().rank) + " lane " + Num(lane) + ": " + why;
  const uint64_t before = host_->WorkerLost(handle, member, what, lane);
  OnWorkerLost(handle, member, before, what);
}

void WorkerProtocol::OnWorkerLost(uint32_t handle, uint32_t member, uint64_t before_seq,
                                  const std::string& why) {
  LaneTenant* t = table_->FindTenant(handle);
  if (!t) return;
  if (auto it = t->conns.find(member);
      it != t->conns.end() && t->conn_seq[member] < before_seq) {
    auto keep = it->second;
    CountError(*t, WireError::kWorkerLost);
    keep->SendError(WireError::kWorkerLost,
                    "worker: another connection of this worker closed (" + why + ")", 0, true);
  }
  table_->FailPending(*t, WireError::kWorkerLost,
                      "worker lost: " + why + "; this iteration's partial sums were discarded");
}

const std::shared_ptr<WorkerGeneration>* WorkerProtocol::GenerationOf(LaneTenant& t,
                                                                     const net::Connection& conn) {
  const uint32_t member = ChunkTable::Member(t, conn.id());
  const auto c = t.conns.find(member);
  if (c == t.conns.end() || c->second.get() != &conn) return nullptr;
  const auto g = t.gens.find(member);
  return g == t.gens.end() ? nullptr : &g->second;
}

Verdict WorkerProtocol::RefuseEnded(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  const auto* gen = GenerationOf(t, conn);
  return Refuse(conn, WireError::kWorkerLost,
                "worker: generation " + (gen ? Num((*gen)->number) : std::string("?")) +
                    " of rank " + Num(conn.id().rank) +
                    " has ended (this process was replaced, lost a connection or said BYE); "
                    "its " + net::OpcodeName(h.opcode) + " was not counted",
                h.request_id);
}

void WorkerProtocol::EndGeneration(LaneTenant& t, uint32_t member,
                                   const std::shared_ptr<WorkerGeneration>& g,
                                   const std::string& why, bool close) {
  if (!g->End()) return;
  spdlog::info("data: tenant '{}': {}", t.info.name, why);
  host_->GenerationEnded(t.info.handle, member, g, why, close);
}

void WorkerProtocol::OnGenerationEnded(uint32_t handle, uint32_t member,
                                       const WorkerGeneration& g, const std::string& why,
                                       bool close) {
  LaneTenant* t = table_->FindTenant(handle);
  if (!t) return;
  if (close) {
    // Fatal INVALID_ARGUMENT, as for a duplicate rank: a replaced process
    // must not reconnect (it would replace its replacement in turn).
    if (auto it = t->gens.find(member); it != t->gens.end() && it->second.get() == &g) {
      auto keep = t->conns.at(member);
      CountError(*t, WireError::kInvalidArgument);
      keep->SendError(WireError::kInvalidArgument, "rank: " + why, 0, true);
    }
  }
  if (t->info.consistency != Consistency::kSync) return;  // nothing is pending
  const uint32_t workers = t->info.workers_per_rack;
  const uint32_t rack = member / workers, rank = member % workers;
  for (uint64_t id : t->pending) {
    const auto it = t->chunks.find(id);
    if (it == t->chunks.end()) continue;
    Chunk& c = *it->second;
    if (member >= c.contributors.size() || c.contributors[member].get() != &g) continue;
    const bool counted =
        c.rows ? c.rows->contributed(rank)
               : (!c.multi_rack() || c.stages[rack]) && c.Stage(rack).has_contributed(rank);
    if (!counted) continue;
    // The update can never complete with the right contributions: the
    // whole iteration is aborted and realigned (the ranks Pull and push).
    host_->AbortIteration(handle,
                          why + "; its contribution to an unfinished update was discarded",
                          false);
    return;
  }
}

bool WorkerProtocol::ContributorsLive(LaneTenant& t, Chunk& c, uint32_t rack, uint32_t workers) {
  for (uint32_t r = 0; r < workers; ++r) {
    const uint32_t member = rack * t.info.workers_per_rack + r;
    if (member >= c.contributors.size() || !c.contributors[member] ||
        c.contributors[member]->live()) {
      continue;
    }
    const std::string why = "worker: rank " + Num(r) + " generation " +
                            Num(c.contributors[member]->number) +
                            " ended while its contribution to chunk " + Num(c.index_in_key) +
                            " of key id " + Num(c.key_id) + " was pending; the partial sums "
                            "were discarded";
    host_->AbortIteration(t.info.handle, why, false);
    table_->FailPending(t, WireError::kWorkerLost, why);  // at once: this update never applies
    return false;
  }
  return true;
}

void WorkerProtocol::RefuseIteration(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                     uint64_t current, const std::string& text) {
  CountError(t, WireError::kBadIteration);
  t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
  net::ErrorFrame e =
      net::MakeErrorFrame(WireError::kBadIteration, text, t.info.handle, h.request_id, false);
  e.header.key = h.key;
  e.header.chunk = h.chunk;
  e.header.iteration = current;  // where the hub is
  conn.SendOwned(e.header, std::move(e.body));
}

void WorkerProtocol::ReleaseParked(uint32_t handle) {
  LaneTenant* t = table_->FindTenant(handle);
  if (!t || t->parked.empty()) return;
  std::vector<ParkedPull> parked;
  parked.swap(t->parked);
  for (const ParkedPull& p : parked) {
    const auto conn = p.conn.lock();
    if (!conn || !conn->open()) continue;
    conn->Unreserve(p.reserved);
    // Re-checked as if it arrived now (the key may be gone; a new recovery
    // holds it again).
    if (!table_->FindKey(*t, p.header.key)) {
      conn->SendError(WireError::kUnknownKey, "key: was deleted", p.header.request_id, false);
      continue;
    }
    if (p.header.opcode == Opcode::kPullRows) {
      ReleaseParkedRows(*conn, *t, p);
      continue;
    }
    OnPull(*conn, *t, p.header);
  }
}

void WorkerProtocol::CheckStragglers() {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::milliseconds(config_.straggler_timeout_ms);
  for (auto& [handle, t] : table_->tenants()) {
    if (t.info.consistency != Consistency::kSync) {
      CheckHeldReplies(t, now);
      continue;
    }
    // Already being recovered (another lane, or a lost worker): its pending
    // updates are failed by that recovery; no second abort.
    if (t.runtime->recovering.load(std::memory_order_acquire) > 0) continue;
    bool expired = false;
    std::string missing, absent, where;
    for (uint64_t id : t.pending) {
      const Chunk& c = *t.chunks.at(id);
      if (now - c.first_contribution <= limit) continue;
      expired = true;
      const auto key = t.keys.find(c.key_id);
      where = "key " + QuoteForLog(key != t.keys.end() ? key->second.info.name : "?") +
              " chunk " + Num(c.index_in_key) + " (update " + Num(c.current_version() + 1) + ")";
      if (c.multi_rack()) {
        missing = "of some rack";
        break;
      }
      const uint32_t workers = c.table() ? t.info.workers_per_rack : c.state.workers();
      for (uint32_t r = 0; r < workers; ++r) {
        if (c.table() ? c.rows->contributed(r) : c.state.has_contributed(r)) continue;
        if (!missing.empty()) missing += ',';
        missing += Num(r);
        // Late or gone? Clients retry a round only for a connected rank.
        const auto conn = t.conns.find(r);
        if (conn == t.conns.end() || !conn->second->open()) {
          absent += (absent.empty() ? "" : ",") + Num(r);
        }
      }
      break;
    }
    if (expired) {
      // Every lane fails its part of the iteration, then the tenant is
      // brought back to one version per key.
      host_->AbortIteration(handle, "straggler: rank(s) " + missing + " did not push within " +
                                        Num(config_.straggler_timeout_ms) +
                                        " ms (data.straggler_timeout_ms) to " + where +
                                        "; partial sums were discarded" +
                                        (absent.empty() ? std::string()
                                                        : "; rank(s) " + absent +
                                                              " not connected"),
                            true);
    }
  }
}

void WorkerProtocol::CloseTenant(LaneTenant& t, WireError code, const std::string& text) {
  const auto conns = t.conns;  // closing edits the map
  for (auto& [member, conn] : conns) {
    CountError(t, code);
    conn->SendError(code, text, 0, true);
  }
}

void WorkerProtocol::TrimMemorySoon() {
  if (trim_armed_) return;
  trim_armed_ = true;
  gate_->After(kTrimDelay, [this] {
    trim_armed_ = false;
    malloc_trim(0);
  });
}

void WorkerProtocol::CloseAll(WireError code, const std::string& text) {
  for (auto& [handle, t] : table_->tenants()) {
    table_->FailPending(t, code, text);
    CloseTenant(t, code, text);
  }
  // Nothing is delivered any more: drop the turns (and their connections).
  if (scheduler_) scheduler_->Clear();
}

}  // namespace rackhub::server
