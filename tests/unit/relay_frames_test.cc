// The relay frames' encoders and decoders (net/frame.h, docs/wire-protocol.md
// 7d): the 16-byte RACK_RELAY prefix round-trips and is little-endian at the
// documented offsets; a short prefix, an unknown kind and a nonzero reserved
// field are refused by name; a RACK_RELAY_REPLY must carry one whole PARAMS
// or ERROR frame.
#include <gtest/gtest.h>

#include <array>
#include <span>
#include <string>

#include "rackhub/net/frame.h"

namespace rackhub::net {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string Frame(FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, kHeaderBytes> buf;
  EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}

TEST(RelayFramesTest, ThePrefixRoundTripsLittleEndianAtItsOffsets) {
  const std::string p = EncodeRelayPrefix(
      {RelayKind::kFrame, Opcode::kPush, 0x04030201u, 0x0c0b0a0908070605ull});
  // kind, opcode, reserved u16, rank u32, session u64 (wire-protocol.md 7d).
  const std::string expected = {0, static_cast<char>(Opcode::kPush), 0, 0, 1, 2, 3, 4,
                                5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(p, expected);
  const Result<RelayPrefix> d = DecodeRelayPrefix(Bytes(p + "payload"));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->kind, RelayKind::kFrame);
  EXPECT_EQ(d->opcode, Opcode::kPush);
  EXPECT_EQ(d->rank, 0x04030201u);
  EXPECT_EQ(d->session, 0x0c0b0a0908070605ull);
  // A notice carries no opcode.
  const std::string gone = EncodeRelayPrefix({RelayKind::kMemberGone, Opcode::kPull, 3, 9});
  EXPECT_EQ(gone[0], 2);
  EXPECT_EQ(gone[1], 0);
  EXPECT_EQ(DecodeRelayPrefix(Bytes(gone))->kind, RelayKind::kMemberGone);
}

TEST(RelayFramesTest, ABadPrefixIsRefusedByName) {
  EXPECT_EQ(DecodeRelayPrefix(Bytes("abc")).status().message(),
            "RACK_RELAY: 3 bytes, shorter than its 16-byte prefix");
  std::string p = EncodeRelayPrefix({RelayKind::kFrame, Opcode::kPull, 0, 1});
  p[0] = 3;
  EXPECT_EQ(DecodeRelayPrefix(Bytes(p)).status().message(), "RACK_RELAY: kind 3 is not a relay kind");
  p[0] = 0;
  p[3] = 1;  // reserved = 256
  EXPECT_EQ(DecodeRelayPrefix(Bytes(p)).status().message(),
            "RACK_RELAY: the prefix's reserved field is 256, not 0");
}

TEST(RelayFramesTest, AReplyCarriesOneWholeParamsOrErrorFrame) {
  FrameHeader params;
  params.opcode = Opcode::kParams;
  params.dtype = DType::kFp32;
  params.request_id = 7;
  const Result<FrameHeader> ok = DecodeRelayReply(Bytes(Frame(params, std::string(8, 'x'))));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->request_id, 7u);
  EXPECT_EQ(ok->payload_bytes, 8u);
  const ErrorFrame e = MakeErrorFrame(WireError::kNotReady, "not yet", 1, 7, false);
  EXPECT_TRUE(DecodeRelayReply(Bytes(Frame(e.header, e.body))).ok());
  EXPECT_EQ(DecodeRelayReply(Bytes("short")).status().message(),
            "RACK_RELAY_REPLY: 5 bytes, shorter than a 40-byte frame header");
  FrameHeader push = params;
  push.opcode = Opcode::kPush;
  EXPECT_EQ(DecodeRelayReply(Bytes(Frame(push, ""))).status().message(),
            "RACK_RELAY_REPLY: carries PUSH, not a PARAMS or ERROR frame");
  EXPECT_EQ(DecodeRelayReply(Bytes(Frame(params, "1234") + "5")).status().message(),
            "RACK_RELAY_REPLY: the frame it carries says 4 payload bytes, 5 follow");
  std::string bad_magic = Frame(params, "");
  bad_magic[0] = 'X';
  const Status magic = DecodeRelayReply(Bytes(bad_magic)).status();
  EXPECT_EQ(magic.message().rfind("RACK_RELAY_REPLY: the frame it carries: magic", 0), 0u)
      << magic.message();
}

}  // namespace
}  // namespace rackhub::net
