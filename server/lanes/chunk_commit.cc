// ChunkTable: the commit copies of an elastic tenant with hub optimizers
// (docs/elastic.md, "Hub optimizers"; COMMIT and ROLLBACK, wire-protocol.md
// section 6e). COMMIT copies each chunk whose key runs an optimizer on the
// hub (not SUM_ONLY; dense, one rack) when its copy is not at its version;
// ROLLBACK puts every such chunk whose version moved since (or with
// contributions pending) back to its copy, or refuses by name. A chunk that
// gets its values after the last COMMIT (created for a zeros key, a
// from_client key's INIT) is copied then (CommitNew): at the commit it had
// no update yet, so a rollback returns it to its initial values, and no
// lane refuses a rollback that another lane carried out.
// Both are idempotent: every member sends them alike and only the first
// that finds a chunk elsewhere than its copy does any work.
#include <spdlog/spdlog.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chunk_table.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"

namespace rackhub::server {

namespace {

bool HubOptimized(const Chunk& c) {
  return !c.table() && !c.multi_rack() && !c.unsynced && c.state.initialized() &&
         c.state.optimizer().type != aggregation::OptimizerType::kSumOnly;
}

void Take(const Chunk& c, CommitCopy& copy) {
  const aggregation::ChunkState& s = c.state;
  const auto params = s.params(s.version());
  copy.params.assign(params.begin(), params.end());
  for (int slot = 0; slot < 2; ++slot) {
    const auto state = s.optimizer_state(slot);
    copy.state[slot].assign(state.begin(), state.end());
  }
  copy.version = s.version();
  copy.done_generation = c.done_generation;
  copy.done_members = c.done_members;
}

// The copy restores the chunk: as many elements and optimizer state slots.
bool Fits(const aggregation::ChunkState& s, const CommitCopy& copy) {
  if (copy.params.size() != s.elements()) return false;
  for (int slot = 0; slot < s.state_slots(); ++slot) {
    if (slot >= 2 || copy.state[slot].size() != s.elements()) return false;
  }
  return true;
}

}  // namespace

void ChunkTable::CommitNew(LaneTenant& t, const Chunk& c) {
  if (!t.committed || !HubOptimized(c)) return;
  const auto [it, fresh] = t.commits.try_emplace(ChunkId(c.key_id, c.index_in_key));
  if (fresh) Take(c, it->second);
}

uint32_t ChunkTable::Commit(LaneTenant& t, uint64_t number) {
  uint32_t copied = 0;
  for (auto& [id, c] : t.chunks) {
    if (!HubOptimized(*c)) continue;
    auto [it, fresh] = t.commits.try_emplace(id);
    if (!fresh && it->second.version == c->state.version()) continue;
    Take(*c, it->second);
    ++copied;
  }
  t.commit_number = number;
  t.committed = true;
  return copied;
}

std::string ChunkTable::Rollback(LaneTenant& t, const std::string& why) {
  // Every chunk checked first: nothing changes when one is refused.
  std::vector<std::pair<Chunk*, const CommitCopy*>> moved;
  for (auto& [id, cp] : t.chunks) {
    Chunk& c = *cp;
    if (!HubOptimized(c)) continue;
    const auto it = t.commits.find(id);
    const CommitCopy* copy = it == t.commits.end() ? nullptr : &it->second;
    if (copy && c.state.version() == copy->version && c.state.contributions() == 0) continue;
    if (!copy || !Fits(c.state, *copy)) {
      const LaneKey* key = FindKey(t, c.key_id);
      return "rollback: key " + (key ? QuoteForLog(key->info.name) : "id " + Num(c.key_id)) +
             " chunk " + Num(c.index_in_key) + " of elastic tenant " + QuoteForLog(t.info.name) +
             (copy ? " no longer fits its copy of commit " + Num(t.commit_number) +
                         " (its optimizer's state changed since)"
                   : " has no copy of commit " + Num(t.commit_number) +
                         " (its optimizer ran on the hub only after that COMMIT)") +
             " on lane " + Num(lane_) + "; nothing was rolled back on this lane (other lanes " +
             "may have rolled back: pull every key before training on)";
    }
    moved.emplace_back(&c, copy);
  }
  if (moved.empty()) return {};
  FailArmed(t, "the tenant was rolled back meanwhile");
  for (auto [c, copy] : moved) {
    // Contributions to the update past the commit: their pushes fail (with
    // `why`: the ranks restore the commit too, docs/elastic.md).
    if (c->state.contributions() != 0) FailChunk(t, *c, net::WireError::kWorkerLost, why);
    const std::span<const float> state[2] = {copy->state[0], copy->state[1]};
    const size_t slots = static_cast<size_t>(c->state.state_slots());
    c->state.Restore(copy->version, copy->params, std::span(state, slots));  // fits: checked
    c->done_generation = copy->done_generation;
    c->done_members = copy->done_members;
    LaneKey* key = FindKey(t, c->key_id);
    if (!key) continue;
    Restored(t, *key, *c);
    if (c->index_in_key == 0) key->runtime->floor.store(copy->version, std::memory_order_release);
  }
  spdlog::info("data: elastic tenant '{}' lane {}: {} chunk(s) rolled back to commit {}",
               t.info.name, lane_, moved.size(), t.commit_number);
  return {};
}

}  // namespace rackhub::server
