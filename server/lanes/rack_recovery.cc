#include "rack_recovery.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

namespace dpb = rackhub::data::v1;

namespace {

uint64_t RandomIncarnation() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^ 1;  // never 0 (0: "no report")
}

constexpr size_t kMaxCause = 512;

}  // namespace

RackRecovery::RackRecovery(uint32_t self_rack, uint32_t racks, Hooks hooks)
    : self_(self_rack), racks_(racks), incarnation_(RandomIncarnation()), hooks_(std::move(hooks)) {}

std::string RackRecovery::Encode(const Round& r, bool finished) const {
  dpb::RackVersions m;
  m.set_tenant(r.name);
  m.set_round(r.number);
  m.set_incarnation(incarnation_);
  m.set_finished(finished);
  m.set_cause(r.cause.substr(0, kMaxCause));
  for (const auto& [key, v] : r.own->newest) {
    auto* k = m.add_keys();
    k->set_key_id(key);
    k->set_newest(v);
  }
  m.set_fresh(r.own->fresh);
  m.set_restore(r.own->restore);
  m.set_restored_round(r.own->restored_round);
  m.set_restored(r.own->restored);
  for (uint64_t seq : r.own->checkpoints) m.add_checkpoints(seq);
  if (r.own->members) {
    m.set_membership_format(kMembershipFormat);
    m.set_membership_generation(r.own->members->generation);
    m.set_members(std::string(r.own->members->member.begin(), r.own->members->member.end()));
    m.set_membership_workers(r.own->members->flags.workers);
    m.set_membership_min_workers(r.own->members->flags.min_workers);
    m.set_membership_max_workers(r.own->members->flags.max_workers);
  }
  return m.SerializeAsString();
}

void RackRecovery::MembersOf(Round& r, Outcome& out) const {
  if (!r.own->members) return;
  out.members.assign(racks_, {});
  out.members[self_] = r.own->members->member;
  uint64_t newest = r.own->members->generation;
  for (const auto& [rack, report] : r.peers) {
    if (!report.members) continue;  // refused on arrival for an elastic tenant
    out.members[rack] = report.members->member;
    newest = std::max(newest, report.members->generation);
  }
  for (const auto& m : out.members) {
    out.total += static_cast<uint32_t>(std::count(m.begin(), m.end(), 1));
  }
  const bool started = newest > 0 || out.total >= r.own->members->quorum;
  out.generation = started ? newest + 1 : 0;
  r.last_generation = out.generation;
}

Status RackRecovery::ParseMembers(uint32_t rack, uint32_t handle, const dpb::RackVersions& m,
                                  Report& report) const {
  if (!hooks_.elastic || !hooks_.elastic(handle)) return Status::Ok();
  if (m.membership_format() != kMembershipFormat) {
    return FailedPrecondition(
        "RACK_VERSIONS: tenant " + QuoteForLog(m.tenant()) + " is elastic, but rack " +
        Num(rack) + "'s report carries membership format " + Num(m.membership_format()) +
        " (this hub reads format " + Num(kMembershipFormat) +
        "; 0: a rackhubd without elastic tenants across racks): run the same rackhubd "
        "version on every hub");
  }
  const size_t slots = hooks_.rank_slots ? hooks_.rank_slots(handle) : kMaxRanks;
  if (m.members().size() > std::min(slots, kMaxRanks)) {
    return InvalidArgument("RACK_VERSIONS: rack " + Num(rack) + "'s member list has " +
                           Num(m.members().size()) + " ranks (at most " +
                           Num(std::min(slots, kMaxRanks)) + ", the tenant's ranks per rack)");
  }
  if (m.membership_generation() > kMaxGeneration) {
    return InvalidArgument("RACK_VERSIONS: rack " + Num(rack) + "'s membership generation " +
                           Num(m.membership_generation()) + " is above " +
                           Num(kMaxGeneration));
  }
  Members members;
  members.flags = {m.membership_workers(), m.membership_min_workers(),
                   m.membership_max_workers()};
  if (const auto own = hooks_.elastic_flags ? hooks_.elastic_flags(handle) : std::nullopt;
      own && *own != members.flags) {
    auto text = [](const RackElasticFlags& f) {
      return "--workers " + Num(f.workers) + " --min-workers " + Num(f.min_workers) +
             " --max-workers " + Num(f.max_workers);
    };
    return FailedPrecondition("RACK_VERSIONS: elastic tenant " + QuoteForLog(m.tenant()) +
                              " has " + text(*own) + " on rack " + Num(self_) + "'s hub but " +
                              text(members.flags) + " on rack " + Num(rack) +
                              "'s (every hub decides the start quorum and the pause from its "
                              "own: create the tenant with the same flags on every hub)");
  }
  members.generation = m.membership_generation();
  for (char b : m.members()) {
    if (b != 0 && b != 1) {
      return InvalidArgument("RACK_VERSIONS: rack " + Num(rack) +
                             "'s member list holds a byte other than 0 or 1");
    }
    members.member.push_back(static_cast<uint8_t>(b));
  }
  report.members = std::move(members);
  return Status::Ok();
}

uint64_t RackRecovery::RestoreOf(const Round& r) {
  // The sequences every hub has, and what the reports ask for.
  std::vector<uint64_t> common = r.own->checkpoints;
  uint64_t requested = r.own->restore;
  bool fresh = r.own->fresh;
  // The newest restore any hub finished, and whether some hub missed it (it
  // left that round for a newer one before the round ended there).
  std::pair<uint64_t, uint64_t> last{r.own->restored_round, r.own->restored};
  uint64_t oldest_round = r.own->restored_round;
  for (const auto& [rack, report] : r.peers) {
    last = std::max(last, std::pair{report.restored_round, report.restored});
    oldest_round = std::min(oldest_round, report.restored_round);
  }
  for (const auto& [rack, report] : r.peers) {
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), report.checkpoints.begin(),
                          report.checkpoints.end(), std::back_inserter(both));
    common = std::move(both);
    requested = std::max(requested, report.restore);
    fresh = fresh || report.fresh;
  }
  if (requested != 0) {
    if (std::binary_search(common.begin(), common.end(), requested)) return requested;
    spdlog::error("rack recovery: tenant '{}' round {}: checkpoint {} is not on every hub; "
                  "not restored",
                  r.name, r.number, requested);
  }
  if (fresh && common.empty()) {
    spdlog::error("rack recovery: tenant '{}' round {}: a hub lost its state and no checkpoint "
                  "is on every hub: the chunks it is home to start over",
                  r.name, r.number);
  }
  if (fresh && !common.empty()) return common.back();  // covers a hub that missed a restore too
  if (oldest_round < last.first) {
    if (std::binary_search(common.begin(), common.end(), last.second)) {
      spdlog::warn("rack recovery: tenant '{}' round {}: a hub missed round {}'s restore of "
                   "checkpoint {}: every hub restores it again",
                   r.name, r.number, last.first, last.second);
      return last.second;
    }
    spdlog::error("rack recovery: tenant '{}' round {}: a hub missed round {}'s restore of "
                  "checkpoint {}, which is no longer on every hub",
                  r.name, r.number, last.first, last.second);
  }
  return 0;
}

void RackRecovery::SendToAll(const Round& r, Effects& fx) const {
  const std::string bytes = Encode(r, false);
  for (uint32_t rack = 0; rack < racks_; ++rack) {
    if (rack != self_) fx.sends.emplace_back(rack, bytes);
  }
}

void RackRecovery::Begin(uint32_t handle, Round& r, uint64_t number, std::string cause,
                         Effects& fx) {
  r.number = number;
  r.active = true;
  r.own.reset();
  r.peers.clear();
  r.cause = std::move(cause);
  fx.recover.emplace(handle, r.cause);
}

void RackRecovery::TryFinish(uint32_t handle, Round& r, Effects& fx) {
  if (!r.active || !r.own || r.peers.size() + 1 < racks_) return;
  Versions agreed = r.own->newest;
  for (const auto& [rack, report] : r.peers) {
    for (const auto& [key, v] : report.newest) agreed[key] = std::max(agreed[key], v);
  }
  for (auto& [key, v] : agreed) ++v;  // every chunk skips: older frames are stale
  r.active = false;
  ++r.finished;
  r.last_agreed = agreed;
  // What this round's report carried is done; a MarkFresh or RequestRestore
  // after the report was made waits for the next round.
  if (r.own->fresh) r.fresh = false;
  if (r.own->restore == r.restore) r.restore = 0;
  if (r.fresh) {
    // Marked after this hub's report was made: the next round carries it.
    fx.recover.emplace(handle, "rack " + Num(self_) + "'s hub lost its state of the tenant");
  }
  fx.done = std::move(r.waiting);
  r.waiting.clear();
  fx.outcome.restore = RestoreOf(r);
  fx.outcome.round = r.number;
  if (fx.outcome.restore != 0) {
    r.restored_round = r.number;
    r.restored = fx.outcome.restore;
  }
  fx.outcome.agreed = std::move(agreed);
  MembersOf(r, fx.outcome);
  if (fx.outcome.restore != 0) {
    spdlog::warn("rack recovery: tenant '{}' round {}: every hub restores checkpoint {}", r.name,
                 r.number, fx.outcome.restore);
  } else {
    spdlog::info("rack recovery: tenant '{}' round {} agreed on {} key version(s) with every rack",
                 r.name, r.number, fx.outcome.agreed.size());
  }
}

void RackRecovery::Apply(Effects fx) {
  // The round that ended realigns first: a recovery begun here (a restart
  // seen, a newer round) reads its versions after that realignment (the
  // DataPlane runs both in the order they are asked for), never before a
  // restore it would undo.
  for (size_t i = 0; i < fx.done.size(); ++i) fx.done[i](fx.outcome, i == 0);
  if (fx.restarted && hooks_.restarted) hooks_.restarted(*fx.restarted);
  for (auto& [rack, bytes] : fx.sends) hooks_.send(rack, std::move(bytes));
  if (fx.recover) hooks_.recover(fx.recover->first, fx.recover->second);
}

uint64_t RackRecovery::FinishedRounds(uint32_t handle) {
  std::lock_guard lock(mu_);
  const auto it = rounds_.find(handle);
  return it == rounds_.end() ? 0 : it->second.finished;
}

bool RackRecovery::Reported(uint32_t handle, const std::string& name, const std::string& cause,
                            Versions newest, Agreed agreed, std::optional<uint64_t> failed_at,
                            uint64_t read_at, std::optional<Members> members) {
  if (!hooks_.handle_of(name)) {
    // Deleted meanwhile (Forget ran): nothing to agree on, the recovery ends.
    agreed(Outcome{}, false);
    return true;
  }
  std::vector<uint64_t> checkpoints =
      hooks_.checkpoints ? hooks_.checkpoints(handle) : std::vector<uint64_t>{};
  std::sort(checkpoints.begin(), checkpoints.end());
  Effects fx;
  Agreed covered;
  {
    std::lock_guard lock(mu_);
    Round& r = rounds_[handle];
    r.name = name;
    if (failed_at && r.finished != *failed_at) {
      // A round ended after this recovery failed its pending updates: that
      // round's realignment was queued on every lane after the failure, so
      // it covers this recovery too. A report now would start a round
      // nobody needs (one more skipped step).
      covered = std::move(agreed);
    } else if (!r.own && r.finished != read_at) {
      return false;  // read again, after that realignment
    } else {
      if (!r.active) {
        r.number += 1;
        r.active = true;
        r.peers.clear();
        r.own.reset();
        r.cause = cause;
      }
      if (!r.own) {
        // Read before the last round's commit, perhaps: never below it.
        if (members) members->generation = std::max(members->generation, r.last_generation);
        // Never below the last round's agreement: phase 1 may have read the
        // lanes before they realigned to it, and frames of updates after it
        // must be stale after this round too.
        for (const auto& [key, v] : r.last_agreed) newest[key] = std::max(newest[key], v);
        r.own = Report{incarnation_, std::move(newest), r.fresh,          r.restore,
                       std::move(checkpoints), r.restored_round, r.restored, std::move(members)};
        spdlog::info("rack recovery: tenant '{}' round {}: reporting {} key version(s){} ({}{}{})",
                     name, r.number, r.own->newest.size(),
                     r.own->members ? fmt::format(" and {} member(s)",
                                                  std::count(r.own->members->member.begin(),
                                                             r.own->members->member.end(), 1))
                                    : std::string(),
                     SafeForLog(r.cause, 200),
                     r.fresh ? "; this hub restarted" : "",
                     r.restore ? "; restore checkpoint " + Num(r.restore) : std::string());
        SendToAll(r, fx);
      }
      r.waiting.push_back(std::move(agreed));
      TryFinish(handle, r, fx);
    }
  }
  if (covered) {
    covered(Outcome{}, false);  // finishes without a realignment of its own
    return true;
  }
  Apply(std::move(fx));
  return true;
}

Status RackRecovery::OnVersions(uint32_t rack, std::span<const std::byte> payload) {
  dpb::RackVersions m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return InvalidArgument("RACK_VERSIONS: the payload is not a RackVersions");
  }
  if (rack >= racks_ || rack == self_) {
    return InvalidArgument("RACK_VERSIONS: from rack " + Num(rack) + ", not another rack");
  }
  if (m.round() == 0 && m.tenant().empty() && m.keys_size() == 0 && m.incarnation() != 0) {
    // An announcement (lane 0's link came up): only who the sender is.
    Effects fx;
    {
      std::lock_guard lock(mu_);
      uint64_t& known = incarnations_[rack];
      if (known != 0 && known != m.incarnation()) fx.restarted = rack;
      known = m.incarnation();
    }
    Apply(std::move(fx));
    return Status::Ok();
  }
  if (m.round() == 0 || m.incarnation() == 0 || static_cast<size_t>(m.keys_size()) > kMaxKeys) {
    return InvalidArgument("RACK_VERSIONS: round " + Num(m.round()) + ", incarnation " +
                           Num(m.incarnation()) + ", " + Num(m.keys_size()) +
                           " keys (round and incarnation must not be 0, at most " +
                           Num(kMaxKeys) + " keys)");
  }
  const std::optional<uint32_t> handle = hooks_.handle_of(m.tenant());
  if (!handle) {
    return NotFound("RACK_VERSIONS: tenant " + QuoteForLog(m.tenant()) +
                    " does not span racks on this hub (not created here yet?)");
  }
  if (static_cast<size_t>(m.checkpoints_size()) > kMaxKeys) {
    return InvalidArgument("RACK_VERSIONS: " + Num(m.checkpoints_size()) +
                           " checkpoint sequences (at most " + Num(kMaxKeys) + ")");
  }
  Report report;
  report.incarnation = m.incarnation();
  for (const auto& k : m.keys()) {
    uint64_t& v = report.newest[k.key_id()];
    v = std::max(v, k.newest());
  }
  report.fresh = m.fresh();
  report.restore = m.restore();
  report.restored_round = m.restored_round();
  report.restored = m.restored();
  report.checkpoints.assign(m.checkpoints().begin(), m.checkpoints().end());
  std::sort(report.checkpoints.begin(), report.checkpoints.end());
  report.checkpoints.erase(std::unique(report.checkpoints.begin(), report.checkpoints.end()),
                           report.checkpoints.end());
  if (Status s = ParseMembers(rack, *handle, m, report); !s.ok()) return s;
  const std::string cause = "rack " + Num(rack) + ": " + SafeForLog(m.cause(), kMaxCause);
  Effects fx;
  {
    std::lock_guard lock(mu_);
    uint64_t& known = incarnations_[rack];
    if (known != 0 && known != m.incarnation()) fx.restarted = rack;
    known = m.incarnation();
    Round& r = rounds_[*handle];
    r.name = m.tenant();
    if (m.round() > r.number) {
      // A newer round: join it (this hub fails its iteration too).
      Begin(*handle, r, m.round(), cause, fx);
      r.peers[rack] = std::move(report);
    } else if (m.round() == r.number) {
      const auto known = r.peers.find(rack);
      const bool same = known == r.peers.end() || known->second.incarnation == m.incarnation();
      if (!same) {
        // The hub restarted and took part in this round number again with
        // other versions: some hubs may end (or have ended) it with the old
        // report, others with the new one. A new round for everyone.
        Begin(*handle, r, r.number + 1, cause + " (its hub restarted)", fx);
      } else if (r.active) {
        r.peers[rack] = std::move(report);
        TryFinish(*handle, r, fx);
      } else if (!m.finished() && r.own) {
        // It missed this hub's report of the round it is still in.
        fx.sends.emplace_back(rack, Encode(r, true));
      }
    } else if (!m.finished()) {
      // It waits in a round this hub has left.
      if (r.active) {
        if (r.own) fx.sends.emplace_back(rack, Encode(r, false));
      } else {
        Begin(*handle, r, r.number + 1, cause, fx);
      }
    }
  }
  Apply(std::move(fx));
  return Status::Ok();
}

void RackRecovery::OnLinkUp(uint32_t rack) {
  Effects fx;
  {
    // Who this hub is, so that the other one notices a restart (Hooks::restarted).
    dpb::RackVersions hello;
    hello.set_incarnation(incarnation_);
    fx.sends.emplace_back(rack, hello.SerializeAsString());
    std::lock_guard lock(mu_);
    for (const auto& [handle, r] : rounds_) {
      if (r.own) fx.sends.emplace_back(rack, Encode(r, !r.active));
    }
  }
  Apply(std::move(fx));
}

void RackRecovery::Resend() {
  Effects fx;
  {
    std::lock_guard lock(mu_);
    for (const auto& [handle, r] : rounds_) {
      if (!r.active || !r.own) continue;
      for (uint32_t rack = 0; rack < racks_; ++rack) {
        if (rack != self_ && !r.peers.count(rack)) fx.sends.emplace_back(rack, Encode(r, false));
      }
    }
  }
  Apply(std::move(fx));
}

void RackRecovery::Forget(uint32_t handle) {
  Effects fx;
  {
    std::lock_guard lock(mu_);
    const auto it = rounds_.find(handle);
    if (it == rounds_.end()) return;
    fx.done = std::move(it->second.waiting);
    rounds_.erase(it);
  }
  // Recoveries still waiting finish without a realignment (nothing is left
  // to realign): their held PULLs are answered (as UNKNOWN_KEY).
  for (auto& done : fx.done) done(Outcome{}, false);
}

void RackRecovery::MarkFresh(uint32_t handle, const std::string& name) {
  std::lock_guard lock(mu_);
  Round& r = rounds_[handle];
  r.name = name;
  r.fresh = true;
}

bool RackRecovery::RequestRestore(uint32_t handle, const std::string& name, uint64_t sequence) {
  std::lock_guard lock(mu_);
  Round& r = rounds_[handle];
  if (r.active && r.own) return false;
  r.name = name;
  r.restore = sequence;
  return true;
}

std::vector<uint32_t> RackRecovery::WaitingFor(uint32_t handle) {
  std::lock_guard lock(mu_);
  std::vector<uint32_t> out;
  const auto it = rounds_.find(handle);
  if (it == rounds_.end() || !it->second.active) return out;
  for (uint32_t rack = 0; rack < racks_; ++rack) {
    if (rack != self_ && !it->second.peers.count(rack)) out.push_back(rack);
  }
  return out;
}

void RackRecovery::Restored(uint32_t handle, const Versions& versions) {
  std::lock_guard lock(mu_);
  const auto it = rounds_.find(handle);
  if (it == rounds_.end()) return;
  for (const auto& [key, v] : versions) it->second.last_agreed[key] = v;
}

}  // namespace rackhub::server
