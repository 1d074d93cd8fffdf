#include "data_plane.h"

#include <fstream>

#include <spdlog/spdlog.h>

namespace rackhub::server {

DataPlane::DataPlane(const Config& config, Registry* registry, LaneSet* lanes,
                     std::unique_ptr<net::Connector> hub_connector)
    : config_(config),
      registry_(registry),
      lane_threads_(lanes),
      hub_connector_(std::move(hub_connector)),
      drained_(lanes->size(), false) {
  for (uint32_t r = 0; r < config.topology.rack_count(); ++r) {
    link_counters_.push_back(std::make_unique<LinkCounters>());
  }
  if (!config.topology.secret_file.empty()) {
    std::ifstream f(config.topology.secret_file);
    std::getline(f, hub_secret_);
  }
  for (uint32_t i = 0; i < lanes->size(); ++i) {
    lanes_.push_back(
        std::make_unique<Lane>(i, lanes->size(), config, registry, this, &lanes->context(i)));
  }
  registry_->SetObserver(this);
}

DataPlane::~DataPlane() {
  registry_->SetObserver(nullptr);
  Shutdown(std::chrono::milliseconds(0));
}

void DataPlane::OnLane(uint32_t i, std::function<void(Lane&)> fn) {
  Lane* lane = lanes_[i].get();
  lane_threads_->Post(i, [lane, fn = std::move(fn)] { fn(*lane); });
}

void DataPlane::OnEveryLane(std::function<void(Lane&)> fn) {
  for (auto& l : lanes_) {
    Lane* lane = l.get();
    lane->gate().Post([lane, fn] { fn(*lane); });
  }
}

void DataPlane::StartHubLinks() {
  if (!config_.topology.multi_rack_exchange()) return;
  OnEveryLane([](Lane& lane) { lane.StartHubLinks(); });
}

void DataPlane::Shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [](Lane& lane) { lane.BeginShutdown(); });
  }
  // Wait for every lane's SHUTTING_DOWN frames to go out and its
  // connections to close (LaneDrained), at most `grace`.
  const auto deadline = std::chrono::steady_clock::now() + grace;
  {
    std::unique_lock lock(shutdown_mu_);
    drained_cv_.wait_until(lock, deadline, [this] {
      return std::all_of(drained_.begin(), drained_.end(), [](bool d) { return d; });
    });
  }
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [](Lane& lane) { lane.ForceClose(); });
  }
  // Nothing a lane scheduled may outlive it: wait for the counted work
  // (cancelled timers complete at once).
  const auto idle_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& lane : lanes_) {
    if (!lane->gate().WaitIdle(idle_deadline)) {
      spdlog::error("data: lane {} still has {} pending handlers at shutdown", lane->index(),
                    lane->gate().pending());
    }
  }
}

void DataPlane::LaneDrained(uint32_t lane) {
  std::lock_guard lock(shutdown_mu_);
  drained_[lane] = true;
  drained_cv_.notify_all();
}

void DataPlane::CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) {
  if (rack >= link_counters_.size()) return;
  link_counters_[rack]->bytes_out.fetch_add(out, std::memory_order_relaxed);
  link_counters_[rack]->bytes_in.fetch_add(in, std::memory_order_relaxed);
}

void DataPlane::CountRackChunkBytes(uint32_t rack, uint64_t out) {
  if (rack < link_counters_.size()) {
    link_counters_[rack]->chunk_bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
}

std::vector<DataPlane::RackLinkStats> DataPlane::RackLinks() const {
  std::vector<RackLinkStats> out;
  if (!config_.topology.multi_rack_exchange()) return out;
  for (uint32_t r = 0; r < link_counters_.size(); ++r) {
    if (r == config_.topology.rack) continue;
    out.push_back({r, link_counters_[r]->bytes_out.load(), link_counters_[r]->bytes_in.load(),
                   link_counters_[r]->chunk_bytes_out.load()});
  }
  return out;
}

uint64_t DataPlane::WorkerLost(uint32_t handle, uint32_t member, const std::string& why,
                               uint32_t from_lane) {
  const uint64_t before = seq_.load() + 1;
  OnEveryLane([handle, member, before, why, from_lane](Lane& lane) {
    if (lane.index() != from_lane) lane.OnWorkerLost(handle, member, before, why);
  });
  return before;
}

std::shared_ptr<KeyRuntime> DataPlane::KeyRuntimeFor(uint32_t handle, uint32_t key_id) {
  std::shared_ptr<KeyRuntimes> keys;
  {
    decltype(runtimes_)::accessor t;
    if (runtimes_.insert(t, handle)) t->second = std::make_shared<KeyRuntimes>();
    keys = t->second;
  }
  KeyRuntimes::accessor k;
  if (keys->insert(k, key_id)) k->second = std::make_shared<KeyRuntime>();
  return k->second;
}

void DataPlane::ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) {
  const auto rt = KeyRuntimeFor(handle, key_id);
  if (rt->initialized_chunks.fetch_add(1) + 1 == chunk_count) {
    registry_->MarkKeyReady(handle, key_id);
  }
}

void DataPlane::OnTenantDeleted(uint32_t handle) {
  OnEveryLane([handle](Lane& lane) { lane.OnTenantDeleted(handle); });
  runtimes_.erase(handle);
}

void DataPlane::OnKeyDeleted(uint32_t handle, uint32_t key_id) {
  OnEveryLane([handle, key_id](Lane& lane) { lane.OnKeyDeleted(handle, key_id); });
  decltype(runtimes_)::const_accessor t;
  if (runtimes_.find(t, handle)) t->second->erase(key_id);
}

void DataPlane::OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                                   const aggregation::OptimizerConfig& optimizer,
                                   uint64_t from_update) {
  OnEveryLane([handle, key_id, optimizer, from_update](Lane& lane) {
    lane.OnOptimizerChanged(handle, key_id, optimizer, from_update);
  });
}

}  // namespace rackhub::server
