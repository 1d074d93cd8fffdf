// Hub-link authentication with real hubs on loopback (docs/cluster.md):
// a forged hub link (an old hub's HUB_HELLO carrying the secret, a proof
// under a wrong secret, no proof) on a rack's interhub port is refused before
// it can bind a key or inject a rack sum (issue 12, hole 4). Hub links
// authenticate without sending the secret (issue 31, item 4): a probe that
// listens on a rack's interhub address while that hub is down learns nothing
// it can reuse, the real hub refuses the recorded bytes, a wrong secret is
// refused on both hubs by name, and a stalled handshake is cut.
#include "multi_rack_support.h"

namespace rackhub {
namespace {

using namespace multi_rack_testing;


// A local process speaks for rack 1 on rack 0's interhub port without
// proving the secret, then in the same write sends a KEY_BIND of the
// victim's key and a RACK_SUM of -5 for chunk 0 (whose home is rack 0),
// iteration 0:
//   kOldHello:   a hub-link version 1 HUB_HELLO carrying `secret` (even the
//                real one: the secret must never travel, so version 1 is refused);
//   kWrongProof: a version 2 HUB_HELLO, then a HUB_PROOF under `secret`;
//   kNoProof:    a version 2 HUB_HELLO, then the frames without a HUB_PROOF.
// The hub must answer with a fatal ERROR naming the problem and close the
// link without reading a frame past the refused one. The forger's socket is
// kept open (returned) until the victim's step is done: an accepted link's
// rack sum stays in the chunk only while its link lives.
enum class Forgery { kOldHello, kWrongProof, kNoProof };
std::unique_ptr<RawClient> ForgeRackSum(const std::string& interhub, Forgery how,
                                        const std::string& secret, uint32_t key_id) {
  auto owned = std::make_unique<RawClient>(interhub);
  RawClient& forger = *owned;
  const data::v1::KeyBind bind = BindOfT("w", key_id, 2048, 0, pb::ZEROS);
  net::FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 77;
  kb.key = key_id;
  net::FrameHeader sum;
  sum.opcode = net::Opcode::kRackSum;
  sum.tenant = 77;
  sum.key = key_id;
  sum.chunk = 0;
  sum.dtype = net::DType::kFp32;
  sum.iteration = 0;
  std::string minus_five(1024 * 4, '\0');
  for (size_t i = 0; i < 1024; ++i) {
    const float v = -5.0f;
    std::memcpy(minus_five.data() + i * 4, &v, 4);
  }
  const std::string inject = Frame(kb, bind.SerializeAsString()) + Frame(sum, minus_five);
  if (how == Forgery::kOldHello) {
    forger.SendRaw(testing::FrameBytes(net::Opcode::kHubHello,
                                       testing::HubHelloV1Payload(kRack1To0, secret)) +
                   inject);
    ExpectError(forger.Receive(), net::WireError::kInvalidArgument,
                "hub link: the peer speaks hub-link version 1 (its HUB_HELLO carries the secret "
                "itself); this hub speaks version 2");
  } else {
    const std::string nonce = testing::RandomNonce();
    forger.SendRaw(testing::FrameBytes(net::Opcode::kHubHello,
                                       testing::HubHelloPayload(kRack1To0, nonce)));
    const auto challenge = forger.Receive();
    EXPECT_TRUE(challenge && challenge->h.opcode == net::Opcode::kHubChallenge)
        << testing::Describe(challenge);
    data::v1::HubChallenge c;
    if (challenge) c.ParseFromString(challenge->payload);
    if (how == Forgery::kWrongProof) {
      forger.SendRaw(testing::FrameBytes(net::Opcode::kHubProof,
                                         testing::ProofPayload(testing::RefHubProof(
                                             secret, true, nonce, c.nonce(), kRack1To0))) +
                     inject);
      ExpectError(forger.Receive(), net::WireError::kUnauthenticated,
                  "hub link: wrong hub secret: the HUB_PROOF of rack 1's hub does not match");
    } else {
      forger.SendRaw(inject);
      ExpectError(forger.Receive(), net::WireError::kMalformed,
                  "the frame after HUB_CHALLENGE is not a HUB_PROOF (got KEY_BIND)");
    }
  }
  EXPECT_TRUE(forger.ClosedByPeer(std::chrono::seconds(5))) << "the hub must close the link";
  return owned;
}

TEST(MultiRackTest, ForgedHubHelloCannotBindKeysOrInjectRackSums) {
  const std::string interhub0 = "127.0.0.1:" + std::to_string(FreePort());
  const std::string racks = "127.0.0.1:0=" + interhub0 + ",127.0.0.1:0=127.0.0.1:" +
                            std::to_string(FreePort());
  const std::string secret(48, 's');
  const std::string secret_file = SecretFile(secret);
  DaemonProcess hub0(
      {"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file", secret_file});
  DaemonProcess hub1(
      {"--lanes", "1", "--racks", racks, "--rack", "1", "--hub-secret-file", secret_file});
  ASSERT_TRUE(hub0.started() && hub1.started());
  const std::string token(40, 'k');
  CreateTenantAndKey(hub0.admin_address(), token, 2048);
  CreateTenantAndKey(hub1.admin_address(), token, 2048);

  data::v1::Welcome welcome;
  {
    RawClient probe(hub0.data_address());
    welcome = probe.Hello("t", token, 0, 0);
    net::FrameHeader bye;
    bye.opcode = net::Opcode::kBye;
    bye.tenant = welcome.tenant_handle();
    probe.Send(bye);  // a clean leave: nothing is recovered
  }
  ASSERT_NE(welcome.tenant_handle(), 0u);
  const uint32_t key_id = welcome.keys(0).id();

  // An old hub's HELLO with the real secret or none; proofs under a wrong
  // secret of the same length, a prefix, the secret plus a byte; no proof.
  std::vector<std::unique_ptr<RawClient>> forgers;
  for (const std::string& forged : {secret, std::string()}) {
    SCOPED_TRACE("version 1 HUB_HELLO with a secret of " + std::to_string(forged.size()) +
                 " bytes");
    forgers.push_back(ForgeRackSum(interhub0, Forgery::kOldHello, forged, key_id));
  }
  for (const std::string& forged : {std::string(48, 'x'), secret.substr(0, 47), secret + "s"}) {
    SCOPED_TRACE("proof under a secret of " + std::to_string(forged.size()) + " bytes");
    forgers.push_back(ForgeRackSum(interhub0, Forgery::kWrongProof, forged, key_id));
  }
  forgers.push_back(ForgeRackSum(interhub0, Forgery::kNoProof, secret, key_id));
  const std::string log = hub0.Log();
  EXPECT_NE(log.find("refused a hub link from 127.0.0.1"), std::string::npos) << log;
  EXPECT_NE(log.find("wrong hub secret"), std::string::npos) << log;
  EXPECT_NE(log.find("hub-link version 1"), std::string::npos) << log;

  // The victim's step with zero gradients on both racks stays exactly 0.
  RawClient w0(hub0.data_address()), w1(hub0.data_address());
  RawClient v0(hub1.data_address()), v1(hub1.data_address());
  ASSERT_NE(w0.Hello("t", token, 0, 0).tenant_handle(), 0u);
  ASSERT_NE(w1.Hello("t", token, 1, 0).tenant_handle(), 0u);
  for (RawClient* v : {&v0, &v1}) {
    const uint32_t rank = v == &v0 ? 0 : 1;
    data::v1::Hello hello;
    hello.set_tenant("t");
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_rack(1);
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    v->Send(h, hello.SerializeAsString());
    const auto f = v->Receive();
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kWelcome) << testing::Describe(f);
  }
  const std::string zeros(1024 * 4, '\0');
  for (uint32_t chunk : {0u, 1u}) {
    for (RawClient* c : {&w0, &w1, &v0, &v1}) {
      net::FrameHeader push;
      push.opcode = net::Opcode::kPush;
      push.tenant = welcome.tenant_handle();  // every hub numbers this first tenant 1
      push.key = key_id;
      push.chunk = chunk;
      push.dtype = net::DType::kFp32;
      push.iteration = 0;
      push.request_id = 10 + chunk;
      c->Send(push, zeros);
    }
  }
  int answered = 0;
  for (RawClient* c : {&w0, &w1, &v0, &v1}) {
    for (int i = 0; i < 2; ++i) {
      const auto f = c->Receive(std::chrono::seconds(15));
      ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << testing::Describe(f);
      EXPECT_EQ(f->h.iteration, 1u);
      float first = 0;
      if (f->payload.size() >= 4) std::memcpy(&first, f->payload.data(), 4);
      EXPECT_TRUE(f->payload == zeros)
          << "chunk " << f->h.chunk << ": a zero-gradient SGD step must leave the parameters at "
          << "exactly 0, got " << first << "...: a forged rack sum got in";
      ++answered;
    }
  }
  EXPECT_EQ(answered, 8);
}


// A loopback TCP listener the test owns (port 0: the kernel picks).
struct Listener {
  int fd = -1;
  uint16_t port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // Inherited by the accepted sockets: a hub binds the port after them.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(listen(fd, 8), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
  }
  ~Listener() { Close(); }
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  // The next connection, within 10 s (-1 if none came).
  int Next() {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return -1;
    return accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
};

// An accepted connection that records every byte it receives.
struct RecordingPeer {
  int fd;
  std::string record;
  bool eof = false;
  explicit RecordingPeer(int fd) : fd(fd) {}
  ~RecordingPeer() { Close(); }
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  // Reads `n` bytes (appended to `record`) within `timeout`; false at EOF
  // or timeout.
  bool Read(size_t n, std::string* out, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out->size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
      char buf[4096];
      const ssize_t r = recv(fd, buf, std::min(sizeof buf, n - out->size()), 0);
      if (r <= 0) {
        eof = true;
        return false;
      }
      out->append(buf, static_cast<size_t>(r));
      record.append(buf, static_cast<size_t>(r));
    }
    return true;
  }
  // The next frame (header + payload), or nothing at EOF / after 10 s.
  std::optional<testing::Frame> Frame() {
    std::string header;
    if (!Read(net::kHeaderBytes, &header, std::chrono::seconds(10))) return std::nullopt;
    testing::Frame f;
    f.h = net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
        reinterpret_cast<const std::byte*>(header.data()), net::kHeaderBytes));
    if (f.h.payload_bytes > (1u << 20) ||
        !Read(f.h.payload_bytes, &f.payload, std::chrono::seconds(10))) {
      return std::nullopt;
    }
    return f;
  }
  // True once the peer closed (recording what came before) within `timeout`.
  bool WaitClosed(std::chrono::milliseconds timeout) {
    std::string rest;
    while (!eof && Read(rest.size() + 1, &rest, timeout)) {
    }
    return eof;
  }
  void Send(const std::string& bytes) {
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
};

std::string Digest(const EVP_MD* md, const std::string& in) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(in.data(), in.size(), out, &len, md, nullptr);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string Hmac(const std::string& key, const std::string& msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// Issue 31, item 4. Rack 1's hub is down; the test listens on its interhub
// address instead. Rack 0's hub dials it: a silent listener is cut when the
// handshake times out; a listener that challenges gets rack 0's HUB_PROOF
// but cannot answer it, and rack 0's hub refuses it by name and sends
// nothing else. Every byte rack 0's hub sent is recorded: neither the secret
// nor any fixed function of it (digests, HMACs without the nonces) is in
// them, and the real rack-1 hub, started on that address afterwards, refuses
// the recorded bytes replayed (its nonce is new). The two real hubs then
// link, each proving the secret to the other.
TEST(MultiRackTest, AProbeOnAnInterhubAddressLearnsNothingReusable) {
  Listener probe;
  const std::string interhub1 = "127.0.0.1:" + std::to_string(probe.port);
  const std::string racks =
      "127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.1:0=" + interhub1;
  const std::string secret = "probe-" + Hex(testing::RandomNonce());
  const std::string secret_file = SecretFile(secret);
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file",
                      secret_file, "--hello-timeout-ms", "1000"});
  ASSERT_TRUE(hub0.started());

  // 1. Silent: rack 0's hub sends its HUB_HELLO, waits, and cuts the link.
  RecordingPeer silent(probe.Next());
  ASSERT_GE(silent.fd, 0) << "rack 0's hub did not dial rack 1";
  const auto hello1 = silent.Frame();
  ASSERT_TRUE(hello1 && hello1->h.opcode == net::Opcode::kHubHello) << testing::Describe(hello1);
  EXPECT_TRUE(silent.WaitClosed(std::chrono::seconds(10)))
      << "a handshake that stalls is cut (data.hello_timeout_ms)";
  EXPECT_TRUE(testing::WaitForLog(
      hub0, "rack 1's hub did not finish the hub-link handshake within data.hello_timeout_ms "
            "(1000 ms)"));

  // 2. Challenging: rack 0's hub proves itself, then finds the answer false.
  RecordingPeer challenger(probe.Next());
  ASSERT_GE(challenger.fd, 0);
  const auto hello2 = challenger.Frame();
  ASSERT_TRUE(hello2 && hello2->h.opcode == net::Opcode::kHubHello) << testing::Describe(hello2);
  data::v1::HubHello h2;
  ASSERT_TRUE(h2.ParseFromString(hello2->payload));
  EXPECT_EQ(h2.link_version(), 2u);
  EXPECT_NE(h2.nonce(), [&] {
    data::v1::HubHello h1;
    h1.ParseFromString(hello1->payload);
    return h1.nonce();
  }()) << "every link draws a new nonce";
  data::v1::HubChallenge challenge;
  const std::string probe_nonce = testing::RandomNonce();
  challenge.set_nonce(probe_nonce);
  challenger.Send(testing::FrameBytes(net::Opcode::kHubChallenge, challenge.SerializeAsString()));
  const auto proof = challenger.Frame();
  ASSERT_TRUE(proof && proof->h.opcode == net::Opcode::kHubProof) << testing::Describe(proof);
  data::v1::HubProof p;
  ASSERT_TRUE(p.ParseFromString(proof->payload));
  EXPECT_EQ(p.proof(), testing::RefHubProof(secret, true, h2.nonce(), probe_nonce, kRack0To1))
      << "the documented HMAC";
  challenger.Send(testing::FrameBytes(net::Opcode::kHubAccept,
                                      testing::ProofPayload(testing::RandomNonce())));
  const auto refusal = challenger.Frame();
  ExpectError(refusal, net::WireError::kUnauthenticated,
              "wrong hub secret: the HUB_ACCEPT of rack 1's hub does not prove this hub's "
              "topology.secret_file");
  EXPECT_TRUE(challenger.WaitClosed(std::chrono::seconds(10)));
  EXPECT_TRUE(testing::WaitForLog(hub0, "wrong hub secret: the HUB_ACCEPT of rack 1's hub"));
  const std::string handshake2 = challenger.record;  // HUB_HELLO, HUB_PROOF, ERROR: nothing else
  EXPECT_EQ(handshake2.size(), 3 * net::kHeaderBytes + hello2->payload.size() +
                                   proof->payload.size() + refusal->payload.size());

  // Nothing fixed about the secret is in what rack 0's hub sent.
  const std::string heard = silent.record + challenger.record;
  const std::vector<std::pair<std::string, std::string>> fixed = {
      {"the secret", secret},
      {"its first 16 characters", secret.substr(0, 16)},
      {"its SHA-256", Digest(EVP_sha256(), secret)},
      {"its SHA-256 in hex", Hex(Digest(EVP_sha256(), secret))},
      {"its SHA-512", Digest(EVP_sha512(), secret)},
      {"HMAC-SHA256(secret, \"\")", Hmac(secret, "")},
      {"HMAC of the opener label alone", Hmac(secret, std::string("rackhub hub link v2: opener proof", 34))},
      {"HMAC of the acceptor label alone", Hmac(secret, std::string("rackhub hub link v2: acceptor proof", 36))},
  };
  for (const auto& [what, bytes] : fixed) {
    EXPECT_EQ(heard.find(bytes), std::string::npos) << what << " went over the wire";
  }

  // 3. The recorded bytes replayed to the real rack-1 hub do not authenticate.
  while (true) {  // drop rack 0's further attempts queued on the probe
    pollfd pf{probe.fd, POLLIN, 0};
    if (poll(&pf, 1, 0) != 1) break;
    close(accept4(probe.fd, nullptr, nullptr, SOCK_CLOEXEC));
  }
  probe.Close();
  silent.Close();
  challenger.Close();
  DaemonProcess hub1({"--lanes", "1", "--racks", racks, "--rack", "1", "--hub-secret-file",
                      secret_file});
  ASSERT_TRUE(hub1.started());
  {
    RawClient replay(interhub1);
    replay.SendRaw(handshake2);
    const auto c = replay.Receive();
    ASSERT_TRUE(c && c->h.opcode == net::Opcode::kHubChallenge) << testing::Describe(c);
    ExpectError(replay.Receive(), net::WireError::kUnauthenticated,
                "hub link: wrong hub secret: the HUB_PROOF of rack 0's hub does not match");
    EXPECT_TRUE(replay.ClosedByPeer(std::chrono::seconds(5)));
  }
  EXPECT_TRUE(testing::WaitForLog(hub1, "refused a hub link from 127.0.0.1"));

  // 4. The real hubs link both ways, each proving the secret.
  EXPECT_TRUE(testing::WaitForLog(hub0, "connected to rack 1's hub at " + interhub1 +
                                            " (tcp), mutually authenticated"));
  EXPECT_TRUE(testing::WaitForLog(hub1, "connected to rack 0's hub at"));
  EXPECT_TRUE(testing::WaitForLog(hub1, "lane 0 accepted rack 0's hub"));
  EXPECT_EQ(hub0.Stop(SIGTERM), 0);
  EXPECT_EQ(hub1.Stop(SIGTERM), 0);
}

// A peer that stops in the middle of the handshake (after HUB_HELLO, or
// after HUB_CHALLENGE came) is cut by the accepting hub after
// data.hello_timeout_ms, with an ERROR saying so.
TEST(MultiRackTest, AStalledHandshakeIsCutByTheAcceptingHub) {
  const std::string interhub0 = "127.0.0.1:" + std::to_string(FreePort());
  const std::string racks = "127.0.0.1:0=" + interhub0 + ",127.0.0.1:0=127.0.0.1:" +
                            std::to_string(FreePort());
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file",
                      SecretFile(), "--hello-timeout-ms", "500"});
  ASSERT_TRUE(hub0.started());
  for (const bool hello : {false, true}) {
    SCOPED_TRACE(hello ? "stalled after HUB_HELLO" : "stalled before HUB_HELLO");
    RawClient peer(interhub0);
    if (hello) {
      peer.SendRaw(testing::FrameBytes(
          net::Opcode::kHubHello, testing::HubHelloPayload(kRack1To0, testing::RandomNonce())));
      const auto c = peer.Receive();
      ASSERT_TRUE(c && c->h.opcode == net::Opcode::kHubChallenge) << testing::Describe(c);
    }
    ExpectError(peer.Receive(), net::WireError::kMalformed,
                "hub link: the handshake did not finish within data.hello_timeout_ms (500 ms)");
    EXPECT_TRUE(peer.ClosedByPeer());
  }
  EXPECT_TRUE(testing::WaitForLog(hub0, "the handshake did not finish within", 2));
}

// Two hubs with different secrets: each refuses the other's link naming the
// wrong secret, each is told so as the opener, neither crashes, and a worker
// waiting on the other rack fails with the reason instead of hanging.
TEST(MultiRackTest, AWrongSecretIsRefusedOnBothSidesByName) {
  const std::string interhub0 = "127.0.0.1:" + std::to_string(FreePort());
  const std::string interhub1 = "127.0.0.1:" + std::to_string(FreePort());
  const std::string racks = "127.0.0.1:0=" + interhub0 + ",127.0.0.1:0=" + interhub1;
  const auto started = std::chrono::steady_clock::now();
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file",
                      SecretFile(std::string(48, 'a'))});
  DaemonProcess hub1({"--lanes", "1", "--racks", racks, "--rack", "1", "--hub-secret-file",
                      SecretFile(std::string(48, 'b'))});
  ASSERT_TRUE(hub0.started() && hub1.started());
  for (int r = 0; r < 2; ++r) {
    const DaemonProcess& me = r == 0 ? hub0 : hub1;
    const std::string peer = std::to_string(1 - r);
    const std::string peer_interhub = r == 0 ? interhub1 : interhub0;
    SCOPED_TRACE("hub " + std::to_string(r));
    // As the acceptor of the peer's link.
    EXPECT_TRUE(testing::WaitForLog(
        me, "rack link: refused a hub link from 127.0.0.1"));
    EXPECT_TRUE(testing::WaitForLog(
        me, "wrong hub secret: the HUB_PROOF of rack " + peer +
                "'s hub does not match this hub's topology.secret_file"));
    // As the opener of its own.
    EXPECT_TRUE(testing::WaitForLog(
        me, "rack " + peer + "'s hub at " + peer_interhub +
                " refused the link: UNAUTHENTICATED: hub link: wrong hub secret"));
  }
  const std::string token(40, 'k');
  CreateTenantAndKey(hub0.admin_address(), token, 2048);
  RawClient w0(hub0.data_address()), w1(hub0.data_address());
  const auto welcome = w0.Hello("t", token, 0, 0);
  ASSERT_NE(welcome.tenant_handle(), 0u);
  ASSERT_NE(w1.Hello("t", token, 1, 0).tenant_handle(), 0u);
  for (RawClient* w : {&w0, &w1}) {
    net::FrameHeader push;
    push.opcode = net::Opcode::kPush;
    push.tenant = welcome.tenant_handle();
    push.key = welcome.keys(0).id();
    push.chunk = 1;  // home: rack 1
    push.dtype = net::DType::kFp32;
    w->Send(push, std::string(1024 * 4, '\0'));
  }
  for (RawClient* w : {&w0, &w1}) {
    ExpectError(w->Receive(std::chrono::seconds(15)), net::WireError::kWorkerLost,
                "is unreachable: rack 1's hub at " + interhub1 +
                    " refused the link: UNAUTHENTICATED: hub link: wrong hub secret",
                false);
  }
  // Rack 0's hub retries every 200 ms but logs its refusals at most 5 times
  // per 10 s (rack 1's hub, which logs up to 20, counts the attempts).
  ASSERT_TRUE(testing::WaitForLog(hub1, "refused a hub link from 127.0.0.1", 8));
  const std::string log0 = hub0.Log();
  size_t logged = 0;
  // The opener's refusal lines end so (not the workers' failures naming them).
  const std::string line_end = "; retrying every 200 ms";
  for (size_t at = log0.find(line_end); at != std::string::npos;
       at = log0.find(line_end, at + 1)) {
    ++logged;
  }
  if (std::chrono::steady_clock::now() - started < std::chrono::seconds(10)) {
    EXPECT_LE(logged, 5u) << log0;
  }
  EXPECT_EQ(hub0.Stop(SIGTERM), 0) << "no crash";
  EXPECT_EQ(hub1.Stop(SIGTERM), 0) << "no crash";
}

}  // namespace
}  // namespace rackhub
