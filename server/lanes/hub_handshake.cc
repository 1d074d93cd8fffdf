#include "hub_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <string_view>
#include <vector>

namespace rackhub::server {

namespace dpb = rackhub::data::v1;

namespace {

// Distinct, fixed-length labels (NUL-terminated, so neither is a prefix of
// the other's input).
constexpr std::string_view kOpenerLabel{"rackhub hub link v2: opener proof", 34};
constexpr std::string_view kAcceptorLabel{"rackhub hub link v2: acceptor proof", 36};

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Result<HubNonce> NewNonce() {
  HubNonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return Internal("hub link: RAND_bytes failed: no randomness for the handshake nonce");
  }
  return n;
}

bool CopyBytes(const std::string& in, HubNonce* out) {
  if (in.size() != out->size()) return false;
  std::memcpy(out->data(), in.data(), out->size());
  return true;
}

std::string AsString(const HubNonce& n) {
  return std::string(reinterpret_cast<const char*>(n.data()), n.size());
}

// The proof in `payload` (a HubProof) against the one expected.
Status CheckProof(std::span<const std::byte> payload, const HubMac& expected, const char* frame,
                  const std::string& mismatch) {
  dpb::HubProof proof;
  if (!proof.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return InvalidArgument(std::string(frame) + " is not a HubProof");
  }
  if (proof.proof().size() != expected.size()) {
    return InvalidArgument(std::string(frame) + ": the proof has " +
                           std::to_string(proof.proof().size()) + " bytes, not " +
                           std::to_string(expected.size()));
  }
  if (CRYPTO_memcmp(proof.proof().data(), expected.data(), expected.size()) != 0) {
    return Unauthenticated(mismatch);
  }
  return {};
}

std::string ProofPayload(const HubMac& mac) {
  dpb::HubProof p;
  p.set_proof(std::string(reinterpret_cast<const char*>(mac.data()), mac.size()));
  return p.SerializeAsString();
}

}  // namespace

Result<HubMac> ComputeHubProof(const std::string& secret, HubRole role, const HubLinkFacts& facts,
                               const HubNonce& opener_nonce, const HubNonce& acceptor_nonce) {
  if (secret.empty()) return FailedPrecondition("topology.secret_file: no hub secret");
  const std::string_view label = role == HubRole::kOpener ? kOpenerLabel : kAcceptorLabel;
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.insert(msg.end(), opener_nonce.begin(), opener_nonce.end());
  msg.insert(msg.end(), acceptor_nonce.begin(), acceptor_nonce.end());
  PutU32(msg, kHubLinkVersion);
  PutU32(msg, facts.opener_rack);
  PutU32(msg, facts.acceptor_rack);
  PutU32(msg, facts.lane);
  PutU32(msg, facts.racks);
  PutU32(msg, facts.lanes);
  HubMac mac{};
  unsigned len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
           mac.data(), &len) == nullptr ||
      len != mac.size()) {
    return Internal("hub link: HMAC-SHA256 failed");
  }
  return mac;
}

Status CheckHubHelloVersion(const dpb::HubHello& hello) {
  if (hello.link_version() != kHubLinkVersion) {
    const uint32_t v = hello.link_version() == 0 ? 1 : hello.link_version();
    return FailedPrecondition("the peer speaks hub-link version " + std::to_string(v) +
                              (v == 1 ? " (its HUB_HELLO carries the secret itself)" : "") +
                              "; this hub speaks version " + std::to_string(kHubLinkVersion) +
                              " (challenge-response): run the same rackhubd release on every hub");
  }
  if (hello.nonce().size() != kHubNonceBytes) {
    return InvalidArgument("HUB_HELLO: the nonce has " + std::to_string(hello.nonce().size()) +
                           " bytes, not " + std::to_string(kHubNonceBytes));
  }
  return {};
}

// ---- opener ----

HubOpener::HubOpener(const std::string& secret, const HubLinkFacts& facts)
    : secret_(secret), facts_(facts) {}

HubOpener::~HubOpener() { OPENSSL_cleanse(secret_.data(), secret_.size()); }

Result<std::string> HubOpener::Hello() {
  if (stage_ != Stage::kNew) return InvalidArgument("hub link: HUB_HELLO was sent already");
  Result<HubNonce> n = NewNonce();
  if (!n.ok()) {
    stage_ = Stage::kFailed;
    return n.status();
  }
  mine_ = *n;
  dpb::HubHello hello;
  hello.set_rack(facts_.opener_rack);
  hello.set_lane(facts_.lane);
  hello.set_racks(facts_.racks);
  hello.set_lanes(facts_.lanes);
  hello.set_link_version(kHubLinkVersion);
  hello.set_nonce(AsString(mine_));
  stage_ = Stage::kHelloSent;
  return hello.SerializeAsString();
}

Result<std::string> HubOpener::OnChallenge(std::span<const std::byte> payload) {
  if (stage_ != Stage::kHelloSent) {
    stage_ = Stage::kFailed;
    return InvalidArgument("HUB_CHALLENGE out of turn");
  }
  stage_ = Stage::kFailed;  // until it succeeds
  dpb::HubChallenge c;
  if (!c.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return InvalidArgument("HUB_CHALLENGE is not a HubChallenge");
  }
  if (!CopyBytes(c.nonce(), &theirs_)) {
    return InvalidArgument("HUB_CHALLENGE: the nonce has " + std::to_string(c.nonce().size()) +
                           " bytes, not " + std::to_string(kHubNonceBytes));
  }
  if (theirs_ == mine_) {
    return InvalidArgument("HUB_CHALLENGE: the acceptor's nonce repeats this hub's own");
  }
  Result<HubMac> mac = ComputeHubProof(secret_, HubRole::kOpener, facts_, mine_, theirs_);
  if (!mac.ok()) return mac.status();
  stage_ = Stage::kProofSent;
  return ProofPayload(*mac);
}

Status HubOpener::OnAccept(std::span<const std::byte> payload) {
  if (stage_ != Stage::kProofSent) {
    stage_ = Stage::kFailed;
    return InvalidArgument("HUB_ACCEPT out of turn");
  }
  stage_ = Stage::kFailed;
  Result<HubMac> want = ComputeHubProof(secret_, HubRole::kAcceptor, facts_, mine_, theirs_);
  if (!want.ok()) return want.status();
  if (Status s = CheckProof(payload, *want, "HUB_ACCEPT",
                            "wrong hub secret: the HUB_ACCEPT of rack " +
                                std::to_string(facts_.acceptor_rack) +
                                "'s hub does not prove this hub's topology.secret_file (a "
                                "process that is not a hub of this cluster, or another secret)");
      !s.ok()) {
    return s;
  }
  stage_ = Stage::kDone;
  return {};
}

// ---- acceptor ----

HubAcceptor::HubAcceptor(const std::string& secret, uint32_t rack) : secret_(secret) {
  facts_.acceptor_rack = rack;
}

HubAcceptor::~HubAcceptor() { OPENSSL_cleanse(secret_.data(), secret_.size()); }

Result<std::string> HubAcceptor::OnHello(const dpb::HubHello& hello) {
  if (stage_ != Stage::kNew) {
    stage_ = Stage::kFailed;
    return InvalidArgument("HUB_HELLO out of turn");
  }
  stage_ = Stage::kFailed;
  if (Status s = CheckHubHelloVersion(hello); !s.ok()) return s;
  if (secret_.empty()) {
    // Config validation requires a secret with racks > 1: cannot happen.
    return Unauthenticated("this hub has no hub secret (topology.secret_file)");
  }
  CopyBytes(hello.nonce(), &theirs_);
  facts_.opener_rack = hello.rack();
  facts_.lane = hello.lane();
  facts_.racks = hello.racks();
  facts_.lanes = hello.lanes();
  Result<HubNonce> n = NewNonce();
  if (!n.ok()) return n.status();
  mine_ = *n;
  dpb::HubChallenge c;
  c.set_nonce(AsString(mine_));
  stage_ = Stage::kChallengeSent;
  return c.SerializeAsString();
}

Result<std::string> HubAcceptor::OnProof(std::span<const std::byte> payload) {
  if (stage_ != Stage::kChallengeSent) {
    stage_ = Stage::kFailed;
    return InvalidArgument("HUB_PROOF out of turn");
  }
  stage_ = Stage::kFailed;
  Result<HubMac> want = ComputeHubProof(secret_, HubRole::kOpener, facts_, theirs_, mine_);
  if (!want.ok()) return want.status();
  if (Status s = CheckProof(payload, *want, "HUB_PROOF",
                            "wrong hub secret: the HUB_PROOF of rack " +
                                std::to_string(facts_.opener_rack) +
                                "'s hub does not match this hub's topology.secret_file "
                                "(another secret, or a replayed or forged handshake)");
      !s.ok()) {
    return s;
  }
  Result<HubMac> mine = ComputeHubProof(secret_, HubRole::kAcceptor, facts_, theirs_, mine_);
  if (!mine.ok()) return mine.status();
  stage_ = Stage::kDone;
  return ProofPayload(*mine);
}

}  // namespace rackhub::server
