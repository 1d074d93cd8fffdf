#include "lane.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace rackhub::server {

using net::WireError;

namespace {
constexpr auto kStragglerCheckPeriod = std::chrono::milliseconds(250);
}  // namespace

Lane::Lane(uint32_t lane, uint32_t lanes, const Config& config, Registry* registry,
           LaneHost* host, boost::asio::io_context* io)
    : io_(io),
      host_(host),
      gate_(*io),
      table_(lane, lanes, config.topology, registry, host),
      exchange_(config.topology, config.data, &table_, registry, host, &gate_, io),
      workers_(config.data, &table_, registry, host, &gate_, &exchange_) {
  exchange_.SetWorkers(&workers_);
  table_.SetNewChunkHook(
      [this](LaneTenant& t, LaneKey& key, Chunk& c) { exchange_.OnNewChunk(t, key, c); });
  gate_.Post([this] { ArmStragglerCheck(); });
}

void Lane::ArmStragglerCheck() {
  gate_.After(kStragglerCheckPeriod, [this] {
    workers_.CheckStragglers();
    ArmStragglerCheck();
  });
}

void Lane::AdoptWorker(std::shared_ptr<net::Connection> conn, uint64_t seq) {
  workers_.Adopt(std::move(conn), seq);
}

void Lane::AdoptHubLink(std::shared_ptr<net::Connection> conn, std::string accept) {
  exchange_.AdoptLink(std::move(conn), std::move(accept));
}

void Lane::OnWorkerLost(uint32_t handle, uint32_t member, uint64_t before_seq,
                        const std::string& why) {
  workers_.OnWorkerLost(handle, member, before_seq, why);
}

void Lane::OnTenantDeleted(uint32_t handle) {
  LaneTenant* t = table_.FindTenant(handle);
  if (!t) return;
  table_.FailPending(*t, WireError::kTenantGone, "tenant: was deleted");
  for (auto& [id, job] : t->armed) job->Fail("the tenant was deleted during the checkpoint");
  workers_.CloseTenant(*t, WireError::kTenantGone, "tenant: '" + t->info.name + "' was deleted");
  table_.EraseTenant(handle);
  exchange_.ForgetTenant(handle);  // its relays (their connections' close callbacks find no tenant)
  if (FairScheduler* s = workers_.scheduler()) s->Forget(handle);
  workers_.TrimMemorySoon();  // its chunks are gone (or go with the replies still queued)
}

std::map<uint32_t, uint64_t> Lane::KeyVersions(uint32_t handle) {
  LaneTenant* t = table_.FindTenant(handle);
  return t ? table_.KeyVersions(*t) : std::map<uint32_t, uint64_t>{};
}

void Lane::Align(uint32_t handle, const std::map<uint32_t, uint64_t>& versions,
                 uint64_t round) {
  LaneTenant* t = table_.FindTenant(handle);
  // Across racks a hub that restarted has not loaded the tenant yet, but it
  // is home to some of its chunks: they are realigned (and sent) all the same.
  if (!t && table_.exchange()) t = table_.LoadTenant(handle);
  if (!t) return;
  t->rack_epoch = std::max(t->rack_epoch, round);
  table_.Align(*t, versions);
  exchange_.Realign(*t, versions);
}

void Lane::RaiseRackEpoch(uint32_t handle, uint64_t round) {
  LaneTenant* t = table_.FindTenant(handle);
  if (!t && table_.exchange()) t = table_.LoadTenant(handle);
  if (t) t->rack_epoch = std::max(t->rack_epoch, round);
}

void Lane::Snapshot(uint32_t handle, const std::shared_ptr<SnapshotJob>& job) {
  LaneTenant* t = table_.LoadTenant(handle);
  if (!t) {
    job->Fail("the tenant was deleted during the checkpoint");
    return;
  }
  table_.Snapshot(*t, job);
}

uint32_t Lane::Restore(uint32_t handle, const CheckpointImage& image,
                       const std::unordered_set<uint32_t>& keys) {
  LaneTenant* t = table_.LoadTenant(handle);
  return t ? table_.Restore(*t, image, keys) : 0;
}

void Lane::OnGenerationEnded(uint32_t handle, uint32_t member, const WorkerGeneration& g,
                             const std::string& why, bool close) {
  workers_.OnGenerationEnded(handle, member, g, why, close);
}

void Lane::FailPending(uint32_t handle, const std::string& why) {
  if (LaneTenant* t = table_.FindTenant(handle)) table_.FailPending(*t, WireError::kWorkerLost, why);
}

void Lane::OnKeyDeleted(uint32_t handle, uint32_t key_id) {
  if (LaneTenant* t = table_.FindTenant(handle)) {
    table_.DropKey(*t, key_id);
    workers_.TrimMemorySoon();
  }
}

void Lane::OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                              const aggregation::OptimizerConfig& optimizer,
                              uint64_t from_update) {
  table_.ApplyOptimizer(handle, key_id, optimizer, from_update);
}

void Lane::BeginShutdown() {
  if (gate_.closed()) return;
  gate_.Close();
  exchange_.CloseAll("the hub is shutting down");
  workers_.CloseAll(WireError::kShuttingDown, "the hub is shutting down");
  if (table_.connection_count() == 0) host_->LaneDrained(index());
}

void Lane::ForceClose(const std::string& why) {
  for (auto& [handle, t] : table_.tenants()) {
    const auto conns = t.conns;
    for (auto& [member, conn] : conns) conn->Close(why);
  }
  if (FairScheduler* s = workers_.scheduler()) s->Clear();
}

void Lane::Abort() {
  if (gate_.closed()) return;
  gate_.Close();
  exchange_.CloseAll("the hub crashed");
  ForceClose("the hub crashed");
  if (table_.connection_count() == 0) host_->LaneDrained(index());
}

}  // namespace rackhub::server
