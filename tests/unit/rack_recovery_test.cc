// Cross-rack recovery rounds (server/lanes/rack_recovery.h) under a
// simulated cluster: 2-4 hubs whose RACK_VERSIONS are delivered in random
// order, lost in cut links (and sent again when the link is up), with
// failures starting new recoveries on random hubs meanwhile and hubs
// restarting without their state. Whatever the interleaving, every local
// recovery finishes (no hub waits for ever once the links hold), every hub
// ends with the same version of every key, and that version is past every
// version any hub had when the failures began (older frames are stale).
// Thousands of seeded interleavings; the simulation is the only scheduler.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "rack_recovery.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {
namespace {

using Versions = RackRecovery::Versions;

// The rounds log at info level; thousands of them here.
struct QuietLogs : ::testing::Environment {
  void SetUp() override { spdlog::set_level(spdlog::level::warn); }
};
const auto* const kQuiet = ::testing::AddGlobalTestEnvironment(new QuietLogs);

class Sim {
 public:
  // `elastic`: the tenant is elastic; each hub reports its members (a
  // random set per report) and the generation it committed last.
  Sim(uint32_t racks, uint32_t seed, bool elastic = false)
      : racks_(racks), rng_(seed), elastic_(elastic) {
    for (uint32_t r = 0; r < racks; ++r) {
      hubs_.emplace_back();
      Hub& h = hubs_.back();
      // Different starting versions per hub and key (a cut mid-update).
      for (uint32_t k = 1; k <= 3; ++k) h.versions[k] = 10 + Pick(3);
      Start(r);
    }
  }

  void Start(uint32_t rack) {
    Hub& h = hubs_[rack];
    ++h.incarnation;
    const uint64_t inc = h.incarnation;
    RackRecovery::Hooks hooks;
    hooks.send = [this, rack, inc](uint32_t to, std::string payload) {
      if (elastic_) RecordOwn(rack, inc, payload);
      messages_.push_back({rack, to, std::move(payload)});
    };
    hooks.recover = [this, rack, inc](uint32_t, const std::string&) {
      if (hubs_[rack].incarnation == inc) Fail(rack);
    };
    hooks.handle_of = [](const std::string& name) -> std::optional<uint32_t> {
      if (name == "job") return 7;
      return std::nullopt;
    };
    hooks.elastic = [this](uint32_t) { return elastic_; };
    h.generation = 0;  // lost with the process's state
    h.committed_round = 0;
    h.recovery = std::make_unique<RackRecovery>(rack, racks_, std::move(hooks));
    h.recovering = 0;
    h.to_report.clear();
  }

  // A local failure: the hub recovers the tenant (phase 1 soon), covered
  // by a round that ends before (DataPlane::Recover) unless `own_round`.
  void Fail(uint32_t rack, bool own_round = false) {
    Hub& h = hubs_[rack];
    h.to_report.push_back(own_round ? std::nullopt
                                    : std::optional(h.recovery->FinishedRounds(7)));
  }

  // The hub is killed and started again with its chunks at `lost` versions.
  void Restart(uint32_t rack) {
    Hub& h = hubs_[rack];
    for (auto& [k, v] : h.versions) v = 0;
    Start(rack);
    // Its links broke: every other hub recovers in a round of its own (as
    // when it sees the new process: DataPlane's Hooks::restarted), links
    // come up both ways.
    for (uint32_t r = 0; r < racks_; ++r) {
      if (r == rack) continue;
      Fail(r, /*own_round=*/true);
      link_ups_.push_back({r, rack});
      link_ups_.push_back({rack, r});
    }
  }

  // Runs one event; false when nothing is left to do. Elastic: the
  // outcomes the event committed are checked against the reports.
  bool Step(double drop, bool chaos) {
    const bool more = Event(drop, chaos);
    VerifyCommits();
    return more;
  }

  bool Event(double drop, bool chaos) {
    std::vector<int> kinds;
    if (!messages_.empty()) kinds.push_back(0);
    if (!link_ups_.empty()) kinds.push_back(1);
    for (const Hub& h : hubs_) {
      if (!h.to_report.empty()) {
        kinds.push_back(2);
        break;
      }
    }
    if (kinds.empty()) return false;
    if (chaos && Pick(40) == 0) {
      if (Pick(4) == 0) {
        Restart(Pick(racks_));
      } else {
        Fail(Pick(racks_));
      }
      return true;
    }
    switch (kinds[Pick(kinds.size())]) {
      case 0: {
        const size_t i = Pick(messages_.size());
        Message m = std::move(messages_[i]);
        messages_.erase(messages_.begin() + static_cast<long>(i));
        if (Coin(drop)) {
          // Lost in a cut: the sender's link comes up again later.
          link_ups_.push_back({m.from, m.to});
          return true;
        }
        if (elastic_) RecordDelivered(m.from, m.to, m.payload);
        const Status s = hubs_[m.to].recovery->OnVersions(
            m.from, {reinterpret_cast<const std::byte*>(m.payload.data()), m.payload.size()});
        EXPECT_TRUE(s.ok()) << s.message();
        return true;
      }
      case 1: {
        const size_t i = Pick(link_ups_.size());
        const auto [from, to] = link_ups_[i];
        link_ups_.erase(link_ups_.begin() + static_cast<long>(i));
        hubs_[from].recovery->OnLinkUp(to);
        return true;
      }
      default: {
        std::vector<uint32_t> ready;
        for (uint32_t r = 0; r < racks_; ++r) {
          if (!hubs_[r].to_report.empty()) ready.push_back(r);
        }
        Report(ready[Pick(ready.size())]);
        return true;
      }
    }
  }

  // Phase 1 of one local recovery of `rack` is done.
  void Report(uint32_t rack) {
    Hub& h = hubs_[rack];
    const std::optional<uint64_t> failed_at = h.to_report.front();
    h.to_report.pop_front();
    ++h.recovering;
    const uint64_t inc = h.incarnation;
    std::optional<RackRecovery::Members> members;
    if (elastic_) {
      members.emplace();
      members->generation = h.generation;
      for (int r = 0; r < 3; ++r) members->member.push_back(Pick(2) ? 1 : 0);
      members->quorum = kQuorum;
    }
    ASSERT_TRUE(h.recovery->Reported(7, "job", "test failure", h.versions,
                         [this, rack, inc](const RackRecovery::Outcome& outcome,
                                           bool realign) {
                           const Versions& agreed = outcome.agreed;
                           EXPECT_EQ(outcome.restore, 0u) << "no checkpoints: never a restore";
                           Hub& hub = hubs_[rack];
                           if (hub.incarnation != inc) return;  // a killed process
                           --hub.recovering;
                           // A recovery a round covered: nothing to commit.
                           if (outcome.round == 0) {
                             EXPECT_FALSE(realign);
                             ++covered_;
                             return;
                           }
                           if (elastic_) CommitMembers(rack, outcome);
                           if (!realign) return;
                           for (const auto& [k, v] : agreed) {
                             EXPECT_GT(v, hub.versions[k]) << "a round moves every key on";
                             hub.versions[k] = v;
                           }
                           hub.last_agreed = agreed;
                         },
                                     failed_at, h.recovery->FinishedRounds(7),
                                     std::move(members)));
  }

  // A hub commits each round's cluster membership once (generation, total,
  // every rack's members); generations only grow. (Hubs may end one round
  // number with different reports when a restarted hub reported twice: the
  // next round, which that starts, agrees; so does the last one.)
  void CommitMembers(uint32_t rack, const RackRecovery::Outcome& outcome) {
    ASSERT_EQ(outcome.members.size(), racks_);
    Hub& hub = hubs_[rack];
    hub.last = outcome;
    hub.last.agreed.clear();
    to_verify_.push_back({rack, hub.incarnation, hub.last});
    // A round's recoveries on one hub each finish with it: the first commits.
    if (outcome.round == hub.committed_round) return;
    EXPECT_GT(outcome.round, hub.committed_round) << "rack " << rack;
    hub.committed_round = outcome.round;
    if (outcome.generation != 0) {
      EXPECT_GT(outcome.generation, hub.generation) << "rack " << rack;
      hub.generation = outcome.generation;
    }
  }

  // The membership part of one report as it went on the wire.
  struct SentMembers {
    uint64_t generation = 0;
    std::vector<uint8_t> member;
  };
  static std::optional<std::pair<uint64_t, SentMembers>> Decode(const std::string& payload) {
    data::v1::RackVersions m;
    if (!m.ParseFromString(payload) || m.round() == 0) return std::nullopt;  // an announcement
    SentMembers s;
    s.generation = m.membership_generation();
    s.member.assign(m.members().begin(), m.members().end());
    return std::pair{m.round(), std::move(s)};
  }
  // A hub's own report of a round: what it sends (one content per round).
  void RecordOwn(uint32_t rack, uint64_t inc, const std::string& payload) {
    auto d = Decode(payload);
    if (!d) return;
    own_.try_emplace({rack, inc, d->first}, std::move(d->second));
  }
  // The report of `from` a hub takes into a round: the first of that round
  // delivered to it (another one of the round, from a restarted process,
  // makes it start a newer round, so it never ends this one with both).
  void RecordDelivered(uint32_t from, uint32_t to, const std::string& payload) {
    auto d = Decode(payload);
    if (!d) return;
    delivered_.try_emplace({to, hubs_[to].incarnation, from, d->first}, std::move(d->second));
  }
  // Each committed outcome against an expectation computed here from the
  // reports of its round alone (docs/elastic.md, "Across racks"): every
  // rack's members as reported, the total their sum, the generation 1 + the
  // newest reported, or 0 while no report named a started generation and
  // the total is below the start quorum.
  void VerifyCommits() {
    for (const Commit& c : to_verify_) {
      const uint64_t round = c.outcome.round;
      std::vector<std::vector<uint8_t>> members(racks_);
      uint64_t newest = 0;
      bool complete = true;
      for (uint32_t rack = 0; rack < racks_; ++rack) {
        const SentMembers* report = nullptr;
        if (rack == c.rack) {
          const auto it = own_.find({c.rack, c.incarnation, round});
          if (it != own_.end()) report = &it->second;
        } else {
          const auto it = delivered_.find({c.rack, c.incarnation, rack, round});
          if (it != delivered_.end()) report = &it->second;
        }
        EXPECT_NE(report, nullptr) << "hub " << c.rack << " ended round " << round
                                   << " without a report of rack " << rack;
        if (!report) {
          complete = false;
          continue;
        }
        members[rack] = report->member;
        newest = std::max(newest, report->generation);
      }
      if (!complete) continue;
      uint32_t total = 0;
      for (const auto& m : members) {
        for (uint8_t b : m) total += b == 1 ? 1 : 0;
      }
      const uint64_t generation = newest > 0 || total >= kQuorum ? newest + 1 : 0;
      EXPECT_EQ(c.outcome.members, members) << "hub " << c.rack << " round " << round;
      EXPECT_EQ(c.outcome.total, total) << "hub " << c.rack << " round " << round;
      EXPECT_EQ(c.outcome.generation, generation)
          << "hub " << c.rack << " round " << round << ": newest reported " << newest
          << ", total " << total << ", start quorum " << kQuorum;
      ++verified_;
      if (generation > 0) ++started_;
    }
    to_verify_.clear();
  }
  uint64_t verified() const { return verified_; }
  uint64_t covered() const { return covered_; }
  uint64_t started() const { return started_; }

  static constexpr uint32_t kQuorum = 2;  // the start quorum each hub's report is read with

  struct Hub {
    std::unique_ptr<RackRecovery> recovery;
    uint64_t incarnation = 0;
    Versions versions;
    Versions last_agreed;
    // Local recoveries started, phase 1 not done: FinishedRounds when each
    // failed (none: a round of its own).
    std::deque<std::optional<uint64_t>> to_report;
    int recovering = 0;  // phase 1 done, round not ended
    uint64_t generation = 0;  // elastic: the cluster generation committed last
    uint64_t committed_round = 0;  // and the round that committed it
    RackRecovery::Outcome last;    // elastic: the last round's outcome
  };
  std::vector<Hub>& hubs() { return hubs_; }
  uint32_t Pick(size_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool Coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

 private:
  struct Message {
    uint32_t from, to;
    std::string payload;
  };
  struct Commit {
    uint32_t rack;
    uint64_t incarnation;
    RackRecovery::Outcome outcome;
  };
  // By (rack, its incarnation, round): the hub's own report.
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, SentMembers> own_;
  // By (receiver, its incarnation, sender, round): the report it took.
  std::map<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t>, SentMembers> delivered_;
  std::vector<Commit> to_verify_;  // committed since the last Step
  uint64_t verified_ = 0, started_ = 0, covered_ = 0;
  const uint32_t racks_;
  std::mt19937_64 rng_;
  const bool elastic_;
  std::vector<Hub> hubs_;
  std::vector<Message> messages_;
  std::vector<std::pair<uint32_t, uint32_t>> link_ups_;
};

void ExpectAgreement(Sim& sim, uint32_t seed) {
  const Versions& first = sim.hubs()[0].versions;
  for (size_t r = 0; r < sim.hubs().size(); ++r) {
    const auto& h = sim.hubs()[r];
    EXPECT_EQ(h.recovering, 0) << "seed " << seed << ": hub " << r << " still waits in a round";
    EXPECT_EQ(h.versions, first) << "seed " << seed << ": hub " << r << " disagrees";
  }
}

TEST(RackRecoveryTest, OneFailureOnOneHubRealignsEveryHubToOneVersionPerKey) {
  for (uint32_t seed = 0; seed < 2000; ++seed) {
    const uint32_t racks = 2 + seed % 3;
    Sim sim(racks, seed);
    Versions newest;
    for (const auto& h : sim.hubs()) {
      for (const auto& [k, v] : h.versions) newest[k] = std::max(newest[k], v);
    }
    sim.Fail(sim.Pick(racks));
    while (sim.Step(0.0, false)) {
    }
    ExpectAgreement(sim, seed);
    for (const auto& [k, v] : newest) {
      EXPECT_EQ(sim.hubs()[0].versions[k], v + 1) << "seed " << seed << " key " << k;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(RackRecoveryTest, LostReportsFailuresAndRestartsDuringRoundsStillEndInAgreement) {
  // RACKHUB_RR_SEEDS=N runs N interleavings (a deeper search than CI's).
  const char* seeds = std::getenv("RACKHUB_RR_SEEDS");
  const uint32_t n = seeds ? static_cast<uint32_t>(std::atoi(seeds)) : 3000;
  for (uint32_t seed = 0; seed < n; ++seed) {
    const uint32_t racks = 2 + seed % 3;
    Sim sim(racks, seed);
    sim.Fail(sim.Pick(racks));
    if (seed % 2) sim.Fail(sim.Pick(racks));  // concurrent starts
    // Chaos for a while (cuts lose reports; failures; restarts), then the
    // links hold and the cluster must settle.
    for (int i = 0; i < 300 && sim.Step(0.3, true); ++i) {
    }
    int steps = 0;
    while (sim.Step(0.0, false)) ASSERT_LT(++steps, 100000) << "seed " << seed << " livelocks";
    ExpectAgreement(sim, seed);
    if (::testing::Test::HasFailure()) return;
  }
}

// Elastic tenants (docs/elastic.md, "Across racks"): under the same chaos,
// every outcome any hub commits, in every round (not only the last), equals
// the membership computed in this test from that round's reports alone
// (Sim::VerifyCommits), and the hubs end with the same one.
TEST(RackRecoveryTest, ElasticRoundsCommitOneClusterMembershipOnEveryHub) {
  uint64_t verified = 0, started = 0;
  for (uint32_t seed = 0; seed < 1000; ++seed) {
    const uint32_t racks = 2 + seed % 3;
    Sim sim(racks, seed, true);
    sim.Fail(sim.Pick(racks));
    for (int i = 0; i < 300 && sim.Step(0.3, true); ++i) {
    }
    int steps = 0;
    while (sim.Step(0.0, false)) ASSERT_LT(++steps, 100000) << "seed " << seed << " livelocks";
    ExpectAgreement(sim, seed);
    const RackRecovery::Outcome& first = sim.hubs()[0].last;
    for (size_t r = 1; r < sim.hubs().size(); ++r) {
      const RackRecovery::Outcome& last = sim.hubs()[r].last;
      EXPECT_EQ(last.round, first.round) << "seed " << seed << " hub " << r;
      EXPECT_EQ(last.generation, first.generation) << "seed " << seed << " hub " << r;
      EXPECT_EQ(last.total, first.total) << "seed " << seed << " hub " << r;
      EXPECT_EQ(last.members, first.members) << "seed " << seed << " hub " << r;
    }
    verified += sim.verified();
    started += sim.started();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
  }
  // The search reached both sides of the start quorum.
  EXPECT_GT(started, 1000u);
  EXPECT_GT(verified - started, 20u);
  std::printf("%llu committed outcomes checked, %llu of them started\n",
              static_cast<unsigned long long>(verified), static_cast<unsigned long long>(started));
}

// A report of an elastic tenant without the membership fields (a hub that
// predates them) or with a malformed member list is refused by name.
TEST(RackRecoveryTest, ElasticReportsWithoutMembersAreRefusedByName) {
  RackRecovery::Hooks hooks;
  hooks.send = [](uint32_t, std::string) {};
  hooks.recover = [](uint32_t, const std::string&) { ADD_FAILURE() << "no recovery"; };
  hooks.handle_of = [](const std::string&) { return std::optional<uint32_t>(1); };
  hooks.elastic = [](uint32_t) { return true; };
  hooks.rank_slots = [](uint32_t) { return 4u; };
  RackRecovery rr(0, 2, hooks);
  data::v1::RackVersions m;
  m.set_tenant("job");
  m.set_round(1);
  m.set_incarnation(5);
  const auto refuse = [&](const std::string& needle) {
    const std::string b = m.SerializeAsString();
    const Status s =
        rr.OnVersions(1, {reinterpret_cast<const std::byte*>(b.data()), b.size()});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  refuse("is elastic, but rack 1's report carries membership format 0");
  m.set_membership_format(3);
  refuse("membership format 3 (this hub reads format 2");
  m.set_membership_format(1);  // a hub without the tenant's flags in its reports
  refuse("membership format 1 (this hub reads format 2");
  m.set_membership_format(2);
  m.set_members(std::string("\x01\x02", 2));
  refuse("a byte other than 0 or 1");
  m.set_members(std::string(2000, '\x01'));
  refuse("2000 ranks (at most 4, the tenant's ranks per rack)");
  m.set_members(std::string(5, '\x01'));  // longer than max_workers
  refuse("5 ranks (at most 4");
  m.set_members(std::string(4, '\x01'));
  m.set_membership_generation(UINT64_MAX);  // 1 + it would wrap to 0
  refuse("membership generation 18446744073709551615 is above 4611686018427387904");
}

// Every hub decides the start quorum and the pause from its own flags: a
// report from a hub whose tenant has other flags is refused by name, before
// it can join a round; one with the same flags joins it.
TEST(RackRecoveryTest, ElasticReportsWithOtherFlagsAreRefusedByName) {
  int recoveries = 0;
  RackRecovery::Hooks hooks;
  hooks.send = [](uint32_t, std::string) {};
  hooks.recover = [&](uint32_t, const std::string&) { ++recoveries; };
  hooks.handle_of = [](const std::string&) { return std::optional<uint32_t>(1); };
  hooks.elastic = [](uint32_t) { return true; };
  hooks.rank_slots = [](uint32_t) { return 4u; };
  hooks.elastic_flags = [](uint32_t) { return std::optional<RackElasticFlags>({2, 1, 4}); };
  RackRecovery rr(0, 2, hooks);
  data::v1::RackVersions m;
  m.set_tenant("job");
  m.set_round(1);
  m.set_incarnation(5);
  m.set_membership_format(RackRecovery::kMembershipFormat);
  m.set_members(std::string(4, '\x01'));
  const auto send = [&](uint32_t workers, uint32_t min_workers, uint32_t max_workers) {
    m.set_membership_workers(workers);
    m.set_membership_min_workers(min_workers);
    m.set_membership_max_workers(max_workers);
    const std::string b = m.SerializeAsString();
    return rr.OnVersions(1, {reinterpret_cast<const std::byte*>(b.data()), b.size()});
  };
  using Flags = std::tuple<uint32_t, uint32_t, uint32_t>;
  for (const auto& [w, lo, hi] : std::vector<Flags>{{3, 1, 4}, {2, 2, 4}, {2, 1, 8}}) {
    const Status s = send(w, lo, hi);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
    const std::string theirs = "--workers " + std::to_string(w) + " --min-workers " +
                               std::to_string(lo) + " --max-workers " + std::to_string(hi);
    EXPECT_NE(s.message().find("'job' has --workers 2 --min-workers 1 --max-workers 4 on rack "
                               "0's hub but " + theirs + " on rack 1's"),
              std::string::npos)
        << s.message();
  }
  EXPECT_EQ(recoveries, 0);  // no round began
  const Status same = send(2, 1, 4);
  EXPECT_TRUE(same.ok()) << same.message();
  EXPECT_EQ(recoveries, 1);  // it joined the peer's round
}

// Hubs restarted together (docs/cluster.md, "Cluster checkpoints"): a hub
// recovers the tenant at start-up and, as a peer's report arrives, again to
// join the peer's round. The first recovery's report makes the round; the
// second, covered by that round (it ended after the second one's failure),
// must not start another round: one more skipped step would move the job
// past the restored checkpoint's version. A recovery that needs a round of
// its own (a peer's new process seen) still gets one.
TEST(RackRecoveryTest, ARecoveryARoundEndedAfterIsCoveredByIt) {
  struct Hub {
    std::unique_ptr<RackRecovery> rr;
    std::vector<std::optional<uint64_t>> to_report;  // failed_at of pending recoveries
    std::vector<std::string> out;                    // RACK_VERSIONS to the other hub
    std::vector<std::pair<uint64_t, bool>> ended;    // (round, realign) per recovery
  };
  Hub hubs[2];
  for (uint32_t r = 0; r < 2; ++r) {
    RackRecovery::Hooks hooks;
    hooks.send = [&hubs, r](uint32_t, std::string payload) {
      hubs[r].out.push_back(std::move(payload));
    };
    hooks.recover = [&hubs, r](uint32_t, const std::string&) {
      hubs[r].to_report.push_back(hubs[r].rr->FinishedRounds(1));
    };
    hooks.handle_of = [](const std::string&) { return std::optional<uint32_t>(1); };
    hubs[r].rr = std::make_unique<RackRecovery>(r, 2, hooks);
  }
  const auto report = [&](uint32_t r, size_t i) {
    Hub& h = hubs[r];
    const std::optional<uint64_t> failed_at = h.to_report.at(i);
    h.to_report.erase(h.to_report.begin() + static_cast<long>(i));
    ASSERT_TRUE(h.rr->Reported(
        1, "job", "test", {{1, 72}},
        [&h](const RackRecovery::Outcome& o, bool realign) {
          h.ended.emplace_back(o.round, realign);
        },
        failed_at, h.rr->FinishedRounds(1)));
  };
  const auto deliver = [&](uint32_t from) {
    std::vector<std::string> out;
    out.swap(hubs[from].out);
    for (const std::string& b : out) {
      const Status s = hubs[1 - from].rr->OnVersions(
          from, {reinterpret_cast<const std::byte*>(b.data()), b.size()});
      ASSERT_TRUE(s.ok()) << s.message();
    }
  };
  // Both recover at start-up; hub 0 reports first.
  hubs[0].to_report.push_back(hubs[0].rr->FinishedRounds(1));
  hubs[1].to_report.push_back(hubs[1].rr->FinishedRounds(1));
  report(0, 0);
  deliver(0);  // hub 1 joins round 1: a second recovery there
  ASSERT_EQ(hubs[1].to_report.size(), 2u);
  report(1, 0);  // the start-up recovery's report: round 1 ends on hub 1
  EXPECT_EQ(hubs[1].rr->FinishedRounds(1), 1u);
  deliver(1);  // and on hub 0
  EXPECT_EQ(hubs[0].rr->FinishedRounds(1), 1u);
  report(1, 0);  // the joining recovery: covered by round 1
  EXPECT_TRUE(hubs[1].out.empty()) << "a covered recovery started another round";
  EXPECT_EQ(hubs[1].ended,
            (std::vector<std::pair<uint64_t, bool>>{{1, true}, {0, false}}));
  EXPECT_EQ(hubs[0].ended, (std::vector<std::pair<uint64_t, bool>>{{1, true}}));
  // A recovery of its own (no failed_at): round 2 on both hubs.
  hubs[1].to_report.push_back(std::nullopt);
  report(1, 0);
  deliver(1);
  ASSERT_EQ(hubs[0].to_report.size(), 1u);
  report(0, 0);
  deliver(0);
  EXPECT_EQ(hubs[0].rr->FinishedRounds(1), 2u);
  EXPECT_EQ(hubs[1].rr->FinishedRounds(1), 2u);
  EXPECT_EQ(hubs[1].ended.back(), (std::pair<uint64_t, bool>{2, true}));
}

TEST(RackRecoveryTest, BadReportsAreRefusedByName) {
  RackRecovery::Hooks hooks;
  hooks.send = [](uint32_t, std::string) {};
  hooks.recover = [](uint32_t, const std::string&) { ADD_FAILURE() << "no recovery"; };
  hooks.handle_of = [](const std::string& name) -> std::optional<uint32_t> {
    return name == "job" ? std::optional<uint32_t>(1) : std::nullopt;
  };
  RackRecovery rr(0, 2, hooks);
  auto bytes = [](const data::v1::RackVersions& m) { return m.SerializeAsString(); };
  auto span = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };
  const std::string junk = "\xff\xff\xff";
  EXPECT_NE(rr.OnVersions(1, span(junk)).message().find("not a RackVersions"), std::string::npos);
  data::v1::RackVersions m;
  m.set_tenant("job");
  m.set_round(1);
  m.set_incarnation(5);
  const std::string good = bytes(m);
  EXPECT_NE(rr.OnVersions(0, span(good)).message().find("not another rack"), std::string::npos);
  EXPECT_NE(rr.OnVersions(2, span(good)).message().find("not another rack"), std::string::npos);
  m.set_round(0);
  const std::string zero = bytes(m);
  EXPECT_NE(rr.OnVersions(1, span(zero)).message().find("must not be 0"), std::string::npos);
  m.set_round(1);
  m.set_tenant("other");
  const std::string other = bytes(m);
  const Status s = rr.OnVersions(1, span(other));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'other'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace rackhub::server
