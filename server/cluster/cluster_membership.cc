#include "cluster_membership.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "rackhub/cluster/v1/records.pb.h"

namespace rackhub::server {
namespace {

namespace pb = etcdserverpb;
namespace rec = rackhub::cluster::v1;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The rack of "<prefix>hubs/<rack>", or -1.
int64_t RackOf(const std::string& key, const std::string& hubs) {
  if (key.compare(0, hubs.size(), hubs) != 0 || key.size() == hubs.size()) return -1;
  const std::string tail = key.substr(hubs.size());
  if (tail.find_first_not_of("0123456789") != std::string::npos || tail.size() > 9) return -1;
  return std::stoll(tail);
}

}  // namespace

Result<std::unique_ptr<ClusterMembership>> ClusterMembership::Join(const EtcdOptions& options,
                                                                   const std::string& prefix,
                                                                   const Self& self,
                                                                   uint32_t ttl_s) {
  Result<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options, prefix + "hubs/");
  if (!client.ok()) return client.status();
  std::unique_ptr<ClusterMembership> m(
      new ClusterMembership(*std::move(client), prefix, self, ttl_s));
  if (Status s = m->Register(); !s.ok()) return s;
  return m;
}

ClusterMembership::~ClusterMembership() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  client_->Cancel();
  if (keepalive_.joinable()) keepalive_.join();
  if (watcher_.joinable()) watcher_.join();
  // A clean leave: the others see this rack go at once, not after the TTL.
  if (lease_ != 0) (void)client_->LeaseRevoke(lease_);
}

Status ClusterMembership::Register() {
  Result<int64_t> lease = client_->LeaseGrant(ttl_s_);
  if (!lease.ok()) return lease.status();
  rec::HubRecord r;
  r.set_rack(self_.rack);
  r.set_data_address(self_.data.ToString());
  r.set_interhub_address(self_.interhub.ToString());
  r.set_lanes(self_.lanes);
  r.set_version(RACKHUB_VERSION);
  r.set_started_unix_ms(NowMs());
  const std::string path = HubPath(self_.rack);
  pb::TxnRequest txn;
  auto* c = txn.add_compare();
  c->set_result(pb::Compare::EQUAL);
  c->set_target(pb::Compare::CREATE);
  c->set_key(path);
  c->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(path);
  put->set_value(r.SerializeAsString());
  put->set_lease(*lease);
  txn.add_failure()->mutable_request_range()->set_key(path);
  Result<pb::TxnResponse> resp = client_->Txn(txn);
  if (!resp.ok()) return resp.status().WithContext("topology.racks_from: registering this hub");
  if (!resp->succeeded()) {
    // Someone holds the rack: this hub before a restart (the same interhub
    // address, which only one process can listen on: take it over) or
    // another live hub (refuse).
    rec::HubRecord other;
    const auto& kvs = resp->responses(0).response_range().kvs();
    if (!kvs.empty() && other.ParseFromString(kvs[0].value()) &&
        other.interhub_address() != r.interhub_address()) {
      (void)client_->LeaseRevoke(*lease);
      return FailedPrecondition("topology.rack: rack " + std::to_string(self_.rack) +
                                " is already registered in etcd by a live hub (data " +
                                other.data_address() + ", interhub " +
                                other.interhub_address() + "); give each hub its own rack");
    }
    pb::PutRequest again;
    again.set_key(path);
    again.set_value(r.SerializeAsString());
    again.set_lease(*lease);
    if (Result<pb::PutResponse> p = client_->Put(again); !p.ok()) return p.status();
  }
  lease_ = *lease;
  spdlog::info("cluster: rack {} registered in etcd ({}) under lease {:x}, ttl {} s", self_.rack,
               client_->endpoints(), lease_, ttl_s_);
  return Status::Ok();
}

Result<std::vector<RackAddress>> ClusterMembership::WaitForRacks(uint32_t count,
                                                                 std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string hubs = prefix_ + "hubs/";
  std::string missing;
  Status last = Status::Ok();
  while (true) {
    Result<pb::RangeResponse> r = client_->Range(hubs, EtcdClient::PrefixEnd(hubs));
    if (r.ok()) {
      std::map<uint32_t, RackAddress> found;
      for (const auto& kv : r->kvs()) {
        const int64_t rack = RackOf(kv.key(), hubs);
        rec::HubRecord h;
        if (rack < 0 || rack >= count || !h.ParseFromString(kv.value())) continue;
        Result<net::Endpoint> d = net::ParseEndpoint(h.data_address());
        Result<net::Endpoint> i = net::ParseEndpoint(h.interhub_address());
        if (!d.ok() || !i.ok()) continue;
        found[static_cast<uint32_t>(rack)] = RackAddress{*d, *i};
      }
      if (found.size() == count) {
        std::vector<RackAddress> out;
        for (auto& [rack, a] : found) out.push_back(a);
        return out;
      }
      missing.clear();
      for (uint32_t i = 0; i < count; ++i) {
        if (!found.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      }
    } else {
      last = r.status();
    }
    // SIGTERM/SIGINT are blocked until start-up ends (daemon.cc): a stop
    // while waiting ends the wait.
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1)) {
      return Unavailable("topology.racks_from: stopped while waiting for rack(s) " + missing);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Unavailable("topology.racks_from: after " + std::to_string(timeout.count()) +
                         " s etcd still lists no hub for rack(s) " + missing +
                         " of topology.rack_count " + std::to_string(count) +
                         (last.ok() ? "" : " (" + last.message() + ")") +
                         "; start them or raise topology.discover_timeout_s");
    }
    if (!Sleep(std::chrono::milliseconds(200))) return Unavailable("shutting down");
  }
}

void ClusterMembership::Start(uint32_t count, std::function<void(uint32_t)> lost,
                              std::function<void(uint32_t)> back) {
  lost_ = std::move(lost);
  back_ = std::move(back);
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  watcher_ = std::thread([this, count] { WatchLoop(count); });
}

std::set<uint32_t> ClusterMembership::live() const {
  std::lock_guard lock(mu_);
  return live_;
}

bool ClusterMembership::Sleep(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

void ClusterMembership::KeepAliveLoop() {
  const auto period = std::chrono::milliseconds(std::max<uint32_t>(ttl_s_ * 1000 / 3, 300));
  bool down = false;
  while (Sleep(period)) {
    Status s = client_->LeaseKeepAlive(lease_);
    if (s.code() == StatusCode::kNotFound) {
      // etcd was away longer than the TTL: this hub dropped out; come back.
      spdlog::warn("cluster: rack {}'s lease expired; registering again", self_.rack);
      s = Register();
    }
    if (!s.ok() && !down) spdlog::warn("cluster: keeping rack {} registered: {}", self_.rack, s.message());
    if (s.ok() && down) spdlog::info("cluster: rack {} registered again", self_.rack);
    down = !s.ok();
  }
}

void ClusterMembership::WatchLoop(uint32_t count) {
  const std::string hubs = prefix_ + "hubs/";
  const std::string end = EtcdClient::PrefixEnd(hubs);
  // Every rack starts live (WaitForRacks saw them all).
  std::set<uint32_t> live;
  for (uint32_t r = 0; r < count; ++r) live.insert(r);
  const auto publish = [&](const std::set<uint32_t>& now) {
    for (uint32_t r = 0; r < count; ++r) {
      if (r == self_.rack) continue;
      const bool was = live.count(r), is = now.count(r);
      if (was && !is) {
        spdlog::warn("cluster: the hub of rack {} left etcd (lease gone)", r);
        if (lost_) lost_(r);
      } else if (!was && is) {
        spdlog::info("cluster: the hub of rack {} is back in etcd", r);
        if (back_) back_(r);
      }
    }
    live = now;
    std::lock_guard lock(mu_);
    live_ = now;
  };
  while (true) {
    Result<pb::RangeResponse> r = client_->Range(hubs, end);
    if (!r.ok()) {
      if (!Sleep(std::chrono::milliseconds(500))) return;
      continue;
    }
    std::set<uint32_t> now;
    for (const auto& kv : r->kvs()) {
      const int64_t rack = RackOf(kv.key(), hubs);
      if (rack >= 0 && rack < count) now.insert(static_cast<uint32_t>(rack));
    }
    publish(now);
    (void)client_->Watch(hubs, end, r->header().revision() + 1,
                         [&](const pb::WatchResponse& resp) {
                           if (resp.compact_revision() > 0 || resp.canceled()) return false;
                           std::set<uint32_t> next = live;
                           for (const auto& ev : resp.events()) {
                             const int64_t rack = RackOf(ev.kv().key(), hubs);
                             if (rack < 0 || rack >= count) continue;
                             if (ev.type() == pb::Event::PUT) {
                               next.insert(static_cast<uint32_t>(rack));
                             } else {
                               next.erase(static_cast<uint32_t>(rack));
                             }
                           }
                           publish(next);
                           return true;
                         });
    if (!Sleep(std::chrono::milliseconds(500))) return;
  }
}

}  // namespace rackhub::server
