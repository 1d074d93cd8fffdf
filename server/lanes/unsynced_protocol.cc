// WorkerProtocol, part 4: PUSH and the held replies of bounded and async
// tenants (docs/consistency.md). Each contribution is applied to the chunk
// as it arrives (ChunkState::ApplyAlone); a worker's own iteration count on
// the chunk (UnsyncedClocks::clock) is what its PUSH names and its reply
// carries. A reply that would put its worker more than `staleness`
// iterations ahead of the slowest member connected to this lane waits in
// Chunk::pushes until the slowest catches up, the slowest leaves, or the
// straggler timeout fails it.
#include <algorithm>

#include "params_reply.h"
#include "rackhub/common/number.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace {

// The largest iteration count a reply may carry when the slowest member
// is at `slowest`.
uint64_t Allowed(const LaneTenant& t, uint64_t slowest) {
  if (t.info.consistency == Consistency::kAsync || slowest == UINT64_MAX) return UINT64_MAX;
  const uint64_t s = t.info.staleness;
  return slowest > UINT64_MAX - s ? UINT64_MAX : slowest + s;
}

}  // namespace

Verdict WorkerProtocol::CheckUnsyncedPush(net::Connection& conn, LaneTenant& t, const KeyInfo& k,
                                          Chunk& c, const FrameHeader& h) {
  if (!c.state.initialized()) {
    if (table_->RelayedWorker(conn.id())) {
      // Another rack's worker: this home may have restarted without state
      // (no other hub keeps the chunk). Non-fatal: its connection on its
      // own hub stays; rank 0 of rack 0 INITs the key again
      // (docs/consistency.md, Across racks).
      return Refuse(conn, WireError::kNotReady,
                    "key: '" + k.name + "' has no initial values at chunk " + Num(h.chunk) +
                        "'s home, rack " + Num(table_->self_rack()) + "'s hub (rank 0 of " +
                        "rack 0 must INIT it, again if that hub restarted without state)",
                    h.request_id);
    }
    return Reject(conn, WireError::kNotReady,
                  "key: '" + k.name + "' has no initial values yet (rank 0 must INIT it first)",
                  h.request_id);
  }
  const uint64_t clock = c.unsynced->clock[ChunkTable::Member(t, conn.id())];
  if (h.iteration == clock || h.iteration + 1 == clock) return Verdict::kAccept;
  RefuseIteration(conn, t, h, clock,
                  "iteration: " + Num(h.iteration) + " for chunk " + Num(h.chunk) + " of key '" +
                      k.name + "', this worker's next iteration there is " + Num(clock) +
                      (h.iteration < clock ? " (stale)" : " (ahead)") +
                      "; Pull the key to resynchronize");
  return Verdict::kDiscard;
}

void WorkerProtocol::OnUnsyncedPush(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
                                    const FrameHeader& h, std::span<const std::byte> payload,
                                    const net::SparsePayload* sparse) {
  UnsyncedClocks& u = *c.unsynced;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  uint64_t& clock = u.clock[member];
  if (h.iteration != clock && h.iteration + 1 != clock) {
    RefuseIteration(conn, t, h, clock,
                    "iteration: " + Num(h.iteration) + " is no longer this worker's next on chunk " +
                        Num(h.chunk) + " of key '" + key.info.name + "' (" + Num(clock) +
                        "); Pull the key to resynchronize");
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (h.iteration == clock) {
    const bool ok = sparse ? c.state.ApplyAloneSparse({sparse->count, sparse->indices,
                                                       sparse->values})
                           : c.state.ApplyAlone(payload);
    if (!ok) {
      Reject(conn, WireError::kInternal, "chunk: contribution refused", h.request_id);
      return;
    }
    ++clock;
    t.metrics->pushes.Add(1);
    t.metrics->bytes_in.Add(payload.size() + net::kHeaderBytes);
    if (c.index_in_key == 0) {
      t.info.counters->iterations_completed.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // (A retry of an applied push is answered like the push was.)
  u.gone[member] = 0;
  if (c.pushes.empty()) {
    c.first_contribution = now;
    t.pending.insert(ChunkTable::ChunkId(c.key_id, c.index_in_key));
  }
  c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, {}});
  u.held.push_back(clock);
  u.held_since.push_back(now);
  ReleaseHeld(t, c);
}

void WorkerProtocol::ReleaseHeld(LaneTenant& t, Chunk& c) {
  UnsyncedClocks& u = *c.unsynced;
  const uint64_t allowed = Allowed(t, u.Slowest());
  size_t kept = 0;
  for (size_t i = 0; i < c.pushes.size(); ++i) {
    const auto conn = c.pushes[i].conn.lock();
    if (!conn || !conn->open()) continue;  // its worker is gone: dropped
    if (u.held[i] <= allowed) {
      SendVersionedParams(*conn, c, u.held[i], c.pushes[i].request_id);
      continue;
    }
    if (kept != i) {
      c.pushes[kept] = std::move(c.pushes[i]);
      u.held[kept] = u.held[i];
      u.held_since[kept] = u.held_since[i];
    }
    ++kept;
  }
  c.pushes.resize(kept);
  u.held.resize(kept);
  u.held_since.resize(kept);
  if (kept == 0) {
    t.pending.erase(ChunkTable::ChunkId(c.key_id, c.index_in_key));
  } else {
    c.first_contribution = *std::min_element(u.held_since.begin(), u.held_since.end());
  }
}

void WorkerProtocol::UnsyncedMemberGone(LaneTenant& t, uint32_t member) {
  for (auto& [id, c] : t.chunks) {
    if (!c->unsynced || member >= c->unsynced->gone.size()) continue;
    c->unsynced->gone[member] = 1;
    ReleaseHeld(t, *c);
  }
}

void WorkerProtocol::UnsyncedMemberBack(LaneTenant& t, uint32_t member) {
  for (auto& [id, c] : t.chunks) {
    UnsyncedClocks* u = c->unsynced.get();
    if (!u || member >= u->gone.size() || !u->gone[member]) continue;
    // Brought forward to the slowest of the others: the iterations it
    // missed are not waited for.
    const uint64_t others = u->Slowest();
    if (others != UINT64_MAX) u->clock[member] = std::max(u->clock[member], others);
    u->gone[member] = 0;
  }
}

void WorkerProtocol::CheckHeldReplies(LaneTenant& t, std::chrono::steady_clock::time_point now) {
  const auto limit = std::chrono::milliseconds(config_.straggler_timeout_ms);
  std::vector<uint64_t> ids(t.pending.begin(), t.pending.end());
  for (uint64_t id : ids) {
    const auto it = t.chunks.find(id);
    if (it == t.chunks.end() || !it->second->unsynced) continue;
    Chunk& c = *it->second;
    UnsyncedClocks& u = *c.unsynced;
    if (now - c.first_contribution <= limit) continue;
    for (size_t i = 0; i < c.pushes.size(); ++i) {
      if (now - u.held_since[i] <= limit) continue;
      const auto conn = c.pushes[i].conn.lock();
      if (!conn || !conn->open()) continue;
      std::string behind;
      for (uint32_t m = 0; m < u.clock.size(); ++m) {
        if (u.gone[m] || u.clock[m] + t.info.staleness >= u.held[i]) continue;
        const uint32_t slots = t.info.rank_slots();
        behind += (behind.empty() ? "" : ", ") +
                  (table_->racks() > 1 ? "rack " + Num(m / slots) + " " : std::string()) +
                  "rank " + Num(m % slots) + " at " + Num(u.clock[m]);
      }
      const auto key = t.keys.find(c.key_id);
      const std::string text =
          "straggler: this worker's reply for iteration " + Num(u.held[i]) + " of key '" +
          (key != t.keys.end() ? key->second.info.name : "?") + "' chunk " +
          Num(c.index_in_key) + " was held " + Num(config_.straggler_timeout_ms) +
          " ms (data.straggler_timeout_ms) by the staleness bound (" +
          ConsistencyName(t.info.consistency, t.info.staleness) + "), waiting for " +
          (behind.empty() ? std::string("slower ranks") : behind) +
          "; its contribution was applied: Pull the key and push the next iteration";
      t.CountError(WireError::kWorkerLost);
      conn->SendError(WireError::kWorkerLost, text, c.pushes[i].request_id, false);
      c.pushes[i].conn.reset();  // ReleaseHeld drops it
    }
    t.info.counters->stragglers.fetch_add(1, std::memory_order_relaxed);
    ReleaseHeld(t, c);
  }
}

}  // namespace rackhub::server
