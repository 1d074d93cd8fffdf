// The hub-link handshake (server/lanes/hub_handshake.h) on its own: both
// ends driven with each other's bytes. Proofs are compared with the tests'
// own HMAC of the documented transcript (tests/support/hub_link_auth.h), a
// wrong secret, a replayed or reflected proof, another link's proof, an old
// hub's HUB_HELLO and malformed or out-of-order messages are refused with
// the error that names them.
#include "hub_handshake.h"

#include <gtest/gtest.h>

#include <span>
#include <string>

#include "hello_check.h"
#include "hub_link_auth.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {
namespace {

namespace dpb = rackhub::data::v1;

const std::string kSecret(48, 's');

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Rack 0 (opener) to rack 2 (acceptor), lane 1 of 2, 3 racks.
HubLinkFacts Facts() { return {0, 2, 1, 3, 2}; }
testing::HubLinkRef Ref() { return {0, 2, 1, 3, 2}; }

dpb::HubHello Parse(const std::string& bytes) {
  dpb::HubHello h;
  EXPECT_TRUE(h.ParseFromString(bytes));
  return h;
}

std::string Nonce(const std::string& payload_of_challenge) {
  dpb::HubChallenge c;
  EXPECT_TRUE(c.ParseFromString(payload_of_challenge));
  return c.nonce();
}

std::string ProofOf(const std::string& payload) {
  dpb::HubProof p;
  EXPECT_TRUE(p.ParseFromString(payload));
  return p.proof();
}

TEST(HubHandshakeTest, BothSidesProveTheSecretWithTheDocumentedHmac) {
  HubOpener opener(kSecret, Facts());
  HubAcceptor acceptor(kSecret, 2);
  const Result<std::string> hello = opener.Hello();
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  const dpb::HubHello h = Parse(*hello);
  EXPECT_EQ(h.link_version(), kHubLinkVersion);
  EXPECT_EQ(h.nonce().size(), 32u);
  EXPECT_EQ(h.rack(), 0u);
  EXPECT_EQ(h.lane(), 1u);
  EXPECT_EQ(h.racks(), 3u);
  EXPECT_EQ(h.lanes(), 2u);
  EXPECT_EQ(hello->find(kSecret), std::string::npos);
  const Result<std::string> challenge = acceptor.OnHello(h);
  ASSERT_TRUE(challenge.ok()) << challenge.status().ToString();
  const std::string nonce_a = Nonce(*challenge);
  ASSERT_EQ(nonce_a.size(), 32u);
  EXPECT_NE(nonce_a, h.nonce());
  const Result<std::string> proof = opener.OnChallenge(Bytes(*challenge));
  ASSERT_TRUE(proof.ok()) << proof.status().ToString();
  EXPECT_EQ(ProofOf(*proof), testing::RefHubProof(kSecret, true, h.nonce(), nonce_a, Ref()));
  const Result<std::string> accept = acceptor.OnProof(Bytes(*proof));
  ASSERT_TRUE(accept.ok()) << accept.status().ToString();
  EXPECT_EQ(ProofOf(*accept), testing::RefHubProof(kSecret, false, h.nonce(), nonce_a, Ref()));
  EXPECT_NE(ProofOf(*accept), ProofOf(*proof)) << "the roles' proofs differ";
  EXPECT_TRUE(opener.OnAccept(Bytes(*accept)).ok());
  // Each handshake is used once.
  EXPECT_FALSE(opener.OnAccept(Bytes(*accept)).ok());
  EXPECT_FALSE(acceptor.OnProof(Bytes(*proof)).ok());
}

TEST(HubHandshakeTest, FreshNoncesEveryTime) {
  HubOpener a(kSecret, Facts()), b(kSecret, Facts());
  EXPECT_NE(Parse(*a.Hello()).nonce(), Parse(*b.Hello()).nonce());
}

TEST(HubHandshakeTest, AWrongSecretIsRefusedByEitherSide) {
  // The opener's secret is wrong: the acceptor says so.
  {
    HubOpener opener(std::string(48, 'x'), Facts());
    HubAcceptor acceptor(kSecret, 2);
    const auto challenge = acceptor.OnHello(Parse(*opener.Hello()));
    const auto proof = opener.OnChallenge(Bytes(*challenge));
    const Result<std::string> r = acceptor.OnProof(Bytes(*proof));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
    EXPECT_NE(r.status().message().find("wrong hub secret: the HUB_PROOF of rack 0's hub"),
              std::string::npos)
        << r.status().message();
  }
  // Something answering as the acceptor without the secret: the opener says so.
  {
    HubOpener opener(kSecret, Facts());
    HubAcceptor impostor(std::string(48, 'x'), 2);
    const dpb::HubHello hello = Parse(*opener.Hello());
    const auto challenge = impostor.OnHello(hello);
    const auto proof = opener.OnChallenge(Bytes(*challenge));
    ASSERT_TRUE(proof.ok());
    // The impostor cannot check the proof; it answers with what it can make.
    const std::string forged = testing::ProofPayload(
        testing::RefHubProof(std::string(48, 'x'), false, hello.nonce(), Nonce(*challenge), Ref()));
    const Status s = opener.OnAccept(Bytes(forged));
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << s.ToString();
    EXPECT_NE(s.message().find("wrong hub secret: the HUB_ACCEPT of rack 2's hub"),
              std::string::npos)
        << s.message();
  }
}

TEST(HubHandshakeTest, ReplayedReflectedAndOtherLinksProofsAreRefused) {
  // A recorded opener (hello + proof) replayed against a fresh acceptor.
  HubOpener recorded(kSecret, Facts());
  const std::string hello = *recorded.Hello();
  HubAcceptor first(kSecret, 2);
  const std::string proof = *recorded.OnChallenge(Bytes(*first.OnHello(Parse(hello))));
  ASSERT_TRUE(first.OnProof(Bytes(proof)).ok());
  HubAcceptor replayed(kSecret, 2);
  ASSERT_TRUE(replayed.OnHello(Parse(hello)).ok());
  const Result<std::string> r = replayed.OnProof(Bytes(proof));
  ASSERT_FALSE(r.ok()) << "a replayed HUB_PROOF must not authenticate: the nonce differs";
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);

  // Reflection: an opener's own proof handed back to it as HUB_ACCEPT.
  HubOpener opener(kSecret, Facts());
  HubAcceptor acceptor(kSecret, 2);
  const auto challenge = acceptor.OnHello(Parse(*opener.Hello()));
  const auto own = opener.OnChallenge(Bytes(*challenge));
  EXPECT_EQ(opener.OnAccept(Bytes(*own)).code(), StatusCode::kUnauthenticated);

  // A proof made for another link (lane 0 instead of lane 1; another
  // acceptor rack) does not verify for this one.
  HubOpener o2(kSecret, Facts());
  const dpb::HubHello h2 = Parse(*o2.Hello());
  testing::HubLinkRef other_lane = Ref();
  other_lane.lane = 0;
  testing::HubLinkRef other_rack = Ref();
  other_rack.acceptor_rack = 1;
  for (const auto& other : {Ref(), other_lane, other_rack}) {
    HubAcceptor a3(kSecret, 2);
    const std::string n3 = Nonce(*a3.OnHello(h2));
    const std::string p =
        testing::ProofPayload(testing::RefHubProof(kSecret, true, h2.nonce(), n3, other));
    // The right link's reference proof passes (so the others fail for their link alone).
    const bool same = other.lane == Ref().lane && other.acceptor_rack == Ref().acceptor_rack;
    EXPECT_EQ(a3.OnProof(Bytes(p)).ok(), same);
  }
}

TEST(HubHandshakeTest, AnOldHubsHelloIsRefusedNamingTheVersions) {
  const std::string v1 = testing::HubHelloV1Payload({1, 0, 0, 2, 1}, kSecret);
  TopologyConfig topo;
  topo.rack = 0;
  topo.racks.resize(2);
  const auto r = CheckHubHello(Bytes(v1), topo, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("the peer speaks hub-link version 1 (its HUB_HELLO carries "
                                      "the secret itself); this hub speaks version 2"),
            std::string::npos)
      << r.status().message();
  // The version-2 HELLO of the same link passes.
  const std::string v2 = testing::HubHelloPayload({1, 0, 0, 2, 1}, testing::RandomNonce());
  EXPECT_TRUE(CheckHubHello(Bytes(v2), topo, 1).ok());
  dpb::HubHello v3 = Parse(v2);
  v3.set_link_version(3);
  EXPECT_NE(CheckHubHelloVersion(v3).message().find("hub-link version 3"), std::string::npos);
}

TEST(HubHandshakeTest, MalformedAndOutOfOrderMessagesAreRefused) {
  HubAcceptor acceptor(kSecret, 2);
  dpb::HubHello short_nonce;
  short_nonce.set_link_version(2);
  short_nonce.set_nonce("abc");
  const auto r = acceptor.OnHello(short_nonce);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("the nonce has 3 bytes, not 32"), std::string::npos);

  HubAcceptor a(kSecret, 2);
  EXPECT_NE(a.OnProof(Bytes(testing::ProofPayload(std::string(32, 'p'))))
                .status()
                .message()
                .find("HUB_PROOF out of turn"),
            std::string::npos);
  HubOpener o(kSecret, Facts());
  EXPECT_NE(o.OnAccept(Bytes(std::string())).message().find("HUB_ACCEPT out of turn"),
            std::string::npos);
  HubOpener o2(kSecret, Facts());
  HubAcceptor a2(kSecret, 2);
  const auto challenge = a2.OnHello(Parse(*o2.Hello()));
  const auto proof = o2.OnChallenge(Bytes(*challenge));
  const auto bad = a2.OnProof(Bytes(testing::ProofPayload(std::string(31, 'p'))));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("the proof has 31 bytes, not 32"), std::string::npos);
  EXPECT_FALSE(a2.OnProof(Bytes(*proof)).ok()) << "a failed handshake stays failed";
  HubOpener o3(kSecret, Facts());
  ASSERT_TRUE(o3.Hello().ok());
  const auto garbage = o3.OnChallenge(Bytes(std::string("\xff\xff\xff", 3)));
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("HUB_CHALLENGE is not a HubChallenge"),
            std::string::npos)
      << garbage.status().message();
}

}  // namespace
}  // namespace rackhub::server
