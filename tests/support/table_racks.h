// Test support for row-sparse tables spanning racks
// (tests/integration/multi_rack_table_test.cc, table_recovery_test.cc):
// three tables whose one row range each has its home on racks 0, 1 and 2
// (mod the rack count), what each worker pushes, real hubs on loopback (one
// per rack, or one flat hub), and librackhub workers that declare the tables.
// Single-threaded use from a test body, except the Clients it returns.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/client/client.h"
#include "table_reference.h"

namespace rackhub::testing::table_racks {

namespace pb = rackhub::admin::v1;
using namespace std::chrono_literals;
using client::Client;

constexpr uint32_t kWorkers = 2;  // per rack
constexpr uint64_t kRows = 23;
constexpr uint32_t kDim = 3;
constexpr int kIterations = 5;
inline const std::string kToken(40, 'r');

// The tables: one row range each (one lane), so their homes are racks 0, 1
// and 2 (mod the rack count): first_chunk 0, 1, 2 and home (g / 1) % R.
struct TableKind {
  std::string name, type;
  double lr, momentum, beta1, beta2, eps, acc;
};
inline const std::vector<TableKind> kTables = {
    {"emb_momentum", "momentum", 0.1, 0.9, 0, 0, 0, 0},
    {"emb_adam", "adam", 0.01, 0, 0.9, 0.999, 1e-8, 0},
    {"emb_adagrad", "adagrad", 0.05, 0, 0, 0, 1e-10, 0.1},
};

inline client::OptimizerSpec SpecOf(const TableKind& k) {
  client::OptimizerSpec s;
  s.type = k.type;
  s.learning_rate = k.lr;
  s.momentum = k.momentum;
  s.beta1 = k.beta1;
  s.beta2 = k.beta2;
  s.epsilon = k.eps;
  s.initial_accumulator = k.acc;
  return s;
}

inline aggregation::OptimizerConfig ConfigOf(const TableKind& k) {
  aggregation::OptimizerConfig c;
  for (int t = 1; t <= 7; ++t) {
    const auto candidate = static_cast<aggregation::OptimizerType>(t);
    if (k.type == aggregation::OptimizerTypeName(candidate)) c.type = candidate;
  }
  c.learning_rate = k.lr;
  c.momentum = k.momentum;
  c.beta1 = k.beta1;
  c.beta2 = k.beta2;
  c.epsilon = k.eps;
  c.initial_accumulator = k.acc;
  EXPECT_TRUE(aggregation::NormalizeOptimizer(&c).ok()) << k.type;
  return c;
}

// What worker (rack, rank) pushes to table `table` at iteration `it`: some
// empty pushes, ids in any order with duplicates, rows at both ends.
inline TablePush MakePush(uint32_t rack, uint32_t rank, int it, size_t table) {
  std::mt19937 rng(static_cast<uint32_t>(1000003 * rack + 10007 * rank + 101 * it + table));
  TablePush p;
  if ((it + rack + rank) % 4 == 3) return p;  // touches nothing this time
  std::uniform_int_distribution<uint64_t> id(0, kRows - 1);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const size_t n = 2 + rng() % 8;
  for (size_t i = 0; i < n; ++i) p.ids.push_back(id(rng));
  p.ids.push_back(it % 2 ? 0 : kRows - 1);
  p.ids.push_back(p.ids.front());  // a duplicate
  for (size_t i = 0; i < p.ids.size() * kDim; ++i) p.rows.push_back(value(rng));
  return p;
}

// Hubs serving `racks` racks: one per rack (hierarchical), or one flat hub
// serving them all.
struct Hubs {
  std::vector<std::unique_ptr<DaemonProcess>> hubs;
  std::vector<std::string> interhub;  // by rack
  std::string secret;
  const std::string& Data(uint32_t rack) const {
    return hubs[hubs.size() == 1 ? 0 : rack]->data_address();
  }
};

// `durable`: each hub keeps its registry in a state directory (a restarted
// hub has the tenant and keys again); `chunk_bytes`: the tenant's (0: the
// default).
inline Hubs StartHubs(uint32_t racks, bool flat, const std::string& straggler_ms = "30000",
                      bool durable = false, uint32_t chunk_bytes = 0) {
  Hubs out;
  std::string list;
  for (uint32_t r = 0; r < racks; ++r) {
    out.interhub.push_back("127.0.0.1:" + std::to_string(FreeLoopbackPort()));
    list += (r ? "," : "") + std::string("127.0.0.1:0=") + out.interhub.back();
  }
  const std::string secret = MakeTempDir() + "/hub.secret";
  out.secret = std::string(48, 's');
  WriteFile(secret, out.secret + "\n");
  for (uint32_t r = 0; r < (flat ? 1 : racks); ++r) {
    std::vector<std::string> args = {"--lanes", "1", "--racks", list, "--rack",
                                     std::to_string(r), "--straggler-timeout-ms", straggler_ms};
    if (!durable) args.push_back("--in-memory");
    if (flat) {
      args.insert(args.end(), {"--topology-mode", "flat"});
    } else {
      args.insert(args.end(), {"--hub-secret-file", secret});
    }
    out.hubs.push_back(std::make_unique<DaemonProcess>(args));
    EXPECT_TRUE(out.hubs.back()->started());
    // The same tenant (2 workers per rack) on every hub.
    auto channel = grpc::CreateChannel(out.hubs.back()->admin_address(),
                                       grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    req.set_name("job");
    req.set_workers_per_rack(kWorkers);
    req.set_token(kToken);
    if (chunk_bytes > 0) req.set_chunk_bytes(chunk_bytes);
    req.mutable_default_optimizer()->set_type(pb::SGD);
    req.mutable_default_optimizer()->set_learning_rate(0.1);
    pb::CreateTenantResponse resp;
    const grpc::Status s = pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  return out;
}

inline std::unique_ptr<Client> ConnectWorker(const Hubs& hubs, uint32_t rack, uint32_t rank,
                                      std::vector<client::KeyId>* keys,
                                      std::chrono::milliseconds op_timeout = 60s) {
  client::Options o;
  o.hub = hubs.Data(rack);
  o.tenant = "job";
  o.token = kToken;
  o.rack = rack;
  o.rank = rank;
  o.connect_timeout = 10s;
  o.op_timeout = op_timeout;
  o.shm = client::Shm::kOff;
  client::Error e;
  auto c = Client::Connect(o, &e);
  EXPECT_NE(c, nullptr) << e.message;
  if (!c) return c;
  for (const TableKind& k : kTables) {
    client::KeyDecl decl;
    decl.name = k.name;
    decl.rows = kRows;
    decl.dim = kDim;
    decl.optimizer = SpecOf(k);
    client::KeyId id = 0;
    const client::Error d = c->DeclareKey(decl, &id);
    EXPECT_TRUE(d.ok()) << d.message;
    keys->push_back(id);
  }
  return c;
}

}  // namespace rackhub::testing::table_racks
