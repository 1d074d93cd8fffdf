// Prometheus /metrics for one rackhubd (docs/metrics.md), served by
// prometheus-cpp's pull exposer (civetweb) on metrics.listen.
//
// Nothing is recorded here: a scrape reads what the lanes and the registry
// already count (TenantCounters and its per-lane blocks, tenant_metrics.h;
// the lane threads' CPU clocks; the hub links' byte counters) and renders it,
// so serving metrics adds nothing to the data path.
//
// Beyond loopback every scrape must authenticate (config validation refuses
// otherwise): HTTP basic auth whose password is the admin token or the
// read-only token, compared in constant time; any user name.
//
// Ownership: the Hub owns it and keeps the Registry, LaneSet and DataPlane
// alive while it runs (Stop first). Threading: Start/Stop from the Hub's
// thread; scrapes run on the exposer's threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "config.h"
#include "rackhub/common/status.h"

namespace prometheus {
class Exposer;
}

namespace rackhub::server {

class DataPlane;
class LaneSet;
class Registry;

class MetricsExporter {
 public:
  MetricsExporter(const Config& config, Registry* registry, LaneSet* lanes, DataPlane* data,
                  std::string admin_token, std::string readonly_token);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Binds metrics.listen and starts serving. INTERNAL naming the field when
  // the address cannot be bound.
  Status Start();
  // Stops serving; in-flight scrapes finish first. Idempotent. Returns
  // within milliseconds (the listener is woken, not waited for).
  void Stop();
  // HOST:PORT actually bound (the port is chosen when metrics.listen has 0).
  const std::string& address() const { return address_; }

  class Collector;

 private:
  void WakeListener() const;

  const Config config_;
  const std::string admin_token_;
  const std::string readonly_token_;
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace rackhub::server
