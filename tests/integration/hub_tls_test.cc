// Mutual TLS on hub links (docs/cluster.md, TLS for hub links; issue 31,
// item 4), with real hubs on loopback and a throwaway PKI made by openssl at
// run time (tests/support/test_pki.h):
//   - two racks whose hubs link over TLS give bit for bit the parameters a
//     single-process reference computes (rack sums in rank order, then racks
//     in order), and so do the same hubs without TLS;
//   - a relay between the hubs records the link: TLS records (0x16 0x03 ...)
//     both ways, and neither the hub secret nor a rack sum's bytes in it;
//   - a plaintext hub and a TLS hub refuse each other by name, both ways;
//   - a hub whose certificate another CA signed is refused;
//   - neither hub crashes; the links retry.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "raw_client.h"
#include "test_pki.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::RawClient;
using testing::WriteFile;

constexpr size_t kChunkElements = 1024;  // chunk_bytes 4096, fp32
constexpr uint32_t kChunks = 2;          // chunk 0: home rack 0, chunk 1: home rack 1
constexpr uint32_t kIterations = 2;
const std::string kToken(40, 'k');

std::string Port() { return std::to_string(testing::FreeLoopbackPort()); }

// A throwaway PKI: ca.pem signs hub0 and hub1; rogue/ca.pem signs rogue.
struct Pki {
  std::string dir = MakeTempDir();
  std::string rogue_dir = dir + "/rogue";
  std::string error;
  Pki() {
    error = testing::MakeTestPki(dir, {"hub0", "hub1"});
    if (error.empty()) {
      testing::RunCommand({"/bin/mkdir", "-p", rogue_dir});
      error = testing::MakeTestPki(rogue_dir, {"rogue"});
    }
  }
  // --hub-tls-* for a hub presenting `leaf` of `leaf_dir`, trusting ca.pem.
  std::vector<std::string> Flags(const std::string& leaf_dir, const std::string& leaf) const {
    return {"--hub-tls-cert", leaf_dir + "/" + leaf + ".pem", "--hub-tls-key",
            leaf_dir + "/" + leaf + ".key", "--hub-tls-ca", dir + "/ca.pem"};
  }
};

std::string SecretFile(const std::string& secret) {
  const std::string path = MakeTempDir() + "/hub.secret";
  WriteFile(path, secret + "\n");
  return path;
}

// rackhubd of `rack` in `racks` with `extra` flags (TLS or none).
std::unique_ptr<DaemonProcess> Hub(const std::string& racks, int rack, const std::string& secret,
                                   std::vector<std::string> extra) {
  std::vector<std::string> args = {"--in-memory", "--lanes", "1", "--racks", racks, "--rack",
                                   std::to_string(rack), "--hub-secret-file", secret};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<DaemonProcess>(args);
}

// Tenant "t" (2 workers per rack, SGD lr 1, reduction SUM) and key "w" of
// kChunks chunks (zeros) on the hub at `admin`.
void CreateTenantAndKey(const std::string& admin) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  pb::CreateTenantRequest req;
  req.set_name("t");
  req.set_workers_per_rack(2);
  req.set_chunk_bytes(kChunkElements * 4);
  req.set_token(kToken);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(1.0);
  req.mutable_default_optimizer()->set_reduction(pb::SUM);
  pb::CreateTenantResponse resp;
  ASSERT_TRUE(pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp).ok());
  grpc::ClientContext kctx;
  pb::CreateKeyRequest key;
  key.set_tenant("t");
  key.set_name("w");
  key.set_elements(kChunks * kChunkElements);
  pb::Key k;
  ASSERT_TRUE(pb::KeyService::NewStub(channel)->CreateKey(&kctx, key, &k).ok());
}

// The gradient of (rack, rank) for `chunk` at `iteration`: fixed
// pseudo-random floats whose sums round (so the order of summation shows).
std::vector<float> Gradient(uint32_t rack, uint32_t rank, uint32_t chunk, uint32_t iteration) {
  std::mt19937 gen(1000 * rack + 100 * rank + 10 * chunk + iteration);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> g(kChunkElements);
  for (float& v : g) v = d(gen);
  return g;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Rack `rack`'s sum of `chunk` at `iteration`: its ranks in order.
std::vector<float> RackSum(uint32_t rack, uint32_t chunk, uint32_t iteration) {
  std::vector<float> s = Gradient(rack, 0, chunk, iteration);
  const std::vector<float> g1 = Gradient(rack, 1, chunk, iteration);
  for (size_t i = 0; i < s.size(); ++i) s[i] += g1[i];
  return s;
}

// The single-process reference: parameters of every chunk after each
// iteration (zeros, then p -= 1 * (rack 0's sum + rack 1's sum)).
std::vector<std::vector<std::string>> Reference() {
  std::vector<std::vector<float>> p(kChunks, std::vector<float>(kChunkElements, 0.0f));
  std::vector<std::vector<std::string>> out(kIterations);
  for (uint32_t it = 0; it < kIterations; ++it) {
    for (uint32_t c = 0; c < kChunks; ++c) {
      const std::vector<float> r0 = RackSum(0, c, it), r1 = RackSum(1, c, it);
      for (size_t i = 0; i < kChunkElements; ++i) p[c][i] -= 1.0f * (r0[i] + r1[i]);
      out[it].push_back(Bytes(p[c]));
    }
  }
  return out;
}

// Two workers per rack push every chunk for kIterations; returns what each
// worker got back (PARAMS payloads, [iteration][chunk]), asserting all four
// agree. `hubs` are the data addresses of rack 0's and rack 1's hubs.
std::vector<std::vector<std::string>> Train(const std::string& hub0, const std::string& hub1) {
  std::vector<std::unique_ptr<RawClient>> workers;
  std::vector<std::pair<uint32_t, uint32_t>> who;  // (rack, rank)
  std::vector<std::pair<uint32_t, uint32_t>> ids;  // (tenant handle, key id) on its hub
  for (uint32_t rack = 0; rack < 2; ++rack) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      workers.push_back(std::make_unique<RawClient>(rack == 0 ? hub0 : hub1));
      data::v1::Hello hello;
      hello.set_tenant("t");
      hello.set_token(kToken);
      hello.set_rank(rank);
      hello.set_rack(rack);
      net::FrameHeader h;
      h.opcode = net::Opcode::kHello;
      workers.back()->Send(h, hello.SerializeAsString());
      const auto reply = workers.back()->Receive();
      data::v1::Welcome welcome;
      if (reply && reply->h.opcode == net::Opcode::kWelcome) welcome.ParseFromString(reply->payload);
      EXPECT_NE(welcome.tenant_handle(), 0u) << testing::Describe(reply);
      if (welcome.keys_size() == 0) return {};
      ids.emplace_back(welcome.tenant_handle(), welcome.keys(0).id());
      who.emplace_back(rack, rank);
    }
  }
  std::vector<std::vector<std::string>> got(kIterations, std::vector<std::string>(kChunks));
  for (uint32_t it = 0; it < kIterations; ++it) {
    for (uint32_t c = 0; c < kChunks; ++c) {
      for (size_t w = 0; w < workers.size(); ++w) {
        net::FrameHeader push;
        push.opcode = net::Opcode::kPush;
        push.tenant = ids[w].first;
        push.key = ids[w].second;
        push.chunk = c;
        push.iteration = it;
        push.dtype = net::DType::kFp32;
        workers[w]->Send(push, Bytes(Gradient(who[w].first, who[w].second, c, it)));
      }
      for (size_t w = 0; w < workers.size(); ++w) {
        const auto params = workers[w]->Receive(std::chrono::seconds(20));
        EXPECT_TRUE(params && params->h.opcode == net::Opcode::kParams &&
                    params->h.chunk == c && params->h.iteration == it + 1)
            << "worker " << w << ": " << testing::Describe(params);
        if (!params) return {};
        if (w == 0) got[it][c] = params->payload;
        EXPECT_EQ(params->payload, got[it][c]) << "workers disagree";
      }
    }
  }
  return got;
}

// A TCP relay on loopback that records both directions of every
// connection it forwards to `upstream_port`.
class Relay {
 public:
  explicit Relay(uint16_t upstream_port) : upstream_(upstream_port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof sa;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  uint16_t port() const { return port_; }
  // Bytes the dialing hub sent / received, over every connection so far.
  std::string sent() {
    std::lock_guard<std::mutex> l(mu_);
    return sent_;
  }
  std::string received() {
    std::lock_guard<std::mutex> l(mu_);
    return received_;
  }
  // The first bytes of the first connection, each way.
  std::string first_sent() {
    std::lock_guard<std::mutex> l(mu_);
    return first_sent_;
  }
  std::string first_received() {
    std::lock_guard<std::mutex> l(mu_);
    return first_received_;
  }

 private:
  void Run() {
    struct Pair {
      int down, up;
      bool first;
    };
    std::vector<Pair> pairs;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (const Pair& p : pairs) {
        fds.push_back({p.down, POLLIN, 0});
        fds.push_back({p.up, POLLIN, 0});
      }
      // A bounded wait only so that the destructor's stop is seen.
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int down = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        const int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(upstream_);
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        if (down >= 0 && connect(up, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
          pairs.push_back({down, up, pairs_seen_++ == 0});
        } else {
          if (down >= 0) close(down);
          close(up);
        }
      }
      for (size_t i = 0; i < pairs.size();) {
        bool closed = false;
        for (int dir = 0; dir < 2 && !closed; ++dir) {
          const pollfd& pf = fds[1 + 2 * i + dir];
          if (!(pf.revents & (POLLIN | POLLHUP | POLLERR))) continue;
          char buf[65536];
          const ssize_t n = read(pf.fd, buf, sizeof buf);
          if (n <= 0) {
            closed = true;
            break;
          }
          const int to = dir == 0 ? pairs[i].up : pairs[i].down;
          if (send(to, buf, n, MSG_NOSIGNAL) != n) closed = true;
          std::lock_guard<std::mutex> l(mu_);
          (dir == 0 ? sent_ : received_).append(buf, n);
          if (pairs[i].first) (dir == 0 ? first_sent_ : first_received_).append(buf, n);
        }
        if (closed) {
          close(pairs[i].down);
          close(pairs[i].up);
          pairs.erase(pairs.begin() + i);
          fds.erase(fds.begin() + 1 + 2 * i, fds.begin() + 3 + 2 * i);
        } else {
          ++i;
        }
      }
    }
    for (const Pair& p : pairs) {
      close(p.down);
      close(p.up);
    }
  }

  const uint16_t upstream_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int pairs_seen_ = 0;
  std::mutex mu_;
  std::string sent_, received_, first_sent_, first_received_;
};

// Both hubs with TLS; rack 0's hub reaches rack 1's through a recording
// relay. The parameters equal the reference's bit for bit; the relay saw TLS
// records only (no secret, no rack sum, no gradient). Then the same without
// TLS: the same bits.
TEST(HubTlsTest, TlsHubLinksGiveTheReferenceBitForBitAndCarryNoPlaintext) {
  const Pki pki;
  ASSERT_EQ(pki.error, "");
  const auto reference = Reference();
  const std::string secret = "hub-link-secret-for-the-tls-test-0123456789";
  const std::string secret_file = SecretFile(secret);
  {
    const std::string i0 = Port();
    const uint16_t i1 = testing::FreeLoopbackPort();
    Relay relay(i1);
    const std::string relayed = "127.0.0.1:" + std::to_string(relay.port());
    auto hub0 = Hub("127.0.0.1:0=127.0.0.1:" + i0 + ",127.0.0.1:0=" + relayed, 0, secret_file,
                    pki.Flags(pki.dir, "hub0"));
    auto hub1 = Hub("127.0.0.1:0=127.0.0.1:" + i0 + ",127.0.0.1:0=127.0.0.1:" + std::to_string(i1),
                    1, secret_file, pki.Flags(pki.dir, "hub1"));
    ASSERT_TRUE(hub0->started() && hub1->started());
    EXPECT_TRUE(testing::WaitForLog(*hub0, "connected to rack 1's hub at " + relayed +
                                               " (tcp+tls), mutually authenticated"));
    EXPECT_TRUE(testing::WaitForLog(*hub1, "(tcp+tls), mutually authenticated"));
    EXPECT_NE(hub0->Log().find("hub links on 127.0.0.1:" + i0 + " (TLS"), std::string::npos)
        << hub0->Log();
    CreateTenantAndKey(hub0->admin_address());
    CreateTenantAndKey(hub1->admin_address());
    const auto got = Train(hub0->data_address(), hub1->data_address());
    EXPECT_TRUE(got == reference) << "TLS hub links changed the parameters";

    // What a probe on the link sees: TLS handshake records first, each way.
    const std::string sent = relay.sent(), received = relay.received();
    ASSERT_GE(relay.first_sent().size(), 2u);
    ASSERT_GE(relay.first_received().size(), 2u);
    EXPECT_EQ(relay.first_sent().substr(0, 2), std::string("\x16\x03", 2)) << "a ClientHello";
    EXPECT_EQ(relay.first_received().substr(0, 2), std::string("\x16\x03", 2)) << "a ServerHello";
    // Rack 0's sums of chunk 1 (home: rack 1) crossed the link.
    EXPECT_GT(sent.size(), kIterations * kChunkElements * 4);
    for (const std::string* heard : {&sent, &received}) {
      EXPECT_EQ(heard->find(secret), std::string::npos) << "the secret went over the link";
      EXPECT_EQ(heard->find(secret.substr(0, 16)), std::string::npos);
      for (uint32_t it = 0; it < kIterations; ++it) {
        EXPECT_EQ(heard->find(Bytes(RackSum(0, 1, it)).substr(0, 64)), std::string::npos)
            << "a rack sum in clear";
        EXPECT_EQ(heard->find(Bytes(Gradient(0, 0, 1, it)).substr(0, 64)), std::string::npos)
            << "a gradient in clear";
        EXPECT_EQ(heard->find(reference[it][1].substr(0, 64)), std::string::npos)
            << "parameters in clear";
      }
    }
    EXPECT_EQ(hub0->Stop(SIGTERM), 0);
    EXPECT_EQ(hub1->Stop(SIGTERM), 0);
  }
  {
    const std::string racks = "127.0.0.1:0=127.0.0.1:" + Port() + ",127.0.0.1:0=127.0.0.1:" + Port();
    auto hub0 = Hub(racks, 0, secret_file, {});
    auto hub1 = Hub(racks, 1, secret_file, {});
    ASSERT_TRUE(hub0->started() && hub1->started());
    EXPECT_TRUE(testing::WaitForLog(*hub0, "(tcp), mutually authenticated"));
    EXPECT_TRUE(testing::WaitForLog(*hub1, "(tcp), mutually authenticated"));
    CreateTenantAndKey(hub0->admin_address());
    CreateTenantAndKey(hub1->admin_address());
    EXPECT_TRUE(Train(hub0->data_address(), hub1->data_address()) == reference)
        << "plaintext hub links differ from the reference";
    EXPECT_EQ(hub0->Stop(SIGTERM), 0);
    EXPECT_EQ(hub1->Stop(SIGTERM), 0);
  }
}

// A TLS hub and a plaintext hub: each refuses the other's link and says
// why, as acceptor and as opener; a worker waiting on the other rack fails
// with the reason instead of hanging; neither hub crashes.
TEST(HubTlsTest, APlaintextHubAndATlsHubRefuseEachOtherByName) {
  const Pki pki;
  ASSERT_EQ(pki.error, "");
  const std::string i0 = "127.0.0.1:" + Port(), i1 = "127.0.0.1:" + Port();
  const std::string racks = "127.0.0.1:0=" + i0 + ",127.0.0.1:0=" + i1;
  const std::string secret_file = SecretFile(std::string(48, 's'));
  // The plaintext hub first: the TLS hub's first dial then meets it (a
  // hub logs why it cannot reach a rack once, until the link comes up).
  auto plain = Hub(racks, 1, secret_file, {});
  auto tls = Hub(racks, 0, secret_file, pki.Flags(pki.dir, "hub0"));
  ASSERT_TRUE(tls->started() && plain->started());
  // The TLS hub accepting the plaintext hub's link, and that hub told so.
  EXPECT_TRUE(testing::WaitForLog(
      *tls, "refused a hub link from 127.0.0.1:"));
  EXPECT_TRUE(testing::WaitForLog(
      *tls, "this hub requires TLS on hub links (topology.tls_cert_file is set) and the peer "
            "speaks plaintext"));
  EXPECT_TRUE(testing::WaitForLog(
      *plain, "rack 0's hub at " + i0 + " refused the link: INVALID_ARGUMENT: hub link: this hub "
              "requires TLS on hub links"));
  // The plaintext hub accepting the TLS hub's link, and the TLS hub's view.
  EXPECT_TRUE(testing::WaitForLog(
      *plain, "the peer speaks TLS (its topology.tls_* is set) and this hub does not"));
  EXPECT_TRUE(testing::WaitForLog(*tls, "cannot reach rack 1's hub (TLS handshake failed: "));
  EXPECT_EQ(tls->Log().find("mutually authenticated"), std::string::npos) << tls->Log();
  EXPECT_EQ(plain->Log().find("mutually authenticated"), std::string::npos) << plain->Log();

  CreateTenantAndKey(tls->admin_address());
  RawClient w0(tls->data_address()), w1(tls->data_address());
  const auto welcome = w0.Hello("t", kToken, 0, 0);
  ASSERT_NE(welcome.tenant_handle(), 0u);
  ASSERT_NE(w1.Hello("t", kToken, 1, 0).tenant_handle(), 0u);
  for (RawClient* w : {&w0, &w1}) {
    net::FrameHeader push;
    push.opcode = net::Opcode::kPush;
    push.tenant = welcome.tenant_handle();
    push.key = welcome.keys(0).id();
    push.chunk = 1;  // home: rack 1
    push.dtype = net::DType::kFp32;
    w->Send(push, std::string(kChunkElements * 4, '\0'));
  }
  for (RawClient* w : {&w0, &w1}) {
    testing::ExpectError(w->Receive(std::chrono::seconds(20)), net::WireError::kWorkerLost,
                         "hub of rack 1", false);
  }
  EXPECT_EQ(tls->Stop(SIGTERM), 0) << "no crash";
  EXPECT_EQ(plain->Stop(SIGTERM), 0) << "no crash";
}

// Rack 1's hub presents a certificate another CA signed (it trusts the
// right CA): rack 0's hub refuses it both as acceptor and as opener, naming
// the failed verification; no link comes up.
TEST(HubTlsTest, AHubWhoseCertificateAnotherCaSignedIsRefused) {
  const Pki pki;
  ASSERT_EQ(pki.error, "");
  const std::string i0 = "127.0.0.1:" + Port(), i1 = "127.0.0.1:" + Port();
  const std::string racks = "127.0.0.1:0=" + i0 + ",127.0.0.1:0=" + i1;
  const std::string secret_file = SecretFile(std::string(48, 's'));
  // The rogue first: the good hub's first dial meets it (see above).
  auto rogue = Hub(racks, 1, secret_file, pki.Flags(pki.rogue_dir, "rogue"));
  auto good = Hub(racks, 0, secret_file, pki.Flags(pki.dir, "hub0"));
  ASSERT_TRUE(good->started() && rogue->started());
  // As acceptor: the rogue's client certificate does not verify.
  EXPECT_TRUE(testing::WaitForLog(*good, "closed during the handshake: TLS handshake failed: "));
  // As opener: the rogue's server certificate does not verify.
  EXPECT_TRUE(testing::WaitForLog(
      *good, "cannot reach rack 1's hub (TLS handshake failed: certificate verify failed"));
  EXPECT_EQ(good->Log().find("mutually authenticated"), std::string::npos) << good->Log();
  EXPECT_EQ(good->Log().find("accepted rack 1's hub"), std::string::npos) << good->Log();
  EXPECT_EQ(good->Stop(SIGTERM), 0) << "no crash";
  EXPECT_EQ(rogue->Stop(SIGTERM), 0) << "no crash";
}

}  // namespace
}  // namespace rackhub
