// Registry::Apply: makes the registry's memory equal to a store's contents
// (at start-up, and for a shared store after every change it reports), and
// the waiting and retrying of writes to a shared store (registry.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "rackhub/common/log_safe.h"
#include "registry.h"
#include "registry_backend.h"
#include "registry_internal.h"

namespace rackhub::server {

using aggregation::ChunkLayout;

namespace {

// How long a mutation waits for its own change (or the change that beat it)
// to come back through the watch before it re-reads the store itself, and
// how often a conflict is retried.
constexpr auto kWatchWait = std::chrono::seconds(1);
constexpr auto kConflictWindow = std::chrono::seconds(10);

bool ValidKey(const KeyInfo& key) {
  return (key.dtype == WireDType::kFp32 || key.dtype == WireDType::kFp16 ||
          key.dtype == WireDType::kBf16) &&
         (key.init == InitMode::kZeros || key.init == InitMode::kFromClient ||
          (key.init == InitMode::kRandom && key.table())) &&
         key.chunk_elements > 0 && key.elements > 0 && key.id > 0 &&
         (!key.table() ||
          (key.dim > 0 && key.elements == key.rows * key.dim && key.chunk_elements % key.dim == 0 &&
           key.placement.chunk_count ==
               (key.rows + key.rows_per_chunk() - 1) / key.rows_per_chunk()));
}

bool SameSchedule(const KeyInfo& a, const KeyInfo& b) {
  return a.optimizer == b.optimizer && a.schedule.base == b.schedule.base &&
         a.schedule.latest == b.schedule.latest && a.schedule.from_update == b.schedule.from_update;
}

}  // namespace

Status Registry::Apply(const RegistryContents& c, bool strict, const std::string& where) {
  {
    // Contents older than what was applied (the watch and a writer's
    // re-read race) would undo newer changes.
    std::lock_guard lock(revision_mu_);
    if (!strict && c.revision < applied_revision_) return Status::Ok();
  }
  // A row this hub cannot use: fatal at start-up, logged and skipped later
  // (another hub, maybe a newer version, wrote it; the rest still applies).
  auto bad = [&](const std::string& what) -> Status {
    if (strict) return FailedPrecondition(where + what);
    spdlog::error("registry: {}{}; ignored", where, what);
    return Status::Ok();
  };
  std::map<std::string, const StoredTenant*> want;
  for (const StoredTenant& row : c.tenants) want[row.info.name] = &row;
  // Tenants gone, or replaced by a new one of the same name.
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    const auto w = want.find(it->first);
    if (w != want.end() && w->second->info.handle == it->second->info.handle) {
      ++it;
      continue;
    }
    const uint32_t handle = it->second->info.handle;
    by_handle_.erase(handle);
    it = tenants_.erase(it);
    if (observer_) observer_->OnTenantDeleted(handle);
  }
  next_handle_ = std::max<uint32_t>({next_handle_, c.next_handle, 1});
  for (const StoredTenant& row : c.tenants) {
    const TenantInfo& info = row.info;
    Tenant* t = FindTenant(info.name);
    if (!t) {
      if (!ChunkLayout::IsValidChunkBytes(info.chunk_bytes) || info.handle == 0 ||
          !IsValidTenantName(info.name) || by_handle_.count(info.handle)) {
        if (Status s = bad("tenant " + QuoteForLog(info.name) + " (handle " +
                           std::to_string(info.handle) + ") is invalid (chunk_bytes " +
                           std::to_string(info.chunk_bytes) + ")");
            !s.ok()) {
          return s;
        }
        continue;
      }
      if (info.quotas.weight == 0 || info.quotas.weight > Quotas::kMaxWeight) {
        if (Status s = bad("tenant " + QuoteForLog(info.name) + ": weight " +
                           std::to_string(info.quotas.weight) + " is out of range");
            !s.ok()) {
          return s;
        }
        continue;
      }
      TenantInfo fresh = info;
      fresh.key_count = 0;
      fresh.parameter_bytes = 0;
      fresh.memory_bytes = 0;
      fresh.counters = NewCounters(fresh);
      auto tenant = std::make_unique<Tenant>(fresh, row.token, ChunkLayout(info.chunk_bytes, lanes_));
      t = tenant.get();
      by_handle_.emplace(info.handle, t);
      tenants_.emplace(info.name, std::move(tenant));
    } else if (!(t->info.quotas.max_parameter_bytes == info.quotas.max_parameter_bytes &&
                 t->info.quotas.max_keys == info.quotas.max_keys &&
                 t->info.quotas.max_workers == info.quotas.max_workers &&
                 t->info.quotas.weight == info.quotas.weight)) {
      t->info.quotas = info.quotas;
      t->info.counters->weight.store(info.quotas.weight, std::memory_order_relaxed);
    }
    // Reserve the chunk indices used so far (deleted keys' included: never reused).
    if (row.next_chunk > t->layout.next_chunk()) {
      t->layout.Allocate((row.next_chunk - t->layout.next_chunk()) * t->layout.chunk_elements());
    }
    t->info.chunk_count = t->layout.next_chunk();
    t->next_key_id = std::max<uint32_t>({t->next_key_id, row.next_key_id, 1});
    t->revision = row.revision;
    next_handle_ = std::max(next_handle_, info.handle + 1);
  }

  std::map<uint32_t, std::map<std::string, const StoredKey*>> keys;
  for (const StoredKey& row : c.keys) {
    if (!FindTenantByHandle(row.tenant_handle)) {
      if (Status s = bad("key " + QuoteForLog(row.key.name) + " (tenant handle " +
                         std::to_string(row.tenant_handle) + ", id " +
                         std::to_string(row.key.id) + ") belongs to no tenant");
          !s.ok()) {
        return s;
      }
      continue;
    }
    keys[row.tenant_handle][row.key.name] = &row;
  }
  for (auto& [name, tp] : tenants_) {
    Tenant& t = *tp;
    const auto& wanted = keys[t.info.handle];
    for (auto it = t.keys.begin(); it != t.keys.end();) {
      const auto w = wanted.find(it->first);
      if (w != wanted.end() && w->second->key.id == it->second.id) {
        ++it;
        continue;
      }
      const uint32_t key_id = it->second.id;
      t.info.key_count--;
      t.info.parameter_bytes -= it->second.parameter_bytes();
      t.info.memory_bytes -= it->second.memory_bytes;
      t.NoteDeleted(it->second);
      t.key_names.erase(key_id);
      t.key_revisions.erase(key_id);
      it = t.keys.erase(it);
      if (observer_) observer_->OnKeyDeleted(t.info.handle, key_id);
    }
    for (const auto& [key_name, row] : wanted) {
      const auto it = t.keys.find(key_name);
      if (it == t.keys.end()) {
        KeyInfo key = row->key;
        if (!ValidKey(key) || t.key_names.count(key.id)) {
          if (Status s = bad("key " + QuoteForLog(key.name) + " (tenant handle " +
                             std::to_string(row->tenant_handle) + ", id " +
                             std::to_string(key.id) + ") is invalid");
              !s.ok()) {
            return s;
          }
          continue;
        }
        key.tenant = t.info.name;
        // Values of FROM_CLIENT keys come back only from a checkpoint.
        key.ready = key.init != InitMode::kFromClient;
        key.memory_bytes = KeyMemory(t.info, key);
        t.info.key_count++;
        t.info.parameter_bytes += key.parameter_bytes();
        t.info.memory_bytes += key.memory_bytes;
        t.next_key_id = std::max(t.next_key_id, key.id + 1);
        t.key_names.emplace(key.id, key.name);
        t.key_revisions[key.id] = row->revision;
        if (observer_) observer_->OnKeyCreated(t.info.handle, key.id);
        t.keys.emplace(key.name, std::move(key));
        continue;
      }
      KeyInfo& key = it->second;
      t.key_revisions[key.id] = row->revision;
      if (!SameSchedule(key, row->key)) {
        key.optimizer = row->key.optimizer;
        key.schedule = row->key.schedule;
        if (observer_) {
          observer_->OnOptimizerChanged(t.info.handle, key.id, key.optimizer,
                                        key.schedule.from_update);
        }
      }
    }
  }
  {
    std::lock_guard lock(revision_mu_);
    applied_revision_ = std::max(applied_revision_, c.revision);
  }
  revision_cv_.notify_all();
  return Status::Ok();
}

void Registry::Reconcile(const RegistryContents& contents) {
  std::unique_lock lock(mu_);
  (void)Apply(contents, false, store_ ? store_->where() + ": " : std::string());
}

bool Registry::shared() const { return store_ && store_->shared(); }

Status Registry::AwaitRevision(int64_t revision) {
  {
    std::unique_lock lock(revision_mu_);
    if (revision_cv_.wait_for(lock, kWatchWait, [&] { return applied_revision_ >= revision; })) {
      return Status::Ok();
    }
  }
  // The watch is slow or down (or the revision belongs to keys outside the
  // registry): read the store now; it applies contents at >= `revision`.
  return store_->Refresh();
}

Status Registry::Retrying(const std::function<Status(int64_t* revision)>& attempt) {
  // Conflicts resolve in favour of whoever wrote first, so each try makes
  // progress for someone; under a storm (every rack's workers declaring at
  // once) a writer may lose several times: retry with a small random
  // back-off, for a bounded time.
  const auto deadline = std::chrono::steady_clock::now() + kConflictWindow;
  thread_local std::minstd_rand jitter(std::random_device{}());
  for (int i = 0;; ++i) {
    int64_t revision = 0;
    Status s = attempt(&revision);
    if (s.code() != StatusCode::kAborted || !shared()) return s;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Unavailable(s.message() + " (still conflicting after " + std::to_string(i + 1) +
                         " tries in " + std::to_string(kConflictWindow.count()) + " s)");
    }
    // Another hub wrote first: wait until this hub has its change, retry.
    if (Status w = AwaitRevision(revision); !w.ok()) return w;
    const int cap = 1 << std::min(i, 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + jitter() % cap));
  }
}

}  // namespace rackhub::server
