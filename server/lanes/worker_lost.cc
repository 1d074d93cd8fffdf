// WorkerProtocol: the end of worker connections: a connection closed, a
// worker lost on any lane, worker generations ending (docs/durability.md),
// stragglers, closing a tenant's or every connection, and handing freed
// memory back after a big release. Adoption and header checks:
// worker_protocol.cc.
#include <malloc.h>

#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace {

// A connection closing with at least this much queued is a big release.
constexpr size_t kTrimAfterBacklog = 1u << 20;
constexpr auto kTrimDelay = std::chrono::milliseconds(500);

}  // namespace

void WorkerProtocol::OnConnectionClosed(net::Connection& conn, const std::string& why) {
  pacer_.Forget(conn);
  LaneTenant* t = table_->FindTenant(conn.id().tenant_handle);
  if (!t) return;
  const uint32_t member = ChunkTable::Member(*t, conn.id());
  const auto it = t->conns.find(member);
  if (it == t->conns.end() || it->second.get() != &conn) return;  // a refused duplicate
  auto keep = it->second;
  t->conns.erase(it);
  pacer_.ReleaseIfAllHeld(t->conns);  // the one they waited for may be this one
  std::shared_ptr<WorkerGeneration> gen;
  if (auto g = t->gens.find(member); g != t->gens.end()) {
    gen = std::move(g->second);
    t->gens.erase(g);
  }
  if (gen && t->info.elastic) gen->lanes.fetch_sub(1, std::memory_order_acq_rel);
  // Its queue goes with the connection, soon after this returns.
  if (conn.backlog_bytes() >= kTrimAfterBacklog) TrimMemorySoon();
  const uint32_t lane = table_->lane();
  // (Counted on lane 0 of its own rack's hub only.)
  const bool counted = lane == 0 && !table_->RelayedWorker(conn.id());
  if (counted) t->info.counters->workers_connected.fetch_sub(1, std::memory_order_relaxed);
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
    if (!left && counted) t->info.counters->workers_lost.fetch_add(1, std::memory_order_relaxed);
    UnsyncedMemberGone(*t, member);
    // Across racks: the homes it was relayed to hear it too.
    if (table_->exchange()) exchange_->RelayMemberGone(*t, member, conn);
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
    t->CountError(WireError::kWorkerLost);
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
  // An elastic tenant's membership loses it at once (docs/elastic.md).
  if (t.info.elastic) host_->MembershipChanged(t.info.handle, why);
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
      t->CountError(WireError::kInvalidArgument);
      keep->SendError(WireError::kInvalidArgument, "rank: " + why, 0, true);
    }
  }
  if (t->info.consistency != Consistency::kSync) return;  // nothing is pending
  const uint32_t workers = t->info.rank_slots();
  const uint32_t rack = member / workers, rank = member % workers;
  for (uint64_t id : t->pending) {
    const auto it = t->chunks.find(id);
    if (it == t->chunks.end()) continue;
    Chunk& c = *it->second;
    if (member >= c.contributors.size() || c.contributors[member].get() != &g) continue;
    const bool counted =
        c.rows ? c.RowContributed(rack, rank)
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
    const uint32_t member = rack * t.info.rank_slots() + r;
    if (member >= c.contributors.size() || !c.contributors[member] ||
        c.contributors[member]->live()) {
      continue;
    }
    // Only this update's contributors (an elastic tenant's non-members keep
    // the generation of an older update here).
    if (!(c.rows ? c.RowContributed(rack, r) : c.Stage(rack).has_contributed(r))) continue;
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
      const bool across = c.multi_rack() || c.rows_across_racks();
      const auto key = t.keys.find(c.key_id);
      where = "key " + QuoteForLog(key != t.keys.end() ? key->second.info.name : "?") +
              " chunk " + Num(c.index_in_key) + " (update " + Num(c.current_version() + 1) + ")";
      if (t.info.elastic) {
        // Removed from the membership at once, the iteration aborted
        // (across racks: this rack's stragglers; another rack's hub
        // removes its own).
        const std::string why = "did not push " + where + " within " +
                                Num(config_.straggler_timeout_ms) +
                                " ms (data.straggler_timeout_ms)";
        const bool removed = RemoveStragglers(t, *t.chunks.at(id), why);
        // Across racks, with this rack's sum in (or no member here): the hub
        // of the rack with the straggler removes it (a round follows); no
        // abort here. Bounded: a sum that never comes (dropped, or a peer
        // that never removes its straggler) ends after twice the timeout.
        if (!removed && across && now - c.first_contribution <= 2 * limit) continue;
        host_->AbortIteration(handle,
                              removed || !across ? "straggler: " + why + "; partial sums were discarded"
                                      : "straggler: another rack's sum for " + where +
                                            " did not come within twice the " +
                                            Num(config_.straggler_timeout_ms) +
                                            " ms (data.straggler_timeout_ms); partial sums "
                                            "were discarded",
                              true);
        break;
      }
      expired = true;
      if (across) {
        missing = "of some rack";
        break;
      }
      const uint32_t workers = c.table() ? t.info.workers_per_rack : c.state.workers();
      for (uint32_t r = 0; r < workers; ++r) {
        if (c.table() ? c.rows->contributed(r) : c.state.has_contributed(r)) continue;
        if (!c.table() && !c.state.is_member(r)) continue;  // not a participant of the key
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
    t.CountError(code);
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
