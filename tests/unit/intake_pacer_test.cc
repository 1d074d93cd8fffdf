// Workers in step on the hub's side (server/lanes/intake_pacer.h) over the
// in-memory transport: a connection charged above the lead is not read (its
// frames wait, delivered in order once it is released), a hold ends when
// its charges drop to half, when every connection of the tenant is held, or
// when it is older than kMaxHold; and Connection::HoldIntake itself, apart
// from the send backlog's pause.

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "intake_pacer.h"
#include "memory_transport_test_util.h"

namespace rackhub::server {
namespace {

using namespace net::testing::memtest;  // NOLINT(build/namespaces)
using net::Opcode;

constexpr size_t kLead = 64 << 10;

std::vector<Frame> Pushes(size_t count, uint64_t seed) {
  std::vector<Frame> v;
  for (size_t i = 0; i < count; ++i) {
    v.push_back(MakeFrame(Opcode::kPush, seed * 100 + i, Pattern(256, seed + i), net::DType::kFp32));
  }
  return v;
}

TEST(IntakePacerTest, HoldIntakeStopsDeliveryUntilReleasedAndKeepsOrder) {
  Harness h;
  const std::vector<Frame> first = Pushes(3, 1), later = Pushes(5, 2);
  SendAll(*h.p.a, first);
  h.Run();
  ExpectFrames(h.rb.frames, first);
  h.p.b->HoldIntake(true);
  SendAll(*h.p.a, later);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), first.size()) << "a held connection delivered frames";
  h.p.b->HoldIntake(false);
  h.Run();
  std::vector<Frame> all = first;
  all.insert(all.end(), later.begin(), later.end());
  ExpectFrames(h.rb.frames, all);
  h.CloseCleanly();
}

TEST(IntakePacerTest, AHoldTakenInsideAFrameStopsAtThatFrame) {
  Harness h;
  const std::vector<Frame> frames = Pushes(6, 3);
  h.rb.on_frame = [&](net::Connection& c, const Frame&) {
    if (h.rb.frames.size() == 2) c.HoldIntake(true);
  };
  SendAll(*h.p.a, frames);
  h.Run();
  ASSERT_EQ(h.rb.frames.size(), 2u);
  h.rb.on_frame = nullptr;
  h.p.b->HoldIntake(false);
  h.Run();
  ExpectFrames(h.rb.frames, frames);
  h.CloseCleanly();
}

TEST(IntakePacerTest, AConnectionAheadIsHeldUntilItsPushesAreAnsweredDownToHalf) {
  Harness h;
  IntakePacer pacer(kLead);
  std::vector<IntakeCharge> waiting;
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2));
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2));  // exactly the lead: still read
  const std::vector<Frame> frames = Pushes(4, 4);
  SendAll(*h.p.a, frames);
  h.Run();
  ExpectFrames(h.rb.frames, frames);

  waiting.push_back(pacer.Charge(*h.p.b, 1));  // past the lead: held
  const std::vector<Frame> more = Pushes(4, 5);
  SendAll(*h.p.a, more);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), frames.size());

  waiting.erase(waiting.begin());  // answered: lead / 2 + 1 left, above half
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), frames.size());
  waiting.erase(waiting.begin() + 1);  // lead / 2 left: released
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), frames.size() + more.size());
  waiting.clear();
  h.CloseCleanly();
}

TEST(IntakePacerTest, WhenEveryConnectionOfTheTenantIsHeldAllAreReleasedUntilHalf) {
  Harness x, y;
  IntakePacer pacer(kLead);
  std::map<uint32_t, std::shared_ptr<net::Connection>> peers{{0, x.p.b}, {1, y.p.b}};
  std::vector<IntakeCharge> cx, cy;
  cx.push_back(pacer.Charge(*x.p.b, kLead + 1));
  pacer.ReleaseIfAllHeld(*x.p.b, peers);  // y is read: x stays held
  SendAll(*x.p.a, Pushes(2, 6));
  x.Run();
  EXPECT_TRUE(x.rb.frames.empty());

  cy.push_back(pacer.Charge(*y.p.b, kLead + 1));
  pacer.ReleaseIfAllHeld(*y.p.b, peers);  // both held: nobody could catch up
  SendAll(*y.p.a, Pushes(2, 7));
  x.Run();
  y.Run();
  EXPECT_EQ(x.rb.frames.size(), 2u);
  EXPECT_EQ(y.rb.frames.size(), 2u);

  // Exempt until its charges are down to half: more does not hold it again.
  cx.push_back(pacer.Charge(*x.p.b, kLead));
  SendAll(*x.p.a, Pushes(2, 8));
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 4u);
  cx.clear();  // answered: in step again, so the next lead holds
  cx.push_back(pacer.Charge(*x.p.b, kLead + 1));
  SendAll(*x.p.a, Pushes(2, 9));
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 4u);
  cx.clear();
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 6u);
  cy.clear();
  x.CloseCleanly();
  y.CloseCleanly();
}

TEST(IntakePacerTest, AHoldOlderThanTheLimitIsReleased) {
  Harness h;
  IntakePacer pacer(kLead);
  IntakeCharge c = pacer.Charge(*h.p.b, kLead + 1);
  SendAll(*h.p.a, Pushes(3, 10));
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  pacer.ReleaseStale(std::chrono::steady_clock::now());  // young: kept
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  pacer.ReleaseStale(std::chrono::steady_clock::now() + IntakePacer::kMaxHold);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 3u);
  h.CloseCleanly();
}

TEST(IntakePacerTest, OffNeverHoldsAndAClosedConnectionsChargesAreHarmless) {
  Harness h;
  IntakePacer off(0);
  IntakeCharge none = off.Charge(*h.p.b, 1u << 30);
  SendAll(*h.p.a, Pushes(2, 11));
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 2u);

  // A held connection sees its peer's close when released, after the
  // frames before it (like a frame: the stream is not read meanwhile).
  IntakePacer pacer(kLead);
  IntakeCharge held = pacer.Charge(*h.p.b, kLead + 1);
  SendAll(*h.p.a, Pushes(1, 12));
  h.Run();  // written into the stream, not read
  EXPECT_EQ(h.rb.frames.size(), 2u);
  h.p.a->Close("done");
  h.Run();
  EXPECT_TRUE(h.rb.closes.empty());
  pacer.ReleaseStale(std::chrono::steady_clock::now() + IntakePacer::kMaxHold);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 3u);
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"peer closed the connection"});
  pacer.Forget(*h.p.b);
  h.p = {};  // both ends gone; the charge outlives them
  IntakeCharge moved = std::move(held);
  moved = IntakeCharge();  // released after the close: nothing to resume
}

}  // namespace
}  // namespace rackhub::server
