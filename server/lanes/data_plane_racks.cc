// DataPlane, across racks: the data plane's side of recovery rounds
// (rack_recovery.h: phase 1's reports and each round's realignment, on
// realign_strand_) and of cluster checkpoints (the Checkpointer's hooks,
// RACK_CHECKPOINT frames, restores as rounds). See data_plane.h.
#include <algorithm>
#include <future>
#include <map>

#include <spdlog/spdlog.h>

#include "data_plane.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

void DataPlane::SetCheckpointHooks(CheckpointHooks hooks) {
  std::unique_lock lock(ckpt_mu_);
  ckpt_cv_.wait(lock, [this] { return ckpt_calls_ == 0; });
  ckpt_hooks_ = std::move(hooks);
}

void DataPlane::SendRackCheckpoint(uint32_t rack, std::string payload) {
  Lane* lane0 = lanes_[0].get();
  lane0->gate().Post([lane0, rack, payload = std::move(payload)] {
    lane0->SendRackControl(rack, net::Opcode::kRackCheckpoint, payload);
  });
}

void DataPlane::OnRackCheckpoint(uint32_t rack, std::span<const std::byte> payload) {
  std::string bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
  const bool taken = WithCheckpointHooks([&](const CheckpointHooks& h) {
    if (!h.on_message) return false;
    h.on_message(rack, std::move(bytes));
    return true;
  });
  if (taken) return;
  // Checkpoints are off here (state.in_memory, or the hub stops): the
  // coordinator's QUERY and PREPARE get that answer instead of a silence.
  data::v1::RackCheckpoint m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
  if (m.op() != data::v1::RackCheckpoint::QUERY && m.op() != data::v1::RackCheckpoint::PREPARE) {
    return;
  }
  data::v1::RackCheckpoint reply;
  reply.set_op(m.op() == data::v1::RackCheckpoint::QUERY ? data::v1::RackCheckpoint::QUERY_REPLY
                                                          : data::v1::RackCheckpoint::PREPARE_REPLY);
  reply.set_tenant(m.tenant());
  reply.set_request(m.request());
  reply.set_sequence(m.sequence());
  reply.set_code(static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  reply.set_error("checkpoints are off on rack " + std::to_string(config_.topology.rack) +
                  "'s hub (" + (config_.state.in_memory ? "state.in_memory" : "it is stopping") +
                  ")");
  SendRackCheckpoint(rack, reply.SerializeAsString());
}

void DataPlane::ResumeAcrossRacks(uint32_t handle, const std::string& why) {
  TenantInfo info;
  if (!rack_recovery_ || !registry_->GetTenantByHandle(handle, &info).ok() || !SpansRacks(info)) {
    return;
  }
  rack_recovery_->MarkFresh(handle, info.name);
  Recover(handle, why, [handle, why](Lane& lane) { lane.FailPending(handle, why); });
}

std::string DataPlane::RoundWaitsFor(uint32_t handle) {
  if (!rack_recovery_) return "";
  const std::vector<uint32_t> racks = rack_recovery_->WaitingFor(handle);
  if (racks.empty()) return "";
  std::string list;
  for (size_t i = 0; i < racks.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == racks.size() ? " and " : ", ") + std::to_string(racks[i]);
  }
  return (racks.size() == 1 ? "rack " : "racks ") + list + "'s hub" + (racks.size() == 1 ? "" : "s");
}

Status DataPlane::RestoreAcrossRacks(uint32_t handle, uint64_t sequence, const std::string& why) {
  TenantInfo info;
  if (!rack_recovery_ || !registry_->GetTenantByHandle(handle, &info).ok() || !SpansRacks(info)) {
    return FailedPrecondition("the tenant does not span racks on this hub");
  }
  if (!rack_recovery_->RequestRestore(handle, info.name, sequence)) {
    return Unavailable("a recovery round of tenant '" + info.name + "' is under way");
  }
  Recover(handle, why, [handle, why](Lane& lane) { lane.FailPending(handle, why); });
  return Status::Ok();
}

Status DataPlane::OnRackVersions(uint32_t rack, std::span<const std::byte> payload) {
  if (!rack_recovery_) return FailedPrecondition("RACK_VERSIONS: this hub serves one rack");
  return rack_recovery_->OnVersions(rack, payload);
}

void DataPlane::RackLinkUp(uint32_t rack) {
  if (rack_recovery_) rack_recovery_->OnLinkUp(rack);
}

void DataPlane::ResendRackReports() {
  if (rack_recovery_) rack_recovery_->Resend();
}

void DataPlane::ReportAcrossRacks(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                                  std::string why, std::string name,
                                  std::optional<uint64_t> failed_at) {
  boost::asio::post(*realign_strand_, [this, handle, tenant, why, name, failed_at] {
    const uint64_t read_at = rack_recovery_->FinishedRounds(handle);
    std::map<uint32_t, uint64_t> versions;
    if (!KeyVersionsAndWait(handle, &versions)) return;  // the hub stops
    std::optional<RackRecovery::Members> members;
    TenantInfo info;
    if (registry_->GetTenantByHandle(handle, &info).ok() && info.elastic) {
      // This rack's ranks present now: what this hub commits if the round
      // ends with this report (docs/elastic.md, "Across racks").
      const uint32_t slots = info.rank_slots();
      members.emplace();
      members->generation = tenant->membership()->generation;
      members->member = tenant->Present(config_.topology.rack * slots, slots, lane_count());
      members->quorum = info.workers_per_rack * config_.topology.rack_count();
      members->flags = ElasticFlagsOf(info);
    }
    const bool taken = rack_recovery_->Reported(
        handle, name, why, std::move(versions),
        [this, handle, tenant](const RackRecovery::Outcome& outcome, bool realign) {
          Realign(handle, tenant, outcome, realign);
        },
        failed_at, read_at, std::move(members));
    // A round ended meanwhile: its realignment is queued on this thread;
    // the versions are read again after it.
    if (!taken) ReportAcrossRacks(handle, tenant, why, name, failed_at);
  });
}

void DataPlane::CommitClusterMembership(const TenantInfo& info, TenantRuntime& tenant,
                                        const RackRecovery::Outcome& cluster) {
  const uint32_t self = config_.topology.rack;
  const std::shared_ptr<const Membership> cur = tenant.membership();
  // A round's recoveries commit alike (the first one does); an older round
  // finishing late never overwrites a newer one.
  if (cluster.round < cur->round || (cluster.round == cur->round && cur->round != 0)) return;
  auto next = std::make_shared<Membership>();
  next->round = cluster.round;
  next->member = cluster.members[self];
  next->member.resize(info.rank_slots(), 0);
  next->count = static_cast<uint32_t>(std::count(next->member.begin(), next->member.end(), 1));
  next->total = cluster.total;
  next->racks.assign(cluster.members.size(), 0);
  for (size_t r = 0; r < cluster.members.size(); ++r) {
    const auto& m = cluster.members[r];
    next->racks[r] = std::count(m.begin(), m.end(), 1) > 0 ? 1 : 0;
  }
  next->generation = cluster.generation;
  next->paused =
      cluster.generation == 0 || next->total < std::max<uint32_t>(info.min_workers, 1);
  const std::vector<uint8_t> reported = next->member;
  PublishMembership(info, tenant, std::move(next),
                    cluster.generation == 0
                        ? " (paused: waiting for the start quorum of " +
                              std::to_string(info.workers_per_rack *
                                             config_.topology.rack_count()) +
                              " members in total over the racks, " +
                              std::to_string(info.workers_per_rack) + " x " +
                              std::to_string(config_.topology.rack_count()) + ")"
                        : std::string());
  // A rank that joined or left after this hub's report: another round.
  const uint32_t slots = info.rank_slots();
  if (tenant.Present(self * slots, slots, lane_count()) != reported) {
    MembershipChanged(info.handle, "the ranks present on rack " + std::to_string(self) +
                                       " changed during recovery round " +
                                       std::to_string(cluster.round));
  }
}

void DataPlane::RealignAcrossRacks(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                                   RackRecovery::Outcome outcome) {
  // An elastic tenant's cluster membership first (no push is accepted until
  // the realignment is done): the versions read for a later round's report
  // come after it.
  CommitMembership(handle, *tenant, &outcome);
  if (outcome.restore != 0) {
    // A rollback to a cluster checkpoint: every hub loads its own file of it.
    // Frames of older rounds are stale first (a late RACK_ALIGN must not
    // overwrite what the file restores). The keys it holds are at its
    // versions on every hub then; the others skip as in any round.
    if (!RaiseEpochAndWait(handle, outcome.round)) return;  // the hub stops
    const Result<std::map<uint32_t, uint64_t>> restored =
        WithCheckpointHooks([&](const CheckpointHooks& h) -> Result<std::map<uint32_t, uint64_t>> {
          if (!h.restore) return FailedPrecondition("checkpoints are off on this hub");
          return h.restore(handle, outcome.restore, outcome.round);
        });
    if (restored.ok()) {
      for (const auto& [key, v] : *restored) outcome.agreed.erase(key);
      rack_recovery_->Restored(handle, *restored);
    } else if (restored.status().code() == StatusCode::kFailedPrecondition) {
      // The hub is stopping (its checkpoints are off now): its chunks stay,
      // nothing is sent; it rolls back when it starts again.
      outcome.agreed.clear();
    } else {
      // This hub's file of it cannot be loaded: its chunks stay as they are
      // (no skip, no RACK_ALIGN of values the others rolled back), and the
      // next round, begun before this one finishes (so the workers wait for
      // it), counts this hub as having lost its state: every hub then rolls
      // back to an older checkpoint they all have (this file is not offered
      // again).
      spdlog::error("rack recovery: restoring checkpoint {} failed here: {}; starting another "
                    "round",
                    outcome.restore, restored.status().message());
      ResumeAcrossRacks(handle, "checkpoint " + std::to_string(outcome.restore) +
                                    " could not be restored on rack " +
                                    std::to_string(config_.topology.rack) + "'s hub");
      outcome.agreed.clear();
    }
  }
  AlignLanes(handle, std::move(tenant), std::move(outcome.agreed), outcome.round);
}

bool DataPlane::RaiseEpochAndWait(uint32_t handle, uint64_t round) {
  return OnEveryLaneAndWait([handle, round](Lane& lane) { lane.RaiseRackEpoch(handle, round); });
}

bool DataPlane::KeyVersionsAndWait(uint32_t handle, std::map<uint32_t, uint64_t>* out) {
  auto mu = std::make_shared<std::mutex>();
  auto versions = std::make_shared<std::map<uint32_t, uint64_t>>();
  if (!OnEveryLaneAndWait([handle, mu, versions](Lane& lane) {
        const auto mine = lane.KeyVersions(handle);
        std::lock_guard lock(*mu);
        for (const auto& [key, v] : mine) (*versions)[key] = std::max((*versions)[key], v);
      })) {
    return false;
  }
  std::lock_guard lock(*mu);
  *out = std::move(*versions);
  return true;
}

bool DataPlane::OnEveryLaneAndWait(std::function<void(Lane&)> fn) {
  std::vector<std::future<void>> done;
  for (uint32_t i = 0; i < lane_count(); ++i) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    OnLane(i, [fn, p](Lane& lane) {
      fn(lane);
      p->set_value();
    });
  }
  for (auto& f : done) {
    while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (stopping()) return false;  // the lanes may never run it (`fn` owns what it uses)
    }
  }
  return true;
}

}  // namespace rackhub::server
