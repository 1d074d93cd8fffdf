// WorkerProtocol: the data frames of a worker connection: PUSH (a synced
// tenant's contribution; bounded/async ones go on in unsynced_protocol.cc),
// INIT, PULL and HEARTBEAT, and the PULLs held during a recovery
// (ReleaseParked). Header checks and adoption: worker_protocol.cc.
#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/aggregation/topk.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace {

// PULLs and PULL_ROWS held per tenant and lane during a recovery, at most
// (each also reserves its reply's bytes on its connection:
// Connection::Reserve).
constexpr size_t kMaxParkedPulls = 65536;

std::string ParticipantList(const KeyInfo& k) {
  std::string text;
  for (uint32_t r : k.participants) {
    if (!text.empty()) text += ',';
    text += Num(r);
  }
  return text;
}

}  // namespace

LaneKey* WorkerProtocol::KeyOrReject(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  LaneKey* key = table_->FindKey(t, h.key);
  if (!key) Reject(conn, WireError::kTenantGone, "key: was deleted", h.request_id);
  return key;
}

WorkerProtocol::Contribution WorkerProtocol::ContributionOf(net::Connection& conn, LaneTenant& t,
                                                           const FrameHeader& h) {
  LaneKey* key = KeyOrReject(conn, t, h);
  if (!key) return {};
  const auto* gen = GenerationOf(t, conn);
  if (!gen || !(*gen)->live()) {
    RefuseEnded(conn, t, h);
    return {};
  }
  return {key, &table_->GetChunk(t, *key, h.chunk), gen};
}

bool WorkerProtocol::StillCurrent(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                  uint64_t version, bool again, const char* what) {
  const uint32_t member = ChunkTable::Member(t, conn.id());
  if (h.iteration == version &&
      (!again || t.runtime->PushFailedAt(member, conn.id().session, h.key, h.iteration)) &&
      t.runtime->recovering.load(std::memory_order_acquire) == 0) {
    return true;
  }
  // State moved while the payload was read (a recovery meanwhile).
  RefuseIteration(conn, t, h, version,
                  "iteration: " + Num(h.iteration) +
                      " is no longer current (the iteration was aborted while this push was "
                      "read); Pull the " + what + " to resynchronize");
  return false;
}

bool WorkerProtocol::AnswerCountedRetry(net::Connection& conn, LaneTenant& t, Chunk& c,
                                        const FrameHeader& h) {
  if (c.multi_rack() || c.table() || c.unsynced) return false;
  const aggregation::ChunkState& s = c.state;
  if (h.iteration + 1 != s.version() || s.updated_version() != s.version()) return false;
  if (s.has_contributed(conn.id().rank) || !FailedAfterCounted(conn, t, c, h.key, h.iteration)) {
    return false;
  }
  SendParams(conn, c, s.version(), h.request_id);
  return true;
}

bool WorkerProtocol::FailedAfterCounted(net::Connection& conn, LaneTenant& t, const Chunk& c,
                                        uint32_t key, uint64_t iteration) {
  const uint32_t member = ChunkTable::Member(t, conn.id());
  if (!t.runtime->PushFailedAt(member, conn.id().session, key, iteration)) return false;
  const auto* gen = GenerationOf(t, conn);
  return gen && (*gen)->live() && member < c.contributors.size() && c.contributors[member] == *gen;
}

bool WorkerProtocol::AnswerCountedAcrossRacks(net::Connection& conn, LaneTenant& t, Chunk& c,
                                              const FrameHeader& h) {
  const uint64_t produced = t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)].produced;
  // Only skipped since the update that produced the parameters.
  if (produced == 0 || h.iteration != c.current_version() || produced >= h.iteration) return false;
  if (c.Stage(conn.id().rack).has_contributed(conn.id().rank) ||
      !FailedAfterCounted(conn, t, c, h.key, produced - 1)) {
    return false;
  }
  SendParams(conn, c, c.current_version(), h.request_id);
  return true;
}

bool WorkerProtocol::WaitCountedAcrossRacks(net::Connection& conn, LaneTenant& t, Chunk& c,
                                            const FrameHeader& h) {
  if (!c.multi_rack() || c.elastic || c.unsynced) return false;
  if (h.iteration + 1 != c.Stage(conn.id().rack).version() || c.current_version() != h.iteration) {
    return false;
  }
  // The update is under way: pending here and no recovery (after a round
  // the stage may be ahead while a copy waits for its home's RACK_ALIGN,
  // and nothing would answer the push).
  if (t.runtime->recovering.load(std::memory_order_acquire) != 0 ||
      !t.pending.count(ChunkTable::ChunkId(c.key_id, c.index_in_key))) {
    return false;
  }
  if (!FailedAfterCounted(conn, t, c, h.key, h.iteration)) return false;
  // Bounded: the connection's counted push (its waiter stays, the client
  // dropped that ticket) and this retry; a client pushing again and again
  // parks no more.
  size_t mine = 0;
  for (const Waiter& w : c.pushes) mine += w.conn.lock().get() == &conn ? 1 : 0;
  if (mine >= 2) return false;
  c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, {}});
  return true;
}

Verdict WorkerProtocol::RefuseRecovering(net::Connection& conn, LaneTenant& t,
                                         const FrameHeader& h, const char* what) {
  t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
  return Refuse(conn, WireError::kWorkerLost,
                "recovering: the tenant's iteration in progress was aborted (" +
                    t.runtime->cause() + "); Pull the " + what + " and push the next iteration",
                h.request_id);
}

void WorkerProtocol::CountContribution(net::Connection& conn, LaneTenant& t, Chunk& c,
                                       uint32_t member,
                                       const std::shared_ptr<WorkerGeneration>& gen,
                                       const FrameHeader& h, size_t payload_bytes,
                                       std::vector<uint64_t> want) {
  c.NoteContributor(member, gen);
  t.metrics->pushes.Add(1);
  t.metrics->bytes_in.Add(payload_bytes + net::kHeaderBytes);
  // How long the update's first contributor waited for this rank.
  const auto now = std::chrono::steady_clock::now();
  table_->MarkPending(t, c, now);
  if (LatencyHistogram* late = t.metrics->rank(member)) late->Observe(now - c.first_contribution);
  c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, std::move(want)});
}

void WorkerProtocol::Pace(net::Connection& conn, LaneTenant& t, Waiter& w, size_t payload_bytes) {
  const bool was_holding = pacer_.holding(conn);
  w.intake = pacer_.Charge(conn, payload_bytes, 4 * (size_t{t.info.chunk_bytes} + net::kHeaderBytes));
  if (was_holding || !pacer_.holding(conn)) return;
  pacer_.ReleaseIfAllHeld(t.conns);
  if (!pacer_.holding(conn)) return;  // undone at once: nothing was held
  t.info.counters->intake_holds.fetch_add(1, std::memory_order_relaxed);
  ArmPacerCheck();
}

void WorkerProtocol::ArmPacerCheck() {
  if (pacer_armed_) return;
  pacer_armed_ = true;
  gate_->After(pacer_.max_hold() / 4, [this] {
    pacer_armed_ = false;
    pacer_.ReleaseStale(std::chrono::steady_clock::now());
    if (pacer_.any_holding()) ArmPacerCheck();
  });
}

void WorkerProtocol::Park(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                          std::vector<uint64_t> ids, size_t reply_bytes) {
  if (t.parked.size() >= kMaxParkedPulls) {
    Refuse(conn, WireError::kWorkerLost, "recovering: too many PULLs held; retry", h.request_id);
    return;
  }
  if (!conn.Reserve(reply_bytes)) return;
  t.parked.push_back(ParkedPull{conn.weak_from_this(), h, std::move(ids), reply_bytes});
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
  const Contribution to = ContributionOf(conn, t, h);
  if (!to.chunk) return;
  LaneKey& key = *to.key;
  Chunk& c = *to.chunk;
  aggregation::ChunkState& stage = c.Stage(conn.id().rack);
  net::SparsePayload sparse;
  const bool is_sparse = (h.flags & net::kFlagSparse) != 0;
  if (is_sparse) {
    const uint32_t n = stage.elements();
    Result<net::SparsePayload> parsed = net::ParseSparsePayload(
        payload, n, aggregation::TopKCount(key.info.topk_ratio, n), h.dtype);
    if (!parsed.ok()) {
      Refuse(conn, WireError::kInvalidArgument,
             "sparse PUSH of chunk " + Num(h.chunk) + " of key '" + key.info.name +
                 "': " + parsed.status().message() + "; nothing was applied",
             h.request_id);
      return;
    }
    sparse = *parsed;
  }
  if (c.unsynced) {
    OnUnsyncedPush(conn, t, key, c, h, payload, is_sparse ? &sparse : nullptr);
    return;
  }
  if (c.elastic && c.multi_rack() && AnswerCountedAcrossRacks(conn, t, c, h)) return;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  const bool again = stage.has_contributed(conn.id().rank);
  if (h.iteration != stage.version() &&
      (AnswerCountedRetry(conn, t, c, h) || WaitCountedAcrossRacks(conn, t, c, h))) {
    return;
  }
  if (!StillCurrent(conn, t, h, stage.version(), again, "key")) return;
  if (c.elastic && !again && !ApplyMembership(conn, t, c, h)) return;
  if (!key.info.participants.empty() && !stage.is_member(conn.id().rank)) {
    Refuse(conn, WireError::kInvalidArgument,
           "participants: rank " + Num(conn.id().rank) + " is not a participant of key '" +
               key.info.name + "' (declared for ranks " + ParticipantList(key.info) +
               "); its push of chunk " + Num(h.chunk) + " was not counted",
           h.request_id);
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
  CountContribution(conn, t, c, member, *to.gen, h, payload.size(), {});
  // Workers in step: a push that waits for the others (or, across racks,
  // for the other racks) counts against its connection's lead.
  if (result != aggregation::ChunkState::AddResult::kComplete || c.multi_rack()) {
    Pace(conn, t, c.pushes.back(), payload.size());
  }
  if (result != aggregation::ChunkState::AddResult::kComplete) return;
  if (!ContributorsLive(t, c, conn.id().rack, stage.workers())) return;
  if (c.multi_rack()) {
    stage.Update();  // the rack's sum (sum-only stage)
    exchange_->OnRackSum(t, key, c, conn.id().rack, h.iteration);
    return;
  }
  c.state.Update();
  const uint64_t v = c.state.version();
  table_->Completed(t, key, c, v);
  AnswerPushes(c, v);
}

void WorkerProtocol::OnInit(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                            std::span<const std::byte> payload) {
  LaneKey* key = KeyOrReject(conn, t, h);
  if (!key) return;
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  const bool set = c.multi_rack() ? table_->SetInitialMultiRack(*key, c, payload)
                                  : !c.state.initialized() && c.state.SetInitial(payload);
  if (!set) {
    Reject(conn, WireError::kInvalidArgument, "chunk: cannot be initialized now", h.request_id);
    return;
  }
  t.metrics->bytes_in.Add(payload.size() + net::kHeaderBytes);
  table_->CommitNew(t, c);  // values that arrive after an elastic tenant's COMMIT
  host_->ChunkInitialized(t.info.handle, key->info.id, key->info.placement.chunk_count);
  SendParams(conn, c, 0, h.request_id);
  // Several racks: the values go to the chunk's home, which passes them on
  // (and, past a recovery round, brings the chunk to its agreed version).
  if (c.multi_rack()) exchange_->OnInitialized(t, *key, c, conn.id().rack);
  if (!c.AwaitsAlign(table_->self_rack(), key->runtime->floor.load(std::memory_order_acquire))) {
    AnswerPulls(c, c.current_version());
  }
}

void WorkerProtocol::OnPull(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  LaneKey* key = KeyOrReject(conn, t, h);
  if (!key) return;
  // A PULL held for later reserves its reply's bytes on the connection now,
  // so held PULLs pause reading and count against the connection's limit
  // like queued replies (a refused reservation means the connection is
  // failing: QUOTA_EXCEEDED).
  const size_t reply_bytes =
      net::kHeaderBytes + size_t{key->info.chunk_elements} * WireDTypeBytes(key->info.dtype);
  if (Holding(t)) {
    // Answered once every chunk is at its key's version again, or the
    // elastic tenant resumes (ReleaseParked).
    Park(conn, t, h, {}, reply_bytes);
    return;
  }
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  if (c.unsynced && c.state.initialized()) {
    SendVersionedParams(conn, c, c.unsynced->clock[ChunkTable::Member(t, conn.id())],
                        h.request_id);
    return;
  }
  // A from_client chunk before its INIT, or (several racks) one whose
  // home's values after a recovery round are on their way (RACK_ALIGN).
  if (!c.state.initialized() ||
      c.AwaitsAlign(table_->self_rack(), key->runtime->floor.load(std::memory_order_acquire))) {
    if (!conn.Reserve(reply_bytes)) return;
    if (table_->RelayedWorker(conn.id())) DropExpiredRelayedPulls(*key, c);
    c.pulls.push_back(Waiter{conn.weak_from_this(), h.request_id, reply_bytes, {},
                             std::chrono::steady_clock::now()});
    return;
  }
  SendParams(conn, c, c.current_version(), h.request_id);
}

void WorkerProtocol::DropExpiredRelayedPulls(const LaneKey& key, Chunk& c) {
  const auto now = std::chrono::steady_clock::now();
  const size_t before = c.pulls.size();
  std::erase_if(c.pulls, [&](const Waiter& w) {
    const auto wc = w.conn.lock();
    if (wc && !(table_->RelayedWorker(wc->id()) && now - w.since >= exchange_->relay_deadline())) {
      return false;
    }
    if (wc) wc->Unreserve(w.reserved);
    return true;
  });
  if (c.pulls.size() < before) {
    spdlog::info("data: lane {}: dropped {} relayed PULL(s) of key {} chunk {} waiting for "
                 "initial values past the relay deadline (their hubs gave up on them)",
                 table_->lane(), before - c.pulls.size(), QuoteForLog(key.info.name),
                 c.index_in_key);
  }
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

}  // namespace rackhub::server
