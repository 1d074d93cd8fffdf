// Hub-link authentication (hub-link version 2, docs/wire-protocol.md section
// 7): a mutual challenge-response over the hub secret (topology.secret_file)
// that never sends the secret or any fixed function of it.
//
//   opener   -> acceptor  HUB_HELLO     {rack, lane, racks, lanes, link_version 2, nonce_o}
//   acceptor -> opener    HUB_CHALLENGE {nonce_a}
//   opener   -> acceptor  HUB_PROOF     {HMAC(secret, "opener"   label || transcript)}
//   acceptor -> opener    HUB_ACCEPT    {HMAC(secret, "acceptor" label || transcript)}
//
// transcript = nonce_o || nonce_a || link_version || opener rack ||
// acceptor rack || lane || racks || lanes (u32 little-endian). Nonces are 32
// bytes from OpenSSL's RAND_bytes, the MAC is OpenSSL's HMAC-SHA256 and
// proofs are compared with CRYPTO_memcmp (constant time). The role labels
// make a proof useless in the other direction (reflection); the nonces make
// a recorded proof useless on another link (replay); the racks and lane make
// it useless towards another hub. The opener proves first (to whoever
// answers its HELLO), the acceptor only after checking that proof; the
// opener sends nothing but HUB_PROOF before it has checked HUB_ACCEPT.
//
// HubOpener is the side that dials (RackExchange), HubAcceptor the side that
// accepts (the TCP acceptor and the RDMA listener, after CheckHubHello's
// topology checks). Each is one link's handshake, used once, by one thread;
// each keeps a copy of the secret (wiped when destroyed). Errors:
// INVALID_ARGUMENT for a malformed or out-of-order message, UNAUTHENTICATED
// for a proof that does not match (a wrong secret, or a replayed or forged
// handshake), FAILED_PRECONDITION for another hub-link version, INTERNAL if
// OpenSSL fails.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "rackhub/common/status.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

inline constexpr uint32_t kHubLinkVersion = 2;
inline constexpr size_t kHubNonceBytes = 32;
inline constexpr size_t kHubProofBytes = 32;
// Largest HUB_CHALLENGE / HUB_PROOF / HUB_ACCEPT payload read (a few bytes
// of protobuf around 32).
inline constexpr uint32_t kMaxHubAuthBytes = 256;

// What both ends of a link agree on and both proofs cover.
struct HubLinkFacts {
  uint32_t opener_rack = 0;
  uint32_t acceptor_rack = 0;
  uint32_t lane = 0;
  uint32_t racks = 0;
  uint32_t lanes = 0;
};

enum class HubRole : uint8_t { kOpener, kAcceptor };
using HubNonce = std::array<uint8_t, kHubNonceBytes>;
using HubMac = std::array<uint8_t, kHubProofBytes>;

// HMAC-SHA256(secret, label(role) || transcript) as above. Exposed for the
// handshake's unit test; the two classes below are the way to use it.
Result<HubMac> ComputeHubProof(const std::string& secret, HubRole role, const HubLinkFacts& facts,
                               const HubNonce& opener_nonce, const HubNonce& acceptor_nonce);

class HubOpener {
 public:
  HubOpener(const std::string& secret, const HubLinkFacts& facts);
  ~HubOpener();
  HubOpener(const HubOpener&) = delete;
  HubOpener& operator=(const HubOpener&) = delete;

  // The HUB_HELLO payload (draws the nonce).
  Result<std::string> Hello();
  // A HUB_CHALLENGE payload: the HUB_PROOF payload to send.
  Result<std::string> OnChallenge(std::span<const std::byte> payload);
  // A HUB_ACCEPT payload: OK when the acceptor proved the secret; the link
  // may carry data only then.
  Status OnAccept(std::span<const std::byte> payload);

 private:
  enum class Stage { kNew, kHelloSent, kProofSent, kDone, kFailed };
  std::string secret_;
  HubLinkFacts facts_;
  Stage stage_ = Stage::kNew;
  HubNonce mine_{};
  HubNonce theirs_{};
};

class HubAcceptor {
 public:
  // `rack`: this hub's rack.
  HubAcceptor(const std::string& secret, uint32_t rack);
  ~HubAcceptor();
  HubAcceptor(const HubAcceptor&) = delete;
  HubAcceptor& operator=(const HubAcceptor&) = delete;

  // A HUB_HELLO that passed CheckHubHello (version, nonce, topology): the
  // HUB_CHALLENGE payload to send.
  Result<std::string> OnHello(const data::v1::HubHello& hello);
  // A HUB_PROOF payload: the HUB_ACCEPT payload to send once it matches.
  Result<std::string> OnProof(std::span<const std::byte> payload);

 private:
  enum class Stage { kNew, kChallengeSent, kDone, kFailed };
  std::string secret_;
  HubLinkFacts facts_;
  Stage stage_ = Stage::kNew;
  HubNonce theirs_{};
  HubNonce mine_{};
};

// The version and nonce of a parsed HUB_HELLO: FAILED_PRECONDITION naming
// both versions for a hub of another hub-link version (version 1 sent the
// secret itself), INVALID_ARGUMENT for a nonce of the wrong size.
Status CheckHubHelloVersion(const data::v1::HubHello& hello);

}  // namespace rackhub::server
