// ChunkTable: the commit copies of an elastic tenant with hub optimizers
// (docs/elastic.md, "Hub optimizers"; COMMIT and ROLLBACK, wire-protocol.md
// section 6e). COMMIT copies each chunk whose key runs an optimizer on the
// hub (not SUM_ONLY; dense, one rack) when its copy is not at its version;
// ROLLBACK puts every chunk whose version moved since back to its copy.
// Both are idempotent: every member sends them alike and only the first
// that finds a chunk elsewhere than its copy does any work.
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "chunk_table.h"

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

}  // namespace

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

uint32_t ChunkTable::Rollback(LaneTenant& t, const std::string& why) {
  std::vector<std::pair<Chunk*, const CommitCopy*>> moved;
  bool pending = false;
  for (auto& [id, copy] : t.commits) {
    const auto it = t.chunks.find(id);
    if (it == t.chunks.end()) continue;
    Chunk& c = *it->second;
    if (c.state.version() == copy.version && c.state.contributions() == 0) continue;
    pending = pending || c.state.contributions() != 0;
    moved.emplace_back(&c, &copy);
  }
  if (moved.empty()) return 0;
  // Contributions to an update past the commit: their pushes fail (the
  // ranks Pull and push again) before the chunks move back.
  if (pending) FailPending(t, net::WireError::kWorkerLost, why);
  // A checkpoint being copied would mix versions before and after this.
  for (auto& [id, job] : t.armed) job->Fail("the tenant was rolled back meanwhile", true);
  t.armed.clear();
  uint32_t rolled = 0;
  for (auto [c, copy] : moved) {
    const std::span<const float> state[2] = {copy->state[0], copy->state[1]};
    const size_t slots = static_cast<size_t>(c->state.state_slots());
    if (!c->state.Restore(copy->version, copy->params, std::span(state, slots))) {
      spdlog::error(
          "data: tenant '{}' lane {}: key id {} chunk {}: the commit copy does not fit "
          "the chunk; left at version {}",
          t.info.name, lane_, c->key_id, c->index_in_key, c->state.version());
      continue;
    }
    c->done_generation = copy->done_generation;
    c->done_members = copy->done_members;
    ++rolled;
    if (c->index_in_key != 0) continue;
    if (auto k = t.keys.find(c->key_id); k != t.keys.end()) {
      k->second.runtime->floor.store(copy->version, std::memory_order_release);
      k->second.runtime->version.store(copy->version, std::memory_order_relaxed);
    }
  }
  spdlog::info("data: elastic tenant '{}' lane {}: {} chunk(s) rolled back to commit {}",
               t.info.name, lane_, rolled, t.commit_number);
  return rolled;
}

}  // namespace rackhub::server
