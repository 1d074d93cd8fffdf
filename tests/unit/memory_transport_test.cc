// Unit tests for FrameReader and the data path of the in-memory transport
// (rackhub_net, rackhub_net_testing): frames in order and intact across every
// short read and write, two threads, discarded payloads, malformed headers.
// Faults: memory_transport_faults_test.cc.

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "memory_transport_test_util.h"
#include "rackhub/net/frame_reader.h"

namespace rackhub::net::testing {
namespace {

using namespace memtest;  // NOLINT(build/namespaces)

// --- FrameReader ----------------------------------------------------------

class StubConnection : public Connection {
 public:
  std::vector<std::pair<WireError, uint64_t>> errors;
  const ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return true; }
  void Start() override {}
  void SendShared(const FrameHeader&, std::span<const std::byte>,
                  std::shared_ptr<const void>) override {}
  void SendOwned(const FrameHeader&, std::string) override {}
  void SendError(WireError code, const std::string&, uint64_t rid, bool fatal) override {
    EXPECT_TRUE(fatal);
    errors.emplace_back(code, rid);
  }
  void Close(const std::string&) override {}

 private:
  ConnectionIdentity id_;
};

std::string Encode(const std::vector<Frame>& v) {
  std::string out;
  for (const Frame& f : v) {
    std::array<std::byte, kHeaderBytes> h;
    EncodeHeader(f.h, h);
    out.append(reinterpret_cast<const char*>(h.data()), h.size());
    out += f.payload;
  }
  return out;
}

// Feeds `stream` to `reader` as a connection would, at most `chunk` bytes
// per receive, parsing after each; `after(at)` sees how far it got.
void FeedInChunks(FrameReader& reader, Connection& conn, FrameHandler& handler,
                  const std::string& stream, size_t chunk,
                  const std::function<void(size_t)>& after = {}) {
  for (size_t at = 0; at < stream.size();) {
    const std::span<std::byte> room = reader.WritableSpan();
    ASSERT_FALSE(room.empty());
    const size_t n = std::min({chunk, room.size(), stream.size() - at});
    std::memcpy(room.data(), stream.data() + at, n);
    reader.Commit(n);
    reader.Parse(conn, handler);
    at += n;
    if (after) after(at);
  }
}

TEST(FrameReaderTest, SmallBufferGrowsAndCompactsAcrossEveryChunking) {
  const std::vector<Frame> want = Mix(24);
  const std::string stream = Encode(want);
  for (size_t chunk : {1, 3, 39, 40, 41, 97, 1000, 100000}) {
    StubConnection conn;
    Recorder rec;
    FrameReader reader(16);
    FeedInChunks(reader, conn, rec, stream, chunk, [&](size_t at) {
      if (at == 10) {
        EXPECT_TRUE(reader.inside_frame());
      }
    });
    ExpectFrames(rec.frames, want);
    EXPECT_FALSE(reader.inside_frame()) << chunk;
    EXPECT_EQ(reader.buffered(), 0u);
    EXPECT_GE(reader.capacity(), 1500u);  // grew for the largest frame
    EXPECT_TRUE(conn.errors.empty());
  }
}

// A handler that names a destination for every odd frame's payload: those
// payloads arrive in the destination (HandleFrame's span is the destination
// itself), the others in the reader's buffer, all intact and in order,
// whatever the chunking; the reader's buffer never grows for a payload that
// goes to a destination.
class DestinationRecorder : public Recorder {
 public:
  std::vector<std::vector<std::byte>> destinations;
  size_t in_place = 0;  // HandleFrame calls whose payload was a destination
  std::span<std::byte> PayloadDestination(Connection&, const FrameHeader& h) override {
    if (headers.size() % 2 == 1) return {};
    destinations.emplace_back(h.payload_bytes);
    return destinations.back();
  }
  void HandleFrame(Connection& c, const FrameHeader& h, std::span<const std::byte> p) override {
    if (!destinations.empty() && p.data() == destinations.back().data()) {
      EXPECT_EQ(p.size(), destinations.back().size());
      ++in_place;
    }
    Recorder::HandleFrame(c, h, p);
  }
};

TEST(FrameReaderTest, PayloadsLandInTheHandlersDestinationAcrossEveryChunking) {
  std::vector<Frame> want = Mix(24);
  // One payload far larger than the reader's buffer.
  want[5].payload.assign(70000, 'x');
  want[5].h.payload_bytes = 70000;
  const std::string stream = Encode(want);
  size_t expect_in_place = 0;
  for (size_t i = 1; i < want.size(); i += 2) expect_in_place += want[i].payload.empty() ? 0 : 1;
  for (size_t chunk : {1, 3, 39, 40, 41, 97, 1000, 100000}) {
    SCOPED_TRACE(chunk);
    StubConnection conn;
    DestinationRecorder rec;
    rec.destinations.reserve(want.size());  // spans stay valid
    FrameReader reader(2048);
    FeedInChunks(reader, conn, rec, stream, chunk);
    ExpectFrames(rec.frames, want);
    EXPECT_EQ(rec.in_place, expect_in_place);
    EXPECT_FALSE(reader.inside_frame());
    EXPECT_EQ(reader.buffered(), 0u);
    EXPECT_LT(reader.capacity(), 70000u) << "the large payload went to its destination";
    EXPECT_TRUE(conn.errors.empty());
  }
}

// --- MemoryConnection: data ------------------------------------------------

TEST(MemoryTransportTest, ShortReadsAndWritesOfEverySize) {
  const std::vector<Frame> want = Mix(12);
  for (size_t s = 1; s <= 41; ++s) {
    for (const auto& [r, w] : {std::pair{s, size_t{0}}, {0, s}, {s, (s * 7) % 41 + 1}}) {
      SCOPED_TRACE("max_read " + std::to_string(r) + " max_write " + std::to_string(w));
      FaultPlan plan;
      plan.max_read_bytes = r;
      plan.max_write_bytes = w;
      Harness h(plan);
      SendAll(*h.p.a, want);
      EXPECT_EQ(h.p.a->queued_bytes(), StreamBytes(want));
      h.Run();
      ExpectFrames(h.rb.frames, want);
      EXPECT_EQ(h.ra.sent, StreamBytes(want));  // OnBytesSent: every byte, once taken
      EXPECT_EQ(h.p.a->queued_bytes(), 0u);
      EXPECT_EQ(h.p.a->faults().delivered_bytes(), StreamBytes(want));
      h.CloseCleanly();
      EXPECT_TRUE(h.ra.frames.empty());
    }
  }
}

TEST(MemoryTransportTest, LargeFramesArriveIntact) {
  std::vector<Frame> want = Mix(3);
  want.push_back(MakeFrame(Opcode::kHello, 77, Pattern(1 << 20, 77)));  // > receive buffer
  want.push_back(MakeFrame(Opcode::kPush, 78, Pattern(3 << 20, 78), DType::kBf16));
  for (size_t r : {0, 4096}) {
    FaultPlan plan;
    plan.max_read_bytes = r;
    Harness h(plan);
    SendAll(*h.p.a, want);
    h.Run();
    ExpectFrames(h.rb.frames, want);
    h.CloseCleanly();
  }
}

TEST(MemoryTransportTest, SharedPayloadIsReadWhenWrittenAndHeldUntilThen) {
  FaultPlan plan;
  plan.max_write_bytes = kHeaderBytes;  // the first step is one header
  plan.stop_reading = true;
  Harness h(plan);
  std::string first = "first";
  std::string second = "old!";
  const Frame f1 = MakeFrame(Opcode::kHello, 1, first);
  const Frame f2 = MakeFrame(Opcode::kHello, 2, second);
  auto owner = std::make_shared<int>(0);
  h.p.a->SendShared(f1.h, Bytes(first), owner);
  first = "FIRST";  // still queued: nothing is written inside the Send call
  h.p.a->SendShared(f2.h, Bytes(second), owner);
  EXPECT_EQ(owner.use_count(), 3);  // each queued frame holds its payload's owner
  h.Run();
  EXPECT_TRUE(h.rb.frames.empty());
  second = "new!";  // the peer is not reading: still referenced, not copied
  h.p.b->incoming_faults().StopReading(false);
  h.Run();
  ExpectFrames(h.rb.frames,
               {MakeFrame(Opcode::kHello, 1, "FIRST"), MakeFrame(Opcode::kHello, 2, "new!")});
  EXPECT_EQ(owner.use_count(), 1);  // written: let go
  h.CloseCleanly();
}

TEST(MemoryTransportTest, TwoIoContextsOnTwoThreadsEcho) {
  asio::io_context io_a, io_b;
  Recorder ra, rb;
  const std::vector<Frame> want = Mix(400, 2);
  FaultPlan ab, ba;
  ab.max_read_bytes = 7;
  ab.max_write_bytes = 13;
  ba.max_read_bytes = 1000;
  MemoryPair p = MakeMemoryPair(io_a, &ra, Id("a"), io_b, &rb, Id("b"), ab, ba);
  rb.on_frame = [](Connection& c, const Frame& f) { c.SendOwned(f.h, f.payload); };  // echo
  ra.on_frame = [&](Connection& c, const Frame&) {
    if (ra.frames.size() == want.size()) c.Close("all echoed");
  };
  auto guard_a = asio::make_work_guard(io_a);
  auto guard_b = asio::make_work_guard(io_b);
  std::thread ta([&] { io_a.run(); });
  std::thread tb([&] { io_b.run(); });
  asio::post(io_b, [&] { p.b->Start(); });
  asio::post(io_a, [&] {
    p.a->Start();
    SendAll(*p.a, want);
  });
  const auto a_closed = ra.closed.get_future();
  const auto b_closed = rb.closed.get_future();
  const bool done = a_closed.wait_for(std::chrono::seconds(60)) == std::future_status::ready &&
                    b_closed.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  guard_a.reset();
  guard_b.reset();
  if (!done) {
    io_a.stop();
    io_b.stop();
  }
  ta.join();
  tb.join();
  ASSERT_TRUE(done);
  ExpectFrames(rb.frames, want);
  ExpectFrames(ra.frames, want);
  EXPECT_EQ(ra.sent, StreamBytes(want));
  EXPECT_EQ(rb.sent, StreamBytes(want));
  EXPECT_EQ(ra.closes, std::vector<std::string>{"all echoed"});
  EXPECT_EQ(rb.closes, std::vector<std::string>{"peer closed the connection"});
}

TEST(MemoryTransportTest, DiscardSkipsExactlyThePayload) {
  const std::vector<Frame> all = {MakeFrame(Opcode::kPush, 1, Pattern(400, 1), DType::kFp32),
                                  MakeFrame(Opcode::kHello, 2, Pattern(13, 2)),
                                  MakeFrame(Opcode::kPush, 3, "", DType::kFp32),
                                  MakeFrame(Opcode::kPush, 4, Pattern(8, 4), DType::kFp32),
                                  MakeFrame(Opcode::kHello, 5, ""),
                                  MakeFrame(Opcode::kKeyInfo, 6, Pattern(77, 6))};
  for (size_t r : {0, 1, 5, 39, 40, 41, 64, 1000}) {
    FaultPlan plan;
    plan.max_read_bytes = r;
    Harness h(plan);
    h.rb.on_header = [](Connection&, const FrameHeader& hd) {
      return hd.opcode == Opcode::kPush ? Verdict::kDiscard : Verdict::kAccept;
    };
    SendAll(*h.p.a, all);
    h.Run();
    ASSERT_EQ(h.rb.headers.size(), all.size()) << r;
    for (size_t i = 0; i < all.size(); ++i) EXPECT_TRUE(SameHeader(h.rb.headers[i], all[i].h));
    ExpectFrames(h.rb.frames, {all[1], all[4], all[5]});
    EXPECT_TRUE(h.rb.closes.empty());
    h.CloseCleanly();
  }
}

TEST(MemoryTransportTest, InvalidHeaderGetsFatalMalformed) {
  struct Case {
    const char* field;
    std::function<void(FrameHeader&)> spoil;
  };
  const std::vector<Case> cases = {
      {"magic", [](FrameHeader& x) { x.magic = 0xdeadbeef; }},
      {"version", [](FrameHeader& x) { x.version = 9; }},
      {"opcode", [](FrameHeader& x) { x.opcode = static_cast<Opcode>(0); }},
      {"opcode", [](FrameHeader& x) { x.opcode = static_cast<Opcode>(99); }},
      {"dtype", [](FrameHeader& x) { x.dtype = static_cast<DType>(9); }},
      {"payload_bytes", [](FrameHeader& x) { x.payload_bytes = kMaxControlPayload + 1; }}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    Harness h;
    const Frame good = MakeFrame(Opcode::kHello, 1, "ok");
    FrameHeader bad = MakeFrame(Opcode::kHello, 42, "").h;
    c.spoil(bad);
    h.p.a->SendOwned(good.h, good.payload);
    h.p.a->SendShared(bad, {}, nullptr);  // the header alone: refused before any payload
    h.p.a->SendOwned(good.h, good.payload);
    h.Run();
    ExpectFrames(h.rb.frames, {good});
    EXPECT_EQ(h.rb.headers.size(), 1u);  // the handler never saw the bad header
    ASSERT_EQ(h.ra.frames.size(), 1u);
    const Frame& e = h.ra.frames[0];
    EXPECT_EQ(e.h.opcode, Opcode::kError);
    EXPECT_EQ(e.h.flags, kFlagFatal);
    EXPECT_EQ(e.h.request_id, 42u);
    const Result<ErrorBody> body = DecodeErrorBody(Bytes(e.payload));
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    const WireError code = body->code;
    const std::string& text = body->text;
    EXPECT_EQ(code, WireError::kMalformed);
    EXPECT_EQ(text.rfind(c.field, 0), 0u) << text;
    EXPECT_EQ(h.rb.closes, std::vector<std::string>{"closed after a fatal error"});
    EXPECT_EQ(h.ra.closes, std::vector<std::string>{"peer closed the connection"});
  }
}

}  // namespace
}  // namespace rackhub::net::testing
