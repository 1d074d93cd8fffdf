// RegistryStore: the SQLite RegistryBackend (registry_backend.h), the durable copy of the registry (tenants, keys, layouts,
// token hashes, quotas, optimizer schedules) in one SQLite database,
// <state.dir>/registry.db (docs/durability.md, "The state directory and the
// registry database").
//
// The schema is versioned with PRAGMA user_version (kSchemaVersion); Open
// upgrades an older file step by step (one migration function per version)
// and refuses a newer one. Every write is one transaction, committed (WAL,
// synchronous=FULL: on disk) before the call returns. A write that fails
// leaves the database as it was.
//
// Open refuses, with FAILED_PRECONDITION naming the file and the problem
// ("state.dir: /x/registry.db: file is not a database"), a file that is not a
// SQLite database, fails PRAGMA integrity_check, cannot be opened (permissions,
// a directory in its place) or has a newer schema; it never deletes or
// recreates such a file. A missing file is a first start: it is created (and
// the state directory too, mode 0700).
//
// Ownership and threads: the Registry owns its store and calls it with its
// own lock (mu_) held exclusively for writes, so calls are serialized; the
// store has no lock of its own (the connection is opened in SQLite's
// serialized mode anyway). Load is called once, before serving.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rackhub/common/status.h"
#include "registry.h"
#include "registry_backend.h"
#include "token.h"

struct sqlite3;

namespace rackhub::server {

class RegistryStore final : public RegistryBackend {
 public:
  // The schema version this build writes; files with a larger user_version
  // are refused, smaller ones are migrated.
  static constexpr int kSchemaVersion = 6;
  // PRAGMA application_id of a rackhub registry ("RHKR").
  static constexpr int32_t kApplicationId = 0x52484b52;
  static constexpr const char* kFileName = "registry.db";
  // flock'ed for the store's lifetime: one rackhubd per state directory.
  static constexpr const char* kLockFileName = "rackhubd.lock";

  // Opens <dir>/registry.db, creating the directory (0700) and the file when
  // missing; FAILED_PRECONDITION if another process holds <dir>/rackhubd.lock. `busy_timeout`: how long a write waits for a lock held by
  // another connection (an operator's sqlite3 shell) before it fails.
  static Result<std::unique_ptr<RegistryStore>> Open(
      const std::string& dir,
      std::chrono::milliseconds busy_timeout = std::chrono::milliseconds(5000));
  ~RegistryStore();
  RegistryStore(const RegistryStore&) = delete;
  RegistryStore& operator=(const RegistryStore&) = delete;

  const std::string& path() const { return path_; }

  std::string where() const override { return "state.dir: " + path_; }
  Result<Contents> Load() override;

  // Each is one transaction. INTERNAL with the SQLite message on failure
  // (nothing written). *revision is always 0 (SQLite is not shared).
  Status InsertTenant(const TenantRow& tenant, uint32_t next_handle, int64_t* revision) override;
  Status UpdateQuotas(const TenantRow& tenant, int64_t* revision) override;
  Status DeleteTenant(const TenantRow& tenant, int64_t* revision) override;
  Status InsertKey(const TenantRow& tenant, const KeyInfo& key, int64_t* revision) override;
  Status DeleteKey(const TenantRow& tenant, const KeyInfo& key, int64_t key_revision,
                   int64_t* revision) override;
  Status UpdateOptimizer(const TenantRow& tenant, const KeyInfo& key, int64_t key_revision,
                         int64_t* revision) override;

 private:
  explicit RegistryStore(std::string path) : path_(std::move(path)) {}
  Status Initialize(std::chrono::milliseconds busy_timeout);

  std::string path_;
  sqlite3* db_ = nullptr;  // owned; closed by the destructor
  int lock_fd_ = -1;       // owned; holds the state directory's flock
};

}  // namespace rackhub::server
