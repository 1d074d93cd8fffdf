// A hub killed with -9 and restarted in a 2-rack job (issue 31; docs/
// cluster.md, Recovery across racks and Limits), with real hubs on loopback
// that keep their registries in state directories, and 2 librackhub workers
// per rack (threads of this process). Multi-rack tenants have no checkpoints
// yet, so the restarted hub has lost the chunks it is home to; the recovery
// round its restart starts must still end with every rack's workers seeing
// the same parameters at one version:
//   - a `from_client` key's chunks homed on the restarted hub come back from
//     the other rack's copies (the parameters of the last update);
//   - a `zeros` key's chunks homed there go back to zeros (the documented
//     loss), the chunks homed on the surviving hub keep their values;
//   - a row-sparse table homed on the surviving hub keeps its rows on every
//     rack, one homed on the restarted hub goes back to zeros on every rack;
//   - the next update of every chunk is the reference's update of what the
//     workers pulled.
// SGD with lr 0.5 and gradients that are small multiples of 1/8 keep every
// value exact in fp32, so the reference is plain arithmetic on the inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data_link.h"  // SameBits
#include "table_racks.h"

namespace rackhub {
namespace {

using namespace testing::table_racks;
using testing::TablePush;
using testing::TableReference;
using testing::SameBits;

constexpr uint64_t kElements = 4096;  // 4 chunks of 1024 floats: homes on both racks
constexpr uint32_t kChunkFloats = 1024;
constexpr size_t kAllWorkers = 2 * kWorkers;

// The rack whose hub is home to `element` of a key whose chunk 0 has the
// tenant-wide index `first_chunk` (one lane: home (g / 1) % 2).
uint32_t HomeOf(uint64_t first_chunk, uint64_t element) {
  return static_cast<uint32_t>((first_chunk + element / kChunkFloats) % 2);
}

// Worker w's gradient at step s: exact multiples of 1/8.
std::vector<float> Grad(size_t w, int s) {
  std::vector<float> g(kElements);
  for (uint64_t i = 0; i < kElements; ++i) {
    g[i] = static_cast<float>(static_cast<int>((i + 3 * w + 5 * s) % 7) - 3) * 0.125f;
  }
  return g;
}

// p - 0.5 * mean over the workers of their gradients at step s.
void ApplyStep(std::vector<float>& p, int s) {
  std::vector<float> sum(kElements, 0.0f);
  for (size_t w = 0; w < kAllWorkers; ++w) {
    const std::vector<float> g = Grad(w, s);
    for (uint64_t i = 0; i < kElements; ++i) sum[i] += g[i];
  }
  for (uint64_t i = 0; i < kElements; ++i) p[i] -= 0.5f * (sum[i] / kAllWorkers);
}

struct Worker {
  std::unique_ptr<client::Client> c;
  client::KeyId u = 0, z = 0;
  std::vector<client::KeyId> tables;  // kTables, declared by ConnectWorker
};

TEST(CrossRackRestartTest, ARestartedHubsChunksComeBackFromTheOtherRackAndEveryRackAgrees) {
  Hubs hubs = StartHubs(2, false, "30000", /*durable=*/true, kChunkFloats * 4);
  std::vector<Worker> w(kAllWorkers);
  client::OptimizerSpec sgd;
  sgd.type = "sgd";
  sgd.learning_rate = 0.5;
  for (size_t i = 0; i < kAllWorkers; ++i) {
    w[i].c = ConnectWorker(hubs, static_cast<uint32_t>(i / kWorkers),
                           static_cast<uint32_t>(i % kWorkers), &w[i].tables, 30s);
    ASSERT_TRUE(w[i].c);
    for (const auto& [name, init, id] :
         {std::tuple{"u", client::Init::kFromClient, &w[i].u},
          std::tuple{"z", client::Init::kZeros, &w[i].z}}) {
      client::KeyDecl d;
      d.name = name;
      d.elements = kElements;
      d.optimizer = sgd;
      d.init = init;
      const client::Error e = w[i].c->DeclareKey(d, id);
      ASSERT_TRUE(e.ok()) << e.message;
    }
  }
  std::vector<float> ref_u(kElements), ref_z(kElements, 0.0f);
  for (uint64_t i = 0; i < kElements; ++i) ref_u[i] = static_cast<float>(i % 13) * 0.25f;
  ASSERT_TRUE(w[0].c->Wait(w[0].c->Init(w[0].u, ref_u)).ok());
  const auto step = [&](int s, std::vector<client::Error>* errors,
                        std::vector<std::vector<float>>* out) {
    errors->assign(2 * kAllWorkers, {});
    out->assign(2 * kAllWorkers, std::vector<float>(kElements));
    std::vector<client::Ticket> t;
    std::vector<std::vector<float>> grads;  // alive until every ticket is done
    for (size_t i = 0; i < kAllWorkers; ++i) grads.push_back(Grad(i, s));
    for (size_t i = 0; i < kAllWorkers; ++i) {
      t.push_back(w[i].c->PushPull(w[i].u, grads[i], (*out)[2 * i]));
      t.push_back(w[i].c->PushPull(w[i].z, grads[i], (*out)[2 * i + 1]));
    }
    for (size_t k = 0; k < t.size(); ++k) (*errors)[k] = w[k / 2].c->Wait(t[k]);
  };
  const auto pull_all = [&](std::vector<std::vector<float>>* out) {
    out->assign(2 * kAllWorkers, std::vector<float>(kElements));
    for (size_t i = 0; i < kAllWorkers; ++i) {
      for (int k = 0; k < 2; ++k) {
        const client::Error e =
            w[i].c->Wait(w[i].c->Pull(k ? w[i].z : w[i].u, (*out)[2 * i + k]));
        ASSERT_TRUE(e.ok()) << "worker " << i << " key " << (k ? "z" : "u") << ": " << e.message;
      }
    }
  };
  std::vector<client::Error> errors;
  std::vector<std::vector<float>> out;
  pull_all(&out);  // every rank has rank 0's values before it pushes
  for (int s = 0; s < 3; ++s) {
    step(s, &errors, &out);
    ApplyStep(ref_u, s);
    ApplyStep(ref_z, s);
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_TRUE(errors[k].ok()) << errors[k].message;
      EXPECT_TRUE(SameBits(out[k], k % 2 ? ref_z : ref_u)) << "step " << s << " op " << k;
    }
  }

  // One update of tables 0 (rows homed on rack 0) and 1 (homed on rack 1).
  std::vector<std::vector<uint64_t>> table_ids(kAllWorkers);
  std::vector<TableReference> table_refs;
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  for (size_t table : {0, 1}) {
    table_refs.emplace_back(ConfigOf(kTables[table]), kAllWorkers, 0, kRows, kDim);
    std::vector<std::vector<TablePush>> by_rack(2);
    std::vector<std::vector<float>> rows(kAllWorkers, std::vector<float>(kRows * kDim));
    std::vector<client::Ticket> t;
    for (size_t i = 0; i < kAllWorkers; ++i) {
      by_rack[i / kWorkers].push_back(MakePush(static_cast<uint32_t>(i / kWorkers),
                                               static_cast<uint32_t>(i % kWorkers), 0, table));
    }
    for (size_t i = 0; i < kAllWorkers; ++i) {
      const TablePush& p = by_rack[i / kWorkers][i % kWorkers];
      t.push_back(w[i].c->PushPullRows(w[i].tables[table], p.ids, p.rows, all, rows[i]));
    }
    for (size_t i = 0; i < kAllWorkers; ++i) ASSERT_TRUE(w[i].c->Wait(t[i]).ok());
    table_refs.back().UpdateAcrossRacks(by_rack);
    EXPECT_TRUE(SameBits(rows[0], table_refs.back().values));
  }

  // Rack 1's hub dies and comes back empty (no checkpoints across racks).
  EXPECT_EQ(hubs.hubs[1]->Kill(), 128 + 9);
  ASSERT_TRUE(hubs.hubs[1]->Restart());
  step(3, &errors, &out);  // refused or rolled back somewhere: the round decides
  pull_all(&out);
  const uint64_t z_first = w[0].c->GetKeyInfo(w[0].z)->first_chunk;
  uint64_t lost = 0;
  for (uint64_t i = 0; i < kElements; ++i) {
    if (HomeOf(z_first, i) == 1) {
      ref_z[i] = 0.0f;  // lost with the hub: back to the initial zeros
      ++lost;
    }
  }
  EXPECT_EQ(lost, kElements / 2) << "half of z's chunks are homed on the restarted hub";
  for (size_t k = 0; k < out.size(); ++k) {
    EXPECT_TRUE(SameBits(out[k], k % 2 ? ref_z : ref_u))
        << "after the restart, worker " << k / 2 << " (rack " << k / 2 / kWorkers
        << ") pulled other values of " << (k % 2 ? "z" : "u");
  }
  const uint64_t version = w[0].c->GetKeyInfo(w[0].u)->next_iteration;
  for (size_t i = 0; i < kAllWorkers; ++i) {
    EXPECT_EQ(w[i].c->GetKeyInfo(w[i].u)->next_iteration, version) << "worker " << i;
  }
  // Table 0's rows kept their home; table 1's went back to zeros with it.
  table_refs[1].values.assign(kRows * kDim, 0.0f);
  for (size_t table : {0, 1}) {
    for (size_t i = 0; i < kAllWorkers; ++i) {
      std::vector<float> rows(kRows * kDim, -1.0f);
      const client::Error e = w[i].c->Wait(w[i].c->PullRows(w[i].tables[table], all, rows));
      ASSERT_TRUE(e.ok()) << "worker " << i << " table " << table << ": " << e.message;
      EXPECT_TRUE(SameBits(rows, table_refs[table].values))
          << "after the restart, worker " << i << " pulled other rows of table " << table;
    }
  }
  step(4, &errors, &out);
  ApplyStep(ref_u, 4);
  ApplyStep(ref_z, 4);
  for (size_t k = 0; k < out.size(); ++k) {
    ASSERT_TRUE(errors[k].ok()) << "op " << k << ": " << errors[k].message;
    EXPECT_TRUE(SameBits(out[k], k % 2 ? ref_z : ref_u)) << "the update after the restart, op "
                                                         << k;
  }
}

}  // namespace
}  // namespace rackhub
