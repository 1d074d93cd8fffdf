#include "fair_scheduler.h"

#include <algorithm>

namespace rackhub::server {

FairScheduler::FairScheduler(LaneGate* gate, std::function<uint32_t(uint32_t)> weight_of)
    : gate_(gate), weight_of_(std::move(weight_of)) {}

void FairScheduler::RequestTurn(std::shared_ptr<net::Connection> conn, size_t bytes) {
  const uint32_t tenant = conn->id().tenant_handle;
  const uint32_t weight = std::clamp<uint32_t>(weight_of_(tenant), 1, kMaxWeight);
  Flow& f = flows_[tenant];
  const uint64_t start = std::max(virtual_time_, f.finish);
  f.finish = start + std::min<uint64_t>(bytes, kMaxBytes) * kScale / weight;
  const uint64_t arrival = arrivals_++;
  if (f.requests.empty()) ready_.emplace(start, arrival, tenant);
  f.requests.push_back({std::move(conn), start, arrival});
  ++queued_;
  PostStep();
}

void FairScheduler::Clear() {
  flows_.clear();
  ready_.clear();
  queued_ = 0;
}

void FairScheduler::Forget(uint32_t tenant) {
  auto it = flows_.find(tenant);
  if (it != flows_.end() && it->second.requests.empty()) flows_.erase(it);
}

void FairScheduler::PostStep() {
  if (step_posted_ || ready_.empty()) return;
  step_posted_ = true;
  gate_->Post([this] {
    step_posted_ = false;
    Step();
  });
}

void FairScheduler::Step() {
  if (ready_.empty()) return;
  const auto [start, unused_arrival, tenant] = *ready_.begin();
  ready_.erase(ready_.begin());
  Flow& f = flows_[tenant];
  Request r = std::move(f.requests.front());
  f.requests.pop_front();
  --queued_;
  virtual_time_ = std::max(virtual_time_, start);
  if (!f.requests.empty()) {
    ready_.emplace(f.requests.front().start, f.requests.front().arrival, tenant);
  } else if (f.finish <= virtual_time_ || weight_of_(tenant) == 0) {
    flows_.erase(tenant);  // nothing it could claim, or the tenant is gone
  }
  if (virtual_time_ >= kRebaseAt) Rebase();
  PostStep();  // the next turn, after the frames that arrive meanwhile
  r.conn->DeliverTurn();
}

void FairScheduler::Rebase() {
  const uint64_t base = virtual_time_;
  const auto shift = [base](uint64_t tag) { return tag > base ? tag - base : 0; };
  virtual_time_ = 0;
  std::set<std::tuple<uint64_t, uint64_t, uint32_t>> ready;
  for (auto& [start, arrival, tenant] : ready_) ready.emplace(shift(start), arrival, tenant);
  ready_ = std::move(ready);
  for (auto& [tenant, f] : flows_) {
    f.finish = shift(f.finish);
    for (Request& r : f.requests) r.start = shift(r.start);
  }
}

}  // namespace rackhub::server
