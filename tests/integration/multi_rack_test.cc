// Hierarchical exchange between hubs (docs/architecture.md, Hierarchical rack
// exchange), with real hubs on loopback: 2 and 3 racks of 2 workers give the
// same bits as one hub serving every rack (flat), the hub links carry exactly
// the analytic bytes, and a hub of another rack going away fails the workers
// instead of hanging.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <regex>
#include <string>

#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "raw_client.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::BinPath;
using testing::DaemonProcess;
using testing::ExpectError;
using testing::RawClient;
using testing::RunCommand;

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

uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Creates tenant "t" (2 workers per rack, 1024-element chunks) with `token`
// and one key of `elements` on the hub at `admin`.
void CreateTenantAndKey(const std::string& admin, const std::string& token, uint64_t elements) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  pb::CreateTenantRequest req;
  req.set_name("t");
  req.set_workers_per_rack(2);
  req.set_chunk_bytes(4096);
  req.set_token(token);
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
  DaemonProcess hub0({"--lanes", "1", "--racks", racks, "--rack", "0"});
  DaemonProcess hub1({"--lanes", "1", "--racks", racks, "--rack", "1"});
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

}  // namespace
}  // namespace rackhub
