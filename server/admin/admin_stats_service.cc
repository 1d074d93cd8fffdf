// StatsService: GetStats (counters, latency histograms, lanes, hub links)
// and ListStalls (the stall inspector), read-only; see admin_service.h.
#include <algorithm>

#include "admin_service.h"
#include "rackhub/net/frame.h"

namespace rackhub::server {
namespace {

namespace pb = rackhub::admin::v1;

constexpr uint32_t kDefaultStallMs = 1000;
constexpr uint32_t kDefaultMaxStalls = 1000;

void HistogramToProto(const LatencyHistogram::Snapshot& s, pb::LatencyHistogram* out) {
  for (int i = 0; i < LatencyHistogram::kBounds; ++i) {
    out->add_upper_bounds_seconds(LatencyHistogram::BoundSeconds(i));
  }
  for (uint64_t c : s.counts) out->add_counts(c);
  out->set_sum_seconds(s.sum_seconds);
  out->set_count(s.count);
}

void TenantToProto(const TenantInfo& t, pb::TenantStats* ts) {
  const TenantCounters& c = *t.counters;
  const TenantLaneSlots::Totals lanes = c.lanes.Sum();
  ts->set_name(t.name);
  ts->set_keys(t.key_count);
  ts->set_parameter_bytes(t.parameter_bytes);
  ts->set_chunks(t.chunk_count);
  ts->set_workers_connected(c.workers_connected.load(std::memory_order_relaxed));
  ts->set_pushes(lanes.pushes);
  ts->set_bytes_in(lanes.bytes_in);
  ts->set_bytes_out(lanes.bytes_out);
  ts->set_iterations_completed(c.iterations_completed.load(std::memory_order_relaxed));
  ts->set_errors(lanes.errors);
  ts->set_memory_bytes(t.memory_bytes);
  ts->set_memory_bytes_allocated(c.memory_bytes_allocated.load(std::memory_order_relaxed));
  HistogramToProto(lanes.update_latency, ts->mutable_update_latency());
  for (uint32_t m = 0; m < lanes.rank_lateness.size(); ++m) {
    if (lanes.rank_lateness[m].count == 0) continue;
    auto* r = ts->add_ranks();
    r->set_rack(m / t.rank_slots());
    r->set_rank(m % t.rank_slots());
    HistogramToProto(lanes.rank_lateness[m], r->mutable_lateness());
  }
  ts->set_workers_lost(c.workers_lost.load(std::memory_order_relaxed));
  ts->set_stragglers(c.stragglers.load(std::memory_order_relaxed));
  if (t.elastic) {
    ts->set_elastic(true);
    ts->set_membership_generation(c.membership_generation.load(std::memory_order_relaxed));
    ts->set_members(c.members.load(std::memory_order_relaxed));
    ts->set_paused(c.paused.load(std::memory_order_relaxed));
  }
  for (uint32_t code = 1; code < kErrorCodeSlots; ++code) {
    if (lanes.errors_by_code[code] == 0) continue;
    auto* e = ts->add_errors_by_code();
    e->set_code(net::WireErrorName(static_cast<net::WireError>(code)));
    e->set_count(lanes.errors_by_code[code]);
  }
  ts->set_checkpoints(c.checkpoints.load(std::memory_order_relaxed));
  ts->set_last_checkpoint_micros(c.last_checkpoint_us.load(std::memory_order_relaxed));
  ts->set_last_checkpoint_bytes(c.last_checkpoint_bytes.load(std::memory_order_relaxed));
}

class StatsServiceImpl final : public pb::StatsService::Service {
 public:
  StatsServiceImpl(Registry* r, const AdminAuth* a, std::shared_ptr<DaemonIdentity> id)
      : registry_(r), auth_(a), identity_(std::move(id)) {}

  grpc::Status GetStats(grpc::ServerContext* ctx, const pb::GetStatsRequest* req,
                        pb::GetStatsResponse* resp) override {
    if (auto s = auth_->Check(ctx, false, "GetStats"); !s.ok()) return s;
    std::vector<TenantInfo> tenants;
    if (req->tenant().empty()) {
      tenants = registry_->ListTenants();
    } else {
      TenantInfo t;
      if (auto s = ToGrpc(registry_->GetTenant(req->tenant(), &t)); !s.ok()) return s;
      tenants.push_back(std::move(t));
    }
    for (const auto& t : tenants) TenantToProto(t, resp->add_tenants());
    // Daemon-wide figures always cover every tenant.
    auto* d = resp->mutable_daemon();
    const auto all = req->tenant().empty() ? tenants : registry_->ListTenants();
    for (const auto& t : all) {
      const TenantCounters& c = *t.counters;
      const TenantLaneSlots::Totals lanes = c.lanes.Sum();
      d->set_workers_connected(d->workers_connected() +
                               c.workers_connected.load(std::memory_order_relaxed));
      d->set_pushes(d->pushes() + lanes.pushes);
      d->set_bytes_in(d->bytes_in() + lanes.bytes_in);
      d->set_bytes_out(d->bytes_out() + lanes.bytes_out);
      d->set_memory_bytes_allocated(d->memory_bytes_allocated() +
                                    c.memory_bytes_allocated.load(std::memory_order_relaxed));
    }
    const auto totals = registry_->GetTotals();
    d->set_version(identity_->version);
    d->set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - identity_->started)
                         .count());
    d->set_lanes(registry_->lanes());
    d->set_tenants(totals.tenants);
    d->set_keys(totals.keys);
    d->set_parameter_bytes(totals.parameter_bytes);
    d->set_memory_bytes(totals.memory_bytes);
    {
      std::lock_guard lock(identity_->addresses_mu);
      d->set_data_listen(identity_->data_listen);
      d->set_admin_listen(identity_->admin_listen);
    }
    d->set_rack(identity_->rack);
    d->set_racks(identity_->racks);
    if (identity_->rack_links) {
      for (const auto& l : identity_->rack_links()) {
        auto* link = d->add_rack_links();
        link->set_peer_rack(l.peer_rack);
        link->set_bytes_out(l.bytes_out);
        link->set_bytes_in(l.bytes_in);
        link->set_chunk_bytes_out(l.chunk_bytes_out);
      }
    }
    if (identity_->lanes) {
      const std::vector<LaneInfo> lanes = identity_->lanes();
      for (uint32_t i = 0; i < lanes.size(); ++i) {
        auto* l = d->add_lane_stats();
        l->set_lane(i);
        l->set_cpu(lanes[i].cpu);
        l->set_busy_seconds(lanes[i].busy_seconds);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status ListStalls(grpc::ServerContext* ctx, const pb::ListStallsRequest* req,
                          pb::ListStallsResponse* resp) override {
    if (auto s = auth_->Check(ctx, false, "ListStalls"); !s.ok()) return s;
    if (!identity_->stalls) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "stalls: no data plane");
    }
    uint32_t handle = 0;
    if (!req->tenant().empty()) {
      TenantInfo t;
      if (auto s = ToGrpc(registry_->GetTenant(req->tenant(), &t)); !s.ok()) return s;
      handle = t.handle;
    }
    const uint32_t min_ms = req->min_wait_ms() == 0 ? kDefaultStallMs : req->min_wait_ms();
    const uint32_t max = req->max_stalls() == 0 ? kDefaultMaxStalls : req->max_stalls();
    std::vector<uint32_t> unanswered;
    const std::vector<StallEntry> stalls =
        identity_->stalls(handle, std::chrono::milliseconds(min_ms), &unanswered);
    resp->set_total(static_cast<uint32_t>(stalls.size()));
    for (size_t i = 0; i < stalls.size() && i < max; ++i) {
      const StallEntry& e = stalls[i];
      auto* s = resp->add_stalls();
      s->set_tenant(e.tenant);
      s->set_key(e.key);
      s->set_chunk(e.chunk);
      s->set_update(e.update);
      s->set_lane(e.lane);
      s->set_rack(e.rack);
      s->set_waiting_ms(
          std::chrono::duration_cast<std::chrono::milliseconds>(e.waiting).count());
      for (uint32_t r : e.pushed) s->add_pushed_ranks(r);
      for (uint32_t r : e.missing) s->add_missing_ranks(r);
      for (uint32_t r : e.disconnected) s->add_disconnected_ranks(r);
      s->set_cross_rack(e.cross_rack);
    }
    for (uint32_t l : unanswered) resp->add_unanswered_lanes(l);
    return grpc::Status::OK;
  }

 private:
  Registry* registry_;
  const AdminAuth* auth_;
  std::shared_ptr<DaemonIdentity> identity_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeStatsService(Registry* registry, const AdminAuth* auth,
                                                std::shared_ptr<DaemonIdentity> identity) {
  return std::make_unique<StatsServiceImpl>(registry, auth, std::move(identity));
}

}  // namespace rackhub::server
