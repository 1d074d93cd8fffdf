// FairScheduler: the order in which one lane handles its tenants' received
// frames (docs/architecture.md, "Fair share of a lane"). Worker connections
// ask it for a turn once they hold a complete frame (net::DeliveryScheduler);
// it grants turns by weighted fair queueing over tenants, in its start-time
// form (SFQ, Goyal et al. 1996): every request gets a virtual start tag
//   S = max(V, F[tenant]),  F[tenant] = S + bytes / weight
// where V is the start tag of the last request granted, and the smallest
// start tag goes first (ties: the order asked). While several tenants have
// work waiting, each gets the lane in proportion to its weight, measured in
// bytes handled, whatever the number of its connections or the size of its
// frames; a tenant that was idle starts at V (it saves no credit) and its
// first frame waits for at most one batch of every other tenant, not for
// their backlog. A lone tenant is never held back. Within a tenant,
// connections go in the order they asked.
//
// One turn is granted per posted step, so the frames that arrive meanwhile
// (other connections' reads completing on the lane) are tagged before the
// next choice.
//
// Ownership: the lane's WorkerProtocol owns it; queued requests hold their
// connections until granted or Clear(). The weight function is the lane's.
// Threading: the lane's thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "lane_gate.h"
#include "rackhub/net/transport.h"

namespace rackhub::server {

class FairScheduler final : public net::DeliveryScheduler {
 public:
  // `weight_of(tenant_handle)`: the tenant's weight now, in [1, kMaxWeight];
  // 0 for a tenant that no longer exists (its last requests are still
  // granted, then it is forgotten).
  FairScheduler(LaneGate* gate, std::function<uint32_t(uint32_t)> weight_of);

  void RequestTurn(std::shared_ptr<net::Connection> conn, size_t bytes) override;
  // Drops every queued request (shutdown): no DeliverTurn follows.
  void Clear();
  // The tenant was deleted: forget its finish tag (its connections are
  // closed; requests still queued are granted and do nothing).
  void Forget(uint32_t tenant);

  // Tenants with a turn waiting, and requests queued (tests, stats).
  size_t active_tenants() const { return ready_.size(); }
  size_t queued() const { return queued_; }
  // Tenants it keeps a finish tag for (waiting, or ahead of V).
  size_t tracked_tenants() const { return flows_.size(); }

  static constexpr uint32_t kMaxWeight = 1000;

 private:
  struct Request {
    std::shared_ptr<net::Connection> conn;
    uint64_t start = 0;    // virtual start tag
    uint64_t arrival = 0;  // tie-break: the order asked
  };
  struct Flow {
    std::deque<Request> requests;  // start tags ascending
    uint64_t finish = 0;           // F: finish tag of its last request
  };

  void PostStep();
  void Step();
  // Keeps tags small: subtracts V from every tag once V passes kRebaseAt.
  void Rebase();

  // Virtual time is in bytes x kScale / weight (truncated: an error below
  // 2^-20 of a byte per request). Bytes per request are capped at kMaxBytes
  // (a turn never holds more than one frame larger than the buffer, and a
  // frame's payload is at most 4 GiB), so a cost fits in 2^56 and a tag,
  // rebased at 2^52, in 2^57.
  static constexpr uint64_t kScale = uint64_t{1} << 20;
  static constexpr uint64_t kMaxBytes = uint64_t{1} << 36;
  static constexpr uint64_t kRebaseAt = uint64_t{1} << 52;

  LaneGate* gate_;
  std::function<uint32_t(uint32_t)> weight_of_;
  std::unordered_map<uint32_t, Flow> flows_;  // by tenant handle
  // (start tag of the head request, arrival number, tenant) of every tenant
  // with requests: the next to go is the first.
  std::set<std::tuple<uint64_t, uint64_t, uint32_t>> ready_;
  uint64_t virtual_time_ = 0;  // V
  uint64_t arrivals_ = 0;
  size_t queued_ = 0;
  bool step_posted_ = false;
};

}  // namespace rackhub::server
