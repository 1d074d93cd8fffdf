// Quotas bound what a tenant really holds in the hub (issue 12, hole 3): a
// tenant with Adam and max_parameter_bytes X once grew rackhubd by 6 X. With
// a real rackhubd on loopback: a key of X bytes of parameters is refused
// with a message naming the hub memory it needs and the quota; keys that fit
// the quota, with every chunk touched by both workers (the higher rank first,
// so a contribution is parked), grow the daemon's RSS by no more than the
// quota plus a fixed overhead, and the lanes' allocation matches what the
// registry reserved.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "raw_client.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::DaemonProcess;
using testing::RawClient;

constexpr uint64_t kQuota = 64ull << 20;
constexpr uint32_t kChunkElements = 8192;  // 32 KiB chunks (the default)
constexpr uint32_t kLanes = 2;

// Resident set of `pid` in bytes (VmRSS), 0 if unreadable.
uint64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

class TenantMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.started());
    auto channel = grpc::CreateChannel(daemon_.admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel);
    keys_ = pb::KeyService::NewStub(channel);
    stats_ = pb::StatsService::NewStub(channel);
    pb::CreateTenantRequest req;
    req.set_name("adam");
    req.set_workers_per_rack(2);
    req.mutable_default_optimizer()->set_type(pb::ADAM);
    req.mutable_default_optimizer()->set_learning_rate(0.001);
    req.mutable_quotas()->set_max_parameter_bytes(kQuota);
    pb::CreateTenantResponse resp;
    const grpc::Status s = tenants_->CreateTenant(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    token_ = resp.token();
  }

  grpc::Status CreateKey(const std::string& name, uint64_t elements, pb::Key* out) {
    pb::CreateKeyRequest req;
    req.set_tenant("adam");
    req.set_name(name);
    req.set_elements(elements);
    return keys_->CreateKey(Ctx().get(), req, out);
  }

  pb::TenantStats Stats() {
    pb::GetStatsRequest req;
    req.set_tenant("adam");
    pb::GetStatsResponse resp;
    EXPECT_TRUE(stats_->GetStats(Ctx().get(), req, &resp).ok());
    return resp.tenants_size() == 1 ? resp.tenants(0) : pb::TenantStats{};
  }

  DaemonProcess daemon_{{"--lanes", std::to_string(kLanes), "--no-pin-lanes", "--in-memory"}};
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::KeyService::Stub> keys_;
  std::unique_ptr<pb::StatsService::Stub> stats_;
  std::string token_;
};

// The case: keys of X bytes of parameters under a quota of X.
TEST_F(TenantMemoryTest, KeyOfQuotaSizedParametersIsRefusedNamingTheFootprint) {
  pb::Key key;
  const grpc::Status s = CreateKey("w", kQuota / 4, &key);  // 64 MiB of fp32 parameters
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(s.error_message().rfind("quotas.max_parameter_bytes: key 'w' needs ", 0), 0u)
      << s.error_message();
  // Adam, 2 workers: parameters x2, 2 state slots, accumulator, 1 parked
  // contribution: about 6x the parameters.
  EXPECT_NE(s.error_message().find("of hub memory for 64 MiB of parameters (6.1x"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("left of its 64 MiB quota"), std::string::npos)
      << s.error_message();
  // Half of it, a quarter: still more than the quota holds.
  EXPECT_EQ(CreateKey("w", kQuota / 8, &key).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(CreateKey("w", kQuota / 16, &key).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Stats().memory_bytes(), 0u) << "refused keys reserve nothing";
}

TEST_F(TenantMemoryTest, TouchingEveryChunkStaysWithinTheQuota) {
  // Keys of 1 MiB of parameters (32 chunks) until the quota refuses one.
  constexpr uint64_t kKeyElements = 32 * kChunkElements;
  std::vector<pb::Key> keys;
  for (int i = 0; i < 1000; ++i) {
    pb::Key key;
    const grpc::Status s = CreateKey("k" + std::to_string(i), kKeyElements, &key);
    if (!s.ok()) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      break;
    }
    keys.push_back(key);
  }
  ASSERT_FALSE(keys.empty());
  const pb::TenantStats reserved = Stats();
  EXPECT_LE(reserved.memory_bytes(), kQuota);
  EXPECT_GT(reserved.memory_bytes(), kQuota - keys[0].memory_bytes());
  EXPECT_LE(keys.size() * kKeyElements * 4, kQuota / 6) << "the quota holds ~1/6 in parameters";
  EXPECT_EQ(reserved.memory_bytes_allocated(), 0u);

  // Two workers, one connection per lane each.
  std::vector<std::unique_ptr<RawClient>> conns;  // [rank * kLanes + lane]
  uint32_t handle = 0;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    for (uint32_t lane = 0; lane < kLanes; ++lane) {
      conns.push_back(std::make_unique<RawClient>(daemon_.data_address()));
      const auto welcome = conns.back()->Hello("adam", token_, rank, lane);
      ASSERT_NE(welcome.tenant_handle(), 0u);
      handle = welcome.tenant_handle();
    }
  }
  const uint64_t rss_before = RssBytes(daemon_.pid());
  ASSERT_GT(rss_before, 0u);

  // Every chunk once: rank 1 first (its contribution is parked until rank
  // 0's arrives), then rank 0; both get the parameters of version 1.
  const std::string grad(kChunkElements * 4, '\0');
  uint64_t request = 1;
  for (const pb::Key& key : keys) {
    for (uint32_t chunk = 0; chunk < key.chunk_count(); ++chunk) {
      const uint32_t lane = static_cast<uint32_t>((key.first_chunk() + chunk) % kLanes);
      net::FrameHeader push;
      push.opcode = net::Opcode::kPush;
      push.tenant = handle;
      push.key = key.id();
      push.chunk = chunk;
      push.dtype = net::DType::kFp32;
      push.iteration = 0;
      for (uint32_t rank : {1u, 0u}) {
        push.request_id = request++;
        conns[rank * kLanes + lane]->Send(push, grad);
      }
      for (uint32_t rank : {1u, 0u}) {
        const auto f = conns[rank * kLanes + lane]->Receive(std::chrono::seconds(10));
        ASSERT_TRUE(f && f->h.opcode == net::Opcode::kParams) << testing::Describe(f);
        ASSERT_EQ(f->h.iteration, 1u);
      }
    }
  }
  const uint64_t rss_after = RssBytes(daemon_.pid());
  const pb::TenantStats touched = Stats();
  EXPECT_EQ(touched.memory_bytes_allocated(), touched.memory_bytes())
      << "every chunk exists now: the lanes hold exactly what the registry reserved";
  // RSS grows by what the chunks hold (<= the quota) plus a fixed overhead
  // (allocator arenas, hash tables, reply buffers); before issue 12 the
  // tenant grew the hub by ~6x its quota here.
  constexpr uint64_t kOverhead = 16ull << 20;
  const uint64_t grown = rss_after > rss_before ? rss_after - rss_before : 0;
  RecordProperty("rss_growth_bytes", std::to_string(grown));
  RecordProperty("memory_bytes", std::to_string(touched.memory_bytes()));
  std::printf("rss grew by %.1f MiB for %.1f MiB reserved (quota %.1f MiB, %zu keys)\n",
              grown / 1048576.0, touched.memory_bytes() / 1048576.0, kQuota / 1048576.0,
              keys.size());
  EXPECT_LE(grown, kQuota + kOverhead) << "RSS " << rss_before << " -> " << rss_after;
  EXPECT_GE(grown + kOverhead, touched.memory_bytes()) << "the chunks really were allocated";
}

}  // namespace
}  // namespace rackhub
