// Test support: the hub-link handshake (hub-link version 2,
// docs/wire-protocol.md section 7) written again from the document, with
// OpenSSL's HMAC directly: the tests' reference for what a hub must send and
// accept, independent of server/lanes/hub_handshake.cc. Lets a test play
// either end of a hub link over a DataLink (a raw TCP socket).
// Single-threaded use from a test body.
#pragma once

#include <gtest/gtest.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "data_link.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub::testing {

// What both proofs of a link cover (besides the nonces).
struct HubLinkRef {
  uint32_t opener_rack = 0;
  uint32_t acceptor_rack = 0;
  uint32_t lane = 0;
  uint32_t racks = 2;
  uint32_t lanes = 1;
};

// HMAC-SHA256(secret, label || nonce_o || nonce_a || u32 LE: 2, opener rack,
// acceptor rack, lane, racks, lanes); labels "rackhub hub link v2: opener
// proof" / "... acceptor proof", each with its terminating NUL.
inline std::string RefHubProof(const std::string& secret, bool opener_role,
                               const std::string& nonce_o, const std::string& nonce_a,
                               const HubLinkRef& link) {
  std::string msg = opener_role ? std::string("rackhub hub link v2: opener proof", 34)
                                : std::string("rackhub hub link v2: acceptor proof", 36);
  msg += nonce_o;
  msg += nonce_a;
  for (uint32_t v : {2u, link.opener_rack, link.acceptor_rack, link.lane, link.racks, link.lanes}) {
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  unsigned char out[32];
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

inline std::string RandomNonce() {
  std::string n(32, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), 32);
  return n;
}

// A whole frame's bytes.
inline std::string FrameBytes(net::Opcode op, const std::string& payload) {
  net::FrameHeader h;
  h.opcode = op;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}

inline std::string HubHelloPayload(const HubLinkRef& link, const std::string& nonce) {
  data::v1::HubHello hello;
  hello.set_rack(link.opener_rack);
  hello.set_lane(link.lane);
  hello.set_racks(link.racks);
  hello.set_lanes(link.lanes);
  hello.set_link_version(2);
  hello.set_nonce(nonce);
  return hello.SerializeAsString();
}

// A hub-link version 1 HUB_HELLO (before the handshake): the secret as field
// 3, a string, in the clear.
inline std::string HubHelloV1Payload(const HubLinkRef& link, const std::string& secret) {
  data::v1::HubHello hello;
  hello.set_rack(link.opener_rack);
  hello.set_lane(link.lane);
  hello.set_racks(link.racks);
  hello.set_lanes(link.lanes);
  std::string bytes = hello.SerializeAsString();
  bytes.push_back(static_cast<char>((3 << 3) | 2));   // field 3, length-delimited
  bytes.push_back(static_cast<char>(secret.size()));  // < 128 here
  return bytes + secret;
}

inline std::string ProofPayload(const std::string& proof) {
  data::v1::HubProof p;
  p.set_proof(proof);
  return p.SerializeAsString();
}

// Plays the opener (rack link.opener_rack) on `link` against the hub of
// link.acceptor_rack: HUB_HELLO, HUB_CHALLENGE, HUB_PROOF, then checks the
// hub's HUB_ACCEPT against the reference. Fails the test (and returns false)
// on anything else. `then`: bytes sent in the same write as HUB_PROOF.
inline bool OpenHubLink(DataLink& conn, const std::string& secret, const HubLinkRef& link,
                        const std::string& then = "") {
  const std::string mine = RandomNonce();
  conn.SendRaw(FrameBytes(net::Opcode::kHubHello, HubHelloPayload(link, mine)));
  const auto challenge = conn.Receive();
  EXPECT_TRUE(challenge && challenge->h.opcode == net::Opcode::kHubChallenge)
      << Describe(challenge);
  if (!challenge || challenge->h.opcode != net::Opcode::kHubChallenge) return false;
  data::v1::HubChallenge c;
  EXPECT_TRUE(c.ParseFromString(challenge->payload));
  EXPECT_EQ(c.nonce().size(), 32u);
  conn.SendRaw(FrameBytes(net::Opcode::kHubProof,
                          ProofPayload(RefHubProof(secret, true, mine, c.nonce(), link))) +
               then);
  const auto accept = conn.Receive();
  EXPECT_TRUE(accept && accept->h.opcode == net::Opcode::kHubAccept) << Describe(accept);
  if (!accept || accept->h.opcode != net::Opcode::kHubAccept) return false;
  data::v1::HubProof p;
  EXPECT_TRUE(p.ParseFromString(accept->payload));
  EXPECT_EQ(p.proof(), RefHubProof(secret, false, mine, c.nonce(), link))
      << "the hub's HUB_ACCEPT is not the acceptor proof of this link";
  return p.proof() == RefHubProof(secret, false, mine, c.nonce(), link);
}

// Plays the acceptor (rack link.acceptor_rack) on an accepted `conn`: reads
// HUB_HELLO (which must match `link`), sends HUB_CHALLENGE, checks the hub's
// HUB_PROOF against the reference and answers HUB_ACCEPT. False (test
// failed) otherwise. `received`: its HUB_HELLO if the caller read it
// already (to tell which rack dialed).
inline bool AcceptHubLink(DataLink& conn, const std::string& secret, const HubLinkRef& link,
                          std::optional<Frame> received = std::nullopt) {
  const auto hello = received ? std::move(received) : conn.Receive();
  EXPECT_TRUE(hello && hello->h.opcode == net::Opcode::kHubHello) << Describe(hello);
  if (!hello || hello->h.opcode != net::Opcode::kHubHello) return false;
  data::v1::HubHello h;
  EXPECT_TRUE(h.ParseFromString(hello->payload));
  EXPECT_EQ(h.link_version(), 2u);
  EXPECT_EQ(h.rack(), link.opener_rack);
  EXPECT_EQ(h.lane(), link.lane);
  const std::string mine = RandomNonce();
  data::v1::HubChallenge c;
  c.set_nonce(mine);
  conn.SendRaw(FrameBytes(net::Opcode::kHubChallenge, c.SerializeAsString()));
  const auto proof = conn.Receive();
  EXPECT_TRUE(proof && proof->h.opcode == net::Opcode::kHubProof) << Describe(proof);
  if (!proof || proof->h.opcode != net::Opcode::kHubProof) return false;
  data::v1::HubProof p;
  EXPECT_TRUE(p.ParseFromString(proof->payload));
  const bool ok = p.proof() == RefHubProof(secret, true, h.nonce(), mine, link);
  EXPECT_TRUE(ok) << "the hub's HUB_PROOF is not the opener proof of this link";
  if (!ok) return false;
  conn.SendRaw(FrameBytes(net::Opcode::kHubAccept,
                          ProofPayload(RefHubProof(secret, false, h.nonce(), mine, link))));
  return true;
}

}  // namespace rackhub::testing
