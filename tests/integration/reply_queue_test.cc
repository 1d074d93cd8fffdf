// What a worker that does not read its replies can do to a real rackhubd
// over loopback TCP (issue 12; docs/architecture.md, "Reply bytes" and
// "Bounded send queues"):
//  - a reply still queued when an admin deletes its key or tenant carries
//    exactly the parameters it was sent for (every byte checked), never the
//    freed memory of a deleted chunk;
//  - 20,000 PULLs never read do not grow the hub by more than a bounded
//    amount (the hub stops reading the connection), a bystander tenant
//    trains bit for bit as it does alone meanwhile, and the memory comes back
//    once the flooder disconnects;
//  - a worker whose replies pile up past data.max_queued_bytes_per_connection
//    gets a fatal QUOTA_EXCEEDED and is closed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data_link.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;
using testing::DaemonProcess;
using testing::Frame;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A raw-frame TCP worker whose sends never block the test for long (the hub
// may stop reading it) and whose receive buffer can be made small (so the
// hub's replies back up in the hub, not in this process's kernel buffer).
class Worker {
 public:
  Worker(const std::string& address, int rcvbuf = 0) {
    const auto colon = address.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  ~Worker() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // Queues a frame in this process; Flush writes what the socket takes.
  void Queue(FrameHeader h, const std::string& payload = "") {
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    std::array<std::byte, net::kHeaderBytes> buf;
    net::EncodeHeader(h, buf);
    out_.append(reinterpret_cast<const char*>(buf.data()), buf.size());
    out_ += payload;
  }
  // Writes queued bytes until all are out or `timeout` passes; returns
  // whether all went out.
  bool Flush(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (sent_ < out_.size()) {
      const ssize_t n = send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    }
    out_.clear();
    sent_ = 0;
    return true;
  }
  size_t unsent() const { return out_.size() - sent_; }
  void Send(FrameHeader h, const std::string& payload = "") {
    Queue(h, payload);
    ASSERT_TRUE(Flush(10s)) << "the hub took nothing for 10 s";
  }
  std::optional<Frame> Receive(std::chrono::milliseconds timeout = 10s) {
    std::string hdr;
    if (!ReadExact(net::kHeaderBytes, &hdr, timeout)) return std::nullopt;
    Frame f;
    f.h = net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
        reinterpret_cast<const std::byte*>(hdr.data()), net::kHeaderBytes));
    if (!ReadExact(f.h.payload_bytes, &f.payload, timeout)) return std::nullopt;
    return f;
  }
  bool eof() const { return eof_; }

  dpb::Welcome Hello(const std::string& tenant, const std::string& token, uint32_t rank,
                     uint32_t lane) {
    dpb::Hello hello;
    hello.set_tenant(tenant);
    hello.set_token(token);
    hello.set_rank(rank);
    hello.set_lane(lane);
    FrameHeader h;
    h.opcode = Opcode::kHello;
    Send(h, hello.SerializeAsString());
    dpb::Welcome w;
    const auto f = Receive();
    EXPECT_TRUE(f && f->h.opcode == Opcode::kWelcome) << testing::Describe(f);
    if (f && f->h.opcode == Opcode::kWelcome) w.ParseFromString(f->payload);
    handle_ = w.tenant_handle();
    return w;
  }
  uint32_t handle() const { return handle_; }

 private:
  bool ReadExact(size_t n, std::string* out, std::chrono::milliseconds timeout) {
    out->assign(n, '\0');
    size_t got = 0;
    const auto deadline = Clock::now() + timeout;
    while (got < n) {
      const ssize_t r = recv(fd_, out->data() + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        eof_ = true;
        return false;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      pollfd p{fd_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(left.count()));
    }
    return true;
  }

  int fd_ = -1;
  bool eof_ = false;
  std::string out_;
  size_t sent_ = 0;
  uint32_t handle_ = 0;
};

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// The daemon's resident memory (VmRSS), bytes.
uint64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}
constexpr uint64_t kMiB = 1 << 20;

class ReplyQueueTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> args) {
    args.push_back("--in-memory");
    hub_ = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(hub_->started());
    auto channel = grpc::CreateChannel(hub_->admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel);
    keys_ = pb::KeyService::NewStub(channel);
    stats_ = pb::StatsService::NewStub(channel);
  }

  // SGD lr 1, sum: after one push of g the parameters are exactly -g.
  std::string CreateTenant(const std::string& name, uint32_t workers, uint32_t chunk_bytes) {
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(chunk_bytes);
    req.mutable_default_optimizer()->set_type(pb::SGD);
    req.mutable_default_optimizer()->set_learning_rate(1.0);
    req.mutable_default_optimizer()->set_reduction(pb::SUM);
    pb::CreateTenantResponse resp;
    const grpc::Status s = tenants_->CreateTenant(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.token();
  }
  pb::Key CreateKey(const std::string& tenant, const std::string& name, uint64_t elements) {
    grpc::ClientContext ctx;
    pb::CreateKeyRequest req;
    req.set_tenant(tenant);
    req.set_name(name);
    req.set_elements(elements);
    req.set_dtype(pb::FP32);
    pb::Key k;
    const grpc::Status s = keys_->CreateKey(&ctx, req, &k);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return k;
  }
  void DeleteKey(const std::string& tenant, const std::string& name) {
    grpc::ClientContext ctx;
    pb::DeleteKeyRequest req;
    req.set_tenant(tenant);
    req.set_name(name);
    pb::DeleteKeyResponse resp;
    const grpc::Status s = keys_->DeleteKey(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  void DeleteTenant(const std::string& name) {
    grpc::ClientContext ctx;
    pb::DeleteTenantRequest req;
    req.set_name(name);
    pb::DeleteTenantResponse resp;
    const grpc::Status s = tenants_->DeleteTenant(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  pb::TenantStats Stats(const std::string& tenant) {
    grpc::ClientContext ctx;
    pb::GetStatsRequest req;
    req.set_tenant(tenant);
    pb::GetStatsResponse resp;
    EXPECT_TRUE(stats_->GetStats(&ctx, req, &resp).ok());
    return resp.tenants_size() > 0 ? resp.tenants(0) : pb::TenantStats();
  }

  // A tenant of two workers over two lanes trains `iterations` steps on a
  // key of 4 chunks of 1024 floats: returns the parameters after each step.
  std::vector<std::string> Train(const std::string& name, int iterations) {
    const std::string token = CreateTenant(name, 2, 4096);
    const pb::Key key = CreateKey(name, "w", 4096);
    std::vector<std::unique_ptr<Worker>> conns;  // rank r lane l at 2r + l
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint32_t l = 0; l < 2; ++l) {
        conns.push_back(std::make_unique<Worker>(hub_->data_address()));
        conns.back()->Hello(name, token, r, l);
      }
    }
    std::vector<std::string> out;
    for (int it = 0; it < iterations; ++it) {
      for (uint32_t r = 0; r < 2; ++r) {
        for (uint32_t c = 0; c < 4; ++c) {
          std::vector<float> g(1024);
          for (uint32_t i = 0; i < 1024; ++i) {
            g[i] = static_cast<float>((c * 1024 + i) % 97) * 0.01f + 0.1f * static_cast<float>(r) -
                   0.003f * static_cast<float>(it);
          }
          FrameHeader h;
          h.opcode = Opcode::kPush;
          h.tenant = conns[2 * r]->handle();
          h.key = key.id();
          h.chunk = c;
          h.dtype = net::DType::kFp32;
          h.iteration = static_cast<uint64_t>(it);
          h.request_id = c + 1;
          conns[2 * r + c % 2]->Send(h, Floats(g));
        }
      }
      std::string params(4096 * sizeof(float), '\0');
      for (uint32_t r = 0; r < 2; ++r) {
        for (uint32_t got = 0; got < 4; ++got) {
          const auto f = conns[2 * r + got / 2]->Receive();
          if (!f || f->h.opcode != Opcode::kParams) {
            ADD_FAILURE() << name << " iteration " << it << ": " << testing::Describe(f);
            return out;
          }
          EXPECT_EQ(f->h.iteration, static_cast<uint64_t>(it + 1));
          if (r == 0) std::memcpy(params.data() + f->h.chunk * 4096, f->payload.data(), 4096);
        }
      }
      out.push_back(params);
    }
    for (auto& c : conns) {
      FrameHeader bye;
      bye.opcode = Opcode::kBye;
      bye.tenant = c->handle();
      c->Send(bye);
    }
    return out;
  }

  // A worker fills its connection with PULLs it does not read, pushes once
  // (the reply queues behind the PULLs' replies), `remove` deletes its key
  // or tenant, then it reads: every byte must be what the hub sent it for.
  void QueuedReplySurvives(const std::function<void()>& remove, bool tenant_deleted) {
    Start({"--lanes", "1"});
    constexpr uint32_t kElements = 8192;  // one 32 KiB chunk
    constexpr int kPulls = 400;           // ~13 MB of replies: far more than the sockets hold
    const std::string token = CreateTenant("victim", 1, 32768);
    const pb::Key key = CreateKey("victim", "w", kElements);
    Worker w(hub_->data_address(), 64 * 1024);
    w.Hello("victim", token, 0, 0);
    ASSERT_NE(w.handle(), 0u);
    FrameHeader pull;
    pull.opcode = Opcode::kPull;
    pull.tenant = w.handle();
    pull.key = key.id();
    for (int i = 0; i < kPulls; ++i) {
      pull.request_id = 1000 + static_cast<uint64_t>(i);
      w.Queue(pull);
    }
    std::vector<float> g(kElements);
    for (uint32_t i = 0; i < kElements; ++i) g[i] = 1.0f + static_cast<float>(i) * 0.25f;
    FrameHeader push;
    push.opcode = Opcode::kPush;
    push.tenant = w.handle();
    push.key = key.id();
    push.dtype = net::DType::kFp32;
    push.iteration = 0;
    push.request_id = 7;
    w.Queue(push, Floats(g));
    ASSERT_TRUE(w.Flush(10s));
    // The hub has the push (and queued its reply) once the update is done.
    const auto deadline = Clock::now() + 10s;
    while (Stats("victim").iterations_completed() < 1 && Clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(Stats("victim").iterations_completed(), 1u) << "the hub never took the push";
    remove();
    // Another tenant's parameters are allocated meanwhile (where the freed
    // ones were, if they were freed under the queued reply).
    const std::string other_token = CreateTenant("other", 1, 32768);
    const pb::Key other = CreateKey("other", "o", 4 * kElements);
    Worker o(hub_->data_address());
    o.Hello("other", other_token, 0, 0);
    for (uint32_t c = 0; c < 4; ++c) {
      FrameHeader h = push;
      h.tenant = o.handle();
      h.key = other.id();
      h.chunk = c;
      o.Send(h, Floats(std::vector<float>(kElements, -12345.0f)));
      ASSERT_TRUE(o.Receive().has_value());
    }
    std::this_thread::sleep_for(100ms);

    // Now read everything: the PULLs' replies (version 0: zeros), then the
    // push's (version 1: exactly -g).
    std::string want_pull(kElements * sizeof(float), '\0');
    std::vector<float> minus_g(kElements);
    for (uint32_t i = 0; i < kElements; ++i) minus_g[i] = -g[i];
    const std::string want_push = Floats(minus_g);
    int pulls = 0;
    bool pushed = false;
    for (;;) {
      const auto f = w.Receive(2s);
      if (!f) break;
      if (f->h.opcode == Opcode::kError) {
        WireError code{};
        std::string text;
        net::DecodeErrorBody(std::as_bytes(std::span(f->payload.data(), f->payload.size())),
                             &code, &text);
        EXPECT_EQ(code, tenant_deleted ? WireError::kTenantGone : WireError::kUnknownKey) << text;
        continue;
      }
      ASSERT_EQ(f->h.opcode, Opcode::kParams) << testing::Describe(f);
      ASSERT_EQ(f->payload.size(), want_pull.size());
      const std::string& want = f->h.request_id == 7 ? want_push : want_pull;
      if (f->h.request_id == 7) {
        EXPECT_EQ(f->h.iteration, 1u);
        pushed = true;
      } else {
        EXPECT_EQ(f->h.iteration, 0u);
        ++pulls;
      }
      size_t bad = 0, first_bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (f->payload[i] != want[i] && bad++ == 0) first_bad = i;
      }
      ASSERT_EQ(bad, 0u) << "request " << f->h.request_id << ": " << bad
                         << " bytes are not the parameters sent, from byte " << first_bad
                         << " (freed memory sent?)";
    }
    EXPECT_TRUE(pushed) << "the push's reply never came";
    EXPECT_EQ(pulls, kPulls);
  }

  std::unique_ptr<DaemonProcess> hub_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
  std::unique_ptr<pb::StatsService::Stub> stats_;
};

TEST_F(ReplyQueueTest, QueuedReplyOutlivesKeyDelete) {
  QueuedReplySurvives([this] { DeleteKey("victim", "w"); }, false);
}

TEST_F(ReplyQueueTest, QueuedReplyOutlivesTenantDelete) {
  QueuedReplySurvives([this] { DeleteTenant("victim"); }, true);
}

// 20,000 PULLs of a 32 KiB chunk (820 MB of replies) sent and never read.
TEST_F(ReplyQueueTest, UnreadPullFloodIsBoundedAndHarmless) {
  Start({"--lanes", "2"});
  const auto reference = Train("reference", 6);
  ASSERT_EQ(reference.size(), 6u);
  const uint64_t baseline = RssBytes(hub_->pid());
  ASSERT_GT(baseline, 0u);

  const std::string token = CreateTenant("flood", 1, 32768);
  const pb::Key key = CreateKey("flood", "w", 8192);
  auto w = std::make_unique<Worker>(hub_->data_address(), 64 * 1024);
  w->Hello("flood", token, 0, 0);
  ASSERT_NE(w->handle(), 0u);
  FrameHeader pull;
  pull.opcode = Opcode::kPull;
  pull.tenant = w->handle();
  pull.key = key.id();
  for (int i = 0; i < 20000; ++i) {
    pull.request_id = static_cast<uint64_t>(i) + 1;
    w->Queue(pull);
  }
  // Whatever the hub takes within 5 s (all of it, if it reads on).
  w->Flush(5s);
  std::this_thread::sleep_for(1s);
  uint64_t peak = RssBytes(hub_->pid());

  // A bystander trains meanwhile, bit for bit as alone.
  const auto during = Train("bystander", 6);
  EXPECT_EQ(during, reference) << "the bystander's training changed under the flood";
  w->Flush(1s);
  peak = std::max(peak, RssBytes(hub_->pid()));
  std::printf("hub RSS: %.1f MiB before the flood, %.1f MiB during it; %zu bytes of PULLs unsent\n",
              static_cast<double>(baseline) / kMiB, static_cast<double>(peak) / kMiB,
              w->unsent());
  EXPECT_LT(peak, baseline + 100 * kMiB) << "20,000 unread PULLs grew the hub by "
                                         << (peak - baseline) / kMiB << " MiB";

  // The flooder leaves: its queue goes, with the memory.
  w.reset();
  uint64_t after = RssBytes(hub_->pid());
  for (auto deadline = Clock::now() + 10s; after > baseline + 20 * kMiB && Clock::now() < deadline;) {
    std::this_thread::sleep_for(100ms);
    after = RssBytes(hub_->pid());
  }
  std::printf("hub RSS: %.1f MiB after the flooder left\n", static_cast<double>(after) / kMiB);
  EXPECT_LT(after, baseline + 20 * kMiB) << "the flooder's memory stayed after it left";
  // And the hub serves on.
  EXPECT_EQ(Train("after", 6), reference);
}

// Replies a worker asked for (its pushes of a large key) pile up unread past
// the limit: the connection gets a fatal QUOTA_EXCEEDED and closes; the
// tenant's other worker sees WORKER_LOST, other tenants nothing.
TEST_F(ReplyQueueTest, RepliesPastTheLimitCloseTheConnection) {
  Start({"--lanes", "2", "--max-queued-bytes-per-connection", "2MiB"});
  const auto reference = Train("reference", 3);
  // Lane 0 holds the even chunks: 256 of them, 8 MiB of replies per worker.
  constexpr uint32_t kChunks = 256;
  const std::string token = CreateTenant("big", 2, 32768);
  const pb::Key key = CreateKey("big", "w", 2 * kChunks * 8192);
  Worker hoarder(hub_->data_address(), 64 * 1024);
  Worker reader(hub_->data_address());
  hoarder.Hello("big", token, 0, 0);
  reader.Hello("big", token, 1, 0);
  const std::string g = Floats(std::vector<float>(8192, 0.5f));
  for (uint32_t c = 0; c < kChunks; ++c) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = hoarder.handle();
    h.key = key.id();
    h.chunk = 2 * c;
    h.dtype = net::DType::kFp32;
    h.request_id = c + 1;
    hoarder.Queue(h, g);
  }
  ASSERT_TRUE(hoarder.Flush(10s));
  // The reader completes every update and reads its own replies (until the
  // hoarder is lost, which fails the update in progress with WORKER_LOST).
  for (uint32_t c = 0; c < kChunks; ++c) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = reader.handle();
    h.key = key.id();
    h.chunk = 2 * c;
    h.dtype = net::DType::kFp32;
    h.request_id = c + 1;
    reader.Send(h, g);
    const auto f = reader.Receive(5s);
    if (!f || f->h.opcode != Opcode::kParams) break;
  }
  // The hoarder's queue passed 2 MiB: what was not being written is dropped,
  // a fatal QUOTA_EXCEEDED follows, and the connection closes once that is
  // out (or 2 s later if the hoarder still does not read).
  bool quota = false;
  for (;;) {
    const auto f = hoarder.Receive(5s);
    if (!f) break;
    if (f->h.opcode == Opcode::kError) {
      WireError code{};
      std::string text;
      net::DecodeErrorBody(std::as_bytes(std::span(f->payload.data(), f->payload.size())), &code,
                           &text);
      EXPECT_EQ(code, WireError::kQuotaExceeded) << text;
      EXPECT_NE(text.find("data.max_queued_bytes_per_connection"), std::string::npos) << text;
      EXPECT_TRUE(f->h.flags & net::kFlagFatal);
      quota = true;
    }
  }
  EXPECT_TRUE(hoarder.eof()) << "the hoarder's connection stayed open";
  if (!quota) std::printf("the hoarder was closed before it read its QUOTA_EXCEEDED\n");
  const std::string log = hub_->Log();
  EXPECT_NE(log.find("QUOTA_EXCEEDED: connection: "), std::string::npos) << log;
  EXPECT_NE(log.find("more than data.max_queued_bytes_per_connection (2097152 bytes)"),
            std::string::npos)
      << log;
  EXPECT_EQ(Train("bystander", 3), reference);
}

}  // namespace
}  // namespace rackhub
