#include "chunk_table.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "element_type.h"
#include "params_reply.h"
#include "rows_reply.h"
#include "rackhub/aggregation/kernels.h"

namespace rackhub::server {

using net::WireError;

namespace {

// A rack's stage: sums its workers' pushes, or for a key reducing element-wise
// (min, max, product) reduces them with that operation (the home then
// reduces the rack results alike, in rack order).
aggregation::OptimizerConfig RackStage(aggregation::Reduction key_reduction) {
  aggregation::OptimizerConfig c;
  c.type = aggregation::OptimizerType::kSumOnly;
  c.learning_rate = 0;
  c.reduction = aggregation::IsElementwiseReduction(key_reduction) ? key_reduction
                                                                    : aggregation::Reduction::kSum;
  return c;
}

}  // namespace

// key_memory.h counts this much per chunk besides its buffers.
static_assert(sizeof(Chunk) + 256 <= kChunkBookkeepingBytes);

MemoryCharge::MemoryCharge(std::shared_ptr<TenantCounters> counters, uint64_t bytes)
    : counters_(std::move(counters)), bytes_(bytes) {
  if (counters_) counters_->memory_bytes_allocated.fetch_add(bytes_, std::memory_order_relaxed);
}

MemoryCharge& MemoryCharge::operator=(MemoryCharge&& other) noexcept {
  if (this != &other) {
    Release();
    counters_ = std::move(other.counters_);
    bytes_ = other.bytes_;
    other.bytes_ = 0;
  }
  return *this;
}

void MemoryCharge::Release() {
  if (counters_) counters_->memory_bytes_allocated.fetch_sub(bytes_, std::memory_order_relaxed);
  counters_.reset();
  bytes_ = 0;
}

ChunkTable::ChunkTable(uint32_t lane, uint32_t lanes, const TopologyConfig& topology,
                       Registry* registry, LaneHost* host)
    : lane_(lane),
      lanes_(lanes),
      racks_(topology.rack_count()),
      exchange_(topology.multi_rack_exchange()),
      self_rack_(topology.rack),
      memory_model_(MemoryModel::Of(topology)),
      registry_(registry),
      host_(host) {}

LaneTenant* ChunkTable::FindTenant(uint32_t handle) {
  const auto it = tenants_.find(handle);
  return it == tenants_.end() ? nullptr : &it->second;
}

LaneTenant* ChunkTable::LoadTenant(uint32_t handle) {
  if (LaneTenant* t = FindTenant(handle)) return t;
  TenantInfo info;
  if (!registry_->GetTenantByHandle(handle, &info).ok()) return nullptr;
  LaneTenant& t = tenants_[handle];
  t.info = std::move(info);
  t.metrics = &t.info.counters->lanes.ForLane(lane_);
  t.runtime = host_->TenantRuntimeFor(handle);
  return &t;
}

void ChunkTable::EnsureTenant(const TenantInfo& info) {
  if (FindTenant(info.handle)) return;
  LaneTenant& t = tenants_[info.handle];
  t.info = info;
  t.metrics = &t.info.counters->lanes.ForLane(lane_);
  t.runtime = host_->TenantRuntimeFor(info.handle);
}

LaneKey* ChunkTable::FindKey(LaneTenant& t, uint32_t key_id) {
  if (auto it = t.keys.find(key_id); it != t.keys.end()) return &it->second;
  KeyInfo info;
  if (!registry_->GetKeyById(t.info.handle, key_id, &info).ok()) return nullptr;
  LaneKey& k = t.keys[key_id];
  k.info = std::move(info);
  k.runtime = host_->KeyRuntimeFor(t.info.handle, key_id);
  return &k;
}

Chunk& ChunkTable::GetChunk(LaneTenant& t, LaneKey& key, uint32_t chunk) {
  auto& slot = t.chunks[ChunkId(key.info.id, chunk)];
  if (!slot && key.info.table()) {
    slot = NewTableChunk(t, key, chunk);
  } else if (!slot) {
    const uint32_t n = ChunkElements(key.info, chunk);
    // Created with the optimizer schedule the key's other chunks follow, so
    // a change announced for a later update applies here at the same update.
    const OptimizerSchedule& sched = key.info.schedule;
    slot = std::make_unique<Chunk>(
        aggregation::ChunkState(n, t.info.rank_slots(), sched.base,
                                ElementTypeOf(key.info.dtype)),
        key.info.id, chunk, static_cast<net::DType>(static_cast<uint8_t>(key.info.dtype)));
    if (sched.from_update != 0) slot->state.SetOptimizer(sched.latest, sched.from_update);
    if (key.info.init == InitMode::kZeros) slot->state.MarkInitialized();
    // Within the key's reservation (Registry::CreateKey checked the quota).
    slot->charge = MemoryCharge(
        t.info.counters, ChunkMemoryBytes(n, t.info.rank_slots(), sched.base.type,
                                          ElementTypeOf(key.info.dtype), memory_model_));
    if (!key.info.participants.empty()) {
      // A participant set (Registry::CreateKey checked it: single rack, sync,
      // ranks < workers): every update sums exactly these ranks.
      std::vector<uint8_t> member(t.info.rank_slots(), 0);
      for (uint32_t r : key.info.participants) {
        if (r < member.size()) member[r] = 1;
      }
      slot->state.SetMembers(member);
    }
    slot->sparse_replies = key.info.topk_ratio > 0;
    slot->elastic = t.info.elastic;
    if (t.info.consistency != Consistency::kSync) {
      // Across racks one chunk serves every rack's workers (at its home;
      // rack_relay.cc brings the other racks' frames there): members
      // rack * rank_slots + rank, the mean over all of them.
      const uint32_t members = t.info.rank_slots() * racks_;
      slot->unsynced = std::make_unique<UnsyncedClocks>(members);
      for (uint32_t m = 0; m < members; ++m) {
        const auto it = t.conns.find(m);
        slot->unsynced->gone[m] = it == t.conns.end() || !it->second->open();
      }
      if (racks_ > 1) {
        slot->state.set_mean_divisor(members);
        slot->home = HomeRack(key.info, chunk);
      }
    }
    if (racks_ > 1 && !slot->unsynced) {
      InitMultiRackChunk(t, key, *slot, chunk);
    } else if (const uint64_t floor = key.runtime->floor.load(std::memory_order_acquire);
               floor > 0 && racks_ == 1) {
      // The key's other chunks were aligned or restored to `floor`.
      slot->state.SkipTo(floor);
    }
    CommitNew(t, *slot);  // an elastic tenant's chunk created after a COMMIT
    if (slot->multi_rack() && new_chunk_hook_) new_chunk_hook_(t, key, *slot);
  }
  return *slot;
}

std::unique_ptr<Chunk> ChunkTable::NewTableChunk(LaneTenant& t, LaneKey& key, uint32_t chunk) {
  const KeyInfo& k = key.info;
  const uint64_t per = k.rows_per_chunk();
  const uint64_t first = uint64_t{chunk} * per;
  const uint64_t n = std::min<uint64_t>(per, k.rows - first);
  const OptimizerSchedule& sched = k.schedule;
  auto c = std::make_unique<Chunk>(
      aggregation::ChunkState(1, 1, RackStage(aggregation::Reduction::kSum),
                              aggregation::ElementType::kFp32),
      k.id, chunk,
      static_cast<net::DType>(static_cast<uint8_t>(k.dtype)));
  // Across racks the shard's contributors are the racks' row sums
  // (rack_rows.cc); the mean is over every rack's workers.
  c->rows = std::make_unique<aggregation::RowShard>(
      first, n, k.dim, racks_ > 1 ? racks_ : t.info.workers_per_rack, sched.base);
  if (racks_ > 1) {
    c->rows->set_mean_divisor(racks_ * t.info.workers_per_rack);
    c->home = HomeRack(k, chunk);
    c->row_stages = std::make_unique<Chunk::RackRowStages>();
    c->row_stages->by_rack.resize(racks_);
    c->row_stages->taken_for.assign(racks_, 0);
    for (uint32_t r = 0; r < racks_; ++r) {
      if (exchange_ && r != self_rack_) continue;  // that rack's workers use their own hub
      c->row_stages->by_rack[r] =
          std::make_unique<aggregation::RowSums>(t.info.workers_per_rack, k.dim);
    }
  }
  if (k.init == InitMode::kRandom) c->rows->InitRandom(k.init_seed, k.init_scale);
  if (sched.from_update != 0) c->rows->SetOptimizer(sched.latest, sched.from_update);
  const uint64_t floor = key.runtime->floor.load(std::memory_order_acquire);
  // The key's other chunks were aligned or restored there; across racks a
  // range homed elsewhere waits for its home's rows instead (its initial
  // rows are not the home's: Chunk::AwaitsAlign).
  if (floor > 0 && !(exchange_ && c->row_stages && c->home != self_rack_)) {
    c->rows->set_version(floor);
  }
  c->charge = MemoryCharge(t.info.counters, TableMemoryBytes(n, k.dim, 1, sched.base.type));
  return c;
}

// A tenant spans R racks with W workers each. Chunk g (tenant-wide index)
// has its home at rack (g / lanes) % R. Each hub sums its own rack's W
// pushes in rank order (a sum-only stage per rack served here); the home
// adds the rack sums in rack order (`state`, fp32 inputs) and applies the
// optimizer with mean = sum / (R * W). A min/max/product key reduces with
// its operation in both stages instead of adding. In flat mode one hub serves every
// rack and is every chunk's home: the same additions in the same order.
void ChunkTable::InitMultiRackChunk(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t chunk) {
  c.home = HomeRack(key.info, chunk);
  const bool from_client = key.info.init == InitMode::kFromClient;
  const uint32_t n = c.state.elements();
  c.stages.resize(racks_);
  for (uint32_t r = 0; r < racks_; ++r) {
    if (exchange_ && r != self_rack_) continue;  // that rack's workers use their own hub
    c.stages[r] = std::make_unique<aggregation::ChunkState>(
        n, t.info.rank_slots(), RackStage(key.info.schedule.base.reduction),
        ElementTypeOf(key.info.dtype));
    // A from_client key's stages wait for its initial values
    // (SetInitialMultiRack): a push before them is NOT_READY, as on one hub.
    if (!from_client) c.stages[r]->MarkInitialized();
  }
  const OptimizerSchedule& sched = key.info.schedule;
  c.state = aggregation::ChunkState(n, racks_, sched.base, aggregation::ElementType::kFp32);
  if (sched.from_update != 0) c.state.SetOptimizer(sched.latest, sched.from_update);
  c.state.set_mean_divisor(racks_ * t.info.workers_per_rack);
  if (!from_client) c.state.MarkInitialized();
  const size_t wire_bytes = size_t{n} * WireDTypeBytes(key.info.dtype);
  c.replies[0] = aggregation::SharedAlignedBuffer<std::byte>(wire_bytes);  // version 0: zeros
  c.replies[1] = aggregation::SharedAlignedBuffer<std::byte>(wire_bytes);
}

bool ChunkTable::SetInitialMultiRack(const LaneKey& key, Chunk& c,
                                     std::span<const std::byte> payload) {
  const uint32_t n = c.state.elements();
  const auto type = ElementTypeOf(key.info.dtype);
  if (!c.multi_rack() || c.state.initialized() || payload.size() != c.replies[0].size()) {
    return false;
  }
  std::vector<float> values(n);
  aggregation::CopyIn(values.data(), payload.data(), n, type);
  if (!c.state.SetInitial(std::span<const float>(values))) return false;
  for (auto& stage : c.stages) {
    if (stage) stage->MarkInitialized();
  }
  c.replies[0].PrepareOverwrite();
  aggregation::CopyOut(c.replies[0].data(), c.state.params(0).data(), n, type);
  return true;
}

void ChunkTable::MarkPending(LaneTenant& t, Chunk& c, std::chrono::steady_clock::time_point now) {
  // Several racks: the first of the update's contributions (a local push or
  // another rack's sum) starts it; later stages do not restart the clock.
  if (t.pending.insert(ChunkId(c.key_id, c.index_in_key)).second) c.first_contribution = now;
}

void ChunkTable::Completed(LaneTenant& t, LaneKey& key, Chunk& c, uint64_t v) {
  t.pending.erase(ChunkId(c.key_id, c.index_in_key));
  if (c.elastic) {
    ElasticForming& forming = t.forming[ChunkId(c.key_id, c.index_in_key)];
    c.done_generation = static_cast<uint32_t>(forming.generation);
    c.done_members = forming.total;
    forming.produced = v;
  }
  t.metrics->update_latency.Observe(std::chrono::steady_clock::now() - c.first_contribution);
  if (!t.armed.empty()) Capture(t, c);
  if (c.index_in_key == 0) {
    key.runtime->version.store(v, std::memory_order_relaxed);
    t.info.counters->iterations_completed.fetch_add(1, std::memory_order_relaxed);
  }
}

void ChunkTable::FailChunk(LaneTenant& t, Chunk& c, WireError code, const std::string& why) {
  for (const Waiter& w : c.pushes) {
    auto wc = w.conn.lock();
    if (!wc || !wc->open()) continue;
    t.runtime->PushFailed(Member(t, wc->id()), wc->id().session, c.key_id, c.current_version());
    t.CountError(code);
    wc->SendError(code, why, w.request_id, false);
  }
  c.pushes.clear();
  if (c.unsynced) {
    c.unsynced->held.clear();
    c.unsynced->held_since.clear();
  }
  if (c.rows) c.rows->Discard();
  if (c.row_stages) {
    for (auto& stage : c.row_stages->by_rack) {
      if (stage) stage->Discard();
    }
    std::fill(c.row_stages->taken_for.begin(), c.row_stages->taken_for.end(), 0);
  }
  c.state.DiscardPending();
  for (auto& stage : c.stages) {
    if (stage) stage->DiscardPending();
  }
}

void ChunkTable::FailPending(LaneTenant& t, WireError code, const std::string& why) {
  for (uint64_t id : t.pending) {
    if (auto it = t.chunks.find(id); it != t.chunks.end()) FailChunk(t, *it->second, code, why);
  }
  if (!t.pending.empty()) {
    spdlog::warn("data: tenant '{}' lane {}: failed {} pending chunk update(s): {}", t.info.name,
                 lane_, t.pending.size(), why);
  }
  t.pending.clear();
}

void ChunkTable::FailArmed(LaneTenant& t, const std::string& why) {
  // A checkpoint being copied would mix the chunks before and after.
  for (auto& [id, job] : t.armed) job->Fail(why, /*moved_on=*/true);
  t.armed.clear();
}

void ChunkTable::Restored(LaneTenant& t, LaneKey& key, Chunk& c) {
  const uint64_t v = c.current_version();
  t.pending.erase(ChunkId(c.key_id, c.index_in_key));
  if (c.index_in_key == 0) key.runtime->version.store(v, std::memory_order_relaxed);
  if (c.rows) {
    AnswerRowPulls(t, c);  // held for a home's rows (Chunk::AwaitsAlign)
  } else {
    AnswerPulls(c, v);  // a FROM_CLIENT key's early PULLs (or held for a home's values)
  }
}

std::map<uint32_t, uint64_t> ChunkTable::KeyVersions(const LaneTenant& t) const {
  std::map<uint32_t, uint64_t> out;
  for (const auto& [id, c] : t.chunks) {
    uint64_t& v = out[c->key_id];
    v = std::max(v, c->current_version());
  }
  return out;
}

void ChunkTable::Align(LaneTenant& t, const std::map<uint32_t, uint64_t>& versions) {
  uint32_t skipped = 0;
  for (auto& [id, c] : t.chunks) {
    // cross-rack recovery: not yet (docs/durability.md)
    if (c->multi_rack() || c->rows_across_racks()) continue;
    const auto it = versions.find(c->key_id);
    if (it == versions.end() || c->current_version() >= it->second) continue;
    if (c->rows) {
      if (c->rows->pending()) continue;  // cannot happen here
      c->rows->set_version(it->second);  // untouched rows, as a step without pushes
    } else if (!c->state.SkipTo(it->second)) {
      continue;  // an update is pending: cannot happen here
    }
    ++skipped;
    if (!t.armed.empty()) Capture(t, *c);
    if (c->index_in_key == 0) {
      if (auto k = t.keys.find(c->key_id); k != t.keys.end()) {
        k->second.runtime->version.store(it->second, std::memory_order_relaxed);
      }
    }
  }
  if (skipped > 0) {
    spdlog::info("data: tenant '{}' lane {}: {} chunk(s) finished the aborted iteration as a "
                 "skipped step",
                 t.info.name, lane_, skipped);
  }
}

namespace {

// A table's row range as a checkpoint chunk of rows x dim elements; the
// row-wise AdaGrad accumulator (one per row) is repeated over its row (the
// file keeps per-element state slots).
CheckpointChunk CopyTableChunk(const Chunk& c) {
  const aggregation::RowShard& r = *c.rows;
  const auto values = r.values();
  CheckpointChunk out{c.key_id, c.index_in_key, {values.begin(), values.end()}, {}};
  const int slots = aggregation::OptimizerStateSlots(r.optimizer().type);
  for (int slot = 0; slot < slots; ++slot) {
    const auto st = r.state(slot);
    if (r.optimizer().type == aggregation::OptimizerType::kAdaGrad) {
      std::vector<float> wide(r.row_count() * r.dim());
      for (uint64_t i = 0; i < r.row_count(); ++i) {
        std::fill_n(wide.begin() + i * r.dim(), r.dim(), st[i]);
      }
      out.state.push_back(std::move(wide));
    } else {
      out.state.emplace_back(st.begin(), st.end());
    }
  }
  return out;
}

CheckpointChunk CopyChunk(const Chunk& c, uint32_t self_rack) {
  if (c.rows) return CopyTableChunk(c);
  const aggregation::ChunkState& s = c.state;
  CheckpointChunk out{c.key_id, c.index_in_key, {}, {}};
  if (c.multi_rack() && c.home != self_rack) {
    // Another hub's chunk across racks: this hub has its parameters only as
    // the home sent them (the key's dtype, widened exactly); the optimizer
    // state is the home's (its own file has it; the slots here are unused).
    out.params.resize(s.elements());
    aggregation::CopyIn(out.params.data(), c.reply_bytes(c.version).data(), s.elements(),
                        static_cast<aggregation::ElementType>(static_cast<uint8_t>(c.dtype)));
  } else {
    const auto params = s.params(s.version());
    out.params.assign(params.begin(), params.end());
  }
  for (int slot = 0; slot < s.state_slots(); ++slot) {
    const auto st = s.optimizer_state(slot);
    out.state.emplace_back(st.begin(), st.end());
  }
  return out;
}

}  // namespace

void ChunkTable::Snapshot(LaneTenant& t, const std::shared_ptr<SnapshotJob>& job) {
  for (const auto& [key_id, target] : job->targets()) {
    LaneKey* key = FindKey(t, key_id);
    if (!key) {
      job->Fail("key id " + std::to_string(key_id) + " was deleted during the checkpoint");
      return;
    }
    for (uint32_t i = 0; i < key->info.placement.chunk_count; ++i) {
      if (OwnerLane(key->info, i) != lane_) continue;
      Chunk& c = GetChunk(t, *key, i);
      const uint64_t v = c.current_version();
      if (v == target) {
        job->Add(CopyChunk(c, self_rack_));
      } else if (v < target) {
        t.armed[ChunkId(key_id, i)] = job;  // copied when its updates get it there
      } else {
        job->Fail("chunk " + std::to_string(i) + " of key '" + key->info.name +
                      "' is at version " + std::to_string(v) + ", past the checkpoint's " +
                      std::to_string(target),
                  /*moved_on=*/true);
        return;
      }
    }
  }
}

void ChunkTable::Capture(LaneTenant& t, Chunk& c) {
  const auto it = t.armed.find(ChunkId(c.key_id, c.index_in_key));
  if (it == t.armed.end()) return;
  const std::shared_ptr<SnapshotJob> job = it->second;
  const auto target = job->targets().find(c.key_id);
  if (job->cancelled() || target == job->targets().end()) {
    t.armed.erase(it);
    return;
  }
  if (c.current_version() < target->second) return;  // not there yet: stays armed
  t.armed.erase(it);
  if (c.current_version() == target->second) {
    job->Add(CopyChunk(c, self_rack_));
  } else {
    job->Fail("chunk " + std::to_string(c.index_in_key) + " of key id " +
                  std::to_string(c.key_id) + " went past the checkpoint's version",
              /*moved_on=*/true);
  }
}

bool ChunkTable::RestoreTableChunk(aggregation::RowShard& r, uint64_t version,
                                   const CheckpointChunk& cc) {
  const size_t n = r.row_count() * r.dim();
  const bool row_wise = r.optimizer().type == aggregation::OptimizerType::kAdaGrad;
  const int slots = aggregation::OptimizerStateSlots(r.optimizer().type);
  if (cc.params.size() != n || cc.state.size() != static_cast<size_t>(slots)) return false;
  for (const auto& st : cc.state) {
    if (st.size() != n) return false;
  }
  r.Discard();
  std::copy(cc.params.begin(), cc.params.end(), r.mutable_values().begin());
  for (int slot = 0; slot < slots; ++slot) {
    auto dst = r.mutable_state(slot);
    if (row_wise) {
      for (uint64_t i = 0; i < r.row_count(); ++i) dst[i] = cc.state[slot][i * r.dim()];
    } else {
      std::copy(cc.state[slot].begin(), cc.state[slot].end(), dst.begin());
    }
  }
  r.set_version(version);
  return true;
}

// A dense chunk spanning racks (or flat) restored at `c.state`'s version:
// the replies of that version and every rack stage served here go there
// too (possibly back: a rollback to a cluster checkpoint).
void ChunkTable::RestoreRackStages(const LaneKey& key, Chunk& c, std::span<const float> params) {
  const uint64_t v = c.state.version();
  for (auto& stage : c.stages) {
    if (!stage) continue;
    // Contributions to the stage are dropped with the rest (ChunkState::Restore
    // takes none: a stage left behind would refuse every push as stale).
    stage->DiscardPending();
    if (!stage->Restore(v, params, {})) {  // sum-only: no optimizer state
      spdlog::error("checkpoint: key '{}' chunk {}: a rack stage could not be restored to "
                    "version {} (its size does not match the key)",
                    key.info.name, c.index_in_key, v);
    }
  }
  auto& out = c.replies[v & 1];
  out.PrepareOverwrite();  // a queued reply keeps its bytes
  aggregation::CopyOut(out.data(), params.data(), c.state.elements(),
                       ElementTypeOf(key.info.dtype));
  c.version = v;
}

uint32_t ChunkTable::Restore(LaneTenant& t, const CheckpointImage& image,
                             const std::unordered_set<uint32_t>& keys) {
  std::unordered_map<uint32_t, uint64_t> versions;
  for (const CheckpointKey& k : image.keys) versions[k.id] = k.version;
  FailArmed(t, "the tenant was restored meanwhile");
  // The elastic commit copies (chunk_commit.cc) predate this state: a
  // ROLLBACK to them would undo the restore; the next COMMIT copies anew.
  t.commits.clear();
  t.committed = false;
  t.fence.reset();
  uint32_t failed = 0;
  for (const CheckpointChunk& cc : image.chunks) {
    if (!keys.count(cc.key_id)) continue;
    LaneKey* key = FindKey(t, cc.key_id);
    if (!key || cc.chunk >= key->info.placement.chunk_count) continue;
    if (OwnerLane(key->info, cc.chunk) != lane_) continue;
    // Made here for the checkpoint's values: not sent at its key's floor
    // before they are written (the restore's own round sends them).
    const NewChunkHook hook = std::exchange(new_chunk_hook_, nullptr);
    Chunk& c = GetChunk(t, *key, cc.chunk);
    new_chunk_hook_ = hook;
    std::vector<std::span<const float>> state(cc.state.begin(), cc.state.end());
    const uint64_t v = versions[cc.key_id];
    c.state.DiscardPending();
    if (c.rows ? !RestoreTableChunk(*c.rows, v, cc) : !c.state.Restore(v, cc.params, state)) {
      ++failed;
      spdlog::error("checkpoint: tenant '{}' key '{}' chunk {}: sizes or optimizer state slots "
                    "do not match the key; left as it was",
                    t.info.name, key->info.name, cc.chunk);
      continue;
    }
    if (c.multi_rack()) RestoreRackStages(*key, c, cc.params);
    if (c.row_stages) {
      for (auto& stage : c.row_stages->by_rack) {
        if (stage) stage->Discard();
      }
      std::fill(c.row_stages->taken_for.begin(), c.row_stages->taken_for.end(), 0);
    }
    Restored(t, *key, c);
  }
  return failed;
}

void ChunkTable::DropKey(LaneTenant& t, uint32_t key_id) {
  for (auto it = t.chunks.begin(); it != t.chunks.end();) {
    if (it->second->key_id != key_id) {
      ++it;
      continue;
    }
    for (const Waiter& w : it->second->pushes) {
      if (auto wc = w.conn.lock(); wc && wc->open()) {
        wc->SendError(WireError::kTenantGone, "key: was deleted", w.request_id, false);
      }
    }
    for (const Waiter& w : it->second->pulls) {  // held for initial values
      if (auto wc = w.conn.lock(); wc && wc->open()) {
        wc->Unreserve(w.reserved);
        wc->SendError(WireError::kTenantGone, "key: was deleted", w.request_id, false);
      }
    }
    t.pending.erase(it->first);
    t.commits.erase(it->first);
    if (auto a = t.armed.find(it->first); a != t.armed.end()) {
      a->second->Fail("key id " + std::to_string(key_id) + " was deleted during the checkpoint");
      t.armed.erase(a);
    }
    it = t.chunks.erase(it);
  }
  t.keys.erase(key_id);
}

void ChunkTable::ApplyOptimizer(uint32_t handle, uint32_t key_id,
                                const aggregation::OptimizerConfig& optimizer,
                                uint64_t from_update) {
  LaneTenant* t = FindTenant(handle);
  if (!t) return;
  if (auto it = t->keys.find(key_id); it != t->keys.end()) {
    it->second.info.optimizer = optimizer;
    it->second.info.schedule.Apply(optimizer, from_update);
  }
  for (auto& [id, chunk] : t->chunks) {
    if (chunk->key_id != key_id) continue;
    if (chunk->rows) {
      chunk->rows->SetOptimizer(optimizer, from_update);
    } else {
      chunk->state.SetOptimizer(optimizer, from_update);
    }
  }
}

size_t ChunkTable::connection_count() const {
  size_t n = 0;
  for (const auto& [h, t] : tenants_) n += t.conns.size();
  return n;
}

}  // namespace rackhub::server
