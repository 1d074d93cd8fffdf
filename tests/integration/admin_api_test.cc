// Drives a real rackhubd through the admin gRPC API: every call, every
// validation error with its gRPC code and field name, quotas, admin auth
// (token, read-only token, TLS), health and reflection, that a rejected
// request changes nothing, and that client-supplied names reach neither the
// log nor error messages raw (issue 12, hole 5).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <thread>

#include "process.h"
#include "test_pki.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using testing::DaemonProcess;

class AdminClient {
 public:
  explicit AdminClient(const std::string& address, std::string token = "",
                       std::shared_ptr<grpc::ChannelCredentials> creds = nullptr,
                       const std::string& server_name = "")
      : token_(std::move(token)) {
    grpc::ChannelArguments args;
    if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
    channel_ = grpc::CreateCustomChannel(
        address, creds ? creds : grpc::InsecureChannelCredentials(), args);
    tenants = pb::TenantService::NewStub(channel_);
    keys = pb::KeyService::NewStub(channel_);
    stats = pb::StatsService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Ctx() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
    return ctx;
  }

  grpc::Status CreateTenant(const std::string& name, uint32_t workers,
                            pb::CreateTenantResponse* out = nullptr,
                            const pb::Quotas* quotas = nullptr, uint32_t chunk_bytes = 0) {
    pb::CreateTenantRequest req;
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(chunk_bytes);
    if (quotas) *req.mutable_quotas() = *quotas;
    pb::CreateTenantResponse resp;
    auto s = tenants->CreateTenant(Ctx().get(), req, &resp);
    if (out) *out = resp;
    return s;
  }

  grpc::Status CreateKey(const std::string& tenant, const std::string& name, uint64_t elements,
                         pb::Key* out = nullptr, const pb::Optimizer* opt = nullptr) {
    pb::CreateKeyRequest req;
    req.set_tenant(tenant);
    req.set_name(name);
    req.set_elements(elements);
    if (opt) *req.mutable_optimizer() = *opt;
    pb::Key resp;
    auto s = keys->CreateKey(Ctx().get(), req, &resp);
    if (out) *out = resp;
    return s;
  }

  pb::ListKeysResponse ListKeys(const std::string& tenant) {
    pb::ListKeysRequest req;
    req.set_tenant(tenant);
    pb::ListKeysResponse resp;
    EXPECT_TRUE(keys->ListKeys(Ctx().get(), req, &resp).ok());
    return resp;
  }

  pb::Tenant GetTenant(const std::string& name) {
    pb::GetTenantRequest req;
    req.set_name(name);
    pb::Tenant resp;
    EXPECT_TRUE(tenants->GetTenant(Ctx().get(), req, &resp).ok());
    return resp;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::TenantService::Stub> tenants;
  std::unique_ptr<pb::KeyService::Stub> keys;
  std::unique_ptr<pb::StatsService::Stub> stats;

 private:
  std::string token_;
};

// Expects `s` to fail with `code` and a message starting with `field`.
void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& field) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_EQ(s.error_message().rfind(field, 0), 0u)
      << "message should start with '" << field << "': " << s.error_message();
}

class AdminApiTest : public ::testing::Test {
 protected:
  DaemonProcess daemon_{{"--lanes", "3"}};
  AdminClient client_{daemon_.admin_address()};
};

TEST_F(AdminApiTest, TenantLifecycle) {
  ASSERT_TRUE(daemon_.started());
  pb::CreateTenantResponse created;
  ASSERT_TRUE(client_.CreateTenant("job-a", 4, &created).ok());
  EXPECT_EQ(created.tenant().name(), "job-a");
  EXPECT_EQ(created.tenant().workers_per_rack(), 4u);
  EXPECT_EQ(created.tenant().chunk_bytes(), 32768u);
  EXPECT_NE(created.tenant().handle(), 0u);
  EXPECT_EQ(created.token().rfind("rhk_", 0), 0u);
  EXPECT_EQ(created.tenant().default_optimizer().type(), pb::SGD);

  const pb::Tenant got = client_.GetTenant("job-a");
  EXPECT_EQ(got.handle(), created.tenant().handle());

  ASSERT_TRUE(client_.CreateTenant("job-b", 1).ok());
  pb::ListTenantsResponse list;
  ASSERT_TRUE(client_.tenants->ListTenants(client_.Ctx().get(), {}, &list).ok());
  ASSERT_EQ(list.tenants_size(), 2);
  EXPECT_EQ(list.tenants(0).name(), "job-a");
  EXPECT_EQ(list.tenants(1).name(), "job-b");

  pb::DeleteTenantRequest del;
  del.set_name("job-a");
  pb::DeleteTenantResponse del_resp;
  ASSERT_TRUE(client_.tenants->DeleteTenant(client_.Ctx().get(), del, &del_resp).ok());
  pb::GetTenantRequest get;
  get.set_name("job-a");
  pb::Tenant t;
  ExpectError(client_.tenants->GetTenant(client_.Ctx().get(), get, &t),
              grpc::StatusCode::NOT_FOUND, "tenant");
  ExpectError(client_.tenants->DeleteTenant(client_.Ctx().get(), del, &del_resp),
              grpc::StatusCode::NOT_FOUND, "tenant");
}

TEST_F(AdminApiTest, TenantValidationErrorsChangeNothing) {
  ASSERT_TRUE(daemon_.started());
  ASSERT_TRUE(client_.CreateTenant("ok", 2).ok());
  ExpectError(client_.CreateTenant("", 2), grpc::StatusCode::INVALID_ARGUMENT, "name");
  ExpectError(client_.CreateTenant("Bad Name", 2), grpc::StatusCode::INVALID_ARGUMENT, "name");
  ExpectError(client_.CreateTenant("zero-workers", 0), grpc::StatusCode::INVALID_ARGUMENT,
              "workers_per_rack");
  ExpectError(client_.CreateTenant("odd-chunk", 2, nullptr, nullptr, 1000),
              grpc::StatusCode::INVALID_ARGUMENT, "chunk_bytes");
  ExpectError(client_.CreateTenant("ok", 2), grpc::StatusCode::ALREADY_EXISTS, "name");
  pb::Quotas small;
  small.set_max_workers(2);
  ExpectError(client_.CreateTenant("too-many-workers", 3, nullptr, &small),
              grpc::StatusCode::RESOURCE_EXHAUSTED, "workers_per_rack");

  pb::CreateTenantRequest bad_opt;
  bad_opt.set_name("bad-opt");
  bad_opt.set_workers_per_rack(1);
  bad_opt.mutable_default_optimizer()->set_type(pb::ADAM);
  bad_opt.mutable_default_optimizer()->set_learning_rate(-1);
  pb::CreateTenantResponse resp;
  ExpectError(client_.tenants->CreateTenant(client_.Ctx().get(), bad_opt, &resp),
              grpc::StatusCode::INVALID_ARGUMENT, "default_optimizer.learning_rate");
  bad_opt.mutable_default_optimizer()->set_type(static_cast<pb::OptimizerType>(42));
  ExpectError(client_.tenants->CreateTenant(client_.Ctx().get(), bad_opt, &resp),
              grpc::StatusCode::INVALID_ARGUMENT, "default_optimizer.type");

  pb::CreateTenantRequest chosen;
  chosen.set_name("chosen-token");
  chosen.set_workers_per_rack(1);
  chosen.set_token("short");
  ExpectError(client_.tenants->CreateTenant(client_.Ctx().get(), chosen, &resp),
              grpc::StatusCode::INVALID_ARGUMENT, "token");

  pb::ListTenantsResponse list;
  ASSERT_TRUE(client_.tenants->ListTenants(client_.Ctx().get(), {}, &list).ok());
  ASSERT_EQ(list.tenants_size(), 1) << "rejected creates must not leave tenants behind";
  // A chosen token (multi-rack tenants share one) is accepted and returned.
  chosen.set_token(std::string(48, 'Z'));
  ASSERT_TRUE(client_.tenants->CreateTenant(client_.Ctx().get(), chosen, &resp).ok());
  EXPECT_EQ(resp.token(), std::string(48, 'Z'));
  EXPECT_EQ(list.tenants(0).name(), "ok");
}

// GetKey's reply does not grow with the key: a key of 2^30 elements in
// 1 KiB chunks (4 Mi chunks; the hub allocates chunks lazily) is read as a
// per-lane summary and pages of the chunk list.
TEST_F(AdminApiTest, GetKeyOfMillionsOfChunksIsPaged) {
  ASSERT_TRUE(daemon_.started());
  pb::Quotas q;
  q.set_max_parameter_bytes(uint64_t{64} << 30);
  ASSERT_TRUE(client_.CreateTenant("huge", 1, nullptr, &q, 1024).ok());  // 256 fp32 per chunk
  pb::Key small, k;
  ASSERT_TRUE(client_.CreateKey("huge", "first", 1000, &small).ok());  // chunks 0..3
  constexpr uint64_t kElements = uint64_t{1} << 30;
  pb::Optimizer sum_only;
  sum_only.set_type(pb::SUM_ONLY);
  ASSERT_TRUE(client_.CreateKey("huge", "k", kElements, &k, &sum_only).ok());
  constexpr uint64_t kChunks = kElements / 256;
  ASSERT_EQ(k.chunk_count(), kChunks);
  ASSERT_EQ(k.first_chunk(), 4u);

  pb::GetKeyRequest get;
  get.set_tenant("huge");
  get.set_name("k");
  pb::Key got;
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  EXPECT_LT(got.ByteSizeLong(), 64u * 1024) << "the reply grows with the key";
  ASSERT_EQ(got.chunks_size(), 1000) << "the default page";
  EXPECT_EQ(got.chunk_offset(), 0u);
  for (int i = 0; i < got.chunks_size(); ++i) {
    EXPECT_EQ(got.chunks(i).index(), 4u + i);
    EXPECT_EQ(got.chunks(i).lane(), (4u + i) % 3);
    EXPECT_EQ(got.chunks(i).first_element(), 256u * i);
    EXPECT_EQ(got.chunks(i).elements(), 256u);
  }
  // Per lane, counted chunk by chunk here (chunk g on lane g % 3).
  uint64_t want_chunks[3] = {0, 0, 0};
  for (uint64_t g = 4; g < 4 + kChunks; ++g) ++want_chunks[g % 3];
  ASSERT_EQ(got.lanes_size(), 3);
  for (uint32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(got.lanes(l).lane(), l);
    EXPECT_EQ(got.lanes(l).chunks(), want_chunks[l]) << "lane " << l;
    EXPECT_EQ(got.lanes(l).elements(), want_chunks[l] * 256) << "lane " << l;
  }

  // The last page, short; its last chunk is the key's last.
  get.set_chunk_offset(kChunks - 5);
  get.set_chunk_limit(10);
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  ASSERT_EQ(got.chunks_size(), 5);
  EXPECT_EQ(got.chunk_offset(), kChunks - 5);
  EXPECT_EQ(got.chunks(4).index(), 4 + kChunks - 1);
  EXPECT_EQ(got.chunks(4).first_element(), kElements - 256);
  // Past the end: empty at the end, refused beyond; pages at most 10000.
  get.set_chunk_offset(kChunks);
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  EXPECT_EQ(got.chunks_size(), 0);
  get.set_chunk_offset(kChunks + 1);
  ExpectError(client_.keys->GetKey(client_.Ctx().get(), get, &got),
              grpc::StatusCode::INVALID_ARGUMENT, "chunk_offset: 4194305 is past the 4194304");
  get.set_chunk_offset(0);
  get.set_chunk_limit(10001);
  ExpectError(client_.keys->GetKey(client_.Ctx().get(), get, &got),
              grpc::StatusCode::INVALID_ARGUMENT, "chunk_limit: 10001 is more than 10000");

  // A short last chunk is counted on its lane.
  ASSERT_TRUE(client_.CreateKey("huge", "odd", 1000, &k).ok());  // 256 256 256 232
  get.set_name("odd");
  get.set_chunk_limit(0);
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  uint64_t want_elements[3] = {0, 0, 0};
  for (uint64_t i = 0; i < 4; ++i) want_elements[(k.first_chunk() + i) % 3] += i < 3 ? 256 : 232;
  for (uint32_t l = 0; l < 3; ++l) EXPECT_EQ(got.lanes(l).elements(), want_elements[l]);
}

TEST_F(AdminApiTest, KeyLifecycleAndChunkLayout) {
  ASSERT_TRUE(daemon_.started());
  ASSERT_TRUE(client_.CreateTenant("t", 2, nullptr, nullptr, 4096).ok());  // 1024 fp32 per chunk
  pb::Key k1, k2;
  ASSERT_TRUE(client_.CreateKey("t", "layer1.weight", 2500, &k1).ok());
  ASSERT_TRUE(client_.CreateKey("t", "layer1.bias", 100, &k2).ok());
  EXPECT_EQ(k1.first_chunk(), 0u);
  EXPECT_EQ(k1.chunk_count(), 3u);
  EXPECT_EQ(k2.first_chunk(), 3u);
  EXPECT_EQ(k2.chunk_count(), 1u);
  EXPECT_NE(k1.id(), k2.id());
  EXPECT_TRUE(k1.ready());
  EXPECT_EQ(k1.dtype(), pb::FP32);
  EXPECT_EQ(k1.parameter_bytes(), 10000u);

  pb::GetKeyRequest get;
  get.set_tenant("t");
  get.set_name("layer1.weight");
  pb::Key got;
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  ASSERT_EQ(got.chunks_size(), 3);
  const uint64_t want_first[] = {0, 1024, 2048};
  const uint32_t want_elems[] = {1024, 1024, 452};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got.chunks(i).index(), static_cast<uint64_t>(i));
    EXPECT_EQ(got.chunks(i).lane(), static_cast<uint32_t>(i % 3));  // daemon runs 3 lanes
    EXPECT_EQ(got.chunks(i).first_element(), want_first[i]);
    EXPECT_EQ(got.chunks(i).elements(), want_elems[i]);
  }
  get.set_name("layer1.bias");
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &got).ok());
  ASSERT_EQ(got.chunks_size(), 1);
  EXPECT_EQ(got.chunks(0).lane(), 0u);  // chunk 3 on lane 3 % 3

  auto list = client_.ListKeys("t");
  ASSERT_EQ(list.keys_size(), 2);
  EXPECT_EQ(list.keys(0).name(), "layer1.weight");

  pb::DeleteKeyRequest del;
  del.set_tenant("t");
  del.set_name("layer1.weight");
  pb::DeleteKeyResponse del_resp;
  ASSERT_TRUE(client_.keys->DeleteKey(client_.Ctx().get(), del, &del_resp).ok());
  EXPECT_EQ(client_.ListKeys("t").keys_size(), 1);
  ExpectError(client_.keys->DeleteKey(client_.Ctx().get(), del, &del_resp),
              grpc::StatusCode::NOT_FOUND, "name");
  // Chunk indices are never reused: a new key starts after the old ones.
  pb::Key k3;
  ASSERT_TRUE(client_.CreateKey("t", "layer2.weight", 10, &k3).ok());
  EXPECT_EQ(k3.first_chunk(), 4u);
}

TEST_F(AdminApiTest, KeyValidationErrorsChangeNothing) {
  ASSERT_TRUE(daemon_.started());
  ASSERT_TRUE(client_.CreateTenant("t", 2).ok());
  ASSERT_TRUE(client_.CreateKey("t", "w", 10).ok());
  const pb::Tenant before = client_.GetTenant("t");

  ExpectError(client_.CreateKey("nope", "w", 10), grpc::StatusCode::NOT_FOUND, "tenant");
  ExpectError(client_.CreateKey("t", "", 10), grpc::StatusCode::INVALID_ARGUMENT, "name");
  ExpectError(client_.CreateKey("t", "bad name!", 10), grpc::StatusCode::INVALID_ARGUMENT,
              "name");
  ExpectError(client_.CreateKey("t", "zero", 0), grpc::StatusCode::INVALID_ARGUMENT, "elements");
  ExpectError(client_.CreateKey("t", "w", 10), grpc::StatusCode::ALREADY_EXISTS, "name");
  pb::Optimizer opt;
  opt.set_type(pb::MOMENTUM);
  opt.set_learning_rate(0.1);
  opt.set_momentum(1.5);
  ExpectError(client_.CreateKey("t", "m", 10, nullptr, &opt), grpc::StatusCode::INVALID_ARGUMENT,
              "optimizer.momentum");
  opt.set_type(pb::SGD);
  opt.set_momentum(0);
  opt.set_beta1(0.5);
  ExpectError(client_.CreateKey("t", "m", 10, nullptr, &opt), grpc::StatusCode::INVALID_ARGUMENT,
              "optimizer.beta1");

  pb::CreateKeyRequest bad_dtype;
  bad_dtype.set_tenant("t");
  bad_dtype.set_name("d");
  bad_dtype.set_elements(1);
  bad_dtype.set_dtype(static_cast<pb::DType>(9));
  pb::Key k;
  ExpectError(client_.keys->CreateKey(client_.Ctx().get(), bad_dtype, &k),
              grpc::StatusCode::INVALID_ARGUMENT, "dtype");

  pb::GetKeyRequest get;
  get.set_tenant("t");
  get.set_name("missing");
  ExpectError(client_.keys->GetKey(client_.Ctx().get(), get, &k), grpc::StatusCode::NOT_FOUND,
              "name");

  const pb::Tenant after = client_.GetTenant("t");
  EXPECT_EQ(after.key_count(), before.key_count());
  EXPECT_EQ(after.parameter_bytes(), before.parameter_bytes());
  EXPECT_EQ(after.chunk_count(), before.chunk_count());
  EXPECT_EQ(client_.ListKeys("t").keys_size(), 1);
}

TEST_F(AdminApiTest, QuotasAreEnforcedAndUpdatable) {
  ASSERT_TRUE(daemon_.started());
  // max_parameter_bytes counts the hub memory a key holds (Key.memory_bytes:
  // parameters x2, accumulator, ...): learn it from a tenant of the same shape.
  ASSERT_TRUE(client_.CreateTenant("probe", 1).ok());
  pb::Key k600, k400, k401;
  ASSERT_TRUE(client_.CreateKey("probe", "a", 600, &k600).ok());
  ASSERT_TRUE(client_.CreateKey("probe", "b", 400, &k400).ok());
  ASSERT_TRUE(client_.CreateKey("probe", "c", 401, &k401).ok());
  ASSERT_GT(k401.memory_bytes(), k400.memory_bytes());
  EXPECT_GT(k600.memory_bytes(), 3 * k600.parameter_bytes()) << "sgd, 1 worker: x2 + accumulator";
  EXPECT_EQ(client_.GetTenant("probe").memory_bytes(),
            k600.memory_bytes() + k400.memory_bytes() + k401.memory_bytes());
  const uint64_t quota = k600.memory_bytes() + k400.memory_bytes();
  pb::Quotas q;
  q.set_max_keys(2);
  q.set_max_parameter_bytes(quota);
  ASSERT_TRUE(client_.CreateTenant("q", 1, nullptr, &q).ok());
  ASSERT_TRUE(client_.CreateKey("q", "a", 600).ok());
  const grpc::Status refused = client_.CreateKey("q", "b", 401);
  ExpectError(refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
              "quotas.max_parameter_bytes: key 'b' needs ");
  EXPECT_NE(refused.error_message().find("of hub memory for 1.6 KiB of parameters"),
            std::string::npos)
      << refused.error_message();
  ASSERT_TRUE(client_.CreateKey("q", "b", 400).ok());
  ExpectError(client_.CreateKey("q", "c", 1), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "quotas.max_keys");
  EXPECT_EQ(client_.ListKeys("q").keys_size(), 2);

  pb::UpdateQuotasRequest up;
  up.set_name("q");
  up.mutable_quotas()->set_max_keys(1);
  pb::Tenant t;
  ExpectError(client_.tenants->UpdateQuotas(client_.Ctx().get(), up, &t),
              grpc::StatusCode::FAILED_PRECONDITION, "quotas.max_keys");
  EXPECT_EQ(client_.GetTenant("q").quotas().max_keys(), 2u);
  up.mutable_quotas()->set_max_keys(3);
  ASSERT_TRUE(client_.tenants->UpdateQuotas(client_.Ctx().get(), up, &t).ok());
  EXPECT_EQ(t.quotas().max_keys(), 3u);
  EXPECT_EQ(t.quotas().max_parameter_bytes(), quota) << "unset fields keep their value";
  EXPECT_EQ(t.memory_bytes(), quota);
  up.set_name("missing");
  ExpectError(client_.tenants->UpdateQuotas(client_.Ctx().get(), up, &t),
              grpc::StatusCode::NOT_FOUND, "tenant");
}

TEST_F(AdminApiTest, SetOptimizer) {
  ASSERT_TRUE(daemon_.started());
  ASSERT_TRUE(client_.CreateTenant("t", 1).ok());
  pb::Optimizer adam;
  adam.set_type(pb::ADAM);
  adam.set_learning_rate(0.001);
  pb::Key k;
  ASSERT_TRUE(client_.CreateKey("t", "w", 100, &k, &adam).ok());
  EXPECT_DOUBLE_EQ(k.optimizer().beta1(), 0.9) << "defaults are filled in";
  EXPECT_DOUBLE_EQ(k.optimizer().beta2(), 0.999);

  pb::SetOptimizerRequest req;
  req.set_tenant("t");
  req.set_name("w");
  req.mutable_optimizer()->set_learning_rate(0.0005);  // type unspecified: keep ADAM
  ASSERT_TRUE(client_.keys->SetOptimizer(client_.Ctx().get(), req, &k).ok());
  EXPECT_EQ(k.optimizer().type(), pb::ADAM);
  EXPECT_DOUBLE_EQ(k.optimizer().learning_rate(), 0.0005);

  req.mutable_optimizer()->set_type(pb::SGD);
  ExpectError(client_.keys->SetOptimizer(client_.Ctx().get(), req, &k),
              grpc::StatusCode::INVALID_ARGUMENT, "optimizer.type");
  req.mutable_optimizer()->set_type(pb::ADAM);
  req.mutable_optimizer()->set_learning_rate(0);
  ExpectError(client_.keys->SetOptimizer(client_.Ctx().get(), req, &k),
              grpc::StatusCode::INVALID_ARGUMENT, "optimizer.learning_rate");
  pb::GetKeyRequest get;
  get.set_tenant("t");
  get.set_name("w");
  ASSERT_TRUE(client_.keys->GetKey(client_.Ctx().get(), get, &k).ok());
  EXPECT_DOUBLE_EQ(k.optimizer().learning_rate(), 0.0005) << "refused updates change nothing";
}

TEST_F(AdminApiTest, Stats) {
  ASSERT_TRUE(daemon_.started());
  ASSERT_TRUE(client_.CreateTenant("s1", 1).ok());
  ASSERT_TRUE(client_.CreateTenant("s2", 1).ok());
  ASSERT_TRUE(client_.CreateKey("s1", "a", 1000).ok());
  ASSERT_TRUE(client_.CreateKey("s2", "b", 3000).ok());
  pb::GetStatsResponse stats;
  ASSERT_TRUE(client_.stats->GetStats(client_.Ctx().get(), {}, &stats).ok());
  EXPECT_EQ(stats.daemon().tenants(), 2u);
  EXPECT_EQ(stats.daemon().keys(), 2u);
  EXPECT_EQ(stats.daemon().parameter_bytes(), 16000u);
  EXPECT_GT(stats.daemon().memory_bytes(), 3 * 16000u);
  EXPECT_EQ(stats.daemon().memory_bytes_allocated(), 0u) << "no chunk used yet";
  EXPECT_EQ(stats.daemon().lanes(), 3u);
  EXPECT_EQ(stats.daemon().admin_listen(), daemon_.admin_address());
  EXPECT_EQ(stats.daemon().data_listen(), daemon_.data_address());
  EXPECT_EQ(stats.tenants_size(), 2);
  pb::GetStatsRequest one;
  one.set_tenant("s2");
  ASSERT_TRUE(client_.stats->GetStats(client_.Ctx().get(), one, &stats).ok());
  ASSERT_EQ(stats.tenants_size(), 1);
  EXPECT_EQ(stats.tenants(0).parameter_bytes(), 12000u);
  EXPECT_EQ(stats.tenants(0).workers_connected(), 0u);
  one.set_tenant("none");
  ExpectError(client_.stats->GetStats(client_.Ctx().get(), one, &stats),
              grpc::StatusCode::NOT_FOUND, "tenant");
}

// Issue 12, hole 5: a refused CreateTenant echoed the name raw into the log
// (a newline forged a line) and a 1 MiB name wrote 2 MB of log per call.
TEST_F(AdminApiTest, ClientNamesAreEscapedAndTruncatedInLogsAndErrors) {
  ASSERT_TRUE(daemon_.started());
  const std::string forged_line = "2030-01-01T00:00:00.000 info admin: DeleteTenant 'prod'";
  grpc::Status s = client_.CreateTenant("a\n" + forged_line, 1);
  ExpectError(s, grpc::StatusCode::INVALID_ARGUMENT, "name: 'a\\x0a2030-01-01T00:00:00.000");
  EXPECT_EQ(s.error_message().find('\n'), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("is not a valid tenant name"), std::string::npos);
  // The same through a key name and a tenant name that does not exist.
  ASSERT_TRUE(client_.CreateTenant("t", 1).ok());
  s = client_.CreateKey("t", "k\r\n" + forged_line, 10);
  ExpectError(s, grpc::StatusCode::INVALID_ARGUMENT, "name: 'k\\x0d\\x0a2030");
  s = client_.CreateKey("nope\n" + forged_line, "k", 10);
  ExpectError(s, grpc::StatusCode::NOT_FOUND, "tenant: 'nope\\x0a2030");
  pb::DeleteTenantRequest del;
  del.set_name("x\n" + forged_line);
  pb::DeleteTenantResponse gone;
  ExpectError(client_.tenants->DeleteTenant(client_.Ctx().get(), del, &gone),
              grpc::StatusCode::NOT_FOUND, "tenant: 'x\\x0a2030");

  // Every log line is one record: none starts with the forged text.
  EXPECT_TRUE(testing::WaitForLog(daemon_, "DeleteTenant 'x\\x0a"));
  std::string log = daemon_.Log();
  EXPECT_NE(log.find("admin: CreateTenant 'a\\x0a2030-01-01T00:00:00.000 info admin: "
                     "DeleteTenant 'prod'' refused: name: "),
            std::string::npos)
      << log;
  for (size_t start = 0; start < log.size();) {
    const size_t end = log.find('\n', start);
    const std::string line = log.substr(start, end - start);
    EXPECT_NE(line.rfind("2030-01-01", 0), 0u) << "forged log line: " << line;
    EXPECT_EQ(line.find("\r"), std::string::npos) << line;
    if (end == std::string::npos) break;
    start = end + 1;
  }

  // A 1 MiB name: a bounded log line and message, per call.
  const std::string huge(1 << 20, 'n');
  for (int i = 0; i < 5; ++i) {
    const size_t before = daemon_.Log().size();
    s = client_.CreateTenant(huge, 1);
    ExpectError(s, grpc::StatusCode::INVALID_ARGUMENT, "name: 'nnnn");
    EXPECT_LT(s.error_message().size(), 512u);
    EXPECT_NE(s.error_message().find("...(1048576 bytes)' is not a valid tenant name"),
              std::string::npos)
        << s.error_message().substr(0, 400);
    s = client_.CreateKey("t", huge, 10);
    ExpectError(s, grpc::StatusCode::INVALID_ARGUMENT, "name: 'nnnn");
    EXPECT_LT(s.error_message().size(), 512u);
    EXPECT_TRUE(
        testing::WaitForLog(daemon_, std::string(128, 'n') + "...(1048576 bytes)' refused"));
    log = daemon_.Log();
    const size_t grown = daemon_.Log().size() - before;
    EXPECT_LT(grown, 4096u) << "two refused calls with a 1 MiB name grew the log by " << grown;
  }
}

TEST_F(AdminApiTest, HealthAndReflectionAreServed) {
  ASSERT_TRUE(daemon_.started());
  // grpc.health.v1.Health (synchronous stubs of proto/grpc/health/v1).
  namespace health = grpc::health::v1;
  auto stub = health::Health::NewStub(client_.channel_);
  for (const char* service : {"", "rackhub.admin.v1.TenantService",
                              "rackhub.admin.v1.CheckpointService"}) {
    health::HealthCheckRequest req;
    req.set_service(service);
    health::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(client_.Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << service << ": " << s.error_message();
    EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVING) << service;
  }
  {
    health::HealthCheckRequest req;
    req.set_service("no.such.Service");
    health::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(client_.Ctx().get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_NE(s.error_message().find("no.such.Service"), std::string::npos) << s.error_message();
  }
  {
    // Watch of an unknown name: SERVICE_UNKNOWN at once, the stream stays open.
    health::HealthCheckRequest req;
    req.set_service("no.such.Service");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Watch(&ctx, req);
    health::HealthCheckResponse resp;
    ASSERT_TRUE(reader->Read(&resp));
    EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVICE_UNKNOWN);
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }

  // Server reflection: ServerReflectionRequest{list_services: ""} is field 7,
  // an empty string: bytes 3a 00. The reply lists our services by name.
  grpc::GenericStub generic(client_.channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext rctx;
  rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = generic.PrepareCall(
      &rctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_EQ(reinterpret_cast<intptr_t>(tag), want);
    ASSERT_TRUE(ok);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(1);
  grpc::Slice list_services("\x3a\x00", 2);
  grpc::ByteBuffer reflection_request(&list_services, 1);
  call->Write(reflection_request, reinterpret_cast<void*>(2));
  step(2);
  grpc::ByteBuffer reflection_response;
  call->Read(&reflection_response, reinterpret_cast<void*>(3));
  {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_EQ(reinterpret_cast<intptr_t>(tag), 3);
    if (!ok) {  // the server ended the call: say how
      grpc::Status st;
      call->Finish(&st, reinterpret_cast<void*>(9));
      cq.Next(&tag, &ok);
      const std::string log = daemon_.Log();
      FAIL() << "reflection stream ended without a reply: " << st.error_code() << " "
             << st.error_message() << "\nrackhubd log (end):\n"
             << log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
    }
  }
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status finish;
  call->Finish(&finish, reinterpret_cast<void*>(5));
  step(5);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reflection_response.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("rackhub.admin.v1.TenantService"), std::string::npos);
  EXPECT_NE(bytes.find("rackhub.admin.v1.KeyService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
}

// A Watch sees SERVING, then NOT_SERVING when rackhubd is told to stop, and
// its stream ends: a watcher never holds the daemon's shutdown.
TEST_F(AdminApiTest, HealthWatchEndsWithNotServingWhenTheDaemonStops) {
  ASSERT_TRUE(daemon_.started());
  namespace health = grpc::health::v1;
  auto stub = health::Health::NewStub(client_.channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Watch(&ctx, health::HealthCheckRequest());
  health::HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVING);
  std::thread stopper([this] { EXPECT_EQ(daemon_.Stop(SIGTERM), 0); });
  std::vector<int> seen;
  while (reader->Read(&resp)) seen.push_back(resp.status());
  const grpc::Status end = reader->Finish();
  stopper.join();
  ASSERT_FALSE(seen.empty()) << "the stream ended without NOT_SERVING: " << end.error_message();
  EXPECT_EQ(seen.back(), health::HealthCheckResponse::NOT_SERVING);
  // OK only when the service ended the stream itself; the admin server's
  // shutdown grace would cancel it instead.
  EXPECT_TRUE(end.ok()) << end.error_code() << ": " << end.error_message();
}

// --- Admin authentication ---------------------------------------------------

class AdminAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    testing::WriteFile(dir_ + "/admin.token", "s3cret-admin\n");
    testing::WriteFile(dir_ + "/ro.token", "s3cret-ro\n");
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--admin-token-file", dir_ + "/admin.token", "--admin-readonly-token-file",
        dir_ + "/ro.token"});
  }
  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(AdminAuthTest, TokenIsRequiredAndChecked) {
  ASSERT_TRUE(daemon_->started());
  AdminClient none(daemon_->admin_address());
  AdminClient wrong(daemon_->admin_address(), "guess");
  AdminClient admin(daemon_->admin_address(), "s3cret-admin");
  AdminClient ro(daemon_->admin_address(), "s3cret-ro");

  ExpectError(none.CreateTenant("x", 1), grpc::StatusCode::UNAUTHENTICATED, "authorization");
  ExpectError(wrong.CreateTenant("x", 1), grpc::StatusCode::UNAUTHENTICATED, "authorization");
  ExpectError(ro.CreateTenant("x", 1), grpc::StatusCode::PERMISSION_DENIED, "authorization");
  pb::ListTenantsResponse list;
  ExpectError(none.tenants->ListTenants(none.Ctx().get(), {}, &list),
              grpc::StatusCode::UNAUTHENTICATED, "authorization");
  ASSERT_TRUE(ro.tenants->ListTenants(ro.Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.tenants_size(), 0) << "refused creates must not create anything";

  ASSERT_TRUE(admin.CreateTenant("x", 1).ok());
  ExpectError(ro.CreateKey("x", "k", 1), grpc::StatusCode::PERMISSION_DENIED, "authorization");
  ASSERT_TRUE(ro.tenants->ListTenants(ro.Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.tenants_size(), 1);
  EXPECT_EQ(ro.ListKeys("x").keys_size(), 0);
}

TEST(AdminTlsTest, TlsWithClientCertificates) {
  const std::string dir = testing::MakeTempDir();
  // A CA, a server cert for "localhost" and a client cert, all signed by the CA.
  ASSERT_EQ(testing::MakeTestPki(dir, {"server", "client"}), "");

  DaemonProcess daemon({"--admin-tls-cert", dir + "/server.pem", "--admin-tls-key",
                        dir + "/server.key", "--admin-tls-client-ca", dir + "/ca.pem"});
  ASSERT_TRUE(daemon.started());
  const std::string ca = testing::ReadFile(dir + "/ca.pem");

  grpc::SslCredentialsOptions with_cert;
  with_cert.pem_root_certs = ca;
  with_cert.pem_private_key = testing::ReadFile(dir + "/client.key");
  with_cert.pem_cert_chain = testing::ReadFile(dir + "/client.pem");
  AdminClient good(daemon.admin_address(), "", grpc::SslCredentials(with_cert), "localhost");
  ASSERT_TRUE(good.CreateTenant("tls-tenant", 1).ok());

  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ca;
  AdminClient anonymous(daemon.admin_address(), "", grpc::SslCredentials(no_cert), "localhost");
  EXPECT_FALSE(anonymous.CreateTenant("anon", 1).ok());

  AdminClient plaintext(daemon.admin_address());
  EXPECT_FALSE(plaintext.CreateTenant("plain", 1).ok());
  EXPECT_EQ(good.GetTenant("tls-tenant").name(), "tls-tenant");
  pb::ListTenantsResponse list;
  ASSERT_TRUE(good.tenants->ListTenants(good.Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.tenants_size(), 1);
}

}  // namespace
}  // namespace rackhub
