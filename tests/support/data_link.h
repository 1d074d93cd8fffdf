// Test support: one raw data-plane connection of a test worker, whatever
// carries it: TCP (RawClient, raw_client.h), the in-memory transport or RDMA
// (ConnectionLink, connection_link.h). Tests send the frames they mean and
// read what comes back, so the same protocol scenarios run over every
// transport (hub_under_test.h).
//
// Threading: single-threaded use from a test body.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub::testing {

using net::FrameHeader;
using net::Opcode;
using net::WireError;

struct Frame {
  FrameHeader h;
  std::string payload;
};

inline constexpr std::chrono::milliseconds kReceiveTimeout{5000};

// fp32 payloads: the bytes of `v`, of `n` copies of `value`, and back.
inline std::string Floats(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
inline std::string Floats(std::initializer_list<float> v) {
  return Floats(std::span<const float>(v.begin(), v.size()));
}
inline std::string Floats(size_t n, float value) { return Floats(std::vector<float>(n, value)); }
// Whether two float vectors hold the same bit patterns (-0 vs +0 and NaNs told apart).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline std::vector<float> AsFloats(const std::string& s) {
  std::vector<float> v(s.size() / sizeof(float));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

class DataLink {
 public:
  virtual ~DataLink() = default;
  // Sends one frame (payload_bytes is set from `payload`).
  virtual void Send(FrameHeader h, const std::string& payload = "") = 0;
  // Next frame, or nullopt on close / timeout.
  virtual std::optional<Frame> Receive(std::chrono::milliseconds timeout = kReceiveTimeout) = 0;
  // True when the hub closed the connection within `timeout` (frames still
  // arriving before the close are dropped).
  virtual bool ClosedByPeer(std::chrono::milliseconds timeout = kReceiveTimeout) = 0;
  // Byte-stream transports accept arbitrary bytes (malformed headers).
  virtual bool SupportsRawBytes() const { return false; }
  virtual void SendRaw(const std::string& bytes) {
    ADD_FAILURE() << "this transport carries whole frames only (" << bytes.size() << " bytes)";
  }

  // HELLO + WELCOME. Returns the Welcome (empty tenant_handle on failure).
  data::v1::Welcome Hello(const std::string& tenant, const std::string& token, uint32_t rank,
                          uint32_t lane, std::optional<Frame>* reply = nullptr) {
    data::v1::Hello hello;
    hello.set_tenant(tenant);
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_lane(lane);
    FrameHeader h;
    h.opcode = Opcode::kHello;
    Send(h, hello.SerializeAsString());
    auto f = Receive();
    data::v1::Welcome w;
    if (f && f->h.opcode == Opcode::kWelcome) w.ParseFromString(f->payload);
    if (reply) *reply = f;
    return w;
  }

};

// "nothing", or the frame's opcode, iteration and (for ERROR) code and text.
inline std::string Describe(const std::optional<Frame>& f) {
  if (!f) return "nothing";
  std::string out = std::string(net::OpcodeName(f->h.opcode)) + " iteration " +
                    std::to_string(f->h.iteration) + " request " +
                    std::to_string(f->h.request_id);
  if (f->h.opcode == Opcode::kError) {
    const Result<net::ErrorBody> e =
        net::DecodeErrorBody(std::as_bytes(std::span(f->payload.data(), f->payload.size())));
    out += e.ok() ? std::string(" ") + net::WireErrorName(e->code) + ": " + e->text
                  : " " + e.status().ToString();
  }
  return out;
}

// Expects an ERROR frame with `code`, a message containing `text`, and the
// fatal flag as given.
inline void ExpectError(const std::optional<Frame>& f, WireError code, const std::string& text,
                 bool fatal = true) {
  ASSERT_TRUE(f.has_value()) << "expected an ERROR frame, got nothing";
  ASSERT_EQ(f->h.opcode, Opcode::kError) << "opcode " << static_cast<int>(f->h.opcode);
  const Result<net::ErrorBody> body = net::DecodeErrorBody(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(f->payload.data()), f->payload.size()));
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const WireError got = body->code;
  const std::string& message = body->text;
  EXPECT_EQ(got, code) << message;
  EXPECT_NE(message.find(text), std::string::npos) << "message: " << message;
  EXPECT_EQ((f->h.flags & net::kFlagFatal) != 0, fatal) << message;
}

}  // namespace rackhub::testing
