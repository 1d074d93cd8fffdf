// Unit tests of the in-memory transport's faults (rackhub_net_testing): each
// fault ends in the right OnConnectionClosed reason on the right end, and
// delivers exactly what came before it.

#include <chrono>
#include <gtest/gtest.h>

#include "memory_transport_test_util.h"

namespace rackhub::net::testing {
namespace {

using namespace memtest;  // NOLINT(build/namespaces)

// --- MemoryConnection: faults ----------------------------------------------

// F1 = bytes [0, 50), F2 = [50, 120), F3 = [120, 140).
std::vector<Frame> ThreeFrames() {
  return {MakeFrame(Opcode::kHello, 1, Pattern(10, 1)), MakeFrame(Opcode::kHello, 2, Pattern(30, 2)),
          MakeFrame(Opcode::kHeartbeat, 3, "")};
}

TEST(MemoryTransportTest, EofAfterBytesBetweenAndInsideFrames) {
  const std::vector<Frame> all = ThreeFrames();
  struct Case {
    uint64_t cut;
    size_t frames;
    const char* why;
  };
  for (const Case& c : {Case{0, 0, "peer closed the connection"},
                        Case{50, 1, "peer closed the connection"},
                        Case{120, 2, "peer closed the connection"},
                        Case{55, 1, "peer closed the connection inside a frame"},
                        Case{100, 1, "peer closed the connection inside a frame"}}) {
    SCOPED_TRACE("cut at " + std::to_string(c.cut));
    FaultPlan plan;
    plan.eof_after_bytes = c.cut;
    plan.max_read_bytes = 7;
    Harness h(plan);
    SendAll(*h.p.a, all);
    h.Run();
    ExpectFrames(h.rb.frames, {all.begin(), all.begin() + c.frames});
    EXPECT_EQ(h.rb.closes, std::vector<std::string>{c.why});
    EXPECT_EQ(h.ra.closes, std::vector<std::string>{"peer closed the connection"});
    EXPECT_TRUE(h.ra.frames.empty());
    EXPECT_EQ(h.p.a->faults().delivered_bytes(), c.cut);
  }
}

TEST(MemoryTransportTest, PeerCloseMidFrameIsSeenInsideAFrame) {
  FaultPlan plan;
  plan.max_write_bytes = 100;
  plan.stop_reading = true;
  Harness h(plan);
  const Frame big = MakeFrame(Opcode::kHello, 1, Pattern(1000, 1));
  h.p.a->SendShared(big.h, Bytes(big.payload), nullptr);
  h.Run();              // the first 100 bytes are in the stream
  h.p.a->Close("bye");  // the rest of the frame is dropped
  h.p.b->incoming_faults().StopReading(false);
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  EXPECT_EQ(h.p.a->faults().delivered_bytes(), 100u);
  EXPECT_EQ(h.ra.closes, std::vector<std::string>{"bye"});
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"peer closed the connection inside a frame"});
}

TEST(MemoryTransportTest, ResetAfterBytesResetsBothEnds) {
  const std::vector<Frame> all = ThreeFrames();
  FaultPlan plan;
  plan.reset_after_bytes = 60;
  Harness h(plan);
  SendAll(*h.p.a, all);
  h.p.b->SendOwned(MakeFrame(Opcode::kHeartbeat, 9, "").h, "");
  h.Run();
  ExpectFrames(h.rb.frames, {all[0]});
  ASSERT_EQ(h.rb.closes.size(), 1u);
  ASSERT_EQ(h.ra.closes.size(), 1u);
  EXPECT_NE(h.rb.closes[0].find("reset"), std::string::npos) << h.rb.closes[0];
  EXPECT_NE(h.ra.closes[0].find("reset"), std::string::npos) << h.ra.closes[0];
  EXPECT_FALSE(h.p.a->open());
  EXPECT_EQ(h.p.a->faults().delivered_bytes(), 60u);
}

TEST(MemoryTransportTest, FatalErrorClosesOnlyAfterTheErrorFrameIsOut) {
  FaultPlan ba;
  ba.stop_reading = true;  // a does not take b's bytes yet
  ba.max_write_bytes = 5;
  Harness h({}, ba);
  h.rb.on_frame = [](Connection& c, const Frame& f) {
    if (f.h.opcode != Opcode::kPush) return;
    c.SendError(WireError::kBadChunk, "chunk 9", 7, true);
    c.SendOwned(MakeFrame(Opcode::kHello, 50, "").h, "never sent");
  };
  const std::vector<Frame> all = {MakeFrame(Opcode::kHello, 1, "x"),
                                  MakeFrame(Opcode::kPush, 7, Pattern(16, 7), DType::kFp32),
                                  MakeFrame(Opcode::kHello, 8, "never delivered")};
  SendAll(*h.p.a, all);
  h.Run();
  ExpectFrames(h.rb.frames, {all[0], all[1]});  // nothing after the fatal error
  EXPECT_EQ(h.rb.headers.size(), 2u);
  EXPECT_TRUE(h.p.b->open());  // the ERROR is not out yet
  EXPECT_GT(h.p.b->queued_bytes(), 0u);
  EXPECT_TRUE(h.rb.closes.empty());
  h.p.a->incoming_faults().StopReading(false);
  h.Run();
  ASSERT_EQ(h.ra.frames.size(), 1u);
  const Frame& e = h.ra.frames[0];
  EXPECT_EQ(e.h.opcode, Opcode::kError);
  EXPECT_EQ(e.h.flags, kFlagFatal);
  EXPECT_EQ(e.h.request_id, 7u);
  const Result<ErrorBody> body = DecodeErrorBody(Bytes(e.payload));
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const WireError code = body->code;
  const std::string& text = body->text;
  EXPECT_EQ(code, WireError::kBadChunk);
  EXPECT_EQ(text, "chunk 9");
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"closed after a fatal error"});
  EXPECT_EQ(h.ra.closes, std::vector<std::string>{"peer closed the connection"});
}

TEST(MemoryTransportTest, RejectedHeaderDeliversNothingMore) {
  Harness h;
  h.rb.on_header = [](Connection& c, const FrameHeader& hd) {
    if (hd.opcode != Opcode::kPush) return Verdict::kAccept;
    c.SendError(WireError::kUnauthenticated, "no", hd.request_id, true);
    return Verdict::kReject;
  };
  const std::vector<Frame> all = {MakeFrame(Opcode::kHello, 1, "x"),
                                  MakeFrame(Opcode::kPush, 2, Pattern(8, 2), DType::kFp32),
                                  MakeFrame(Opcode::kHello, 3, "y")};
  SendAll(*h.p.a, all);
  h.Run();
  ExpectFrames(h.rb.frames, {all[0]});
  EXPECT_EQ(h.rb.headers.size(), 2u);
  ASSERT_EQ(h.ra.frames.size(), 1u);
  EXPECT_EQ(h.ra.frames[0].h.opcode, Opcode::kError);
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"closed after a fatal error"});
  EXPECT_EQ(h.ra.closes, std::vector<std::string>{"peer closed the connection"});
}

TEST(MemoryTransportTest, StallThenResumeDeliversEverything) {
  FaultPlan plan;
  plan.stall = true;
  Harness h(plan);
  const std::vector<Frame> want = Mix(20, 3);
  SendAll(*h.p.a, want);
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  EXPECT_EQ(h.ra.sent, 0u);
  EXPECT_EQ(h.p.a->queued_bytes(), StreamBytes(want));
  h.p.a->faults().Stall(false);
  h.Run();
  ExpectFrames(h.rb.frames, want);
  EXPECT_EQ(h.ra.sent, StreamBytes(want));
  EXPECT_EQ(h.p.a->queued_bytes(), 0u);
  h.CloseCleanly();
}

TEST(MemoryTransportTest, StopReadingBackPressuresTheSender) {
  Harness h({}, {}, /*start_b=*/false);  // not started yet: takes nothing either
  std::vector<std::vector<Frame>> rounds;
  rounds.reserve(3);
  std::vector<Frame> want;
  for (int round = 0; round < 3; ++round) {
    if (round == 1) {
      h.p.b->incoming_faults().StopReading(true);
      h.p.b->Start();
    }
    rounds.push_back(Mix(10, 10 + round));
    SendAll(*h.p.a, rounds.back());
    want.insert(want.end(), rounds.back().begin(), rounds.back().end());
    h.Run();
    EXPECT_EQ(h.p.a->queued_bytes(), StreamBytes(want));  // the queue grows
    EXPECT_EQ(h.ra.sent, 0u);                              // OnBytesSent stops
    EXPECT_TRUE(h.rb.frames.empty());
  }
  EXPECT_EQ(h.p.a->faults().delivered_bytes(), 0u);
  h.p.b->incoming_faults().StopReading(false);
  h.Run();
  ExpectFrames(h.rb.frames, want);
  EXPECT_EQ(h.ra.sent, StreamBytes(want));
  EXPECT_EQ(h.p.a->queued_bytes(), 0u);
  h.CloseCleanly();
}

TEST(MemoryTransportTest, DelayDelaysEachDeliveryStep) {
  FaultPlan plan;
  plan.delay = std::chrono::milliseconds(30);
  plan.max_read_bytes = 20;
  Harness h(plan);
  const Frame f = MakeFrame(Opcode::kHeartbeat, 1, "");  // 40 bytes: two steps
  const auto start = std::chrono::steady_clock::now();
  h.p.a->SendOwned(f.h, "");
  h.Run();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(60));
  ExpectFrames(h.rb.frames, {f});
  h.CloseCleanly();
}

TEST(MemoryTransportTest, CloseIsIdempotentAndReportedOncePerEnd) {
  Harness h;
  h.p.a->Close("first");
  h.p.a->Close("second");
  h.p.a->SendOwned(MakeFrame(Opcode::kHello, 1, "").h, "ignored");
  EXPECT_FALSE(h.p.a->open());
  h.Run();
  EXPECT_EQ(h.ra.closes, std::vector<std::string>{"first"});
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"peer closed the connection"});
  EXPECT_TRUE(h.rb.frames.empty());
  h.p.b->Close("again");
  h.Run();
  EXPECT_EQ(h.rb.closes.size(), 1u);
}

TEST(MemoryTransportTest, DestroyingAnOpenEndClosesThePeer) {
  Harness h;
  const Frame f = MakeFrame(Opcode::kHello, 1, "last words");
  h.p.a->SendOwned(f.h, f.payload);
  h.Run();
  h.p.a.reset();
  h.Run();
  ExpectFrames(h.rb.frames, {f});
  EXPECT_TRUE(h.ra.closes.empty());  // no handler call from a destructor
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"peer closed the connection"});
}

// --- Bounded send queues (SendLimits) ---------------------------------------

// b answers every frame with 300 bytes; a sends 20 frames and does not read.
// (Runs until nothing moves, or for 300 ms when a failing end's 2 s grace
// timer would keep the io_context busy.)
struct EchoHarness : Harness {
  explicit EchoHarness(const SendLimits& limits) : Harness() {
    p.b->SetSendLimits(limits);
    p.a->incoming_faults().StopReading(true);
    rb.on_frame = [](Connection& c, const Frame& f) {
      c.SendOwned(MakeFrame(Opcode::kHello, f.h.request_id, "").h, Pattern(300, f.h.request_id));
    };
    for (uint64_t i = 1; i <= 20; ++i) p.a->SendOwned(MakeFrame(Opcode::kPull, i, "").h, "");
    RunFor(limits.max_bytes != 0);
  }
  void RunFor(bool briefly) {
    if (!briefly) return Run();
    io.restart();
    io.run_for(std::chrono::milliseconds(300));
  }
};

TEST(MemoryTransportTest, BacklogAbovePauseBytesStopsDeliveryUntilDrained) {
  SendLimits limits;
  limits.pause_bytes = 1000;  // 3 answers of 340 bytes pass it
  EchoHarness h(limits);
  EXPECT_EQ(h.rb.frames.size(), 3u) << "b took frames while its answers piled up";
  EXPECT_EQ(h.p.b->backlog_bytes(), 3u * 340);
  EXPECT_TRUE(h.rb.closes.empty());
  h.p.a->incoming_faults().StopReading(false);  // a reads: b drains and resumes
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 20u);
  EXPECT_EQ(h.ra.frames.size(), 20u);
  EXPECT_EQ(h.p.b->backlog_bytes(), 0u);
  // Reservations count the same way.
  h.p.a->incoming_faults().StopReading(true);
  EXPECT_TRUE(h.p.b->Reserve(1200));
  h.p.a->SendOwned(MakeFrame(Opcode::kPull, 21, "").h, "");
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 20u) << "delivered while reservations are above pause_bytes";
  h.p.b->Unreserve(1200);
  h.Run();
  EXPECT_EQ(h.rb.frames.size(), 21u);
  h.p.a->incoming_faults().StopReading(false);
  h.CloseCleanly();
}

TEST(MemoryTransportTest, BacklogPastMaxBytesFailsTheConnection) {
  SendLimits limits;
  limits.max_bytes = 2000;
  limits.setting = "test.limit";
  EchoHarness h(limits);
  // The 6th answer takes the backlog past 2000: b drops what is not written
  // yet and fails with QUOTA_EXCEEDED; nothing more is delivered to it.
  EXPECT_EQ(h.rb.frames.size(), 6u);
  EXPECT_FALSE(h.p.b->Reserve(1));
  h.p.a->incoming_faults().StopReading(false);
  h.Run();  // a takes what b wrote; b closes once the ERROR is out
  ASSERT_GE(h.ra.frames.size(), 1u);
  const Frame& last = h.ra.frames.back();
  ASSERT_EQ(last.h.opcode, Opcode::kError);
  EXPECT_TRUE(last.h.flags & kFlagFatal);
  const Result<ErrorBody> body = DecodeErrorBody(Bytes(last.payload));
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const WireError code = body->code;
  const std::string& text = body->text;
  EXPECT_EQ(code, WireError::kQuotaExceeded);
  EXPECT_NE(text.find("more than test.limit (2000 bytes)"), std::string::npos) << text;
  for (size_t i = 0; i + 1 < h.ra.frames.size(); ++i) {
    EXPECT_EQ(h.ra.frames[i].h.opcode, Opcode::kHello);  // whole answers only
    EXPECT_EQ(h.ra.frames[i].payload, Pattern(300, h.ra.frames[i].h.request_id));
  }
  EXPECT_EQ(h.rb.closes, std::vector<std::string>{"closed after a fatal error"});
  EXPECT_EQ(h.ra.closes, std::vector<std::string>{"peer closed the connection"});
}

}  // namespace
}  // namespace rackhub::net::testing
