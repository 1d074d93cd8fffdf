// Registry: keys: declaring and creating keys (dense and row-sparse tables)
// inside a tenant's quotas, looking them up, deleting them, changing their
// optimizer, and the chunks and memory a key takes. Tenants, tokens and
// totals: registry.cc.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "rackhub/common/log_safe.h"
#include "rackhub/common/size.h"
#include "registry.h"
#include "registry_backend.h"
#include "registry_internal.h"

namespace rackhub::server {

namespace {

// Top-k ratios of one key: equal, or one of them came through a float (a
// key stored, or a client declaring, before the exact double travelled) and
// both round to the same float: the stored ratio stays.
bool SameTopKRatio(double stored, double given) {
  if (stored == given) return true;
  auto from_float = [](double r) { return static_cast<double>(static_cast<float>(r)) == r; };
  return (from_float(stored) || from_float(given)) &&
         static_cast<float>(stored) == static_cast<float>(given);
}

std::string ParticipantsText(const std::vector<uint32_t>& ranks) {
  if (ranks.empty()) return "summing every worker";
  std::string text = "with participants [";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) text += ',';
    text += std::to_string(ranks[i]);
  }
  return text + "]";
}

// A participant set (KeySpec::participants) a tenant can reduce over.
Status CheckParticipants(const KeySpec& spec, const TenantInfo& t, uint32_t racks) {
  const std::vector<uint32_t>& p = spec.participants;
  if (p.empty()) return Status::Ok();
  const std::string key = "key " + Quoted(spec.name);
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] >= t.workers_per_rack) {
      return InvalidArgument("participants: rank " + std::to_string(p[i]) + " of " + key +
                             " is out of range: tenant " + Quoted(spec.tenant) + " has " +
                             std::to_string(t.workers_per_rack) + " workers");
    }
    if (i > 0 && p[i] <= p[i - 1]) {
      return InvalidArgument("participants: the ranks of " + key +
                             " must be strictly ascending (no duplicates), got " +
                             std::to_string(p[i - 1]) + " then " + std::to_string(p[i]));
    }
  }
  if (t.elastic) {
    return InvalidArgument("participants: tenant " + Quoted(spec.tenant) +
                           " is elastic: its membership changes, so a fixed participant set "
                           "cannot be kept (docs/elastic.md, Limits)");
  }
  if (racks > 1) {
    return InvalidArgument("participants: participant sets are single-rack only; this hub's "
                           "topology has " + std::to_string(racks) + " racks");
  }
  if (t.consistency != Consistency::kSync) {
    return InvalidArgument("participants: a participant set needs a sync tenant; tenant " +
                           Quoted(spec.tenant) + " is " +
                           ConsistencyName(t.consistency, t.staleness));
  }
  if (spec.rows > 0) {
    return InvalidArgument("participants: row-sparse tables sum every worker's rows; " + key +
                           " is a table");
  }
  return Status::Ok();
}

}  // namespace

using aggregation::ChunkLayout;
using aggregation::OptimizerConfig;

// Largest key: 2^34 fp32 elements (64 GiB) keeps every byte count far from
// overflow and is beyond any single hub's memory.
constexpr uint64_t kMaxKeyElements = 1ull << 34;
constexpr uint32_t kMaxTableDim = 65536;  // columns of a row-sparse table

Status Registry::GetKeyById(uint32_t handle, uint32_t key_id, KeyInfo* out) const {
  std::shared_lock lock(mu_);
  const Tenant* t = FindTenantByHandle(handle);
  if (!t) return NotFound("tenant: handle " + std::to_string(handle) + " does not exist");
  const auto it = t->key_names.find(key_id);
  if (it == t->key_names.end()) {
    return NotFound("key: id " + std::to_string(key_id) + " does not exist in tenant " +
                    Quoted(t->info.name));
  }
  *out = t->keys.at(it->second);
  return Status::Ok();
}

Status Registry::DeclareKey(const KeySpec& spec, KeyInfo* out, bool* created) {
  *created = false;
  {
    std::shared_lock lock(mu_);
    const Tenant* t = FindTenant(spec.tenant);
    if (!t) return TenantNotFound(spec.tenant);
    const auto it = t->keys.find(spec.name);
    if (it != t->keys.end()) {
      const KeyInfo& k = it->second;
      if (k.table() || spec.rows > 0) {
        if (k.rows != spec.rows || k.dim != spec.dim || k.dtype != spec.dtype) {
          return InvalidArgument(
              "name: key " + Quoted(spec.name) + " already exists as " +
              (k.table() ? "a " + std::to_string(k.rows) + " x " + std::to_string(k.dim) +
                               " table"
                         : "a dense key of " + std::to_string(k.elements) + " elements") +
              " of " + WireDTypeName(k.dtype) + ", not " +
              (spec.rows > 0 ? "a " + std::to_string(spec.rows) + " x " +
                                   std::to_string(spec.dim) + " table"
                             : "a dense key of " + std::to_string(spec.elements) + " elements") +
              " of " + WireDTypeName(spec.dtype));
        }
      } else if (k.elements != spec.elements || k.dtype != spec.dtype) {
        return InvalidArgument("name: key " + Quoted(spec.name) + " already exists with " +
                               std::to_string(k.elements) + " " + WireDTypeName(k.dtype) +
                               " elements, not " + std::to_string(spec.elements) + " " +
                               WireDTypeName(spec.dtype));
      } else if (k.participants != spec.participants) {
        return InvalidArgument("participants: key " + Quoted(spec.name) + " already exists " +
                               ParticipantsText(k.participants) + ", not " +
                               ParticipantsText(spec.participants));
      } else if (!SameTopKRatio(k.topk_ratio, spec.topk_ratio)) {
        auto comp = [](double r) {  // the shortest decimal that reads back as r
          char buf[40];
          const auto end = std::to_chars(buf, buf + sizeof buf, r).ptr;
          return r > 0 ? "top-k ratio " + std::string(buf, end) : std::string("dense pushes");
        };
        return InvalidArgument("topk_ratio: key " + Quoted(spec.name) + " already exists with " +
                               comp(k.topk_ratio) + ", not " + comp(spec.topk_ratio));
      }
      *out = k;
      return Status::Ok();
    }
  }
  Status s = CreateKey(spec, out);
  if (s.code() == StatusCode::kAlreadyExists) {
    // Another rank declared it between the two locks: return that one.
    bool ignored;
    return DeclareKey(spec, out, &ignored);
  }
  *created = s.ok();
  return s;
}

void Registry::MarkKeyReady(uint32_t handle, uint32_t key_id) {
  std::unique_lock lock(mu_);
  Tenant* t = FindTenantByHandle(handle);
  if (!t) return;
  const auto it = t->key_names.find(key_id);
  if (it != t->key_names.end()) t->keys.at(it->second).ready = true;
}

Status Registry::CreateKey(const KeySpec& spec, KeyInfo* out) {
  return CreateKeyAt(spec, std::nullopt, out);
}

Status Registry::AdoptKey(const KeySpec& spec, uint32_t id, uint64_t first_chunk, KeyInfo* out) {
  if (store_ && store_->shared()) {
    return FailedPrecondition("key: the registry is shared (etcd): keys come through it");
  }
  return CreateKeyAt(spec, KeyAt{id, first_chunk}, out);
}

Status Registry::CheckKeyAt(const Tenant& t, const KeySpec& spec, const KeyAt& at,
                            uint64_t elements) const {
  const uint64_t count = spec.rows > 0 ? ChunkLayout::TableChunkCount(spec.rows, lanes_)
                                       : t.layout.ChunksFor(elements);
  const auto taken = [&](const std::string& by, const std::string& how = "'s here") {
    return FailedPrecondition("key " + Quoted(spec.name) + " of tenant " + Quoted(spec.tenant) +
                              ": id " + std::to_string(at.id) + " or chunks " +
                              std::to_string(at.first_chunk) + ".." +
                              std::to_string(at.first_chunk + count - 1) +
                              " are key " + Quoted(by) + how);
  };
  if (const auto it = t.key_names.find(at.id); it != t.key_names.end()) return taken(it->second);
  for (const auto& [name, k] : t.keys) {
    const uint64_t first = k.placement.first_chunk, end = first + k.placement.chunk_count;
    if (at.first_chunk < end && first < at.first_chunk + count) return taken(name);
  }
  for (const auto& [id, d] : t.deleted) {
    const uint64_t end = d.first_chunk + d.chunk_count;
    if (id == at.id || (at.first_chunk < end && d.first_chunk < at.first_chunk + count)) {
      return taken(d.name, " (deleted here: a deleted key's id and chunks are not given again)");
    }
  }
  return Status::Ok();
}

Status Registry::CreateKeyAt(const KeySpec& spec, std::optional<KeyAt> at, KeyInfo* out) {
  if (!IsValidKeyName(spec.name)) {
    return InvalidArgument("name: " + Quoted(spec.name) +
                           " is not a valid key name (1-128 of A-Z a-z 0-9 _ . : / -)");
  }
  uint64_t elements = spec.elements;
  if (spec.rows > 0 || spec.dim > 0) {
    if (Status s = CheckTableSpec(spec, &elements); !s.ok()) return s;
  } else if (spec.elements == 0 || spec.elements > kMaxKeyElements) {
    return InvalidArgument("elements: must be in [1, " + std::to_string(kMaxKeyElements) +
                           "], got " + std::to_string(spec.elements) +
                           " (a row-sparse table gives rows and dim instead)");
  } else if (spec.init == InitMode::kRandom) {
    return InvalidArgument("init: RANDOM is for row-sparse tables (rows and dim); dense keys "
                           "start at zeros or from the client");
  }
  if (spec.dtype != WireDType::kFp32 && spec.dtype != WireDType::kFp16 &&
      spec.dtype != WireDType::kBf16) {
    return InvalidArgument("dtype: unknown wire dtype");
  }
  if (spec.init != InitMode::kZeros && spec.init != InitMode::kFromClient &&
      spec.init != InitMode::kRandom) {
    return InvalidArgument("init: unknown init mode");
  }
  if (!(spec.topk_ratio >= 0.0 && spec.topk_ratio <= 1.0)) {
    return InvalidArgument("topk_ratio: must be in (0, 1] (or 0 for dense pushes), got " +
                           std::to_string(spec.topk_ratio));
  }
  if (spec.topk_ratio > 0 && spec.rows > 0) {
    return InvalidArgument("topk_ratio: top-k compression is for dense keys; a row-sparse "
                           "table's pushes are sparse already");
  }
  OptimizerConfig checked_opt = spec.optimizer;
  if (!spec.use_tenant_optimizer) {
    if (auto s = CheckOptimizer("optimizer", &checked_opt); !s.ok()) return s;
  }

  return Retrying([&](int64_t* revision) -> Status {
  OptimizerConfig opt = checked_opt;
  std::unique_lock lock(mu_);
  Tenant* t = FindTenant(spec.tenant);
  if (!t) return TenantNotFound(spec.tenant);
  if (spec.rows > 0 && t->info.elastic) {
    return InvalidArgument("rows: row-sparse tables are not built for elastic tenants; tenant " +
                           Quoted(spec.tenant) + " is elastic (docs/elastic.md, Limits)");
  }
  if (spec.rows > 0 && t->info.consistency != Consistency::kSync) {
    return InvalidArgument("rows: row-sparse tables need a sync tenant; tenant " +
                           Quoted(spec.tenant) + " is " +
                           ConsistencyName(t->info.consistency, t->info.staleness));
  }
  if (spec.use_tenant_optimizer) opt = t->info.default_optimizer;
  if (Status s = CheckParticipants(spec, t->info, racks_); !s.ok()) return s;
  if (aggregation::IsElementwiseReduction(opt.reduction)) {
    const std::string r = aggregation::ReductionName(opt.reduction);
    if (spec.topk_ratio > 0) {
      return InvalidArgument("topk_ratio: top-k compression sends the largest terms of a sum; "
                             "key " + Quoted(spec.name) + " reduces with " + r +
                             " (declare it dense, topk_ratio 0)");
    }
    if (spec.rows > 0) {
      return InvalidArgument("optimizer.reduction: row-sparse tables sum or average their rows; " +
                             r + " is for dense sum-only keys");
    }
    if (t->info.consistency != Consistency::kSync) {
      // Bounded/async tenants apply each push as an update of its own.
      return InvalidArgument("optimizer.reduction: " + r + " combines every worker's push of a "
                             "step, which needs a sync tenant; tenant " + Quoted(spec.tenant) +
                             " is " + ConsistencyName(t->info.consistency, t->info.staleness));
    }
  }
  if (t->keys.count(spec.name)) {
    return AlreadyExists("name: key " + Quoted(spec.name) + " already exists in tenant " +
                         Quoted(spec.tenant));
  }
  if (at) {
    if (Status s = CheckKeyAt(*t, spec, *at, elements); !s.ok()) return s;
  }
  if (t->info.key_count + 1 > t->info.quotas.max_keys) {
    return ResourceExhausted("quotas.max_keys: tenant " + Quoted(spec.tenant) + " already has " +
                             std::to_string(t->info.key_count) + " of " +
                             std::to_string(t->info.quotas.max_keys) + " keys");
  }
  const uint64_t bytes = elements * aggregation::kMasterElementBytes;
  const uint32_t chunk_elements = t->layout.chunk_elements();
  const uint64_t memory =
      spec.rows > 0
          ? TableMemoryBytes(spec.rows, spec.dim, ChunkLayout::TableChunkCount(spec.rows, lanes_),
                             opt.type)
          : KeyMemory(t->info, spec.elements, spec.dtype, opt.type, chunk_elements);
  const uint64_t quota = t->info.quotas.max_parameter_bytes;
  if (t->info.memory_bytes + memory > quota) {
    // Name what the memory is for: the quota counts all of it, not only the
    // parameters (docs/architecture.md, Memory a key holds).
    const int slots = aggregation::OptimizerStateSlots(opt.type);
    const uint32_t w = t->info.rank_slots();
    std::string what = spec.rows > 0 ? "fp32 rows" : "fp32 parameters x2 (double buffer)";
    if (spec.dtype != WireDType::kFp32) {
      what += std::string(", their ") + WireDTypeName(spec.dtype) + " copies";
    }
    what += ", " + std::to_string(slots) + " " + aggregation::OptimizerTypeName(opt.type) +
            " state slot" + (slots == 1 ? "" : "s") + ", an accumulator";
    if (w > 1 && spec.rows == 0) {
      what += " and up to " + std::to_string(w - 1) + " parked contribution" +
              (w == 2 ? "" : "s");
    }
    if (spec.rows == 0 && t->info.elastic && memory_model_.racks <= 1 &&
        opt.type != aggregation::OptimizerType::kSumOnly) {
      what += ", a commit copy of the parameters and state (elastic)";
    }
    what += spec.rows > 0 ? "" : " per chunk";
    const uint64_t left = quota > t->info.memory_bytes ? quota - t->info.memory_bytes : 0;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.1fx", static_cast<double>(memory) / bytes);
    return ResourceExhausted("quotas.max_parameter_bytes: key " + Quoted(spec.name) + " needs " +
                             FormatSize(memory) + " of hub memory for " + FormatSize(bytes) +
                             " of parameters (" + ratio + ": " + what + ") but tenant " +
                             Quoted(spec.tenant) + " has " + FormatSize(left) + " left of its " +
                             FormatSize(quota) + " quota");
  }
  KeyInfo key;
  key.tenant = spec.tenant;
  key.name = spec.name;
  key.id = at ? at->id : t->next_key_id;
  key.elements = elements;
  key.rows = spec.rows;
  key.dim = spec.dim;
  key.init_scale = spec.init_scale;
  key.init_seed = spec.init_seed;
  key.topk_ratio = spec.topk_ratio;
  key.participants = spec.participants;
  key.dtype = spec.dtype;
  key.optimizer = opt;
  key.schedule.base = key.schedule.latest = opt;
  key.init = spec.init;
  key.ready = spec.init != InitMode::kFromClient;
  key.placement = {at ? at->first_chunk : t->layout.next_chunk(),
                   key.table() ? ChunkLayout::TableChunkCount(key.rows, lanes_)
                               : t->layout.ChunksFor(elements)};
  // A table's chunks are its row ranges (ChunkLayout::TableChunks).
  key.chunk_elements =
      key.table()
          ? static_cast<uint32_t>(ChunkLayout::TableRowsPerChunk(key.rows, lanes_) * key.dim)
          : chunk_elements;
  key.memory_bytes = memory;
  if (store_) {
    StoredTenant row = t->Row();
    row.next_key_id = std::max(t->next_key_id, key.id + 1);
    row.next_chunk = std::max(t->layout.next_chunk(),
                              key.placement.first_chunk + key.placement.chunk_count);
    if (Status s = store_->InsertKey(row, key, revision); !s.ok()) return s;
    if (store_->shared()) {
      lock.unlock();
      if (Status s = AwaitRevision(*revision); !s.ok()) return s;
      return GetKey(spec.tenant, spec.name, out);
    }
  }
  t->next_key_id = std::max(t->next_key_id, key.id + 1);
  if (!at) {
    if (key.table()) {
      t->layout.AllocateTable(key.rows);  // == key.placement
    } else {
      t->layout.Allocate(elements);  // == key.placement
    }
  } else if (const uint64_t end = key.placement.first_chunk + key.placement.chunk_count;
             end > t->layout.next_chunk()) {
    // Past the chunks given so far (the ones skipped: keys of lower ids
    // declared later, or deleted on that hub).
    t->layout.Allocate((end - t->layout.next_chunk()) * t->layout.chunk_elements());
  }
  t->info.key_count++;
  t->info.parameter_bytes += bytes;
  t->info.memory_bytes += memory;
  t->info.chunk_count = t->layout.next_chunk();
  t->keys.emplace(key.name, key);
  t->key_names.emplace(key.id, key.name);
  if (observer_) observer_->OnKeyCreated(t->info.handle, key.id);
  *out = key;
  return Status::Ok();
  });
}

Status Registry::FindKey(const std::string& tenant, const std::string& name, Tenant** t,
                         KeyInfo** key) const {
  *t = FindTenant(tenant);
  if (!*t) return TenantNotFound(tenant);
  const auto it = (*t)->keys.find(name);
  if (it == (*t)->keys.end()) {
    return NotFound("name: key " + Quoted(name) + " does not exist in tenant " + Quoted(tenant));
  }
  *key = &it->second;
  return Status::Ok();
}

Status Registry::GetKey(const std::string& tenant, const std::string& name, KeyInfo* out) const {
  std::shared_lock lock(mu_);
  Tenant* t = nullptr;
  KeyInfo* key = nullptr;
  if (Status s = FindKey(tenant, name, &t, &key); !s.ok()) return s;
  *out = *key;
  return Status::Ok();
}

Status Registry::ListKeys(const std::string& tenant, std::vector<KeyInfo>* out) const {
  std::shared_lock lock(mu_);
  const Tenant* t = FindTenant(tenant);
  if (!t) return TenantNotFound(tenant);
  out->clear();
  for (const auto& [name, key] : t->keys) out->push_back(key);
  std::sort(out->begin(), out->end(),
            [](const KeyInfo& a, const KeyInfo& b) { return a.id < b.id; });
  return Status::Ok();
}

Status Registry::DeleteKey(const std::string& tenant, const std::string& name) {
  return Retrying([&](int64_t* revision) -> Status {
  std::unique_lock lock(mu_);
  Tenant* t = nullptr;
  KeyInfo* key = nullptr;
  if (Status s = FindKey(tenant, name, &t, &key); !s.ok()) return s;
  const uint32_t key_id = key->id;
  if (store_) {
    if (Status s = store_->DeleteKey(t->Row(), *key, t->key_revisions[key_id], revision);
        !s.ok()) {
      return s;
    }
    if (store_->shared()) {
      lock.unlock();
      return AwaitRevision(*revision);
    }
  }
  t->info.key_count--;
  t->info.parameter_bytes -= key->parameter_bytes();
  t->info.memory_bytes -= key->memory_bytes;
  t->NoteDeleted(*key);
  t->key_names.erase(key_id);
  t->keys.erase(name);
  if (observer_) observer_->OnKeyDeleted(t->info.handle, key_id);
  return Status::Ok();
  });
}

Status Registry::SetOptimizer(const std::string& tenant, const std::string& name,
                              OptimizerConfig optimizer, bool keep_type, KeyInfo* out,
                              uint64_t from_update) {
  const OptimizerConfig asked = optimizer;
  return Retrying([&](int64_t* revision) -> Status {
  OptimizerConfig optimizer = asked;
  std::unique_lock lock(mu_);
  Tenant* t = nullptr;
  KeyInfo* found = nullptr;
  if (Status s = FindKey(tenant, name, &t, &found); !s.ok()) return s;
  KeyInfo& key = *found;
  if (keep_type) optimizer.type = key.optimizer.type;
  if (optimizer.type != key.optimizer.type) {
    return InvalidArgument(std::string("optimizer.type: cannot change ") +
                           aggregation::OptimizerTypeName(key.optimizer.type) + " to " +
                           aggregation::OptimizerTypeName(optimizer.type) +
                           " on an existing key (its optimizer state would be lost); delete and "
                           "recreate the key");
  }
  if (auto s = CheckOptimizer("optimizer", &optimizer); !s.ok()) return s;
  if (optimizer.reduction != key.optimizer.reduction &&
      (aggregation::IsElementwiseReduction(optimizer.reduction) ||
       aggregation::IsElementwiseReduction(key.optimizer.reduction))) {
    // Contributions already folded into an update would mix two operations.
    return InvalidArgument(std::string("optimizer.reduction: cannot change ") +
                           aggregation::ReductionName(key.optimizer.reduction) + " to " +
                           aggregation::ReductionName(optimizer.reduction) +
                           " on an existing key (only mean and sum switch); delete and "
                           "recreate the key");
  }
  KeyInfo updated = key;
  updated.schedule.Apply(optimizer, from_update);
  updated.optimizer = optimizer;
  if (store_) {
    if (Status s = store_->UpdateOptimizer(t->Row(), updated, t->key_revisions[key.id], revision);
        !s.ok()) {
      return s;
    }
    if (store_->shared()) {
      lock.unlock();
      if (Status s = AwaitRevision(*revision); !s.ok()) return s;
      return GetKey(tenant, name, out);
    }
  }
  key.schedule = updated.schedule;
  key.optimizer = optimizer;
  *out = key;
  if (observer_) observer_->OnOptimizerChanged(t->info.handle, key.id, optimizer, from_update);
  return Status::Ok();
  });
}

std::vector<aggregation::ChunkSpan> Registry::ChunksOf(const KeyInfo& key, uint64_t from,
                                                     uint64_t count) const {
  if (key.table()) {
    ChunkLayout layout(aggregation::kDefaultChunkBytes, lanes_);
    return layout.TableChunks(key.placement, key.rows, key.dim, key.rows_per_chunk(), from, count);
  }
  ChunkLayout layout(key.chunk_elements * aggregation::kMasterElementBytes, lanes_);
  return layout.Chunks(key.placement, key.elements, from, count);
}

std::vector<Registry::LaneShare> Registry::LanesOf(const KeyInfo& key) const {
  std::vector<LaneShare> out(lanes_);
  const uint64_t n = key.placement.chunk_count;
  if (n == 0 || lanes_ == 0) return out;
  // Every chunk is full but the last; chunk i of the key is on lane
  // (first_chunk + i) % lanes.
  const uint64_t per = key.table() ? key.rows_per_chunk() * key.dim : key.chunk_elements;
  const uint64_t total = key.table() ? key.rows * key.dim : key.elements;
  const uint64_t last = total - (n - 1) * per;
  const uint64_t first_lane = key.placement.first_chunk % lanes_;
  for (uint32_t l = 0; l < lanes_; ++l) {
    const uint64_t i0 = (l + lanes_ - first_lane) % lanes_;  // the key's first chunk on lane l
    LaneShare& share = out[l];
    share.chunks = i0 < n ? (n - 1 - i0) / lanes_ + 1 : 0;
    share.elements = share.chunks * per;
  }
  out[(first_lane + n - 1) % lanes_].elements -= per - last;
  return out;
}

uint64_t Registry::KeyMemory(const TenantInfo& t, uint64_t elements, WireDType dtype,
                             aggregation::OptimizerType optimizer, uint32_t chunk_elements) const {
  // An elastic tenant on one rack also keeps a commit copy of each chunk
  // with a hub optimizer (several racks: no copies, chunk_commit.cc).
  const uint64_t copies =
      t.elastic && memory_model_.racks <= 1 ? CommitCopyBytes(elements, chunk_elements, optimizer)
                                            : 0;
  return copies + KeyMemoryBytes(elements, chunk_elements, t.rank_slots(), optimizer,
                                 static_cast<aggregation::ElementType>(static_cast<uint8_t>(dtype)),
                                 memory_model_);
}

uint64_t Registry::KeyMemory(const TenantInfo& t, const KeyInfo& key) const {
  if (key.table()) {
    return TableMemoryBytes(key.rows, key.dim, key.placement.chunk_count, key.optimizer.type);
  }
  return KeyMemory(t, key.elements, key.dtype, key.optimizer.type, key.chunk_elements);
}

Status Registry::CheckTableSpec(const KeySpec& spec, uint64_t* elements) const {
  if (spec.rows == 0 || spec.dim == 0 || spec.dim > kMaxTableDim) {
    return InvalidArgument("rows, dim: a row-sparse table needs rows >= 1 and dim in [1, " +
                           std::to_string(kMaxTableDim) + "], got " + std::to_string(spec.rows) +
                           " x " + std::to_string(spec.dim));
  }
  if (spec.rows > kMaxKeyElements / spec.dim) {
    return InvalidArgument("rows: " + std::to_string(spec.rows) + " x " +
                           std::to_string(spec.dim) + " exceeds " +
                           std::to_string(kMaxKeyElements) + " elements");
  }
  const uint64_t per = ChunkLayout::TableRowsPerChunk(spec.rows, lanes_);
  if (per * spec.dim > UINT32_MAX) {
    return InvalidArgument("rows: " + std::to_string(per) + " rows x " +
                           std::to_string(spec.dim) + " per lane exceed " +
                           std::to_string(UINT32_MAX) + " elements; the hub has " +
                           std::to_string(lanes_) + " lanes");
  }
  if (spec.elements != 0 && spec.elements != spec.rows * spec.dim) {
    return InvalidArgument("elements: " + std::to_string(spec.elements) +
                           " is not rows x dim = " + std::to_string(spec.rows * spec.dim) +
                           " (leave it 0 for a table)");
  }
  if (spec.init == InitMode::kFromClient) {
    return InvalidArgument("init: FROM_CLIENT is not available for row-sparse tables; use ZEROS "
                           "or RANDOM (seeded on the hub)");
  }
  if (spec.init == InitMode::kRandom &&
      !(std::isfinite(spec.init_scale) && spec.init_scale > 0)) {
    return InvalidArgument("init_scale: RANDOM needs a finite scale > 0, got " +
                           std::to_string(spec.init_scale));
  }
  *elements = spec.rows * spec.dim;
  return Status::Ok();
}

}  // namespace rackhub::server
