// EtcdRegistryStore: the registry in etcd, shared by the hubs of a cluster
// (registry.backend = "etcd"; docs/cluster.md). A RegistryBackend.
//
// Layout under the prefix P (registry.etcd_prefix, default "/rackhub/"):
//   P meta/next_handle        decimal: the next tenant handle
//   P tenants/<name>          rackhub.cluster.v1.TenantRecord
//   P keys/<handle>/<name>    rackhub.cluster.v1.KeyRecord
//   P hubs/<rack>             HubRecord, under the hub's lease (membership.h)
// Writes are transactions whose compares name the revisions the Registry
// based them on (tenant rows carry the next key id and the next chunk, so
// two hubs can never give two keys the same chunks); a failed compare is
// ABORTED with the store's revision. Every hub watches the prefix and hands
// the whole contents to the Registry after each change.
//
// Threads: writes come from the Registry (its lock held); the watch runs on
// a thread of this store, started by Watch, stopped by the destructor. When
// the watch breaks it re-reads everything and watches again (every
// `retry`), so changes made while etcd was away are picked up.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "etcd_client.h"
#include "registry_backend.h"

namespace rackhub::server {

class EtcdRegistryStore final : public RegistryBackend {
 public:
  // Connects (EtcdClient::Connect): UNAVAILABLE naming the endpoints when
  // etcd cannot be reached; the caller fails start-up with it.
  static Result<std::unique_ptr<EtcdRegistryStore>> Open(const EtcdOptions& options,
                                                          const std::string& prefix);
  ~EtcdRegistryStore() override;

  std::string where() const override;
  Result<Contents> Load() override;
  Status InsertTenant(const TenantRow& tenant, uint32_t next_handle, int64_t* revision) override;
  Status UpdateQuotas(const TenantRow& tenant, int64_t* revision) override;
  Status DeleteTenant(const TenantRow& tenant, int64_t* revision) override;
  Status InsertKey(const TenantRow& tenant, const KeyInfo& key, int64_t* revision) override;
  Status DeleteKey(const TenantRow& tenant, const KeyInfo& key, int64_t key_revision,
                   int64_t* revision) override;
  Status UpdateOptimizer(const TenantRow& tenant, const KeyInfo& key, int64_t key_revision,
                         int64_t* revision) override;
  bool shared() const override { return true; }
  void Watch(std::function<void(const Contents&)> apply, int64_t after_revision) override;
  Status Refresh() override;

  EtcdClient* client() { return client_.get(); }
  const std::string& prefix() const { return prefix_; }

  // Record <-> etcd value conversions (also used by tests).
  static std::string EncodeTenant(const TenantRow& row);
  static std::string EncodeKey(uint32_t tenant_handle, const KeyInfo& key);

 private:
  EtcdRegistryStore(std::unique_ptr<EtcdClient> client, std::string prefix)
      : client_(std::move(client)), prefix_(std::move(prefix)) {}
  std::string TenantPath(const std::string& name) const { return prefix_ + "tenants/" + name; }
  std::string KeyPath(uint32_t handle, const std::string& name) const;
  std::string MetaPath() const { return prefix_ + "meta/next_handle"; }
  // The registry's rows from the etcd keys under the prefix (others ignored).
  Contents Parse(const std::map<std::string, std::string>& kvs, int64_t revision) const;
  // Runs a transaction; ABORTED naming `what` if a compare failed.
  Status Commit(const etcdserverpb::TxnRequest& txn, const std::string& what, int64_t* revision);
  void WatchLoop(std::function<void(const Contents&)> apply, int64_t after_revision);

  std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
  std::function<void(const Contents&)> apply_;  // set once by Watch
  std::thread watcher_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // GUARDED_BY(stop_mu_)
};

}  // namespace rackhub::server
