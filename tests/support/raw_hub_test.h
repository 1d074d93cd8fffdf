// Test support: a raw-frame TCP worker for hostile-client tests and a
// fixture around one real rackhubd (started with --in-memory) with the admin
// calls those tests use and a reference training run (RawHubTest::Train)
// whose parameters, compared bit for bit, show that a bystander tenant was
// not disturbed. Single-threaded use from a test body.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data_link.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace rackhub::testing {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;

using net::FrameHeader;
using net::Opcode;
using net::WireError;

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
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (sent_ < out_.size()) {
      const ssize_t n = send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    }
    out_.clear();
    sent_ = 0;
    return true;
  }
  size_t unsent() const { return out_.size() - sent_; }
  // Queues bytes as they are (a partial or malformed frame).
  void QueueRaw(const std::string& bytes) { out_ += bytes; }
  void Send(FrameHeader h, const std::string& payload = "") {
    Queue(h, payload);
    errno = 0;
    ASSERT_TRUE(Flush(std::chrono::seconds(10)))
        << (errno != 0 && errno != EAGAIN ? std::string("send failed: ") + strerror(errno)
                                          : std::string("the hub took nothing for 10 s"));
  }
  std::optional<Frame> Receive(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
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
    EXPECT_TRUE(f && f->h.opcode == Opcode::kWelcome) << Describe(f);
    if (f && f->h.opcode == Opcode::kWelcome) w.ParseFromString(f->payload);
    handle_ = w.tenant_handle();
    return w;
  }
  uint32_t handle() const { return handle_; }

 private:
  bool ReadExact(size_t n, std::string* out, std::chrono::milliseconds timeout) {
    out->assign(n, '\0');
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
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
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
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

// The daemon's resident memory (VmRSS), bytes.
inline uint64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}
inline constexpr uint64_t kMiB = 1 << 20;

class RawHubTest : public ::testing::Test {
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
    return TrainExisting(name, CreateTenant(name, 2, 4096), iterations);
  }
  // The same on tenant `name` created already (2 workers, 4096-byte chunks,
  // CreateTenant's optimizer); creates its key "w" unless `key_exists`.
  std::vector<std::string> TrainExisting(const std::string& name, const std::string& token,
                                         int iterations, bool key_exists = false) {
    pb::Key key;
    if (key_exists) {
      grpc::ClientContext ctx;
      pb::GetKeyRequest req;
      req.set_tenant(name);
      req.set_name("w");
      EXPECT_TRUE(keys_->GetKey(&ctx, req, &key).ok());
    } else {
      key = CreateKey(name, "w", 4096);
    }
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
            ADD_FAILURE() << name << " iteration " << it << ": " << Describe(f);
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


  std::unique_ptr<DaemonProcess> hub_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
  std::unique_ptr<pb::StatsService::Stub> stats_;
};

}  // namespace rackhub::testing
