// Cross-rack recovery rounds (server/lanes/rack_recovery.h) under a
// simulated cluster: 2-4 hubs whose RACK_VERSIONS are delivered in random
// order, lost in cut links (and sent again when the link is up), with
// failures starting new recoveries on random hubs meanwhile and hubs
// restarting without their state. Whatever the interleaving, every local
// recovery finishes (no hub waits for ever once the links hold), every hub
// ends with the same version of every key, and that version is past every
// version any hub had when the failures began (older frames are stale).
// Thousands of seeded interleavings; the simulation is the only scheduler.
// Single scenarios driven by hand: rack_recovery_protocol_test.cc.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
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

}  // namespace
}  // namespace rackhub::server
