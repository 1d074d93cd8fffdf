#include "metrics_exporter.h"

#include <future>
#include <limits>
#include <stdexcept>
#include <thread>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <spdlog/spdlog.h>

#include "data_plane.h"
#include "lanes.h"
#include "rackhub/net/frame.h"
#include "registry.h"

#ifndef RACKHUB_VERSION
#define RACKHUB_VERSION "0.0.0"
#endif

namespace rackhub::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(MetricFamily& f, Labels labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

void AddHistogram(MetricFamily& f, Labels labels, const LatencyHistogram::Snapshot& s) {
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.sample_count = s.count;
  m.histogram.sample_sum = s.sum_seconds;
  uint64_t cumulative = 0;
  for (int i = 0; i < LatencyHistogram::kBounds; ++i) {
    cumulative += s.counts[i];
    m.histogram.bucket.push_back({cumulative, LatencyHistogram::BoundSeconds(i)});
  }
  m.histogram.bucket.push_back({s.count, std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
}

bool SameSecret(const std::string& given, const std::string& secret) {
  return !secret.empty() && given.size() == secret.size() &&
         CRYPTO_memcmp(given.data(), secret.data(), secret.size()) == 0;
}

}  // namespace

class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  Collector(Registry* registry, LaneSet* lanes, DataPlane* data)
      : registry_(registry), lanes_(lanes), data_(data) {}

  std::vector<MetricFamily> Collect() const override {
    auto pushes = Family("rackhub_pushes_total", "PUSH frames counted into a sum",
                         MetricType::Counter);
    auto in = Family("rackhub_received_bytes_total",
                     "bytes of PUSH and INIT frames from the tenant's workers, headers included",
                     MetricType::Counter);
    auto out = Family("rackhub_sent_bytes_total", "bytes written to the tenant's workers",
                      MetricType::Counter);
    auto iterations = Family("rackhub_iterations_total",
                             "updates of the first chunk of every key (one per key and step)",
                             MetricType::Counter);
    auto errors = Family("rackhub_errors_total", "ERROR frames sent to the tenant's workers",
                         MetricType::Counter);
    auto workers = Family("rackhub_workers_connected", "workers connected (lane 0 connections)",
                          MetricType::Gauge);
    auto latency = Family("rackhub_update_latency_seconds",
                          "first contribution of a chunk update to its replies being queued",
                          MetricType::Histogram);
    auto lateness = Family("rackhub_rank_lateness_seconds",
                           "how long after an update's first contribution this worker's arrived "
                           "(what the others waited for it)",
                           MetricType::Histogram);
    auto stragglers = Family("rackhub_stragglers_total",
                             "iterations aborted by data.straggler_timeout_ms", MetricType::Counter);
    auto lost = Family("rackhub_workers_lost_total", "worker connections closed without BYE",
                       MetricType::Counter);
    auto holds = Family("rackhub_intake_holds_total",
                        "times a worker connection was not read for running ahead of the "
                        "others (data.intake_lead_bytes)",
                        MetricType::Counter);
    auto checkpoints = Family("rackhub_checkpoints_total", "checkpoints written",
                              MetricType::Counter);
    auto ck_seconds = Family("rackhub_checkpoint_duration_seconds",
                             "duration of the newest checkpoint", MetricType::Gauge);
    auto ck_bytes = Family("rackhub_checkpoint_size_bytes",
                           "size on disk of the newest checkpoint", MetricType::Gauge);
    auto memory = Family("rackhub_tenant_memory_bytes",
                         "hub memory of the chunks created so far (parameters, their double "
                         "buffer, optimizer state, accumulators, parked contributions)",
                         MetricType::Gauge);
    auto reserved = Family("rackhub_tenant_memory_reserved_bytes",
                           "hub memory the tenant's keys may hold (counted against its quota)",
                           MetricType::Gauge);
    auto keys = Family("rackhub_tenant_keys", "keys of the tenant", MetricType::Gauge);
    auto members = Family("rackhub_elastic_members",
                          "members of an elastic tenant's current membership",
                          MetricType::Gauge);
    auto generation = Family("rackhub_elastic_membership_generation",
                             "an elastic tenant's membership generation (+1 per change)",
                             MetricType::Gauge);
    auto paused = Family("rackhub_elastic_paused",
                         "1 while an elastic tenant is paused (fewer members than min_workers)",
                         MetricType::Gauge);

    for (const TenantInfo& t : registry_->ListTenants()) {
      const TenantCounters& c = *t.counters;
      const TenantLaneSlots::Totals sum = c.lanes.Sum();
      const Labels tenant{{"tenant", t.name}};
      AddValue(pushes, tenant, static_cast<double>(sum.pushes));
      AddValue(in, tenant, static_cast<double>(sum.bytes_in));
      AddValue(out, tenant, static_cast<double>(sum.bytes_out));
      AddValue(iterations, tenant, static_cast<double>(c.iterations_completed.load()));
      for (uint32_t code = 1; code < kErrorCodeSlots; ++code) {
        if (sum.errors_by_code[code] == 0) continue;
        AddValue(errors,
                 {{"tenant", t.name},
                  {"code", net::WireErrorName(static_cast<net::WireError>(code))}},
                 static_cast<double>(sum.errors_by_code[code]));
      }
      AddValue(workers, tenant, c.workers_connected.load());
      AddHistogram(latency, tenant, sum.update_latency);
      for (uint32_t m = 0; m < sum.rank_lateness.size(); ++m) {
        if (sum.rank_lateness[m].count == 0) continue;
        AddHistogram(lateness,
                     {{"tenant", t.name},
                      {"rack", std::to_string(m / t.rank_slots())},
                      {"rank", std::to_string(m % t.rank_slots())}},
                     sum.rank_lateness[m]);
      }
      AddValue(stragglers, tenant, static_cast<double>(c.stragglers.load()));
      AddValue(lost, tenant, static_cast<double>(c.workers_lost.load()));
      AddValue(holds, tenant, static_cast<double>(c.intake_holds.load()));
      AddValue(checkpoints, tenant, static_cast<double>(c.checkpoints.load()));
      AddValue(ck_seconds, tenant, static_cast<double>(c.last_checkpoint_us.load()) * 1e-6);
      AddValue(ck_bytes, tenant, static_cast<double>(c.last_checkpoint_bytes.load()));
      AddValue(memory, tenant, static_cast<double>(c.memory_bytes_allocated.load()));
      AddValue(reserved, tenant, static_cast<double>(t.memory_bytes));
      AddValue(keys, tenant, t.key_count);
      if (t.elastic) {
        AddValue(members, tenant, c.members.load());
        AddValue(generation, tenant, static_cast<double>(c.membership_generation.load()));
        AddValue(paused, tenant, c.paused.load() ? 1 : 0);
      }
    }

    auto busy = Family("rackhub_lane_busy_seconds_total",
                       "CPU time of the lane's thread; rate() of it is the lane's busy ratio",
                       MetricType::Counter);
    const std::vector<double> seconds = lanes_->BusySeconds();
    for (uint32_t l = 0; l < seconds.size(); ++l) {
      AddValue(busy, {{"lane", std::to_string(l)}}, seconds[l]);
    }
    auto link_out = Family("rackhub_hub_link_sent_bytes_total",
                           "bytes sent to another rack's hub (all lanes)", MetricType::Counter);
    auto link_in = Family("rackhub_hub_link_received_bytes_total",
                          "bytes received from another rack's hub (all lanes)",
                          MetricType::Counter);
    for (const auto& l : data_->RackLinks()) {
      const Labels link{{"link", "rack" + std::to_string(l.rack)}};
      AddValue(link_out, link, static_cast<double>(l.bytes_out));
      AddValue(link_in, link, static_cast<double>(l.bytes_in));
    }
    auto info = Family("rackhub_build_info", "the daemon's version (value 1)", MetricType::Gauge);
    AddValue(info, {{"version", RACKHUB_VERSION}}, 1);
    auto start = Family("rackhub_start_time_seconds", "when this daemon started (Unix time)",
                        MetricType::Gauge);
    AddValue(start, {}, started_unix_);

    std::vector<MetricFamily> all;
    for (MetricFamily* f : {&pushes, &in, &out, &iterations, &errors, &workers, &latency, &lateness,
                            &stragglers, &lost, &holds, &checkpoints, &ck_seconds, &ck_bytes, &memory,
                            &reserved, &keys, &members, &generation, &paused, &busy, &link_out, &link_in, &info, &start}) {
      all.push_back(std::move(*f));
    }
    return all;
  }

 private:
  Registry* registry_;
  LaneSet* lanes_;
  DataPlane* data_;
  const double started_unix_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
};

MetricsExporter::MetricsExporter(const Config& config, Registry* registry, LaneSet* lanes,
                                 DataPlane* data, std::string admin_token,
                                 std::string readonly_token)
    : config_(config),
      admin_token_(std::move(admin_token)),
      readonly_token_(std::move(readonly_token)),
      collector_(std::make_shared<Collector>(registry, lanes, data)) {}

MetricsExporter::~MetricsExporter() { Stop(); }

Status MetricsExporter::Start() {
  const net::Endpoint& want = config_.metrics.listen;
  // civetweb's listening_ports syntax: "HOST:PORT", IPv6 as "[HOST]:PORT".
  const std::string bind =
      (want.host.find(':') != std::string::npos ? "[" + want.host + "]" : want.host) + ":" +
      std::to_string(want.port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind, 2);
  } catch (const std::exception& e) {
    return Internal("metrics.listen: cannot listen on " + want.ToString() + " (" + e.what() +
                    "; address in use or not local?)");
  }
  // Authentication first: civetweb already listens, and /metrics must never
  // be served without it.
  if (!want.IsLoopback()) {
    exposer_->RegisterAuth(
        [this](const std::string& /*user*/, const std::string& password) {
          return SameSecret(password, admin_token_) || SameSecret(password, readonly_token_);
        },
        "rackhub");
  }
  exposer_->RegisterCollectable(collector_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  net::Endpoint bound = want;
  if (!ports.empty()) bound.port = static_cast<uint16_t>(ports.front());
  address_ = bound.ToString();
  spdlog::info("metrics on http://{}/metrics{}", address_,
               want.IsLoopback() ? "" : " (basic auth: the admin or read-only token)");
  return {};
}

void MetricsExporter::Stop() {
  if (!exposer_) return;
  exposer_->RemoveCollectable(collector_);
  // civetweb's listener sleeps in poll() for up to 2 s between looks at its
  // stop flag, and mg_stop waits for it: every daemon stop took 2 s. A
  // connection to the listening port wakes it; one made before mg_stop set
  // the flag is served as a scrape and the listener sleeps again, so poke
  // until the exposer is gone (each poke is a loopback connect, refused at
  // once after the port closed).
  std::promise<void> stopped;
  std::future<void> done = stopped.get_future();
  std::thread stopper([this, &stopped] {
    exposer_.reset();
    stopped.set_value();
  });
  while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    WakeListener();
  }
  stopper.join();
}

void MetricsExporter::WakeListener() const {
  // The bound address; an unspecified host is reached through loopback.
  const size_t colon = address_.rfind(':');
  if (colon == std::string::npos) return;
  std::string host = address_.substr(0, colon);
  const std::string port = address_.substr(colon + 1);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) return;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    (void)connect(fd, found->ai_addr, found->ai_addrlen);
    close(fd);
  }
  freeaddrinfo(found);
}

}  // namespace rackhub::server
