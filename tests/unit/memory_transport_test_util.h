// Helpers shared by the memory transport tests (memory_transport_test.cc,
// memory_transport_faults_test.cc): frames with recognizable payloads, a
// FrameHandler that records everything, and a pair of ends on one
// io_context. Everything runs on the io_context's thread (the test's).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <string>
#include <vector>

#include "rackhub/net/testing/memory_connection.h"

namespace rackhub::net::testing::memtest {

namespace asio = boost::asio;
using Verdict = FrameHandler::Verdict;

inline std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 131 + i * 7 + i / 251) & 0xff);
  return s;
}
inline std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

struct Frame {
  FrameHeader h;
  std::string payload;
};
inline Frame MakeFrame(Opcode op, uint64_t rid, std::string payload, DType dt = DType::kNone) {
  Frame f;
  f.h.opcode = op;
  f.h.dtype = dt;
  f.h.tenant = 3;
  f.h.key = static_cast<uint32_t>(rid * 5);
  f.h.chunk = static_cast<uint32_t>(rid % 7);
  f.h.iteration = rid * 11;
  f.h.request_id = rid;
  f.h.payload_bytes = static_cast<uint32_t>(payload.size());
  f.payload = std::move(payload);
  return f;
}
// Control frames (any payload size) of 0..1500 bytes, plus fp32 PUSHes.
inline std::vector<Frame> Mix(size_t count, uint64_t seed = 1) {
  const size_t sizes[] = {0, 1, 39, 40, 41, 300, 1500, 7};
  std::vector<Frame> v;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t rid = seed * 1000 + i;
    v.push_back(i % 3 == 2 ? MakeFrame(Opcode::kPush, rid, Pattern(4 * (i + 1), rid), DType::kFp32)
                           : MakeFrame(Opcode::kHello, rid, Pattern(sizes[i % 8], rid)));
  }
  return v;
}
inline size_t StreamBytes(const std::vector<Frame>& v) {
  size_t n = 0;
  for (const Frame& f : v) n += kHeaderBytes + f.payload.size();
  return n;
}
// Even frames are shared without an owner (`v` must outlive the write), odd
// ones owned.
inline void SendAll(Connection& c, const std::vector<Frame>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 2 == 0) c.SendShared(v[i].h, Bytes(v[i].payload), nullptr);
    else c.SendOwned(v[i].h, v[i].payload);
  }
}
inline bool SameHeader(const FrameHeader& x, const FrameHeader& y) {
  return x.magic == y.magic && x.version == y.version && x.opcode == y.opcode &&
         x.flags == y.flags && x.dtype == y.dtype && x.tenant == y.tenant && x.key == y.key &&
         x.chunk == y.chunk && x.payload_bytes == y.payload_bytes &&
         x.iteration == y.iteration && x.request_id == y.request_id;
}
inline void ExpectFrames(const std::vector<Frame>& got, const std::vector<Frame>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(SameHeader(got[i].h, want[i].h)) << "frame " << i;
    EXPECT_EQ(got[i].payload, want[i].payload) << "frame " << i;
  }
}

// Records everything a FrameHandler sees; used on its connection's thread only.
class Recorder : public FrameHandler {
 public:
  std::function<Verdict(Connection&, const FrameHeader&)> on_header;
  std::function<void(Connection&, const Frame&)> on_frame;
  std::vector<FrameHeader> headers;
  std::vector<Frame> frames;
  std::vector<std::string> closes;
  size_t sent = 0;
  std::promise<void> closed;

  Verdict AcceptHeader(Connection& c, const FrameHeader& h) override {
    headers.push_back(h);
    return on_header ? on_header(c, h) : Verdict::kAccept;
  }
  void HandleFrame(Connection& c, const FrameHeader& h, std::span<const std::byte> p) override {
    frames.push_back({h, std::string(reinterpret_cast<const char*>(p.data()), p.size())});
    if (on_frame) on_frame(c, frames.back());
  }
  void OnConnectionClosed(Connection&, const std::string& why) override {
    closes.push_back(why);
    if (closes.size() == 1) closed.set_value();
  }
  void OnBytesSent(Connection&, size_t n) override { sent += n; }
};

inline ConnectionIdentity Id(const std::string& peer) {
  ConnectionIdentity id;
  id.tenant_handle = 3;
  id.peer = peer;
  return id;
}

// Both ends on one io_context; Run() returns once nothing moves any more.
struct Harness {
  asio::io_context io;
  Recorder ra, rb;
  MemoryPair p;
  explicit Harness(FaultPlan ab = {}, FaultPlan ba = {}, bool start_b = true) {
    p = MakeMemoryPair(io, &ra, Id("a"), io, &rb, Id("b"), ab, ba);
    p.a->Start();
    if (start_b) p.b->Start();
  }
  void Run() {
    io.restart();
    io.run();
  }
  // Closes a; b must see a clean close.
  void CloseCleanly() {
    p.a->Close("done");
    Run();
    EXPECT_EQ(ra.closes, std::vector<std::string>{"done"});
    EXPECT_EQ(rb.closes, std::vector<std::string>{"peer closed the connection"});
  }
};

}  // namespace rackhub::net::testing::memtest
