// A hub killed with -9 and restarted in a 2-rack job (issue 31; docs/
// cluster.md, Recovery across racks, Cluster checkpoints and Limits), with
// real hubs on loopback that keep their registries in state directories, and
// 2 librackhub workers per rack (threads of this process).
//
// Without a checkpoint the restarted hub has lost the chunks it is home to;
// the recovery round its restart starts must still end with every rack's
// workers seeing the same parameters at one version:
//   - a `from_client` key's chunks homed on the restarted hub come back from
//     the other rack's copies (the parameters of the last update);
//   - a `zeros` key's chunks homed there go back to zeros (the documented
//     loss), the chunks homed on the surviving hub keep their values;
//   - a row-sparse table homed on the surviving hub keeps its rows on every
//     rack, one homed on the restarted hub goes back to zeros on every rack;
//   - the next update of every chunk is the reference's update of what the
//     workers pulled.
// With a cluster checkpoint (taken on rack 0's hub's admin API, or restored
// by it) every hub goes back to it: every key and table at the checkpoint's
// values and version on every rack, and the steps after it replay exactly.
// SGD with lr 0.5 and gradients that are small multiples of 1/8 keep every
// value exact in fp32, so the reference is plain arithmetic on the inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
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

// Two racks of kWorkers workers training keys u (from_client) and z (zeros)
// and tables 0 (rows homed on rack 0) and 1 (homed on rack 1), with the
// reference of every value.
class CrossRackRestartTest : public ::testing::Test {
 protected:
  // One flat hub serving both racks instead of one hub per rack.
  virtual bool flat() const { return false; }
  void SetUp() override {
    hubs_ = StartHubs(2, flat(), "30000", /*durable=*/true, kChunkFloats * 4);
    w_.resize(kAllWorkers);
    client::OptimizerSpec sgd;
    sgd.type = "sgd";
    sgd.learning_rate = 0.5;
    for (size_t i = 0; i < kAllWorkers; ++i) {
      w_[i].c = ConnectWorker(hubs_, static_cast<uint32_t>(i / kWorkers),
                              static_cast<uint32_t>(i % kWorkers), &w_[i].tables, 30s);
      ASSERT_TRUE(w_[i].c);
      for (const auto& [name, init, id] :
           {std::tuple{"u", client::Init::kFromClient, &w_[i].u},
            std::tuple{"z", client::Init::kZeros, &w_[i].z}}) {
        client::KeyDecl d;
        d.name = name;
        d.elements = kElements;
        d.optimizer = sgd;
        d.init = init;
        const client::Error e = w_[i].c->DeclareKey(d, id);
        ASSERT_TRUE(e.ok()) << e.message;
      }
    }
    ref_u_.resize(kElements);
    ref_z_.assign(kElements, 0.0f);
    for (uint64_t i = 0; i < kElements; ++i) ref_u_[i] = static_cast<float>(i % 13) * 0.25f;
    ASSERT_TRUE(w_[0].c->Wait(w_[0].c->Init(w_[0].u, ref_u_)).ok());
    for (uint64_t i = 0; i < kRows; ++i) all_rows_.push_back(i);
    for (size_t table : {0, 1}) {
      table_refs_.emplace_back(ConfigOf(kTables[table]), kAllWorkers, 0, kRows, kDim);
    }
  }

  // Every worker PushPulls u and z with its step-s gradient: the results
  // (op 2i: worker i's u, 2i + 1: its z).
  void Step(int s, std::vector<client::Error>* errors, std::vector<std::vector<float>>* out) {
    errors->assign(2 * kAllWorkers, {});
    out->assign(2 * kAllWorkers, std::vector<float>(kElements));
    std::vector<client::Ticket> t;
    std::vector<std::vector<float>> grads;  // alive until every ticket is done
    for (size_t i = 0; i < kAllWorkers; ++i) grads.push_back(Grad(i, s));
    for (size_t i = 0; i < kAllWorkers; ++i) {
      t.push_back(w_[i].c->PushPull(w_[i].u, grads[i], (*out)[2 * i]));
      t.push_back(w_[i].c->PushPull(w_[i].z, grads[i], (*out)[2 * i + 1]));
    }
    for (size_t k = 0; k < t.size(); ++k) (*errors)[k] = w_[k / 2].c->Wait(t[k]);
  }
  // A step every worker completes, checked against the reference.
  void GoodStep(int s) {
    std::vector<client::Error> errors;
    std::vector<std::vector<float>> out;
    Step(s, &errors, &out);
    ApplyStep(ref_u_, s);
    ApplyStep(ref_z_, s);
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_TRUE(errors[k].ok()) << "step " << s << " op " << k << ": " << errors[k].message;
      EXPECT_TRUE(SameBits(out[k], k % 2 ? ref_z_ : ref_u_)) << "step " << s << " op " << k;
    }
  }
  // Every worker Pulls u and z (op numbering as Step).
  void PullAll(std::vector<std::vector<float>>* out) {
    out->assign(2 * kAllWorkers, std::vector<float>(kElements));
    for (size_t i = 0; i < kAllWorkers; ++i) {
      for (int k = 0; k < 2; ++k) {
        const client::Error e =
            w_[i].c->Wait(w_[i].c->Pull(k ? w_[i].z : w_[i].u, (*out)[2 * i + k]));
        ASSERT_TRUE(e.ok()) << "worker " << i << " key " << (k ? "z" : "u") << ": " << e.message;
      }
    }
  }
  // Every worker's u and z against the reference, and one version of u.
  void ExpectPulled(const std::string& when) {
    std::vector<std::vector<float>> out;
    PullAll(&out);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(SameBits(out[k], k % 2 ? ref_z_ : ref_u_))
          << when << ", worker " << k / 2 << " (rack " << k / 2 / kWorkers
          << ") pulled other values of " << (k % 2 ? "z" : "u");
    }
    const uint64_t version = w_[0].c->GetKeyInfo(w_[0].u)->next_iteration;
    for (size_t i = 0; i < kAllWorkers; ++i) {
      EXPECT_EQ(w_[i].c->GetKeyInfo(w_[i].u)->next_iteration, version) << when << ", worker " << i;
    }
  }
  // One update of tables 0 and 1 (each worker's rows of `step`).
  void TableStep(uint64_t step) {
    for (size_t table : {0, 1}) {
      std::vector<std::vector<TablePush>> by_rack(2);
      std::vector<std::vector<float>> rows(kAllWorkers, std::vector<float>(kRows * kDim));
      std::vector<client::Ticket> t;
      for (size_t i = 0; i < kAllWorkers; ++i) {
        by_rack[i / kWorkers].push_back(MakePush(static_cast<uint32_t>(i / kWorkers),
                                                 static_cast<uint32_t>(i % kWorkers), step,
                                                 table));
      }
      for (size_t i = 0; i < kAllWorkers; ++i) {
        const TablePush& p = by_rack[i / kWorkers][i % kWorkers];
        t.push_back(w_[i].c->PushPullRows(w_[i].tables[table], p.ids, p.rows, all_rows_, rows[i]));
      }
      for (size_t i = 0; i < kAllWorkers; ++i) ASSERT_TRUE(w_[i].c->Wait(t[i]).ok());
      table_refs_[table].UpdateAcrossRacks(by_rack);
      EXPECT_TRUE(SameBits(rows[0], table_refs_[table].values));
    }
  }
  // Every worker's rows of both tables against the reference.
  void ExpectTables(const std::string& when) {
    for (size_t table : {0, 1}) {
      for (size_t i = 0; i < kAllWorkers; ++i) {
        std::vector<float> rows(kRows * kDim, -1.0f);
        const client::Error e =
            w_[i].c->Wait(w_[i].c->PullRows(w_[i].tables[table], all_rows_, rows));
        ASSERT_TRUE(e.ok()) << "worker " << i << " table " << table << ": " << e.message;
        EXPECT_TRUE(SameBits(rows, table_refs_[table].values))
            << when << ", worker " << i << " pulled other rows of table " << table;
      }
    }
  }
  std::unique_ptr<pb::CheckpointService::Stub> Checkpoints(uint32_t rack) {
    return pb::CheckpointService::NewStub(grpc::CreateChannel(
        hubs_.hubs[flat() ? 0 : rack]->admin_address(), grpc::InsecureChannelCredentials()));
  }
  // The reference at a checkpoint, and the reference put back to it.
  struct Saved {
    std::vector<float> u, z;
    std::vector<TableReference> tables;  // rows and optimizer state
  };
  Saved Save() const { return {ref_u_, ref_z_, table_refs_}; }
  void Rewind(const Saved& saved) {
    ref_u_ = saved.u;
    ref_z_ = saved.z;
    table_refs_ = saved.tables;
  }
  // An admin restore of the newest checkpoint every hub has, asked on rack
  // `rack`'s hub.
  grpc::Status RestoreNewest(uint32_t rack, pb::Checkpoint* resp) {
    grpc::ClientContext ctx;
    pb::RestoreCheckpointRequest req;
    req.set_tenant("job");
    return Checkpoints(rack)->RestoreCheckpoint(&ctx, req, resp);
  }
  void CreateCheckpoint(uint32_t rack, uint64_t expected_sequence) {
    grpc::ClientContext ctx;
    pb::CreateCheckpointRequest req;
    req.set_tenant("job");
    pb::Checkpoint resp;
    const grpc::Status s = Checkpoints(rack)->CreateCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.sequence(), expected_sequence);
  }
  // Rack `rack`'s hub's files of checkpoint `seq` (its state directory):
  // removed, or with a byte in their chunk data flipped; how many.
  size_t RemoveCheckpointFile(uint32_t rack, uint64_t seq) { return EachFile(rack, seq, false); }
  size_t DamageCheckpointFile(uint32_t rack, uint64_t seq) { return EachFile(rack, seq, true); }
  size_t EachFile(uint32_t rack, uint64_t seq, bool damage) {
    const std::string name = "ckpt-" + std::string(20 - std::to_string(seq).size(), '0') +
                             std::to_string(seq) + ".rhc";
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(
             hubs_.hubs[rack]->state_dir() + "/checkpoints")) {
      if (e.path().filename() != name) continue;
      ++n;
      if (!damage) {
        std::filesystem::remove(e.path());
        continue;
      }
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      const auto size = std::filesystem::file_size(e.path());
      f.seekg(static_cast<std::streamoff>(size - 16));
      char c = 0;
      f.get(c);
      f.seekp(static_cast<std::streamoff>(size - 16));
      f.put(static_cast<char>(c ^ 0x5a));
    }
    return n;
  }
  // The sequences of rack `rack`'s hub's checkpoints of the tenant.
  std::vector<uint64_t> Sequences(uint32_t rack) {
    grpc::ClientContext ctx;
    pb::ListCheckpointsRequest req;
    req.set_tenant("job");
    pb::ListCheckpointsResponse resp;
    const grpc::Status s = Checkpoints(rack)->ListCheckpoints(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<uint64_t> out;
    for (const auto& c : resp.checkpoints()) out.push_back(c.sequence());
    std::sort(out.begin(), out.end());
    return out;
  }

  Hubs hubs_;
  std::vector<Worker> w_;
  std::vector<float> ref_u_, ref_z_;
  std::vector<TableReference> table_refs_;
  std::vector<uint64_t> all_rows_;
};

TEST_F(CrossRackRestartTest, ARestartedHubsChunksComeBackFromTheOtherRackAndEveryRackAgrees) {
  std::vector<client::Error> errors;
  std::vector<std::vector<float>> out;
  PullAll(&out);  // every rank has rank 0's values before it pushes
  for (int s = 0; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));

  // Rack 1's hub dies and comes back empty (no checkpoint).
  EXPECT_EQ(hubs_.hubs[1]->Kill(), 128 + 9);
  ASSERT_TRUE(hubs_.hubs[1]->Restart());
  Step(3, &errors, &out);  // refused or rolled back somewhere: the round decides
  const uint64_t z_first = w_[0].c->GetKeyInfo(w_[0].z)->first_chunk;
  uint64_t lost = 0;
  for (uint64_t i = 0; i < kElements; ++i) {
    if (HomeOf(z_first, i) == 1) {
      ref_z_[i] = 0.0f;  // lost with the hub: back to the initial zeros
      ++lost;
    }
  }
  EXPECT_EQ(lost, kElements / 2) << "half of z's chunks are homed on the restarted hub";
  ExpectPulled("after the restart");
  // Table 0's rows kept their home; table 1's went back to zeros with it.
  table_refs_[1].values.assign(kRows * kDim, 0.0f);
  ExpectTables("after the restart");
  ASSERT_NO_FATAL_FAILURE(GoodStep(4));
}

// A cluster checkpoint, then more training, then rack 1's hub is killed and
// restarted: every hub rolls back to the checkpoint.
TEST_F(CrossRackRestartTest, AfterAHubRestartEveryRackRollsBackToTheClusterCheckpoint) {
  std::vector<client::Error> errors;
  std::vector<std::vector<float>> out;
  PullAll(&out);
  for (int s = 0; s < 2; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));
  ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(0, 1));
  EXPECT_EQ(Sequences(0), std::vector<uint64_t>{1});
  EXPECT_EQ(Sequences(1), std::vector<uint64_t>{1}) << "every hub wrote the same sequence";
  const Saved ckpt = Save();
  const uint64_t ckpt_version = w_[0].c->GetKeyInfo(w_[0].u)->next_iteration;

  // Training goes on past the checkpoint, then rack 1's hub dies.
  for (int s = 2; s < 4; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
  EXPECT_EQ(hubs_.hubs[1]->Kill(), 128 + 9);
  ASSERT_TRUE(hubs_.hubs[1]->Restart());
  Step(4, &errors, &out);  // refused somewhere: the round decides
  Rewind(ckpt);
  ExpectPulled("after the rollback");
  EXPECT_EQ(w_[0].c->GetKeyInfo(w_[0].u)->next_iteration, ckpt_version)
      << "the keys are back at the checkpoint's version";
  ExpectTables("after the rollback");
  // The steps after the checkpoint replay exactly.
  for (int s = 2; s < 4; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
}

// Both hubs killed at once (a power cut) and restarted: they resume from the
// newest checkpoint they both have (rack 1's newest was lost: they resume
// the one before it, not each its own newest).
TEST_F(CrossRackRestartTest, AfterEveryHubRestartedTheyResumeTheNewestCommonCheckpoint) {
  std::vector<client::Error> errors;
  std::vector<std::vector<float>> out;
  PullAll(&out);
  ASSERT_NO_FATAL_FAILURE(GoodStep(0));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));
  std::vector<Saved> saved;  // by sequence - 1
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(seq == 1 ? 0 : 1, seq));
    saved.push_back(Save());
    ASSERT_NO_FATAL_FAILURE(GoodStep(static_cast<int>(seq)));
    ASSERT_NO_FATAL_FAILURE(TableStep(seq));
  }
  EXPECT_EQ(hubs_.hubs[0]->Kill(), 128 + 9);
  EXPECT_EQ(hubs_.hubs[1]->Kill(), 128 + 9);
  ASSERT_EQ(RemoveCheckpointFile(1, 2), 1u) << "rack 1's ckpt-2 is lost with its disk";
  ASSERT_TRUE(hubs_.hubs[1]->Restart());
  ASSERT_TRUE(hubs_.hubs[0]->Restart());
  Step(3, &errors, &out);  // refused (or rolled back) while the hubs reconnect
  Rewind(saved[0]);
  ExpectPulled("after both hubs restarted");
  ExpectTables("after both hubs restarted");
  ASSERT_NO_FATAL_FAILURE(GoodStep(1));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
}

// An admin restore of a checkpoint whose file is damaged on one hub: that
// hub cannot load it, and every hub rolls back to the newest checkpoint
// they can all load instead; the call says so.
TEST_F(CrossRackRestartTest, ARestoreOfACheckpointDamagedOnOneHubRollsEveryHubBackToTheOneBefore) {
  std::vector<std::vector<float>> out;
  PullAll(&out);
  ASSERT_NO_FATAL_FAILURE(GoodStep(0));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));
  ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(0, 1));
  const Saved ckpt = Save();
  ASSERT_NO_FATAL_FAILURE(GoodStep(1));
  ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(0, 2));
  ASSERT_NO_FATAL_FAILURE(GoodStep(2));
  ASSERT_EQ(DamageCheckpointFile(1, 2), 1u);
  {
    pb::Checkpoint resp;
    const grpc::Status s = RestoreNewest(0, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
    EXPECT_NE(s.error_message().find("checkpoint 1"), std::string::npos) << s.error_message();
  }
  Rewind(ckpt);
  ExpectPulled("after the restore");
  ExpectTables("after the restore");
  ASSERT_NO_FATAL_FAILURE(GoodStep(1));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
}

// The admin restores a cluster checkpoint while the job runs (asked on rack
// 1's hub: any hub coordinates).
TEST_F(CrossRackRestartTest, AnAdminRestoreBringsEveryRackBackToTheClusterCheckpoint) {
  std::vector<std::vector<float>> out;
  PullAll(&out);
  ASSERT_NO_FATAL_FAILURE(GoodStep(0));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));
  ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(1, 1));
  const Saved ckpt = Save();
  for (int s = 1; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
  {
    pb::Checkpoint resp;
    const grpc::Status s = RestoreNewest(0, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.sequence(), 1u);
  }
  Rewind(ckpt);
  ExpectPulled("after the restore");
  ExpectTables("after the restore");
  for (int s = 1; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
}

// A flat hub (one hub serving both racks, every chunk homed on it) keeps
// local checkpoints of the tenant: a kill -9 and restart resumes its newest.
class FlatHubCheckpointTest : public CrossRackRestartTest {
 protected:
  bool flat() const override { return true; }
};

TEST_F(FlatHubCheckpointTest, AFlatHubRestartedResumesItsCheckpointExactly) {
  std::vector<client::Error> errors;
  std::vector<std::vector<float>> out;
  PullAll(&out);
  ASSERT_NO_FATAL_FAILURE(GoodStep(0));
  ASSERT_NO_FATAL_FAILURE(TableStep(0));
  ASSERT_NO_FATAL_FAILURE(CreateCheckpoint(0, 1));
  const Saved ckpt = Save();
  for (int s = 1; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
  EXPECT_EQ(hubs_.hubs[0]->Kill(), 128 + 9);
  ASSERT_TRUE(hubs_.hubs[0]->Restart());
  Step(3, &errors, &out);  // rolled back: kRolledBack on the reconnect
  Rewind(ckpt);
  ExpectPulled("after the flat hub's restart");
  ExpectTables("after the flat hub's restart");
  for (int s = 1; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(GoodStep(s));
  ASSERT_NO_FATAL_FAILURE(TableStep(1));
}

}  // namespace
}  // namespace rackhub
