// RackRecovery: the recovery rounds of tenants spanning racks
// (docs/cluster.md, "Recovery across racks"). When any hub of such a tenant
// recovers it (a worker lost, a straggler, a hub link lost, a hub's refusal),
// every hub must abort the iteration in progress and all must bring each key
// to one version again. A round does that:
//
//   1. A hub that recovers the tenant (DataPlane::Recover: the pending
//      updates failed, no push accepted meanwhile) reports the newest
//      version of each key among its chunks in a RACK_VERSIONS to every other
//      hub, tagged with the tenant's round number.
//   2. A hub that receives a report of a newer round joins it: it recovers
//      the tenant itself (so it fails its pending updates too) and reports.
//   3. Once a hub has every rack's report of the round, each key's agreed
//      version is 1 + the newest version in them; the hub realigns its
//      chunks to it (RackExchange::Realign: a skipped step; a chunk's home
//      sends its parameters to the other hubs in RACK_ALIGN).
//
// Why it cannot deadlock: round numbers only grow, and a hub only ever waits
// for the reports of the round it is in. A hub in an older round joins on
// the first report of a newer one; a hub that finished a round answers a
// hub still waiting in it with its own report of that round (the same
// report everyone else used); a hub asked about a round it can no longer
// answer (an older one, or one a restarted hub reuses: each report names
// the sending process's random incarnation) starts a newer round that
// everyone joins. Reports lost in a broken link are sent again when lane
// 0's link to that hub is up again (OnLinkUp). A round therefore ends on
// every hub once the links hold long enough for one report each way;
// while a hub is unreachable the round waits (workers' Pulls are held,
// bounded by their operation timeout).
//
// Cluster checkpoints (docs/cluster.md, "Cluster checkpoints"): each report
// also lists the sequences of the sender's checkpoint files of the tenant,
// whether the sender lost its state (`fresh`: it restarted and has not
// finished a round since) and an admin's restore request. Every hub decides
// from the same reports: a restore request of a sequence every hub has, or
// else a fresh hub and a sequence every hub has (the newest such), makes the
// round a rollback to that checkpoint (Outcome::restore) instead of a
// skipped step. Reports also carry the last restore each hub did: a hub
// that left a restoring round for a newer one before it ended there makes
// the next round restore that checkpoint again, on every hub. A report must
// not carry versions read before the realignment of a round that ended
// meanwhile (Reported refuses it: the caller reads again). A local recovery
// that a round ending after its failure covers reports nothing (Reported),
// so hubs restarted together start no second round after the restoring one.
//
// Ownership: the DataPlane owns it. Threading: any thread (lanes call it);
// one mutex; the hooks and callbacks run outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rackhub/common/status.h"

namespace rackhub::data::v1 {
class RackVersions;
}

namespace rackhub::server {

// An elastic tenant's part of a report (docs/elastic.md, "Across racks"):
// the sender's committed cluster generation and its rack's ranks present.
// (At namespace scope: a nested struct with member initializers is not
// default-constructible for std::optional inside its class under clang.)
// The tenant's flags the decisions rest on (--workers, --min-workers,
// --max-workers): every hub must have the same (ParseMembers compares them).
struct RackElasticFlags {
  uint32_t workers = 0;
  uint32_t min_workers = 0;
  uint32_t max_workers = 0;
  bool operator==(const RackElasticFlags&) const = default;
};

struct RackMembers {
  uint64_t generation = 0;      // 0: the tenant never started
  std::vector<uint8_t> member;  // by rank: 1 = present
  uint32_t quorum = 0;          // the start quorum over every rack (not sent)
  RackElasticFlags flags;       // the sender's
};

class RackRecovery {
 public:
  using Versions = std::map<uint32_t, uint64_t>;  // key id -> version
  using Members = RackMembers;
  struct Outcome {
    Versions agreed;       // key id -> the version every chunk skips to
    uint64_t round = 0;    // the round's number (frames of older ones are stale)
    uint64_t restore = 0;  // >0: every hub restores this checkpoint sequence
    // Elastic tenants: every rack's members as reported in the round (by
    // rack; this hub's own is what it commits; empty for other tenants), their
    // total, and the cluster generation the round commits: 1 + the newest in
    // the reports once the start quorum was reached (now or before), else 0.
    // The same on every hub.
    std::vector<std::vector<uint8_t>> members;
    uint32_t total = 0;
    uint64_t generation = 0;
  };
  // The layout of the membership fields of RACK_VERSIONS this hub writes and
  // reads (RackVersions.membership_format).
  // 2: with the tenant's flags.
  static constexpr uint32_t kMembershipFormat = 2;
  // Most ranks one rack's member list may carry (the max_workers limit).
  static constexpr size_t kMaxRanks = 1024;
  // A reported cluster generation above this is refused (1 + it must not
  // wrap to 0, "never started").
  static constexpr uint64_t kMaxGeneration = uint64_t{1} << 62;
  // Runs once per local recovery when its round ends; `realign` for exactly
  // one of the round's recoveries (the others only finish: their phase 1 is
  // covered by the same realignment).
  using Agreed = std::function<void(const Outcome& outcome, bool realign)>;
  struct Hooks {
    // RACK_VERSIONS `payload` to rack `rack`'s hub on lane 0's link
    // (dropped while it is down: OnLinkUp sends it again).
    std::function<void(uint32_t rack, std::string payload)> send;
    // Recovers the tenant here (DataPlane::Recover), which calls Reported.
    std::function<void(uint32_t handle, const std::string& why)> recover;
    // The handle of the tenant named `name` if it spans racks here.
    std::function<std::optional<uint32_t>(const std::string& name)> handle_of;
    // Rack `rack`'s hub is another process than the one that reported
    // before (it restarted without its state).
    std::function<void(uint32_t rack)> restarted;
    // The sequences of this hub's checkpoint files of the tenant (may be
    // empty; called outside the lock).
    std::function<std::vector<uint64_t>(uint32_t handle)> checkpoints;
    // Whether the tenant is elastic: its reports must carry Members.
    std::function<bool(uint32_t handle)> elastic;
    // An elastic tenant's ranks per rack (TenantInfo::rank_slots()): a
    // peer's member list is at most that long. Unset: kMaxRanks bounds it.
    std::function<uint32_t(uint32_t handle)> rank_slots;
    // An elastic tenant's flags here; a peer's report with others is
    // refused by name. Unset: not compared.
    std::function<std::optional<RackElasticFlags>(uint32_t handle)> elastic_flags;
  };

  RackRecovery(uint32_t self_rack, uint32_t racks, Hooks hooks);

  // A local recovery of tenant `handle` (`name`) finished its phase 1 with
  // `newest` (key -> newest version here), read when FinishedRounds was
  // `read_at`. `agreed` runs when the round ends. `failed_at`: FinishedRounds
  // read right after the recovery queued the failure of its pending updates
  // on every lane; if a round ended since, `agreed` runs at once without a
  // realignment: that round's realignment ran after the failure on every
  // lane and covers it (a report now would start another round for
  // nothing: one more skipped step). None for a recovery that must be in a
  // round of its own (a peer restarted: a round that ended may have used
  // its old process's report). False (nothing taken) if a round ended since
  // `read_at` and this report would start or make the next one: its
  // versions may predate that round's realignment (a restore moves them
  // back); read them again after it. An elastic tenant's report carries
  // `members` (read with the versions).
  bool Reported(uint32_t handle, const std::string& name, const std::string& cause,
                Versions newest, Agreed agreed, std::optional<uint64_t> failed_at,
                uint64_t read_at, std::optional<Members> members = std::nullopt);
  // This hub process's random id (never 0), in every report.
  uint64_t incarnation() const { return incarnation_; }
  // How many rounds of the tenant ended here (see Reported).
  uint64_t FinishedRounds(uint32_t handle);
  // A RACK_VERSIONS from rack `rack`'s hub. An error names what is wrong
  // with it (the link stays: the caller logs it).
  Status OnVersions(uint32_t rack, std::span<const std::byte> payload);
  // Lane 0's link to rack `rack`'s hub is up (again): an announcement of
  // this hub's incarnation (a RACK_VERSIONS of round 0 without tenant), then
  // the reports it may have missed.
  void OnLinkUp(uint32_t rack);
  // Periodically (lane 0's timer): the reports of rounds still waiting go
  // again to the racks not heard from (a report the receiver could not take
  // yet, e.g. of a tenant its registry did not have yet).
  void Resend();
  // The tenant was deleted: its round ends here (recoveries waiting in it
  // finish without a realignment).
  void Forget(uint32_t handle);
  // This hub lost the tenant's state (it started with the tenant's
  // checkpoints on disk, or could not load the one a round restored): its
  // reports say so until a round whose report said so finishes (marked
  // after the current round's report was made, the next round is started
  // when the current one ends).
  void MarkFresh(uint32_t handle, const std::string& name);
  // An admin restore of checkpoint `sequence`: carried by this hub's next
  // report of the tenant. False while its current round already reported
  // (the caller waits for that round to end and asks again).
  bool RequestRestore(uint32_t handle, const std::string& name, uint64_t sequence);
  // A round's restore installed `versions` (key id -> the checkpoint's
  // version): the next rounds report no less than these, not the versions
  // the rollback undid.
  void Restored(uint32_t handle, const Versions& versions);
  // The racks whose report the tenant's round still waits for (empty when
  // no round is under way).
  std::vector<uint32_t> WaitingFor(uint32_t handle);

  // Most keys one report may carry (RACK_VERSIONS is a control frame).
  static constexpr size_t kMaxKeys = 100000;

 private:
  struct Report {
    uint64_t incarnation = 0;
    Versions newest;
    bool fresh = false;
    uint64_t restore = 0;
    std::vector<uint64_t> checkpoints;  // ascending
    uint64_t restored_round = 0;  // Round::restored_round when the report was made
    uint64_t restored = 0;
    std::optional<Members> members;  // elastic tenants
  };
  struct Round {
    std::string name;
    uint64_t number = 0;    // the round this hub is in (or finished last)
    bool active = false;    // in it and not finished
    std::string cause;
    std::optional<Report> own;         // this hub's report of `number`
    std::map<uint32_t, Report> peers;  // by rack: their reports of `number`
    std::vector<Agreed> waiting;       // local recoveries in `number`
    Versions last_agreed;              // what the last round this hub finished agreed
    bool fresh = false;       // MarkFresh, until a round finishes
    uint64_t restore = 0;     // RequestRestore, until a round finishes
    uint64_t restored_round = 0;  // the last round this hub finished with a restore
    uint64_t restored = 0;        // and the checkpoint it restored
    uint64_t finished = 0;        // rounds finished here
    // Elastic tenants: the generation the last round finished here
    // committed (a report read before that commit says no less).
    uint64_t last_generation = 0;
  };
  struct Effects {  // what to do once the lock is released
    std::vector<std::pair<uint32_t, std::string>> sends;
    std::optional<std::pair<uint32_t, std::string>> recover;
    std::vector<Agreed> done;
    Outcome outcome;
    std::optional<uint32_t> restarted;
  };

  // Enters round `number` (or the next) without a report of this hub yet:
  // a local recovery is started that reports into it.
  void Begin(uint32_t handle, Round& r, uint64_t number, std::string cause, Effects& fx);
  std::string Encode(const Round& r, bool finished) const;
  // The checkpoint every hub restores at the end of round `r` (0: none).
  static uint64_t RestoreOf(const Round& r);
  // An elastic tenant's members in the round's reports (Outcome::members).
  void MembersOf(Round& r, Outcome& out) const;
  // The membership fields of a RACK_VERSIONS of tenant `handle` (an error
  // names what is wrong with them).
  Status ParseMembers(uint32_t rack, uint32_t handle, const data::v1::RackVersions& m,
                      Report& report) const;
  void SendToAll(const Round& r, Effects& fx) const;
  // Ends the round if this hub and every other rack reported.
  void TryFinish(uint32_t handle, Round& r, Effects& fx);
  void Apply(Effects fx);

  const uint32_t self_;
  const uint32_t racks_;
  const uint64_t incarnation_;
  const Hooks hooks_;
  std::mutex mu_;
  std::map<uint32_t, Round> rounds_;  // by tenant handle; GUARDED_BY(mu_)
  std::map<uint32_t, uint64_t> incarnations_;  // by rack: the last seen; GUARDED_BY(mu_)
};

}  // namespace rackhub::server
