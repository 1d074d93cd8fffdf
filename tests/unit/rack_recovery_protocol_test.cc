// Cross-rack recovery rounds (server/lanes/rack_recovery.h), one scenario
// each, driven by hand: reports a hub must refuse by name (malformed,
// another rack's flags, elastic reports without their membership), and a
// recovery that a round ending after its failure covers. The simulated
// cluster's random interleavings are in rack_recovery_test.cc (the same
// test binary).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rack_recovery.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {
namespace {

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
