#include "cluster_checkpoints.h"

#include <algorithm>
#include <iterator>
#include <random>
#include <set>

#include <spdlog/spdlog.h>

#include "checkpointer.h"
#include "data_plane.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

namespace dpb = rackhub::data::v1;

namespace {

std::string Sequences(const std::vector<uint64_t>& seqs) {
  std::string out;
  for (uint64_t s : seqs) out += (out.empty() ? "" : ", ") + Num(s);
  return out.empty() ? "none" : out;
}

}  // namespace

ClusterCheckpoints::ClusterCheckpoints(const Config& config, Registry* registry, DataPlane* data,
                                       Checkpointer* owner)
    : config_(config), registry_(registry), data_(data), owner_(owner) {
  DataPlane::CheckpointHooks hooks;
  hooks.on_message = [this](uint32_t rack, std::string payload) {
    OnMessage(rack, std::move(payload));
  };
  hooks.sequences = [this](uint32_t handle) {
    TenantInfo info;
    if (!registry_->GetTenantByHandle(handle, &info).ok()) return std::vector<uint64_t>{};
    return owner_->Sequences(info);
  };
  hooks.restore = [this](uint32_t handle, uint64_t sequence,
                         uint64_t round) -> Result<std::map<uint32_t, uint64_t>> {
    TenantInfo info;
    if (Status s = registry_->GetTenantByHandle(handle, &info); !s.ok()) return s;
    Result<std::map<uint32_t, uint64_t>> out = owner_->InstallSequence(info, sequence);
    if (out.ok()) {
      std::lock_guard lock(mu_);
      installed_[handle] = {round, sequence};
    }
    return out;
  };
  data_->SetCheckpointHooks(std::move(hooks));
  // Request ids of another process of this hub (a restart) never match.
  std::random_device rd;
  next_request_ = (uint64_t{rd()} << 32) ^ rd();
  query_server_ = std::thread([this] { Serve(&queries_); });
  server_ = std::thread([this] { Serve(&requests_); });
}

ClusterCheckpoints::~ClusterCheckpoints() { Stop(); }

void ClusterCheckpoints::Cancel() {
  Queue dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (Queue* q : {&queries_, &requests_}) {
      for (auto& r : *q) dropped.push_back(std::move(r));
      q->clear();
    }
  }
  cv_.notify_all();  // a coordinator waiting here gives up
  owner_->CancelCopy();
  for (const auto& [rack, payload] : dropped) {
    dpb::RackCheckpoint m;
    if (m.ParseFromString(payload)) AnswerStopping(rack, m);
  }
}

void ClusterCheckpoints::AnswerStopping(uint32_t rack, const Message& request) {
  if (request.op() != dpb::RackCheckpoint::QUERY && request.op() != dpb::RackCheckpoint::PREPARE) {
    return;
  }
  dpb::RackCheckpoint reply;
  reply.set_op(request.op() == dpb::RackCheckpoint::QUERY ? dpb::RackCheckpoint::QUERY_REPLY
                                                           : dpb::RackCheckpoint::PREPARE_REPLY);
  reply.set_tenant(request.tenant());
  reply.set_request(request.request());
  reply.set_sequence(request.sequence());
  reply.set_code(static_cast<uint32_t>(StatusCode::kUnavailable));
  reply.set_error("rack " + Num(config_.topology.rack) + "'s hub is stopping");
  data_->SendRackCheckpoint(rack, reply.SerializeAsString());
}

void ClusterCheckpoints::Stop() {
  Cancel();
  data_->SetCheckpointHooks({});  // waits for hook calls in progress
  if (query_server_.joinable()) query_server_.join();
  if (server_.joinable()) server_.join();
}

std::string ClusterCheckpoints::TenantDir(const TenantInfo& tenant) const {
  return owner_->TenantDir(tenant.name, tenant.handle);
}

void ClusterCheckpoints::OnMessage(uint32_t rack, std::string payload) {
  dpb::RackCheckpoint m;
  if (!m.ParseFromString(payload)) {
    spdlog::warn("rack link: rack {}'s hub sent a RACK_CHECKPOINT that does not parse", rack);
    return;
  }
  std::lock_guard lock(mu_);
  if (m.op() == dpb::RackCheckpoint::QUERY_REPLY || m.op() == dpb::RackCheckpoint::PREPARE_REPLY) {
    // For a coordinator waiting here; one of a request that timed out, or
    // that does not match it, is dropped.
    const auto it = pending_.find(m.request());
    if (it != pending_.end() && it->second.reply_op == m.op() && it->second.tenant == m.tenant() &&
        it->second.sequence == m.sequence()) {
      it->second.replies[rack] = std::move(payload);
      cv_.notify_all();
    }
    return;
  }
  if (stopping_) {
    AnswerStopping(rack, m);  // (sends only: no lock of ours is taken)
    return;
  }
  // At most a few requests are in flight per hub (one checkpoint at a time).
  Queue& queue = m.op() == dpb::RackCheckpoint::QUERY ? queries_ : requests_;
  if (queue.size() >= 64) {
    spdlog::warn("rack link: rack {}'s hub: too many RACK_CHECKPOINT requests queued; dropped one",
                 rack);
    return;
  }
  queue.emplace_back(rack, std::move(payload));
  cv_.notify_all();
}

void ClusterCheckpoints::Serve(Queue* queue) {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue->empty(); });
    if (stopping_) return;
    auto [rack, payload] = std::move(queue->front());
    queue->pop_front();
    lock.unlock();
    dpb::RackCheckpoint m;
    m.ParseFromString(payload);  // parsed once already (OnMessage)
    Answer(rack, m);
    lock.lock();
  }
}

void ClusterCheckpoints::Answer(uint32_t rack, const Message& request) {
  dpb::RackCheckpoint reply;
  reply.set_tenant(request.tenant());
  reply.set_request(request.request());
  reply.set_sequence(request.sequence());
  const auto fail = [&](const Status& s) {
    reply.set_code(static_cast<uint32_t>(s.code() == StatusCode::kOk ? StatusCode::kInternal
                                                                     : s.code()));
    reply.set_error(s.message().substr(0, 1024));
  };
  TenantInfo info;
  Status found = registry_->GetTenant(request.tenant(), &info);
  if (found.ok() && !owner_->Cluster(info)) {
    found = FailedPrecondition("tenant " + QuoteForLog(request.tenant()) +
                               " does not span racks on rack " + Num(config_.topology.rack) +
                               "'s hub");
  }
  switch (request.op()) {
    case dpb::RackCheckpoint::QUERY: {
      reply.set_op(dpb::RackCheckpoint::QUERY_REPLY);
      if (!found.ok()) {
        fail(found);
        break;
      }
      for (const auto& [key, v] : owner_->NewestVersions(info)) {
        auto* k = reply.add_keys();
        k->set_key_id(key);
        k->set_newest(v);
      }
      for (uint64_t seq : owner_->Sequences(info)) reply.add_checkpoints(seq);
      {
        std::lock_guard lock(mu_);
        if (const auto it = installed_.find(info.handle); it != installed_.end()) {
          reply.set_restored_round(it->second.first);
          reply.set_restored(it->second.second);
        }
      }
      break;
    }
    case dpb::RackCheckpoint::PREPARE: {
      reply.set_op(dpb::RackCheckpoint::PREPARE_REPLY);
      if (!found.ok()) {
        fail(found);
        break;
      }
      if (request.sequence() == 0 || request.sequence() == UINT64_MAX) {
        fail(InvalidArgument("RACK_CHECKPOINT: PREPARE of sequence " + Num(request.sequence())));
        break;
      }
      std::unique_lock busy(owner_->mu_, std::try_to_lock);
      if (!busy.owns_lock()) {
        fail(Status(StatusCode::kAborted, "another checkpoint or restore is in progress on rack " +
                                              Num(config_.topology.rack) + "'s hub"));
        break;
      }
      std::map<uint32_t, uint64_t> targets;
      for (const auto& k : request.keys()) targets[k.key_id()] = k.newest();
      std::vector<KeyInfo> keys;
      registry_->ListKeys(info.name, &keys);
      std::erase_if(keys, [&](const KeyInfo& k) { return !targets.count(k.id); });
      if (keys.size() != targets.size()) {
        fail(FailedPrecondition("rack " + Num(config_.topology.rack) + "'s hub has " +
                                Num(keys.size()) + " of the " + Num(targets.size()) +
                                " keys to checkpoint"));
        break;
      }
      if (const auto k = std::find_if(keys.begin(), keys.end(), [](const KeyInfo& k) { return !k.ready; });
          k != keys.end()) {
        fail(Unavailable("key '" + k->name + "' has no initial values on rack " +
                         Num(config_.topology.rack) + "'s hub yet"));
        break;
      }
      const auto timeout = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(std::max<uint32_t>(request.timeout_ms(), 1)), kMaxCopy);
      Result<CheckpointInfo> written =
          owner_->WriteCut(info, keys, targets, request.sequence(), Clock::now() + timeout);
      if (!written.ok()) {
        fail(written.status());
      } else {
        std::lock_guard lock(mu_);
        prepared_[{rack, request.request()}] = request.sequence();
        prepared_order_.emplace_back(rack, request.request());
        while (prepared_order_.size() > kRememberPrepared) {  // an ABORT comes at once, or never
          prepared_.erase(prepared_order_.front());
          prepared_order_.pop_front();
        }
      }
      break;
    }
    case dpb::RackCheckpoint::ABORT: {
      // Only the file this hub wrote for that coordinator's request.
      bool mine = false;
      {
        std::lock_guard lock(mu_);
        const auto it = prepared_.find({rack, request.request()});
        mine = it != prepared_.end() && it->second == request.sequence();
        if (it != prepared_.end()) prepared_.erase(it);
      }
      if (found.ok() && mine && DeleteCheckpoint(TenantDir(info), request.sequence()).ok()) {
        spdlog::warn("checkpoint: tenant '{}': deleted {} (the cluster checkpoint failed on "
                     "another hub)",
                     info.name, CheckpointFileName(request.sequence()));
      }
      return;  // no reply
    }
    default:
      spdlog::warn("rack link: rack {}'s hub sent a RACK_CHECKPOINT of unknown op {}", rack,
                   static_cast<int>(request.op()));
      return;
  }
  data_->SendRackCheckpoint(rack, reply.SerializeAsString());
}

uint64_t ClusterCheckpoints::Send(Message& request) {
  uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = ++next_request_;
    Pending& p = pending_[id];
    p.reply_op = request.op() == dpb::RackCheckpoint::QUERY ? dpb::RackCheckpoint::QUERY_REPLY
                                                            : dpb::RackCheckpoint::PREPARE_REPLY;
    p.tenant = request.tenant();
    p.sequence = request.sequence();
  }
  request.set_request(id);
  const std::string bytes = request.SerializeAsString();
  for (uint32_t rack = 0; rack < config_.topology.rack_count(); ++rack) {
    if (rack != config_.topology.rack) data_->SendRackCheckpoint(rack, bytes);
  }
  return id;
}

std::map<uint32_t, ClusterCheckpoints::Message> ClusterCheckpoints::Await(
    uint64_t id, Clock::time_point deadline) {
  const size_t others = config_.topology.rack_count() - 1;
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline,
                 [&] { return stopping_ || pending_[id].replies.size() >= others; });
  std::map<uint32_t, Message> out;
  for (const auto& [rack, bytes] : pending_[id].replies) out[rack].ParseFromString(bytes);
  pending_.erase(id);
  return out;
}

Result<std::map<uint32_t, ClusterCheckpoints::Message>> ClusterCheckpoints::QueryAll(
    const TenantInfo& tenant, Clock::time_point deadline) {
  dpb::RackCheckpoint query;
  query.set_op(dpb::RackCheckpoint::QUERY);
  query.set_tenant(tenant.name);
  std::map<uint32_t, Message> replies =
      Await(Send(query), std::min(deadline, Clock::now() + kQueryTimeout));
  for (uint32_t rack = 0; rack < config_.topology.rack_count(); ++rack) {
    if (rack == config_.topology.rack) continue;
    const auto it = replies.find(rack);
    if (it == replies.end()) {
      return Unavailable("cluster checkpoint of tenant '" + tenant.name + "': rack " + Num(rack) +
                         "'s hub did not answer (is it down, or its hub link cut?)");
    }
    if (it->second.code() != 0) {
      return Status(static_cast<StatusCode>(it->second.code()),
                    "cluster checkpoint of tenant '" + tenant.name + "': rack " + Num(rack) +
                        "'s hub: " + SafeForLog(it->second.error(), 1024));
    }
  }
  return replies;
}

void ClusterCheckpoints::AbortAll(const TenantInfo& tenant, uint64_t sequence, uint64_t prepare,
                                  bool here) {
  dpb::RackCheckpoint abort;
  abort.set_op(dpb::RackCheckpoint::ABORT);
  abort.set_tenant(tenant.name);
  abort.set_sequence(sequence);
  abort.set_request(prepare);
  const std::string bytes = abort.SerializeAsString();
  for (uint32_t rack = 0; rack < config_.topology.rack_count(); ++rack) {
    if (rack != config_.topology.rack) data_->SendRackCheckpoint(rack, bytes);
  }
  if (here) DeleteCheckpoint(TenantDir(tenant), sequence);
}

Result<CheckpointInfo> ClusterCheckpoints::Create(const TenantInfo& tenant,
                                                  std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout, kMaxCopy);
  Result<std::vector<KeyInfo>> keys = owner_->CheckpointedKeys(tenant);
  if (!keys.ok()) return keys.status();
  for (int attempt = 0;; ++attempt) {
    owner_->WaitRecovered(tenant.handle, deadline);
    Result<std::map<uint32_t, Message>> peers = QueryAll(tenant, deadline);
    if (!peers.ok()) return peers.status();
    // One sequence no hub has used, each key at the newest version any hub
    // has (its chunks get there at once when idle, or as training goes on).
    std::map<uint32_t, uint64_t> targets = owner_->NewestVersions(tenant);
    uint64_t sequence = 1;
    for (uint64_t seq : CheckpointSequences(TenantDir(tenant))) {  // damaged ones too
      sequence = std::max(sequence, seq + 1);
    }
    for (const auto& [rack, reply] : *peers) {
      for (const auto& k : reply.keys()) {
        targets[k.key_id()] = std::max(targets[k.key_id()], k.newest());
      }
      for (uint64_t seq : reply.checkpoints()) {
        if (seq >= UINT64_MAX - 1) {
          return FailedPrecondition("rack " + Num(rack) + "'s hub has checkpoint sequence " +
                                    Num(seq) + ": no sequence is left above it");
        }
        sequence = std::max(sequence, seq + 1);
      }
    }
    std::map<uint32_t, uint64_t> cut;
    for (const KeyInfo& k : *keys) cut[k.id] = targets[k.id] + (attempt > 0 ? 2 : 0);

    dpb::RackCheckpoint prepare;
    prepare.set_op(dpb::RackCheckpoint::PREPARE);
    prepare.set_tenant(tenant.name);
    prepare.set_sequence(sequence);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    prepare.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(left.count(), 1)));
    for (const auto& [key, v] : cut) {
      auto* k = prepare.add_keys();
      k->set_key_id(key);
      k->set_newest(v);
    }
    const uint64_t id = Send(prepare);
    Result<CheckpointInfo> local = owner_->WriteCut(tenant, *keys, cut, sequence, deadline);
    std::map<uint32_t, Message> replies = Await(id, deadline + kWriteGrace);

    // Every hub's file is durable: done. Else why not, by rack.
    std::string failure;
    bool moved_on = !local.ok() && local.status().code() == StatusCode::kUnavailable;
    StatusCode code = local.ok() ? StatusCode::kOk : local.status().code();
    if (!local.ok()) {
      failure = "rack " + Num(config_.topology.rack) + "'s hub: " + local.status().message();
    }
    for (uint32_t rack = 0; rack < config_.topology.rack_count(); ++rack) {
      if (rack == config_.topology.rack) continue;
      const auto it = replies.find(rack);
      std::string why;
      if (it == replies.end()) {
        why = "did not answer in time";
        code = StatusCode::kDeadlineExceeded;
      } else if (it->second.code() != 0) {
        why = SafeForLog(it->second.error(), 1024);
        moved_on = moved_on || it->second.code() == static_cast<uint32_t>(StatusCode::kUnavailable);
        code = static_cast<StatusCode>(it->second.code());
      } else {
        continue;
      }
      failure += (failure.empty() ? "" : "; ") + ("rack " + Num(rack) + "'s hub: " + why);
    }
    if (failure.empty()) {
      spdlog::info("checkpoint: tenant '{}': cluster checkpoint {} written on every rack's hub",
                   tenant.name, CheckpointFileName(sequence));
      return local;
    }
    AbortAll(tenant, sequence, id, local.ok());
    if (moved_on && Clock::now() < deadline) continue;  // training outran the cut: later targets
    if (moved_on) code = StatusCode::kDeadlineExceeded;
    return Status(code, "cluster checkpoint " + Num(sequence) + " of tenant '" + tenant.name +
                            "' failed (no hub keeps it): " + failure);
  }
}

Status ClusterCheckpoints::ConfirmRestored(const TenantInfo& tenant, uint64_t round,
                                           uint64_t sequence, Clock::time_point deadline) {
  for (;;) {
    Result<std::map<uint32_t, Message>> peers = QueryAll(tenant, deadline);
    if (!peers.ok()) return peers.status();
    std::string waiting;
    for (const auto& [rack, reply] : *peers) {
      if (reply.restored_round() > round ||
          (reply.restored_round() == round && reply.restored() != sequence)) {
        return Status(StatusCode::kAborted,
                      "tenant '" + tenant.name + "': rack " + Num(rack) + "'s hub restored " +
                          "checkpoint " + Num(reply.restored()) + " in round " +
                          Num(reply.restored_round()) + " after checkpoint " + Num(sequence) +
                          " in round " + Num(round) + " (it could not load it?): see its log");
      }
      if (reply.restored_round() < round) waiting += (waiting.empty() ? "" : ", ") + Num(rack);
    }
    if (waiting.empty()) return Status::Ok();
    if (Clock::now() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    "checkpoint " + Num(sequence) + " of tenant '" + tenant.name +
                        "' is restored here; rack(s) " + waiting + " have not confirmed it yet");
    }
    std::unique_lock lock(mu_);  // a moment for the others' round to end (or Stop)
    if (cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return stopping_; })) {
      return Unavailable("the hub is stopping");
    }
  }
}

Result<CheckpointInfo> ClusterCheckpoints::Restore(const TenantInfo& tenant, uint64_t sequence,
                                                   std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Result<std::map<uint32_t, Message>> peers = QueryAll(tenant, deadline);
  if (!peers.ok()) return peers.status();
  std::vector<uint64_t> common = owner_->Sequences(tenant);
  std::string lists = "rack " + Num(config_.topology.rack) + ": " + Sequences(common);
  for (const auto& [rack, reply] : *peers) {
    std::vector<uint64_t> theirs(reply.checkpoints().begin(), reply.checkpoints().end());
    std::sort(theirs.begin(), theirs.end());
    lists += "; rack " + Num(rack) + ": " + Sequences(theirs);
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  if (sequence == 0) {
    if (common.empty()) {
      return NotFound("tenant '" + tenant.name + "' has no checkpoint that every rack's hub has (" +
                      lists + ")");
    }
    sequence = common.back();
  } else if (!std::binary_search(common.begin(), common.end(), sequence)) {
    return FailedPrecondition("checkpoint " + Num(sequence) + " of tenant '" + tenant.name +
                              "' is not on every rack's hub (" + lists + ")");
  }
  {
    std::lock_guard lock(mu_);
    installed_.erase(tenant.handle);
  }
  const std::string why = "the tenant is being restored to " + CheckpointFileName(sequence) +
                          " on every rack's hub";
  for (;;) {
    const Status s = data_->RestoreAcrossRacks(tenant.handle, sequence, why);
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable || Clock::now() >= deadline) return s;
    owner_->WaitRecovered(tenant.handle, deadline);  // a round under way: then ask again
  }
  owner_->WaitRecovered(tenant.handle, deadline);
  std::pair<uint64_t, uint64_t> mine{0, 0};  // (round, sequence)
  {
    std::lock_guard lock(mu_);
    if (const auto it = installed_.find(tenant.handle); it != installed_.end()) mine = it->second;
  }
  if (mine.second == 0) {
    return Status(StatusCode::kDeadlineExceeded,
                  "checkpoint " + Num(sequence) + " of tenant '" + tenant.name +
                      "' is requested, but the recovery round that restores it has not ended "
                      "(is a hub unreachable?); it is restored when the round ends");
  }
  if (mine.second != sequence) {
    return Status(StatusCode::kAborted,
                  "tenant '" + tenant.name + "' was restored to checkpoint " + Num(mine.second) +
                      ", not " + Num(sequence) + " (a hub could not load it: see the hubs' logs)");
  }
  // Every other hub restored it in the same round (one that could not load
  // its file starts another round, which restores an older checkpoint).
  if (Status s = ConfirmRestored(tenant, mine.first, sequence, deadline); !s.ok()) return s;
  for (CheckpointInfo& c : ListCheckpoints(TenantDir(tenant))) {
    if (c.sequence == sequence) return std::move(c);
  }
  return NotFound("checkpoint " + Num(sequence) + " of tenant '" + tenant.name +
                  "' was restored but its file is gone");
}

}  // namespace rackhub::server
