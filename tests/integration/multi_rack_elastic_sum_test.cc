// An elastic tenant's RACK_SUM whose membership does not fit the home's
// update (docs/elastic.md, "Across racks"; docs/wire-protocol.md, the
// membership suffix): rack 0's hub is a real rackhubd, home of the key's one
// chunk, with one raw worker; the test plays rack 1's hub on raw
// authenticated links (multi_rack_bounded.h): it answers rack 0's recovery
// rounds with a report of one member on rack 1 (so the cluster has 2), and
// sends the chunk's rack sums itself. A sum naming another generation, or
// another total, is dropped with a warning that names both memberships and
// is never summed: the worker's reply, once the right sum comes, equals the
// reference of the worker's gradient and that sum (rack order), bit for
// bit. A sum without the membership flag is refused by name (and the link
// closed). Every wait is for an event (a frame, a log line).
#include "multi_rack_bounded.h"

#include <atomic>
#include <mutex>

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support

constexpr Mode kSync{pb::SYNC, 0, "sync"};
constexpr uint32_t kPlayedHandle = 77;  // rack 1's tenant handle (its KEY_BIND)
constexpr uint64_t kPlayedIncarnation = 0x5eed;

// Rack 1's side of the recovery rounds: each RACK_VERSIONS report of tenant
// "t" that rack 0's hub sends (on its link to rack 1) is answered once, on
// the test's link to rack 0, with rack 1's report: rank 0 present, and the
// generation rack 1 committed last (each round commits 1 + the newest
// reported: the start quorum, 2 in total, is met). Runs on its own thread
// until the link from rack 0 closes or Stop.
class PlayedRounds {
 public:
  PlayedRounds(RawClient& from0, RawClient& to0, std::mutex& send_mu)
      : from0_(from0), to0_(to0), send_mu_(send_mu), thread_([this] { Run(); }) {}
  ~PlayedRounds() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // The generation of the last round answered (the one the next update has).
  uint64_t generation() const { return generation_.load(); }
  // The last round answered: the epoch of the rack frames after it.
  uint64_t round() const { return round_.load(); }

 private:
  void Run() {
    uint64_t answered = 0;
    while (!stop_) {
      // Woken by a frame, or every 100 ms to see Stop (no synchronisation
      // rests on it; after rack 0's hub closed the link, until Stop).
      const auto f = from0_.Receive(std::chrono::milliseconds(100));
      if (!f) continue;
      if (f->h.opcode != net::Opcode::kRackVersions) continue;  // KEY_BIND, INIT, ALIGN...
      data::v1::RackVersions m;
      if (!m.ParseFromString(f->payload) || m.tenant() != "t" || m.round() <= answered ||
          m.finished()) {
        continue;
      }
      answered = m.round();
      data::v1::RackVersions r;
      r.set_tenant("t");
      r.set_round(m.round());
      r.set_incarnation(kPlayedIncarnation);
      r.set_cause("played rack 1");
      r.set_membership_format(2);  // with the tenant's flags, which must be rack 0's
      r.set_membership_generation(generation_.load());
      r.set_members(std::string("\x01\x00", 2));
      r.set_membership_workers(1);
      r.set_membership_min_workers(1);
      r.set_membership_max_workers(2);
      // What the round commits once rack 0's hub has this report.
      generation_ = std::max(generation_.load(), m.membership_generation()) + 1;
      round_ = m.round();
      {
        std::lock_guard lock(send_mu_);
        FrameHeader h;
        h.opcode = net::Opcode::kRackVersions;
        to0_.Send(h, r.SerializeAsString());
      }
    }
  }

  RawClient& from0_;
  RawClient& to0_;
  std::mutex& send_mu_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0}, round_{0};
  std::thread thread_;
};

// The floats of a PARAMS reply of an elastic tenant (values, then the
// 16-byte membership suffix: generation, member count).
std::vector<float> ElasticParams(const std::optional<Frame>& f, uint64_t* generation,
                                 uint32_t* members) {
  EXPECT_TRUE(f && f->h.opcode == net::Opcode::kParams) << Describe(f);
  if (!f || f->h.opcode != net::Opcode::kParams) return {};
  EXPECT_TRUE(f->h.flags & net::kFlagMembership);
  EXPECT_EQ(f->payload.size(), 4 * kElems + net::kMembershipSuffixBytes);
  if (f->payload.size() != 4 * kElems + net::kMembershipSuffixBytes) return {};
  std::memcpy(generation, f->payload.data() + 4 * kElems, 8);
  std::memcpy(members, f->payload.data() + 4 * kElems + 8, 4);
  return testing::AsFloats(f->payload.substr(0, 4 * kElems));
}

std::string SumWithSuffix(const std::vector<float>& sum, uint64_t generation, uint32_t total) {
  std::string payload = testing::Floats(sum);
  payload.append(reinterpret_cast<const char*>(&generation), 8);
  payload.append(reinterpret_cast<const char*>(&total), 4);
  payload.append(4, '\0');
  return payload;
}

TEST(MultiRackElasticSumTest, SumsOfAnotherMembershipAreDroppedNamingBothNeverSummed) {
  Racks racks(2, false, {"--straggler-timeout-ms", "60000"}, 1);
  auto from0 = racks.AcceptLinkFrom(0);
  ASSERT_TRUE(from0);
  DaemonProcess& hub = racks.hub(0);
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/token", kToken);
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {testing::BinPath("rackhubctl"), "--admin", hub.admin_address()});
    return testing::RunCommand(args);
  };
  // Start quorum 1 x 2 racks = 2 in total; ranks 0..1 per rack.
  testing::CommandResult c =
      ctl({"tenant", "create", "t", "--workers", "1", "--elastic", "--min-workers", "1",
           "--max-workers", "2", "--chunk-bytes", std::to_string(4 * kElems),
           "--tenant-token-file", dir + "/token"});
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  c = ctl({"key", "create", "t", "w", "--elements", std::to_string(kElems), "--optimizer",
           "sum-only", "--reduction", "sum"});
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;

  std::mutex send_mu;
  auto to0 = std::make_unique<RawClient>(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(*to0, std::string(48, 's'), {1, 0, 0, 2, 1}));
  Worker a = Connect(racks, 0, 0, 0xa11ce);  // an elastic tenant's HELLO names a session
  {
    FrameHeader kb;
    kb.opcode = net::Opcode::kKeyBind;
    kb.tenant = kPlayedHandle;
    kb.key = a.key;
    to0->Send(kb, KeyBindOf(kSync, a.key, 1).SerializeAsString());
  }
  PlayedRounds rounds(*from0, *to0, send_mu);

  // Rank 0 of rack 0 joins: a round commits 2 members (it and rack 1's
  // rank 0); its Pull is answered once the tenant runs.
  a.Pull(0);
  const auto pulled = a.link->Receive(std::chrono::seconds(30));
  uint64_t generation = 0;
  uint32_t members = 0;
  ASSERT_TRUE(pulled && pulled->h.opcode == net::Opcode::kParams) << Describe(pulled)
                                                                    << hub.Log();
  const uint64_t iteration = pulled->h.iteration;
  generation = rounds.generation();
  ASSERT_GT(generation, 0u) << hub.Log();

  std::vector<float> grad(kElems), rack1(kElems), want(kElems);
  for (uint32_t i = 0; i < kElems; ++i) {
    grad[i] = 0.1f * static_cast<float>(i) + 0.013f;
    rack1[i] = 1.0f / static_cast<float>(i + 3);
    want[i] = grad[i] + rack1[i];  // rack 0's sum, then rack 1's
  }
  const uint64_t push = a.Push(0, iteration, testing::Floats(grad));

  FrameHeader sum;
  sum.opcode = net::Opcode::kRackSum;
  sum.tenant = kPlayedHandle;
  sum.key = a.key;
  sum.chunk = 0;
  sum.dtype = net::DType::kFp32;
  sum.iteration = iteration;
  sum.flags = net::kFlagMembership;
  sum.request_id = rounds.round();  // the epoch: the round realigned last
  const std::vector<float> junk(kElems, 1000.0f);
  const auto send = [&](const FrameHeader& h, const std::string& payload) {
    std::lock_guard lock(send_mu);
    to0->Send(h, payload);
  };
  // Another generation, then another total: each dropped with a warning
  // naming both memberships.
  const std::string expected = "this hub's update generation " + std::to_string(generation) +
                               " (2 members)";
  send(sum, SumWithSuffix(junk, generation + 1, 2));
  ASSERT_TRUE(testing::WaitForLog(hub, "it sums membership generation " +
                                           std::to_string(generation + 1) + " (2 members), " +
                                           expected))
      << hub.Log();
  send(sum, SumWithSuffix(junk, generation, 3));
  ASSERT_TRUE(testing::WaitForLog(hub, "it sums membership generation " +
                                           std::to_string(generation) + " (3 members), " +
                                           expected))
      << hub.Log();
  const std::string log = hub.Log();
  int dropped = 0;
  for (size_t at = log.find("from rack 1 was dropped"); at != std::string::npos;
       at = log.find("from rack 1 was dropped", at + 1)) {
    ++dropped;
  }
  EXPECT_EQ(dropped, 2) << log;
  // The right one: the update completes with it alone.
  send(sum, SumWithSuffix(rack1, generation, 2));
  const auto reply = a.link->Receive(std::chrono::seconds(30));
  ASSERT_TRUE(reply) << "no reply to the push" << hub.Log();
  EXPECT_EQ(reply->h.request_id, push);
  const std::vector<float> got = ElasticParams(reply, &generation, &members);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * kElems), 0)
      << "not the reference: element 0 " << got[0] << " vs " << want[0];
  EXPECT_EQ(members, 2u);
  EXPECT_EQ(generation, rounds.generation());

  // Without the membership flag: refused by name, the link closed.
  sum.flags = 0;
  sum.iteration = iteration + 1;
  send(sum, testing::Floats(rack1));
  testing::ExpectError(to0->Receive(), net::WireError::kInvalidArgument,
                       "flags: a RACK_SUM of an elastic tenant needs the membership flag");
  EXPECT_TRUE(to0->ClosedByPeer());
  rounds.Stop();
}

}  // namespace
}  // namespace rackhub
