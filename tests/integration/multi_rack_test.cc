// Hierarchical exchange between hubs (docs/architecture.md, Hierarchical rack
// exchange), with real hubs on loopback: 2 and 3 racks of 2 workers give the
// same bits as one hub serving every rack (flat), the hub links carry exactly
// the analytic bytes, a hub of another rack going away fails the workers
// instead of hanging, a topology without a hub secret does not start, a
// link's frames keep their order while they wait for a key, and initial
// values are offered again after a reconnect or an error. Hub-link
// authentication: multi_rack_auth_test.cc.
#include <regex>
#include <sstream>

#include "multi_rack_support.h"

namespace rackhub {
namespace {

using namespace multi_rack_testing;


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

// Hub links use TCP keepalive at both ends (net/tcp/keepalive.h): a peer
// host that vanishes without FIN or RST must not leave a link open for ever.
// Read from the kernel (`ss -o`): every established socket of the interhub
// ports, the dialer's and the acceptor's, has its keepalive timer armed, and
// no later than the configured idle time.
TEST(MultiRackTest, HubLinksUseTcpKeepaliveAtBothEnds) {
  const uint16_t port0 = FreePort(), port1 = FreePort();
  const std::string racks = "127.0.0.1:0=127.0.0.1:" + std::to_string(port0) +
                            ",127.0.0.1:0=127.0.0.1:" + std::to_string(port1);
  const std::string secret = SecretFile();
  DaemonProcess hub0(
      {"--lanes", "2", "--racks", racks, "--rack", "0", "--hub-secret-file", secret});
  DaemonProcess hub1(
      {"--lanes", "2", "--racks", racks, "--rack", "1", "--hub-secret-file", secret});
  ASSERT_TRUE(hub0.started() && hub1.started());
  for (DaemonProcess* hub : {&hub0, &hub1}) {
    ASSERT_TRUE(WaitForLog(*hub, "mutually authenticated", 2));  // its two lanes' links out
  }
  // Each hub dials 2 links (one per lane) and accepts 2: 4 sockets per port
  // pair end, 8 in all, each with a timer "keepalive,<=5s" while idle.
  std::string last;
  const auto armed = [&] {
    const testing::CommandResult r = RunCommand(
        {"/usr/bin/ss", "-tnoH", "state", "established", "( sport = :" + std::to_string(port0) +
                                                    " or dport = :" + std::to_string(port0) +
                                                    " or sport = :" + std::to_string(port1) +
                                                    " or dport = :" + std::to_string(port1) + " )"});
    last = r.out + r.err;
    if (r.exit_code != 0) return false;
    const std::regex timer("timer:\\(keepalive,([0-9.]+)(ms|sec|min)");
    size_t sockets = 0, keepalive = 0;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      ++sockets;
      std::smatch m;
      if (std::regex_search(line, m, timer) && m[2] != "min" &&
          (m[2] == "ms" || std::stod(m[1]) <= 5.0)) {
        ++keepalive;
      }
    }
    return sockets == 8 && keepalive == sockets;
  };
  EXPECT_TRUE(testing::WaitUntil("every hub-link socket's keepalive timer armed", armed)) << last;
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

}  // namespace
}  // namespace rackhub
