// Workers in step on the hub's side (server/lanes/intake_pacer.h) over the
// in-memory transport: a connection charged above the lead is not read (its
// frames wait, delivered in order once it is released), a hold ends when
// its charges drop to half, or (then exempt until half) when every
// connection of the tenant is held, when none of its updates was answered
// for kMaxHold, or when it is older than kMaxAge; and Connection::HoldIntake
// itself, apart from the send backlog's pause. A check that must keep a hold
// takes its time from before the hold, one that must release it from after,
// so that a test thread descheduled in between cannot change the outcome.

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
constexpr std::chrono::milliseconds kStraggler{30000};

// Sends copies (SendOwned): `v` may go at once, unlike SendAll's shared frames.
void SendCopies(net::Connection& c, const std::vector<Frame>& v) {
  for (const Frame& f : v) c.SendOwned(f.h, f.payload);
}

std::vector<Frame> Pushes(size_t count, uint64_t seed) {
  std::vector<Frame> v;
  for (size_t i = 0; i < count; ++i) {
    v.push_back(
        MakeFrame(Opcode::kPush, seed * 100 + i, Pattern(256, seed + i), net::DType::kFp32));
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
  IntakePacer pacer(kLead, kStraggler);
  std::vector<IntakeCharge> waiting;
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2, 0));
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2, 0));  // exactly the lead: still read
  const std::vector<Frame> frames = Pushes(4, 4);
  SendAll(*h.p.a, frames);
  h.Run();
  ExpectFrames(h.rb.frames, frames);

  waiting.push_back(pacer.Charge(*h.p.b, 1, 0));  // past the lead: held
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
  IntakePacer pacer(kLead, kStraggler);
  std::map<uint32_t, std::shared_ptr<net::Connection>> peers{{0, x.p.b}, {1, y.p.b}};
  std::vector<IntakeCharge> cx, cy;
  cx.push_back(pacer.Charge(*x.p.b, kLead + 1, 0));
  pacer.ReleaseIfAllHeld(peers);  // y is read: x stays held
  SendCopies(*x.p.a, Pushes(2, 6));
  x.Run();
  EXPECT_TRUE(x.rb.frames.empty());

  cy.push_back(pacer.Charge(*y.p.b, kLead + 1, 0));
  pacer.ReleaseIfAllHeld(peers);  // both held: nobody could catch up
  SendCopies(*y.p.a, Pushes(2, 7));
  x.Run();
  y.Run();
  EXPECT_EQ(x.rb.frames.size(), 2u);
  EXPECT_EQ(y.rb.frames.size(), 2u);

  // Exempt until its charges are down to half: more does not hold it again.
  cx.push_back(pacer.Charge(*x.p.b, kLead, 0));
  SendCopies(*x.p.a, Pushes(2, 8));
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 4u);
  cx.clear();  // answered: in step again, so the next lead holds
  cx.push_back(pacer.Charge(*x.p.b, kLead + 1, 0));
  SendCopies(*x.p.a, Pushes(2, 9));
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 4u);
  cx.clear();
  x.Run();
  EXPECT_EQ(x.rb.frames.size(), 6u);
  cy.clear();
  x.CloseCleanly();
  y.CloseCleanly();
}

TEST(IntakePacerTest, AHoldWithoutProgressIsReleasedUntilHalf) {
  Harness h;
  IntakePacer pacer(kLead, kStraggler);
  std::vector<IntakeCharge> waiting;
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2, 0));
  const auto before = std::chrono::steady_clock::now();
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 2 + 1, 0));
  const auto held = std::chrono::steady_clock::now();
  ASSERT_TRUE(pacer.holding(*h.p.b));
  SendCopies(*h.p.a, Pushes(3, 10));
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  pacer.ReleaseStale(before + IntakePacer::kMaxHold / 2);  // young: kept
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  pacer.ReleaseStale(held + IntakePacer::kMaxHold);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 3u);
  // Exempt until it is down to half: more charges, or an answer that
  // leaves it above half, do not hold it again.
  waiting.push_back(pacer.Charge(*h.p.b, kLead, 0));
  SendCopies(*h.p.a, Pushes(2, 13));
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 5u);
  EXPECT_FALSE(pacer.holding(*h.p.b));
  waiting.erase(waiting.begin());
  waiting.push_back(pacer.Charge(*h.p.b, 1, 0));
  EXPECT_FALSE(pacer.holding(*h.p.b)) << "held again before it was down to half";
  waiting.clear();  // in step: paced again
  waiting.push_back(pacer.Charge(*h.p.b, kLead + 1, 0));
  EXPECT_TRUE(pacer.holding(*h.p.b));
  SendCopies(*h.p.a, Pushes(1, 15));
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 5u);
  waiting.clear();
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 6u);
  h.CloseCleanly();
}

TEST(IntakePacerTest, AHoldThatMakesProgressStaysUntilItsAgeLimit) {
  // The others catch up (updates it waits for are answered, but not yet
  // down to half): kept past kMaxHold; then without progress for kMaxHold
  // it goes. A hold that keeps making progress goes at kMaxAge.
  using std::chrono::steady_clock;
  constexpr auto kStep = IntakePacer::kMaxHold / 2;
  Harness h;
  IntakePacer pacer(kLead, kStraggler);
  std::vector<IntakeCharge> waiting;
  for (int i = 0; i < 7; ++i) waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  const steady_clock::time_point start = steady_clock::now();
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  ASSERT_TRUE(pacer.holding(*h.p.b));
  SendCopies(*h.p.a, Pushes(3, 20));
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  waiting.erase(waiting.begin());  // one answered: 7/7 of the lead left, above half
  pacer.ReleaseStale(start + 3 * kStep);  // older than kMaxHold, but it progressed
  EXPECT_TRUE(pacer.holding(*h.p.b)) << "a hold that made progress was released";
  pacer.ReleaseStale(start + 4 * kStep);  // no progress since the last check
  EXPECT_TRUE(pacer.holding(*h.p.b));
  pacer.ReleaseStale(start + 5 * kStep);  // kMaxHold without progress (since the check at 3)
  EXPECT_FALSE(pacer.holding(*h.p.b));
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 3u);
  waiting.clear();  // in step again: no longer exempt

  const steady_clock::time_point before = steady_clock::now();
  for (int i = 0; i < 8; ++i) waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  const steady_clock::time_point again = steady_clock::now();
  ASSERT_TRUE(pacer.holding(*h.p.b));
  // Every check sees an answer (and the worker pushes one more: no new
  // hold while held), up to kMaxAge.
  for (auto t = before + kStep; t < before + IntakePacer::kMaxAge; t += kStep) {
    waiting.pop_back();  // 7/7 of the lead left: above half
    pacer.ReleaseStale(t);
    ASSERT_TRUE(pacer.holding(*h.p.b)) << "released while making progress, after "
                                       << std::chrono::duration_cast<std::chrono::milliseconds>(
                                              t - before).count() << " ms";
    waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  }
  waiting.pop_back();  // progress up to the end
  pacer.ReleaseStale(again + IntakePacer::kMaxAge);
  EXPECT_FALSE(pacer.holding(*h.p.b)) << "a hold outlived kMaxAge";
  // Exempt until half this time: an answer above half does not end it.
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  waiting.pop_back();
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  EXPECT_FALSE(pacer.holding(*h.p.b));
  waiting.clear();  // down to half: paced again
  for (int i = 0; i < 8; ++i) waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  EXPECT_TRUE(pacer.holding(*h.p.b));
  waiting.clear();
  h.CloseCleanly();
}

TEST(IntakePacerTest, AnswersBeforeAHoldAreNotItsProgress) {
  Harness h;
  IntakePacer pacer(kLead, kStraggler);
  std::vector<IntakeCharge> waiting;
  for (int i = 0; i < 7; ++i) waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  waiting.pop_back();  // answered while not held (above half)
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  const auto before = std::chrono::steady_clock::now();
  waiting.push_back(pacer.Charge(*h.p.b, kLead / 7, 0));
  const auto held = std::chrono::steady_clock::now();
  ASSERT_TRUE(pacer.holding(*h.p.b));
  pacer.ReleaseStale(before + IntakePacer::kMaxHold / 4);
  EXPECT_TRUE(pacer.holding(*h.p.b));
  pacer.ReleaseStale(held + IntakePacer::kMaxHold);  // no answer since the hold
  EXPECT_FALSE(pacer.holding(*h.p.b));
  waiting.clear();
  h.CloseCleanly();
}

TEST(IntakePacerTest, AShortStragglerTimeoutShortensTheHold) {
  EXPECT_EQ(IntakePacer(kLead, kStraggler).max_hold(), IntakePacer::kMaxHold);
  EXPECT_EQ(IntakePacer(kLead, kStraggler).max_age(), IntakePacer::kMaxAge);
  EXPECT_EQ(IntakePacer(kLead, std::chrono::milliseconds(200)).max_hold(),
            std::chrono::milliseconds(50));
  EXPECT_EQ(IntakePacer(kLead, std::chrono::milliseconds(200)).max_age(),
            std::chrono::milliseconds(100));
}

TEST(IntakePacerTest, TheLeadIsAtLeastTheGivenFloor) {
  Harness h;
  IntakePacer pacer(kLead, kStraggler);
  std::vector<IntakeCharge> waiting;
  waiting.push_back(pacer.Charge(*h.p.b, 3 * kLead, 4 * kLead));  // big chunks: below the floor
  EXPECT_FALSE(pacer.holding(*h.p.b));
  waiting.push_back(pacer.Charge(*h.p.b, kLead + 1, 4 * kLead));
  EXPECT_TRUE(pacer.holding(*h.p.b));
  waiting.erase(waiting.begin());  // kLead + 1 left: at most half of 4 kLead
  EXPECT_FALSE(pacer.holding(*h.p.b));
  waiting.clear();
  h.CloseCleanly();
}

TEST(IntakePacerTest, HoldAndTheSendBacklogsPauseAreIndependent) {
  // b's replies are not read by a: b's backlog passes pause_bytes, so b
  // takes no frames; a hold on top must still stop it once the backlog
  // drained, and the end of the hold must not resume a paused b.
  Harness h;
  net::SendLimits limits;
  limits.pause_bytes = 4096;
  h.p.b->SetSendLimits(limits);
  h.p.a->incoming_faults().StopReading(true);
  const std::vector<Frame> big = {MakeFrame(Opcode::kPush, 1, Pattern(8192, 1), net::DType::kFp32)};
  SendAll(*h.p.b, big);
  h.Run();
  SendCopies(*h.p.a, Pushes(2, 14));
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty()) << "paused by its backlog";
  h.p.b->HoldIntake(true);
  h.p.b->HoldIntake(false);  // the backlog's pause still stands
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  h.p.b->HoldIntake(true);
  h.p.a->incoming_faults().StopReading(false);  // the backlog drains: held still
  h.Run();
  EXPECT_EQ(h.ra.frames.size(), 1u);
  EXPECT_TRUE(h.rb.frames.empty());
  h.p.b->HoldIntake(false);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 2u);
  h.CloseCleanly();
}

TEST(IntakePacerTest, OffNeverHoldsAndAClosedConnectionsChargesAreHarmless) {
  Harness h;
  IntakePacer off(0, kStraggler);
  IntakeCharge none = off.Charge(*h.p.b, 1u << 30, 0);
  SendCopies(*h.p.a, Pushes(2, 11));
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 2u);

  // A held connection sees its peer's close when released, after the
  // frames before it (like a frame: the stream is not read meanwhile).
  IntakePacer pacer(kLead, kStraggler);
  IntakeCharge held = pacer.Charge(*h.p.b, kLead + 1, 0);
  SendCopies(*h.p.a, Pushes(1, 12));
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
