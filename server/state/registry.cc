// Registry: tenants: opening the registry, creating, listing, updating and
// deleting tenants, their tokens (Authenticate), and the hub's totals. Keys:
// registry_keys.cc; applying a store's contents: registry_reconcile.cc.
#include "registry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "rackhub/common/log_safe.h"
#include "rackhub/common/size.h"
#include "registry_backend.h"
#include "registry_internal.h"
#include "token.h"

namespace rackhub::server {

using aggregation::ChunkLayout;
using aggregation::OptimizerConfig;

constexpr uint32_t kMaxWorkersPerRack = 65536;

void OptimizerSchedule::Apply(const aggregation::OptimizerConfig& config, uint64_t from) {
  if (config == latest && from == from_update) return;
  base = from == 0 ? config : latest;
  latest = config;
  from_update = from;
}

const char* WireDTypeName(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFp32: return "fp32";
    case WireDType::kFp16: return "fp16";
    case WireDType::kBf16: return "bf16";
  }
  return "unknown";
}

uint32_t WireDTypeBytes(WireDType dtype) { return dtype == WireDType::kFp32 ? 4 : 2; }

bool IsValidTenantName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '-' && c != '_'))) return false;
  }
  return true;
}

bool IsValidKeyName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Registry::Registry(uint32_t lanes, TenantDefaults defaults, const TopologyConfig& topology)
    : lanes_(lanes),
      racks_(topology.rack_count()),
      exchange_(topology.multi_rack_exchange()),
      defaults_(defaults),
      memory_model_(MemoryModel::Of(topology)) {}

std::shared_ptr<TenantCounters> Registry::NewCounters(const TenantInfo& info) const {
  auto c = std::make_shared<TenantCounters>(lanes_, info.rank_slots() * racks_);
  c->weight.store(info.quotas.weight, std::memory_order_relaxed);
  // An elastic tenant starts paused: no membership until its start quorum.
  c->paused.store(info.elastic, std::memory_order_relaxed);
  return c;
}
Registry::~Registry() {
  // The store's watch thread calls Reconcile: stop it before the maps go.
  store_.reset();
}

Result<std::unique_ptr<Registry>> Registry::Open(uint32_t lanes, TenantDefaults defaults,
                                                 std::unique_ptr<RegistryBackend> store,
                                                 const TopologyConfig& topology) {
  Result<RegistryContents> contents = store->Load();
  if (!contents.ok()) return contents.status();
  auto registry = std::make_unique<Registry>(lanes, defaults, topology);
  {
    std::unique_lock lock(registry->mu_);
    if (Status s = registry->Apply(*contents, true, store->where() + ": "); !s.ok()) return s;
    registry->store_ = std::move(store);
  }
  if (registry->store_->shared()) {
    Registry* r = registry.get();
    registry->store_->Watch([r](const RegistryContents& c) { r->Reconcile(c); },
                            contents->revision);
  }
  return registry;
}

Registry::Tenant* Registry::FindTenant(const std::string& name) const {
  const auto it = tenants_.find(name);
  return it == tenants_.end() ? nullptr : it->second.get();
}

Status Registry::CreateTenant(const TenantSpec& spec, TenantInfo* out, std::string* token) {
  if (!IsValidTenantName(spec.name)) {
    return InvalidArgument("name: " + Quoted(spec.name) +
                           " is not a valid tenant name (1-63 of a-z 0-9 _ -, starting with a "
                           "letter or digit)");
  }
  if (spec.workers_per_rack == 0 || spec.workers_per_rack > kMaxWorkersPerRack) {
    return InvalidArgument("workers_per_rack: must be in [1, " +
                           std::to_string(kMaxWorkersPerRack) + "], got " +
                           std::to_string(spec.workers_per_rack));
  }
  const uint32_t chunk_bytes = spec.chunk_bytes ? spec.chunk_bytes : defaults_.chunk_bytes;
  if (!ChunkLayout::IsValidChunkBytes(chunk_bytes)) {
    return InvalidArgument("chunk_bytes: " + std::to_string(chunk_bytes) +
                           " must be a multiple of 64 in [1024, 67108864]");
  }
  OptimizerConfig opt = spec.default_optimizer;
  if (auto s = CheckOptimizer("default_optimizer", &opt); !s.ok()) return s;
  Quotas q = spec.quotas;
  if (q.max_parameter_bytes == 0) q.max_parameter_bytes = defaults_.max_parameter_bytes;
  if (q.max_keys == 0) q.max_keys = defaults_.max_keys;
  if (q.max_workers == 0) q.max_workers = std::max(defaults_.max_workers, spec.workers_per_rack);
  if (q.weight == 0) q.weight = 1;
  if (q.weight > Quotas::kMaxWeight) {
    return InvalidArgument("quotas.weight: " + std::to_string(q.weight) + " must be in [1, " +
                           std::to_string(Quotas::kMaxWeight) + "]");
  }
  if (spec.workers_per_rack > q.max_workers) {
    if (spec.elastic) {
      return InvalidArgument("workers_per_rack: " + std::to_string(spec.workers_per_rack) +
                             " is above max_workers " + std::to_string(q.max_workers) +
                             " (need min_workers <= workers <= max_workers)");
    }
    return ResourceExhausted("workers_per_rack: " + std::to_string(spec.workers_per_rack) +
                             " exceeds quotas.max_workers " + std::to_string(q.max_workers));
  }
  if (spec.elastic && q.max_workers > kMaxWorkersPerRack) {
    return InvalidArgument("max_workers: " + std::to_string(q.max_workers) +
                           " must be at most " + std::to_string(kMaxWorkersPerRack));
  }

  if (spec.consistency != Consistency::kSync && spec.consistency != Consistency::kBounded &&
      spec.consistency != Consistency::kAsync) {
    return InvalidArgument("consistency: unknown mode");
  }
  if (spec.consistency == Consistency::kBounded && spec.staleness > kMaxStaleness) {
    return InvalidArgument("staleness: " + std::to_string(spec.staleness) + " must be in [0, " +
                           std::to_string(kMaxStaleness) + "] (bounded:S)");
  }
  if (spec.consistency != Consistency::kBounded && spec.staleness != 0) {
    return InvalidArgument("staleness: only a bounded tenant has a staleness bound");
  }
  uint32_t min_workers = 0;
  if (spec.elastic) {
    min_workers = spec.min_workers ? spec.min_workers : 1;
    if (spec.consistency != Consistency::kSync) {
      return InvalidArgument("elastic: an elastic tenant is sync; consistency " +
                             ConsistencyName(spec.consistency, spec.staleness) +
                             " cannot be elastic (docs/elastic.md)");
    }
    if (racks_ > 1 && !exchange_) {
      return InvalidArgument("elastic: elastic tenants on a flat multi-rack hub (one hub serving " +
                             std::to_string(racks_) + " racks) are not built; use the "
                             "hierarchical topology, a hub per rack (docs/elastic.md, Limits)");
    }
    // Across racks min_workers counts every rack's members and the start
    // quorum is workers_per_rack on each rack (docs/elastic.md, Across racks).
    if (const uint32_t quorum = spec.workers_per_rack * racks_; min_workers > quorum) {
      return InvalidArgument("min_workers: " + std::to_string(min_workers) +
                             " is above workers_per_rack " +
                             std::to_string(spec.workers_per_rack) +
                             (racks_ > 1 ? " x " + std::to_string(racks_) + " racks" : "") +
                             " (need min_workers <= workers <= max_workers)");
    }
  } else if (spec.min_workers != 0) {
    return InvalidArgument("min_workers: only an elastic tenant has a minimum (add elastic)");
  }

  if (!spec.token.empty()) {
    bool ok = spec.token.size() >= 32 && spec.token.size() <= 128;
    for (char c : spec.token) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-');
    }
    if (!ok) return InvalidArgument("token: must be 32-128 of A-Z a-z 0-9 _ -");
  }

  std::string new_token = spec.token.empty() ? GenerateToken() : spec.token;
  const TokenHash hash = HashToken(new_token);
  return Retrying([&](int64_t* revision) -> Status {
  std::unique_lock lock(mu_);
  if (tenants_.count(spec.name)) {
    return AlreadyExists("name: tenant " + Quoted(spec.name) + " already exists");
  }
  if (tenants_.size() >= defaults_.max_tenants) {
    return ResourceExhausted("name: the daemon already hosts " + std::to_string(tenants_.size()) +
                             " tenants (tenants.max_tenants)");
  }
  TenantInfo info;
  info.name = spec.name;
  info.handle = next_handle_;
  info.workers_per_rack = spec.workers_per_rack;
  info.chunk_bytes = chunk_bytes;
  info.default_optimizer = opt;
  info.quotas = q;
  info.consistency = spec.consistency;
  info.staleness = spec.staleness;
  info.elastic = spec.elastic;
  info.min_workers = min_workers;
  info.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  info.counters = NewCounters(info);
  if (store_) {
    if (Status s = store_->InsertTenant({info, hash, 1, 0, 0}, info.handle + 1, revision);
        !s.ok()) {
      return s;
    }
    if (store_->shared()) {
      lock.unlock();
      if (Status s = AwaitRevision(*revision); !s.ok()) return s;
      *token = new_token;
      return GetTenant(spec.name, out);
    }
  }
  next_handle_ = info.handle + 1;
  *token = new_token;
  auto tenant = std::make_unique<Tenant>(info, hash, ChunkLayout(chunk_bytes, lanes_));
  *out = tenant->info;
  by_handle_.emplace(info.handle, tenant.get());
  tenants_.emplace(spec.name, std::move(tenant));
  return Status::Ok();
  });
}

Status Registry::GetTenant(const std::string& name, TenantInfo* out) const {
  std::shared_lock lock(mu_);
  const Tenant* t = FindTenant(name);
  if (!t) return TenantNotFound(name);
  *out = t->info;
  return Status::Ok();
}

std::vector<TenantInfo> Registry::ListTenants() const {
  std::shared_lock lock(mu_);
  std::vector<TenantInfo> out;
  for (const auto& [name, t] : tenants_) out.push_back(t->info);
  return out;
}

Status Registry::UpdateQuotas(const std::string& name, const Quotas& quotas, TenantInfo* out) {
  return Retrying([&](int64_t* revision) -> Status {
  std::unique_lock lock(mu_);
  Tenant* t = FindTenant(name);
  if (!t) return TenantNotFound(name);
  Quotas q = t->info.quotas;
  if (quotas.max_parameter_bytes) q.max_parameter_bytes = quotas.max_parameter_bytes;
  if (quotas.max_keys) q.max_keys = quotas.max_keys;
  if (quotas.max_workers) q.max_workers = quotas.max_workers;
  if (quotas.weight) q.weight = quotas.weight;
  if (q.weight > Quotas::kMaxWeight) {
    return InvalidArgument("quotas.weight: " + std::to_string(q.weight) + " must be in [1, " +
                           std::to_string(Quotas::kMaxWeight) + "]");
  }
  if (q.max_parameter_bytes < t->info.memory_bytes) {
    return FailedPrecondition("quotas.max_parameter_bytes: " +
                              FormatSize(q.max_parameter_bytes) + " is below the " +
                              FormatSize(t->info.memory_bytes) +
                              " of hub memory the tenant's keys already hold");
  }
  if (q.max_keys < t->info.key_count) {
    return FailedPrecondition("quotas.max_keys: " + std::to_string(q.max_keys) +
                              " is below the tenant's " + std::to_string(t->info.key_count) +
                              " keys");
  }
  if (t->info.elastic && q.max_workers != t->info.quotas.max_workers) {
    return FailedPrecondition("quotas.max_workers: the rank limit of an elastic tenant is fixed "
                              "when it is created (" +
                              std::to_string(t->info.quotas.max_workers) + ")");
  }
  if (q.max_workers < t->info.workers_per_rack) {
    return FailedPrecondition("quotas.max_workers: " + std::to_string(q.max_workers) +
                              " is below the tenant's workers_per_rack " +
                              std::to_string(t->info.workers_per_rack));
  }
  if (store_) {
    StoredTenant row = t->Row();
    row.info.quotas = q;
    if (Status s = store_->UpdateQuotas(row, revision); !s.ok()) return s;
    if (store_->shared()) {
      lock.unlock();
      if (Status s = AwaitRevision(*revision); !s.ok()) return s;
      return GetTenant(name, out);
    }
  }
  t->info.quotas = q;
  t->info.counters->weight.store(q.weight, std::memory_order_relaxed);
  *out = t->info;
  return Status::Ok();
  });
}

Status Registry::DeleteTenant(const std::string& name) {
  return Retrying([&](int64_t* revision) -> Status {
    std::unique_lock lock(mu_);
    Tenant* t = FindTenant(name);
    if (!t) return TenantNotFound(name);
    const uint32_t handle = t->info.handle;
    if (store_) {
      if (Status s = store_->DeleteTenant(t->Row(), revision); !s.ok()) return s;
      if (store_->shared()) {
        lock.unlock();
        return AwaitRevision(*revision);
      }
    }
    by_handle_.erase(handle);
    tenants_.erase(name);
    if (observer_) observer_->OnTenantDeleted(handle);
    return Status::Ok();
  });
}

Registry::Tenant* Registry::FindTenantByHandle(uint32_t handle) const {
  const auto it = by_handle_.find(handle);
  return it == by_handle_.end() ? nullptr : it->second;
}

Status Registry::GetTenantByHandle(uint32_t handle, TenantInfo* out) const {
  std::shared_lock lock(mu_);
  const Tenant* t = FindTenantByHandle(handle);
  if (!t) return NotFound("tenant: handle " + std::to_string(handle) + " does not exist");
  *out = t->info;
  return Status::Ok();
}

Status Registry::Authenticate(const std::string& tenant, const std::string& token,
                              TenantInfo* out) const {
  std::shared_lock lock(mu_);
  const Tenant* t = FindTenant(tenant);
  // Hash even for an unknown tenant so timing does not reveal which names exist.
  const bool ok = TokenMatches(token, t ? t->token : TokenHash{}) && t != nullptr;
  if (!ok) return Unauthenticated("token: unknown tenant or wrong token");
  *out = t->info;
  return Status::Ok();
}

std::string ConsistencyName(Consistency c, uint32_t staleness) {
  switch (c) {
    case Consistency::kSync: return "sync";
    case Consistency::kBounded: return "bounded:" + std::to_string(staleness);
    case Consistency::kAsync: return "async";
  }
  return "unknown";
}

Registry::Totals Registry::GetTotals() const {
  std::shared_lock lock(mu_);
  Totals totals;
  totals.tenants = static_cast<uint32_t>(tenants_.size());
  for (const auto& [name, t] : tenants_) {
    totals.keys += t->info.key_count;
    totals.parameter_bytes += t->info.parameter_bytes;
    totals.memory_bytes += t->info.memory_bytes;
  }
  return totals;
}

}  // namespace rackhub::server
