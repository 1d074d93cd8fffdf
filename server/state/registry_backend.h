// RegistryBackend: where the registry's durable copy lives (docs/cluster.md,
// docs/durability.md). Two implementations:
//   RegistryStore      SQLite in state.dir, one hub (registry.backend = "sqlite",
//                      the default); the Registry applies its own writes.
//   EtcdRegistryStore  etcd's v3 API, shared by the hubs of a cluster
//                      (registry.backend = "etcd"). Writes are compare-and-swap
//                      transactions against the revisions the Registry last
//                      saw; every change, this hub's own included, comes back
//                      through Watch and is applied by Registry::Reconcile.
//
// Rows carry the store revision they were read at (etcd mod_revision; 0 for
// SQLite): a write names the revisions it is based on, and a shared store
// refuses it with ABORTED if someone else wrote first (*revision is then the
// store's revision at the refusal, to wait for before retrying).
//
// Ownership and threads: the Registry owns its backend and calls the write
// methods with its lock held exclusively (serialized); Load before serving;
// Watch once, after Load. Watch's callback runs on the backend's own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rackhub/common/status.h"
#include "registry.h"
#include "token.h"

namespace rackhub::server {

// One tenant. key_count / parameter_bytes / chunk_count / counters of
// `info` are not stored (they follow from the keys).
struct StoredTenant {
  TenantInfo info;
  TokenHash token;
  uint32_t next_key_id = 1;  // ids are never reused
  uint64_t next_chunk = 0;   // the layout's next free chunk index
  int64_t revision = 0;      // of this row in a shared store
};
struct StoredKey {
  uint32_t tenant_handle = 0;
  KeyInfo key;  // `ready` is not stored
  int64_t revision = 0;
};
struct RegistryContents {
  uint32_t next_handle = 1;          // tenant handles are never reused
  std::vector<StoredTenant> tenants;  // by handle
  std::vector<StoredKey> keys;        // by tenant handle, then id
  int64_t revision = 0;              // the store's revision they were read at
};

class RegistryBackend {
 public:
  using TenantRow = StoredTenant;
  using KeyRow = StoredKey;
  using Contents = RegistryContents;

  virtual ~RegistryBackend() = default;

  // Names the store in messages: "state.dir: /var/lib/rackhub/registry.db",
  // "registry.etcd: 10.0.0.1:2379 /rackhub/".
  virtual std::string where() const = 0;
  virtual Result<Contents> Load() = 0;

  // Each is one transaction; a failure writes nothing (INTERNAL, or for etcd
  // UNAVAILABLE when it cannot be reached and ABORTED on a conflict).
  // `tenant` is the row as it is after the change; `next_handle` the
  // handle counter after it.
  virtual Status InsertTenant(const TenantRow& tenant, uint32_t next_handle,
                              int64_t* revision) = 0;
  // Stores tenant.info.quotas.
  virtual Status UpdateQuotas(const TenantRow& tenant, int64_t* revision) = 0;
  virtual Status DeleteTenant(const TenantRow& tenant, int64_t* revision) = 0;  // and its keys
  // `tenant` carries next_key_id and next_chunk after the key.
  virtual Status InsertKey(const TenantRow& tenant, const KeyInfo& key, int64_t* revision) = 0;
  virtual Status DeleteKey(const TenantRow& tenant, const KeyInfo& key, int64_t key_revision,
                           int64_t* revision) = 0;
  // Stores key.optimizer and key.schedule.
  virtual Status UpdateOptimizer(const TenantRow& tenant, const KeyInfo& key,
                                 int64_t key_revision, int64_t* revision) = 0;

  // True for a store several hubs share: the Registry then applies changes
  // only from Watch.
  virtual bool shared() const { return false; }
  // Shared stores: calls `apply` with the whole contents after every change
  // (revision > after_revision), from its own thread, until destroyed.
  virtual void Watch(std::function<void(const Contents&)> apply, int64_t after_revision) {
    (void)apply;
    (void)after_revision;
  }
  // Shared stores: reads the whole contents now and calls `apply` with them
  // on the calling thread (for a writer that must not wait for the watch).
  virtual Status Refresh() { return Status::Ok(); }
};

}  // namespace rackhub::server
