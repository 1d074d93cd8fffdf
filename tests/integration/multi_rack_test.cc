// Hierarchical exchange between hubs (docs/architecture.md, Hierarchical rack
// exchange), with real hubs on loopback: 2 and 3 racks of 2 workers give the
// same bits as one hub serving every rack (flat), the hub links carry exactly
// the analytic bytes, a hub of another rack going away fails the workers
// instead of hanging, a topology without a hub secret does not start, and a
// forged hub link (an old hub's HUB_HELLO carrying the secret, a proof under
// a wrong secret, no proof) on a rack's interhub port is refused before it
// can bind a key or inject a rack sum (issue 12, hole 4). Hub links
// authenticate without sending the secret (issue 31, item 4): a probe that
// listens on a rack's interhub address while that hub is down learns nothing
// it can reuse, the real hub refuses the recorded bytes, a wrong secret is
// refused on both hubs by name, and a stalled handshake is cut.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <thread>
#include <vector>
#include <string>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "hub_link_auth.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "raw_client.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::BinPath;
using testing::DaemonProcess;
using testing::ExpectError;
using testing::MakeTempDir;
using testing::RawClient;
using testing::RunCommand;
using testing::WriteFile;

// rackhub-bench's one-line JSON as string fields.
std::map<std::string, std::string> BenchJson(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BinPath("rackhub-bench"), "--json"};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = RunCommand(argv, "", std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> out;
  const std::regex field("\"([a-z_0-9]+)\":(\"[^\"]*\"|[^,}]+)");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), field);
       it != std::sregex_iterator(); ++it) {
    std::string v = (*it)[2];
    if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
    out[(*it)[1]] = v;
  }
  return out;
}

TEST(MultiRackTest, HierarchicalEqualsFlatBitForBitWithAnalyticLinkBytes) {
  struct Case {
    std::string racks, dtype, optimizer, bytes;
  } cases[] = {
      {"2", "fp32", "momentum", "2MiB"},
      {"3", "bf16", "adam", "1MiB"},
  };
  for (const auto& c : cases) {
    const std::vector<std::string> common = {"--workers", "2",        "--racks",     c.racks,
                                             "--bytes",   c.bytes,    "--keys",      "3",
                                             "--dtype",   c.dtype,    "--optimizer", c.optimizer,
                                             "--iterations", "4",     "--lanes",     "2"};
    auto hier = common;
    hier.insert(hier.end(), {"--topology", "hierarchical"});
    auto flat = common;
    flat.insert(flat.end(), {"--topology", "flat"});
    const auto h = BenchJson(hier);
    const auto f = BenchJson(flat);
    SCOPED_TRACE(c.racks + " racks, " + c.dtype + ", " + c.optimizer);
    // Each run checks every iteration bit for bit against the same reference
    // (rack sums in rank order, then racks in order); the digests compare
    // the final parameters of the two runs directly.
    EXPECT_EQ(h.at("verified"), "true");
    EXPECT_EQ(f.at("verified"), "true");
    ASSERT_FALSE(h.at("digest").empty());
    EXPECT_NE(h.at("digest"), "workers-disagree");
    EXPECT_EQ(h.at("digest"), f.at("digest")) << "hierarchical and flat runs differ";
    // Hub links: exactly (R-1) * sum over chunks of (2 headers + sum + params).
    EXPECT_NE(h.at("interhub_bytes_analytic"), "0");
    EXPECT_EQ(std::stod(h.at("interhub_bytes_per_iteration")),
              std::stod(h.at("interhub_bytes_analytic")));
    EXPECT_EQ(std::stod(f.at("interhub_bytes_per_iteration")), 0.0) << "flat mode has no links";
  }
}

// Hub-link ports the other hub must know beforehand: reserved, outside the
// kernel's ephemeral range (tests/support/etcd_cluster.h).
uint16_t FreePort() { return testing::FreeLoopbackPort(); }

// A fresh hub secret file (what every hub of a topology must share).
std::string SecretFile(const std::string& secret = std::string(48, 's')) {
  const std::string path = MakeTempDir() + "/hub.secret";
  WriteFile(path, secret + "\n");
  return path;
}

// Creates tenant "t" (2 workers per rack, 1024-element chunks, SGD with
// learning rate 1) with `token` and one key of `elements` on the hub at `admin`.
void CreateTenantAndKey(const std::string& admin, const std::string& token, uint64_t elements) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  pb::CreateTenantRequest req;
  req.set_name("t");
  req.set_workers_per_rack(2);
  req.set_chunk_bytes(4096);
  req.set_token(token);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(1.0);
  pb::CreateTenantResponse resp;
  ASSERT_TRUE(pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp).ok());
  grpc::ClientContext kctx;
  pb::CreateKeyRequest key;
  key.set_tenant("t");
  key.set_name("w");
  key.set_elements(elements);
  pb::Key k;
  ASSERT_TRUE(pb::KeyService::NewStub(channel)->CreateKey(&kctx, key, &k).ok());
}

TEST(MultiRackTest, LostHubFailsTheOtherRacksWorkers) {
  const std::string racks = "127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort()) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort());
  const std::string secret = SecretFile();
  DaemonProcess hub0(
      {"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file", secret});
  DaemonProcess hub1(
      {"--lanes", "1", "--racks", racks, "--rack", "1", "--hub-secret-file", secret});
  ASSERT_TRUE(hub0.started() && hub1.started());
  const std::string token(40, 'k');
  // Chunk 0 has its home on rack 0, chunk 1 on rack 1 ((g / lanes) % racks).
  CreateTenantAndKey(hub0.admin_address(), token, 2048);
  CreateTenantAndKey(hub1.admin_address(), token, 2048);

  // A worker of rack 1 must say so; rack 0's hub sends it to its own hub.
  {
    RawClient wrong(hub0.data_address());
    data::v1::Hello hello;
    hello.set_tenant("t");
    hello.set_token(token);
    hello.set_rank(0);
    hello.set_rack(1);
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    wrong.Send(h, hello.SerializeAsString());
    ExpectError(wrong.Receive(), net::WireError::kInvalidArgument,
                "this hub serves rack 0, not rack 1");
  }

  RawClient w0(hub0.data_address()), w1(hub0.data_address());
  const auto welcome = w0.Hello("t", token, 0, 0);
  ASSERT_NE(welcome.tenant_handle(), 0u);
  ASSERT_NE(w1.Hello("t", token, 1, 0).tenant_handle(), 0u);
  net::FrameHeader push;
  push.opcode = net::Opcode::kPush;
  push.tenant = welcome.tenant_handle();
  push.key = welcome.keys(0).id();
  push.chunk = 1;  // home: rack 1
  push.dtype = net::DType::kFp32;
  const std::string grad(1024 * 4, '\0');

  // Rack 1's hub goes away; rack 0's workers push a chunk homed there.
  EXPECT_EQ(hub1.Stop(SIGKILL), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  w0.Send(push, grad);
  w1.Send(push, grad);
  ExpectError(w0.Receive(std::chrono::seconds(15)), net::WireError::kWorkerLost,
              "hub of rack 1", false);
  ExpectError(w1.Receive(std::chrono::seconds(15)), net::WireError::kWorkerLost,
              "hub of rack 1", false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "a lost hub is an error within a bounded time, not a hang";
  EXPECT_NE(hub0.Log().find("rack link"), std::string::npos) << hub0.Log();
}

// A multi-rack topology always needs the shared secret, on loopback too: a
// hub without one refuses to start (exit 78, EX_CONFIG) naming the field,
// also for --check-config; a secret too short to resist guessing as well.
TEST(MultiRackTest, TopologyWithoutASecretIsAConfigError) {
  const std::string racks = "127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort()) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort());
  const std::string dir = MakeTempDir();
  const std::vector<std::string> base = {BinPath("rackhubd"), "--in-memory",  "--lanes", "1",
                                         "--admin-listen",   "127.0.0.1:0", "--data-listen",
                                         "127.0.0.1:0",      "--racks",     racks,     "--rack",
                                         "0",                "--no-metrics"};
  for (const bool check_only : {true, false}) {
    auto argv = base;
    if (check_only) argv.push_back("--check-config");
    const auto r = RunCommand(argv, "", std::chrono::seconds(10));
    SCOPED_TRACE(check_only ? "--check-config" : "start");
    EXPECT_EQ(r.exit_code, 78) << "a secret-less multi-rack hub must not start\n" << r.out << r.err;
    EXPECT_NE(r.err.find("topology.secret_file: required with 2 racks"), std::string::npos)
        << r.err;
  }
  auto argv = base;
  argv.insert(argv.end(), {"--hub-secret-file", SecretFile("short")});
  const auto r = RunCommand(argv, "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 78) << r.out << r.err;
  EXPECT_NE(r.err.find("holds 5 characters; a hub secret needs at least 16"), std::string::npos)
      << r.err;
  // Flat mode opens no hub links: no secret needed.
  argv = base;
  argv.insert(argv.end(), {"--topology-mode", "flat", "--check-config"});
  EXPECT_EQ(RunCommand(argv, "", std::chrono::seconds(10)).exit_code, 0);
}

std::string Frame(net::FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}

// Rack 1's hub (lane 0 of 1, 2 racks) linking to rack 0's, and back.
const testing::HubLinkRef kRack1To0{1, 0, 0, 2, 1};
const testing::HubLinkRef kRack0To1{0, 1, 0, 2, 1};

// A KEY_BIND of tenant "t" (2 workers per rack, chunks of 1024 fp32).
data::v1::KeyBind BindOfT(const std::string& key, uint32_t key_id, uint64_t elements,
                          uint64_t first_chunk, pb::InitMode init) {
  data::v1::KeyBind bind;
  bind.set_tenant("t");
  bind.set_key(key);
  bind.set_key_id(key_id);
  bind.set_elements(elements);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(first_chunk);
  bind.set_chunk_elements(1024);
  bind.set_workers_per_rack(2);
  bind.set_init(init);
  return bind;
}

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

// A hub handles each link's frames in the order they were sent, also when
// the first ones wait for a key it does not have yet. Rack 1's hub (played
// here by the test, with the real secret) sends a KEY_BIND and the INIT of
// from_client key f before rack 0's hub has f: both wait. f is created, and
// at once rack 1's RACK_SUM follows; it must not overtake the parked INIT
// (a sum for a chunk without values would be refused). Then rack 0's two
// workers pull rank 0's values and push zeros: the step is exact. (The old
// order bug showed only when the sum came within the 10 ms between retries
// of the parked INIT: this test caught it in about 1 of 3 runs.)
TEST(MultiRackTest, ALinksFramesKeepTheirOrderWhileTheyWaitForAKey) {
  const std::string interhub0 = "127.0.0.1:" + std::to_string(FreePort());
  const std::string racks = "127.0.0.1:0=" + interhub0 + ",127.0.0.1:0=127.0.0.1:" +
                            std::to_string(FreePort());
  const std::string secret(48, 's');
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file",
                      SecretFile(secret)});
  ASSERT_TRUE(hub0.started());
  const std::string token(40, 'k');
  CreateTenantAndKey(hub0.admin_address(), token, 2048);  // w: chunks 0 and 1
  auto keys = pb::KeyService::NewStub(
      grpc::CreateChannel(hub0.admin_address(), grpc::InsecureChannelCredentials()));
  pb::Key w;
  {
    grpc::ClientContext ctx;
    pb::GetKeyRequest req;
    req.set_tenant("t");
    req.set_name("w");
    ASSERT_TRUE(keys->GetKey(&ctx, req, &w).ok());
  }
  // f will be the next key: id w + 1, chunk 2 of the tenant (home: rack 0).
  const uint32_t f_id = w.id() + 1;
  const auto floats = [](float v) {
    std::string s(1024 * 4, '\0');
    for (size_t i = 0; i < 1024; ++i) std::memcpy(s.data() + i * 4, &v, 4);
    return s;
  };
  RawClient rack1(interhub0);
  const data::v1::KeyBind bind = BindOfT("f", f_id, 1024, 2, pb::FROM_CLIENT);
  net::FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 5;  // rack 1's handle of the tenant
  kb.key = f_id;
  net::FrameHeader init = kb;
  init.opcode = net::Opcode::kInit;
  init.chunk = 0;
  init.dtype = net::DType::kFp32;
  init.iteration = 0;
  const std::string link_frames = Frame(kb, bind.SerializeAsString()) + Frame(init, floats(1.0f));
  ASSERT_TRUE(testing::OpenHubLink(rack1, secret, kRack1To0, link_frames));
  // The hub counts a link frame's bytes as it handles it (the INIT: parks
  // it, to be retried): both are in before f exists.
  ASSERT_TRUE(testing::WaitUntil("rack 0's hub to handle the KEY_BIND and the INIT", [&] {
    const auto stats = testing::HubStats(hub0.admin_address());
    for (const auto& l : stats.daemon().rack_links()) {
      if (l.peer_rack() == 1 && l.bytes_in() >= link_frames.size()) return true;
    }
    return false;
  })) << hub0.Log();
  {
    grpc::ClientContext ctx;
    pb::CreateKeyRequest req;
    req.set_tenant("t");
    req.set_name("f");
    req.set_elements(1024);
    req.set_init(pb::FROM_CLIENT);
    pb::Key f;
    const grpc::Status st = keys->CreateKey(&ctx, req, &f);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(f.id(), f_id);
    ASSERT_EQ(f.first_chunk(), 2u);
  }
  net::FrameHeader sum = init;
  sum.opcode = net::Opcode::kRackSum;
  rack1.SendRaw(Frame(sum, floats(-5.0f)));
  const auto refused = rack1.Receive(std::chrono::milliseconds(500));
  EXPECT_FALSE(refused.has_value()) << "rack 0's hub refused a frame: "
                                    << testing::Describe(refused);

  RawClient w0(hub0.data_address()), w1(hub0.data_address());
  const uint32_t handle = w0.Hello("t", token, 0, 0).tenant_handle();
  ASSERT_NE(handle, 0u);
  ASSERT_NE(w1.Hello("t", token, 1, 0).tenant_handle(), 0u);
  net::FrameHeader pull;
  pull.opcode = net::Opcode::kPull;
  pull.tenant = handle;
  pull.key = f_id;
  pull.dtype = net::DType::kFp32;
  w0.Send(pull);
  const auto values = w0.Receive();
  ASSERT_TRUE(values && values->h.opcode == net::Opcode::kParams) << testing::Describe(values);
  EXPECT_EQ(values->h.iteration, 0u);
  EXPECT_TRUE(values->payload == floats(1.0f)) << "the INIT's values";
  for (RawClient* c : {&w0, &w1}) {
    net::FrameHeader push = pull;
    push.opcode = net::Opcode::kPush;
    push.iteration = 0;
    c->Send(push, floats(0.0f));
  }
  // SGD, lr 1: 1 - (-5 + 0) / (2 racks x 2 workers) = 2.25, exactly.
  for (RawClient* c : {&w0, &w1}) {
    const auto f = c->Receive(std::chrono::seconds(10));
    ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << testing::Describe(f);
    EXPECT_EQ(f->h.iteration, 1u);
    EXPECT_TRUE(f->payload == floats(2.25f)) << "rack 1's sum and rank 0's values";
  }
  // A KEY_BIND that disagrees on how the key starts (w starts at zeros here)
  // is refused by name, like another layout; the link stays up.
  const data::v1::KeyBind wrong = BindOfT("w", w.id(), 2048, 0, pb::FROM_CLIENT);
  net::FrameHeader wb = kb;
  wb.key = w.id();
  rack1.SendRaw(Frame(wb, wrong.SerializeAsString()));
  ExpectError(rack1.Receive(), net::WireError::kInvalidArgument,
              "is laid out or initialized differently on the two racks", false);
}

// Initial values a hub link may have lost are offered again. The test
// listens on rack 1's interhub address itself: rack 0's hub links to it and
// sends the INITs of from_client key f (chunk 0 homed at rack 0, chunk 1 at
// rack 1) after rank 0 initializes; when the test drops the link, rack 0's
// hub reconnects and sends them again; when the test answers with an ERROR
// (as a hub that dropped a parked INIT does), it sends them again.
TEST(MultiRackTest, InitialValuesAreOfferedAgainAfterAReconnectOrAnError) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof sa;
  getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string racks = "127.0.0.1:0=127.0.0.1:" + std::to_string(FreePort()) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  const std::string secret(48, 's');
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0", "--hub-secret-file",
                      SecretFile(secret)});
  ASSERT_TRUE(hub0.started());
  const std::string token(40, 'k');
  CreateTenantAndKey(hub0.admin_address(), token, 2048);  // w: chunks 0 and 1
  auto keys = pb::KeyService::NewStub(
      grpc::CreateChannel(hub0.admin_address(), grpc::InsecureChannelCredentials()));
  pb::Key f;
  {
    grpc::ClientContext ctx;
    pb::CreateKeyRequest req;
    req.set_tenant("t");
    req.set_name("f");
    req.set_elements(2048);  // chunks 2 (home: rack 0) and 3 (home: rack 1)
    req.set_init(pb::FROM_CLIENT);
    ASSERT_TRUE(keys->CreateKey(&ctx, req, &f).ok());
  }
  // Accepts rack 0's hub's next link and authenticates it as rack 1's hub;
  // then collect the INIT frames of f.
  const auto next_link = [&] {
    pollfd p{listener, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 10000), 1) << "rack 0's hub did not link to rack 1";
    auto link = std::make_unique<RawClient>(RawClient::Adopt{accept4(listener, nullptr, nullptr,
                                                                     SOCK_CLOEXEC)});
    EXPECT_TRUE(testing::AcceptHubLink(*link, secret, kRack0To1));
    return link;
  };
  const auto inits = [&](RawClient& link, size_t want) {
    std::map<uint32_t, std::string> got;  // chunk -> values
    while (got.size() < want) {
      const auto frame = link.Receive(std::chrono::seconds(10));
      if (!frame) break;
      if (frame->h.opcode == net::Opcode::kInit && frame->h.key == f.id()) {
        EXPECT_EQ(frame->h.iteration, 0u);
        got[frame->h.chunk] = frame->payload;
      }
    }
    return got;
  };
  auto link = next_link();
  RawClient w0(hub0.data_address());
  const uint32_t handle = w0.Hello("t", token, 0, 0).tenant_handle();
  ASSERT_NE(handle, 0u);
  std::string values(1024 * 4, '\0');
  for (uint32_t chunk : {0u, 1u}) {
    for (size_t i = 0; i < 1024; ++i) {
      const float v = 0.5f * static_cast<float>(chunk + 1) + static_cast<float>(i % 7);
      std::memcpy(values.data() + i * 4, &v, 4);
    }
    net::FrameHeader init;
    init.opcode = net::Opcode::kInit;
    init.tenant = handle;
    init.key = f.id();
    init.chunk = chunk;
    init.dtype = net::DType::kFp32;
    w0.Send(init, values);
    const auto reply = w0.Receive();
    ASSERT_TRUE(reply && reply->h.opcode == net::Opcode::kParams) << testing::Describe(reply);
  }
  const auto first = inits(*link, 2);
  ASSERT_EQ(first.size(), 2u) << "both chunks' values go to rack 1 (home of one, not the other)";
  // The link drops: the values come again on the new one.
  link.reset();
  link = next_link();
  EXPECT_EQ(inits(*link, 2), first);
  // An ERROR about the tenant: again.
  net::ErrorFrame e = net::MakeErrorFrame(net::WireError::kInvalidArgument,
                                          "key: id 9 was never declared on rack 1's hub",
                                          handle, 0, false);
  link->Send(e.header, e.body);
  EXPECT_EQ(inits(*link, 2), first);
  EXPECT_NE(hub0.Log().find("offered rack 1 the initial values of 2 chunk(s)"),
            std::string::npos)
      << hub0.Log();
  close(listener);
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
