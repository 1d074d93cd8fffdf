// ClusterMembership: this hub's entry in etcd and the list of racks from it
// (topology.racks_from = "etcd", docs/cluster.md).
//
// Join registers <prefix>hubs/<rack> = HubRecord (rack, data and interhub
// addresses, lanes) under a lease of registry.lease_ttl_s, refusing when a
// live hub with another interhub address holds the rack. WaitForRacks reads the
// entries until `count` racks are there. Start keeps the lease alive (every
// ttl/3; re-registering if etcd let it expire) and watches the entries:
// a rack whose entry goes away (its hub died or left: the lease expired or
// was revoked) is reported lost, and back when it returns. The destructor
// revokes the lease (a clean leave).
//
// Threads: Join and WaitForRacks on the caller's; Start runs two threads of
// its own, which call the callbacks (keep them short; they may post only).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "etcd_client.h"
#include "rackhub/common/status.h"

namespace rackhub::server {

class ClusterMembership {
 public:
  struct Self {
    uint32_t rack = 0;
    net::Endpoint data;
    net::Endpoint interhub;
    uint32_t lanes = 0;
  };
  static Result<std::unique_ptr<ClusterMembership>> Join(const EtcdOptions& options,
                                                         const std::string& prefix,
                                                         const Self& self, uint32_t ttl_s);
  ~ClusterMembership();

  // The addresses of racks 0..count-1 once all are registered; UNAVAILABLE
  // naming the missing racks after `timeout`.
  Result<std::vector<RackAddress>> WaitForRacks(uint32_t count, std::chrono::seconds timeout);

  // `lost(rack)` / `back(rack)` for the other racks (0..count-1).
  void Start(uint32_t count, std::function<void(uint32_t rack)> lost,
             std::function<void(uint32_t rack)> back);

  // Racks registered now (tests, status).
  std::set<uint32_t> live() const;

 private:
  ClusterMembership(std::unique_ptr<EtcdClient> client, std::string prefix, Self self,
                    uint32_t ttl_s)
      : client_(std::move(client)), prefix_(std::move(prefix)), self_(self), ttl_s_(ttl_s) {}
  Status Register();  // grants a lease and puts this hub's entry under it
  std::string HubPath(uint32_t rack) const { return prefix_ + "hubs/" + std::to_string(rack); }
  void KeepAliveLoop();
  void WatchLoop(uint32_t count);
  bool Sleep(std::chrono::milliseconds d);  // false: stopping

  std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
  const Self self_;
  const uint32_t ttl_s_;
  int64_t lease_ = 0;  // touched by Register (Join, then the keep-alive thread)
  std::function<void(uint32_t)> lost_, back_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;     // GUARDED_BY(mu_)
  std::set<uint32_t> live_;   // GUARDED_BY(mu_)
  std::thread keepalive_, watcher_;
};

}  // namespace rackhub::server
