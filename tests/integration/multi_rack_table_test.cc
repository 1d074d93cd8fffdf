// Row-sparse tables spanning racks (issue 31 item 3; docs/architecture.md,
// Hierarchical rack exchange), with real hubs on loopback and librackhub
// workers (threads of this process, one Client each):
//   - 2 and 3 racks of 2 workers, three tables (SGD with momentum, Adam,
//     row-wise AdaGrad) whose rows have their homes on different racks: every
//     PushPullRows reply and a final PullRows on every worker equal, bit for
//     bit, an independent reference (tests/support/table_reference.h: each
//     rack's rows summed in rank order, the racks' sums in rack order, the
//     optimizer on touched rows) and the same job on one flat hub serving
//     every rack;
//   - a hub link cut during a cross-rack row update (the other rack's hub
//     killed before or while the rows' home waits for its sums) fails the
//     waiting workers' PushPullRows with WORKER_LOST naming the rack, within
//     a bounded time, never a hang;
//   - the table frames on a hub link as docs/wire-protocol.md section 7 has
//     them, sent by the test for rack 1 (a RACK_SUM counts as rack 1's rows),
//     and bad ones refused by name.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "hub_link_auth.h"
#include "process.h"
#include "raw_client.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/client/client.h"
#include "table_racks.h"
#include "table_reference.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using namespace std::chrono_literals;
using client::Client;
using testing::DaemonProcess;
using testing::TablePush;
using testing::TableReference;

using namespace testing::table_racks;

// seen[rack][rank][iteration][table]: every row after that iteration's
// update as the worker's PushPullRows returned it; iteration kIterations:
// a final PullRows.
using Seen = std::vector<std::vector<std::vector<std::vector<std::vector<float>>>>>;

Seen RunJob(uint32_t racks, bool flat) {
  Hubs hubs = StartHubs(racks, flat);
  Seen seen(racks, std::vector(kWorkers, std::vector(kIterations + 1,
                                                     std::vector<std::vector<float>>(kTables.size()))));
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<std::thread> threads;
  for (uint32_t rack = 0; rack < racks; ++rack) {
    for (uint32_t rank = 0; rank < kWorkers; ++rank) {
      threads.emplace_back([&, rack, rank] {
        std::vector<client::KeyId> keys;
        auto c = ConnectWorker(hubs, rack, rank, &keys);
        if (!c) return;
        auto& mine = seen[rack][rank];
        for (int it = 0; it < kIterations; ++it) {
          for (size_t k = 0; k < kTables.size(); ++k) {
            const TablePush p = MakePush(rack, rank, it, k);
            mine[it][k].assign(kRows * kDim, 0.0f);
            const client::Error e =
                c->Wait(c->PushPullRows(keys[k], p.ids, p.rows, all, mine[it][k]));
            EXPECT_TRUE(e.ok()) << "rack " << rack << " rank " << rank << " iteration " << it
                                << " " << kTables[k].name << ": " << e.message;
          }
        }
        for (size_t k = 0; k < kTables.size(); ++k) {
          mine[kIterations][k].assign(kRows * kDim, 0.0f);
          const client::Error e = c->Wait(c->PullRows(keys[k], all, mine[kIterations][k]));
          EXPECT_TRUE(e.ok()) << e.message;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  return seen;
}

bool SameBits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

TEST(MultiRackTableTest, RowsAcrossRacksEqualTheReferenceAndOneFlatHubBitForBit) {
  for (const uint32_t racks : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(racks) + " racks");
    const Seen hier = RunJob(racks, false);
    const Seen flat = RunJob(racks, true);
    for (size_t k = 0; k < kTables.size(); ++k) {
      SCOPED_TRACE(kTables[k].name);
      TableReference ref(ConfigOf(kTables[k]), racks * kWorkers, 0, kRows, kDim);
      for (int it = 0; it <= kIterations; ++it) {
        if (it < kIterations) {
          std::vector<std::vector<TablePush>> by_rack(racks);
          for (uint32_t rack = 0; rack < racks; ++rack) {
            for (uint32_t rank = 0; rank < kWorkers; ++rank) {
              by_rack[rack].push_back(MakePush(rack, rank, it, k));
            }
          }
          ref.UpdateAcrossRacks(by_rack);
        }
        for (uint32_t rack = 0; rack < racks; ++rack) {
          for (uint32_t rank = 0; rank < kWorkers; ++rank) {
            EXPECT_TRUE(SameBits(hier[rack][rank][it][k], ref.values.data(), kRows * kDim))
                << "hierarchical, rack " << rack << " rank " << rank << " iteration " << it;
            EXPECT_EQ(hier[rack][rank][it][k], flat[rack][rank][it][k])
                << "hierarchical and flat differ: rack " << rack << " rank " << rank
                << " iteration " << it;
          }
        }
      }
      // The tables moved: the check compares something.
      EXPECT_NE(ref.values, std::vector<float>(kRows * kDim, 0.0f));
    }
  }
}

// A hub link cut during a cross-rack row update fails the workers waiting on
// it with WORKER_LOST naming the rack, for each place of the cut: rack 1's
// hub killed (a) before rack 0's workers push rows homed on rack 1, (b)
// after rack 0's workers pushed rows homed on rack 0, which wait for rack
// 1's sums, (c) likewise for rows homed on rack 1 (rack 0's sums sent).
TEST(MultiRackTableTest, ALinkCutDuringARowUpdateFailsTheWaitingWorkersNamingTheRack) {
  enum Cut { kBeforePush, kHomeWaits, kSumSent };
  for (const Cut cut : {kBeforePush, kHomeWaits, kSumSent}) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    Hubs hubs = StartHubs(2, false);
    std::vector<client::KeyId> keys0, keys1;
    auto w0 = ConnectWorker(hubs, 0, 0, &keys0, 30s);
    auto w1 = ConnectWorker(hubs, 0, 1, &keys1, 30s);
    ASSERT_TRUE(w0 && w1);
    // Table 0's rows have their home on rack 0, table 1's on rack 1.
    const size_t table = cut == kHomeWaits ? 0 : 1;
    const TablePush p = MakePush(0, 0, 0, 0);
    std::vector<uint64_t> want = {0, kRows - 1};
    std::vector<float> out0(want.size() * kDim), out1(want.size() * kDim);
    if (cut == kBeforePush) EXPECT_EQ(hubs.hubs[1]->Stop(SIGKILL), 128 + SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    const auto t0 = w0->PushPullRows(keys0[table], p.ids, p.rows, want, out0);
    const auto t1 = w1->PushPullRows(keys1[table], p.ids, p.rows, want, out1);
    if (cut != kBeforePush) {
      // Cut once rack 0's hub counted both pushes (its rack's sums are
      // formed) and, for rows homed on rack 1, sent those sums there.
      const std::string& admin = hubs.hubs[0]->admin_address();
      EXPECT_TRUE(testing::WaitForPushes(admin, "job", 2));
      if (cut == kSumSent) {
        EXPECT_TRUE(testing::WaitUntil("rack 0's row sums sent to rack 1", [&] {
          const auto stats = testing::HubStats(admin);
          for (const auto& link : stats.daemon().rack_links()) {
            if (link.peer_rack() == 1 && link.chunk_bytes_out() > 0) return true;
          }
          return false;
        }));
      }
      EXPECT_EQ(hubs.hubs[1]->Stop(SIGKILL), 128 + SIGKILL);
    }
    for (auto [w, t] : {std::pair{w0.get(), t0}, std::pair{w1.get(), t1}}) {
      const client::Error e = w->Wait(t);
      EXPECT_EQ(e.code, client::ErrorCode::kServer) << e.message;
      EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
      EXPECT_NE(e.message.find("hub of rack 1"), std::string::npos) << e.message;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 15s)
        << "a lost hub is an error within a bounded time, not a hang";
  }
}

// Rack 1's hub killed with -9 at random points of a running 2-rack job: at
// a random op K (iteration and table), rack 1's workers stop before pushing
// it; once rack 0's hub counted its workers' pushes through op K, rack 1's
// hub is killed. Every PushPullRows of rack 0's workers before op K returns
// the reference's rows bit for bit, and op K fails with WORKER_LOST naming
// rack 1 (the rows' home waited for rack 1's sums, or rack 0's sums waited
// for rack 1's answer), within a bounded time: no hang, no wrong rows.
TEST(MultiRackTableTest, KillingARacksHubAtRandomPointsFailsTheUpdateInFlightByName) {
  std::mt19937 pick(20261128);
  const size_t ops = kIterations * kTables.size();
  for (int trial = 0; trial < 5; ++trial) {
    const size_t cut_op = pick() % ops;  // op = iteration * tables + table
    SCOPED_TRACE("trial " + std::to_string(trial) + ": cut at op " + std::to_string(cut_op));
    Hubs hubs = StartHubs(2, false);
    Seen seen(2, std::vector(kWorkers, std::vector(kIterations,
                                                   std::vector<std::vector<float>>(kTables.size()))));
    std::vector<std::vector<client::Error>> first_error(2, std::vector<client::Error>(kWorkers));
    std::vector<std::vector<size_t>> failed_at(2, std::vector<size_t>(kWorkers, ops));
    std::vector<std::chrono::steady_clock::time_point> ended(kWorkers);  // rack 0's workers
    std::promise<void> cut;
    std::shared_future<void> cut_done = cut.get_future().share();
    std::vector<uint64_t> all(kRows);
    for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
    std::vector<std::thread> threads;
    for (uint32_t rack = 0; rack < 2; ++rack) {
      for (uint32_t rank = 0; rank < kWorkers; ++rank) {
        threads.emplace_back([&, rack, rank] {
          std::vector<client::KeyId> keys;
          // (Rack 1's workers lose their hub: their client gives up at its op timeout.)
          auto c = ConnectWorker(hubs, rack, rank, &keys, rack == 0 ? 60s : 15s);
          if (!c) return;
          struct MarkEnd {
            std::chrono::steady_clock::time_point* at;
            ~MarkEnd() {
              if (at) *at = std::chrono::steady_clock::now();
            }
          } mark{rack == 0 ? &ended[rank] : nullptr};
          for (size_t op = 0; op < ops; ++op) {
            if (rack == 1 && op == cut_op) cut_done.wait();  // its hub is gone then
            const int it = static_cast<int>(op / kTables.size());
            const size_t k = op % kTables.size();
            const TablePush p = MakePush(rack, rank, it, k);
            auto& out = seen[rack][rank][it][k];
            out.assign(kRows * kDim, 0.0f);
            const client::Error e = c->Wait(c->PushPullRows(keys[k], p.ids, p.rows, all, out));
            if (!e.ok()) {
              out.clear();
              first_error[rack][rank] = e;
              failed_at[rack][rank] = op;
              return;
            }
          }
        });
      }
    }
    // Rack 0's workers have pushed ops 0..K (rack 1's only up to K - 1).
    EXPECT_TRUE(testing::WaitForPushes(hubs.hubs[0]->admin_address(), "job",
                                       (cut_op + 1) * kWorkers));
    EXPECT_EQ(hubs.hubs[1]->Stop(SIGKILL), 128 + SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    cut.set_value();
    for (auto& t : threads) t.join();
    for (uint32_t rank = 0; rank < kWorkers; ++rank) {
      EXPECT_LT(ended[rank] - killed, 20s) << "rack 0 rank " << rank << ": no hang after the cut";
    }
    std::vector<TableReference> refs;
    for (const TableKind& k : kTables) refs.emplace_back(ConfigOf(k), 2 * kWorkers, 0, kRows, kDim);
    for (size_t op = 0; op < cut_op; ++op) {
      const int it = static_cast<int>(op / kTables.size());
      const size_t k = op % kTables.size();
      std::vector<std::vector<TablePush>> by_rack(2);
      for (uint32_t rack = 0; rack < 2; ++rack) {
        for (uint32_t rank = 0; rank < kWorkers; ++rank) {
          by_rack[rack].push_back(MakePush(rack, rank, it, k));
        }
      }
      refs[k].UpdateAcrossRacks(by_rack);
      for (uint32_t rack = 0; rack < 2; ++rack) {
        for (uint32_t rank = 0; rank < kWorkers; ++rank) {
          EXPECT_TRUE(SameBits(seen[rack][rank][it][k], refs[k].values.data(), kRows * kDim))
              << "rack " << rack << " rank " << rank << " op " << op;
        }
      }
    }
    for (uint32_t rank = 0; rank < kWorkers; ++rank) {
      const client::Error& e = first_error[0][rank];
      EXPECT_EQ(failed_at[0][rank], cut_op) << e.message;
      EXPECT_EQ(e.code, client::ErrorCode::kServer) << e.message;
      EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
      EXPECT_NE(e.message.find("hub of rack 1"), std::string::npos) << e.message;
    }
  }
}

// Hub-link frames of a table, as rack 1's hub would send them to rack 0's
// (docs/wire-protocol.md section 7), from a link the test opens with the
// secret: a well-formed RACK_SUM counts as rack 1's rows (the result equals
// the reference with those sums as rack 1's), and bad ones are refused by
// name: not fp32 (fatal BAD_DTYPE), ids not ascending or out of the range
// (fatal INVALID_ARGUMENT), a stale iteration (non-fatal, dropped).
TEST(MultiRackTableTest, RowFramesOnAHubLinkFollowTheDocumentAndBadOnesAreRefusedByName) {
  Hubs hubs = StartHubs(2, false);
  EXPECT_EQ(hubs.hubs[1]->Stop(SIGKILL), 128 + SIGKILL);  // the test speaks for rack 1
  std::vector<client::KeyId> keys0, keys1;
  auto w0 = ConnectWorker(hubs, 0, 0, &keys0, 30s);
  auto w1 = ConnectWorker(hubs, 0, 1, &keys1, 30s);
  ASSERT_TRUE(w0 && w1);
  const TableKind& table = kTables[0];  // first_chunk 0: its home is rack 0
  pb::Key key;
  {
    auto stub = pb::KeyService::NewStub(grpc::CreateChannel(
        hubs.hubs[0]->admin_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    pb::GetKeyRequest req;
    req.set_tenant("job");
    req.set_name(table.name);
    ASSERT_TRUE(stub->GetKey(&ctx, req, &key).ok());
    ASSERT_EQ(key.first_chunk(), 0u);
  }
  data::v1::KeyBind bind;
  bind.set_tenant("job");
  bind.set_key(table.name);
  bind.set_key_id(key.id());
  bind.set_elements(kRows * kDim);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(key.first_chunk());
  bind.set_chunk_elements(key.chunk_elements());
  bind.set_workers_per_rack(kWorkers);
  bind.set_init(pb::ZEROS);
  bind.set_rows(kRows);
  bind.set_dim(kDim);
  net::FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 9;  // "rack 1's" handle of the tenant
  kb.key = key.id();
  const auto frame = [](net::FrameHeader h, const std::string& payload) {
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    std::array<std::byte, net::kHeaderBytes> buf;
    net::EncodeHeader(h, buf);
    return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
  };
  // A row payload: count, want 0, ids, fp32 rows.
  const auto rows_payload = [](const TablePush& p) {
    std::string s = net::EncodeRowsRequest(p.ids, {});
    s.append(reinterpret_cast<const char*>(p.rows.data()), p.rows.size() * sizeof(float));
    return s;
  };
  net::FrameHeader sum = kb;
  sum.opcode = net::Opcode::kRackSum;
  sum.chunk = 0;
  sum.dtype = net::DType::kFp32;
  sum.iteration = 0;
  const auto open_link = [&](testing::RawClient& link) {
    return testing::OpenHubLink(link, hubs.secret, testing::HubLinkRef{1, 0, 0, 2, 1},
                                frame(kb, bind.SerializeAsString()));
  };
  TablePush rack1;  // rack 1's sums: distinct ascending ids
  rack1.ids = {2, 5, kRows - 1};
  rack1.rows = {0.5f, -1.25f, 3.0f, 0.75f, 0.0f, -2.5f, 1.0f, 2.0f, -0.125f};
  {
    testing::RawClient bad(hubs.interhub[0]);
    ASSERT_TRUE(open_link(bad));
    net::FrameHeader h = sum;
    h.dtype = net::DType::kBf16;
    bad.SendRaw(frame(h, rows_payload(rack1)));
    testing::ExpectError(bad.Receive(), net::WireError::kBadDType,
                         "dtype: RACK_SUM of table '" + table.name +
                             "' chunk 0 must carry fp32 rows, got bf16");
    EXPECT_TRUE(bad.ClosedByPeer()) << "a fatal refusal closes the link";
  }
  for (const auto& [ids, text] :
       {std::pair{std::vector<uint64_t>{5, 2, 7}, std::string("ids: row 2 follows row 5; a hub "
                                                             "link's row ids are strictly "
                                                             "ascending")},
        std::pair{std::vector<uint64_t>{2, 5, 99}, std::string("row id 99 is not in [0, 23)")}}) {
    testing::RawClient bad(hubs.interhub[0]);
    ASSERT_TRUE(open_link(bad));
    TablePush p = rack1;
    p.ids = ids;
    bad.SendRaw(frame(sum, rows_payload(p)));
    testing::ExpectError(bad.Receive(), net::WireError::kInvalidArgument,
                         "RACK_SUM of table '" + table.name + "' chunk 0: " + text);
    EXPECT_TRUE(bad.ClosedByPeer()) << "a fatal refusal closes the link";
  }
  // A table of another shape or random init on "rack 1": refused by name
  // (its frames would otherwise meet rows laid out differently). The link
  // stays open: a hub link lost would start a recovery round, which this
  // stand-in for rack 1's hub does not answer.
  data::v1::KeyBind other = bind;
  other.set_init_seed(7);
  testing::RawClient other_link(hubs.interhub[0]);
  ASSERT_TRUE(testing::OpenHubLink(other_link, hubs.secret, testing::HubLinkRef{1, 0, 0, 2, 1},
                                   frame(kb, other.SerializeAsString())));
  testing::ExpectError(other_link.Receive(), net::WireError::kInvalidArgument,
                       "is laid out or initialized differently on the two racks", false);
  testing::RawClient link(hubs.interhub[0]);
  ASSERT_TRUE(open_link(link));
  net::FrameHeader stale = sum;
  stale.iteration = 7;
  link.SendRaw(frame(stale, rows_payload(rack1)));
  testing::ExpectError(link.Receive(), net::WireError::kInvalidArgument,
                       "iteration: 7 of RACK_SUM of table '" + table.name +
                           "' chunk 0, expected 0",
                       false);
  link.SendRaw(frame(sum, rows_payload(rack1)));  // the link is still up
  // Rack 0's workers push; the update adds rack 1's sums in rack order.
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<TablePush> rack0 = {MakePush(0, 0, 1, 0), MakePush(0, 1, 1, 0)};
  std::vector<float> out0(kRows * kDim), out1(kRows * kDim);
  const auto t0 = w0->PushPullRows(keys0[0], rack0[0].ids, rack0[0].rows, all, out0);
  const auto t1 = w1->PushPullRows(keys1[0], rack0[1].ids, rack0[1].rows, all, out1);
  for (auto [w, t] : {std::pair{w0.get(), t0}, std::pair{w1.get(), t1}}) {
    const client::Error e = w->Wait(t);
    EXPECT_TRUE(e.ok()) << e.message;
  }
  TableReference ref(ConfigOf(table), 2 * kWorkers, 0, kRows, kDim);
  ref.UpdateAcrossRacks({rack0, {rack1}});
  EXPECT_TRUE(SameBits(out0, ref.values.data(), kRows * kDim));
  EXPECT_TRUE(SameBits(out1, ref.values.data(), kRows * kDim));
}

// A rack's workers whose PushPullRows timed out in the client (the other
// rack had not pushed): their rack's sum was already taken for the home, so
// rank 0 pushing the same iteration again is refused by name as a
// duplicate, never counted a second time (it was counted into a new rack
// sum: the home applied rack 0 twice, or rank 0's rows of iteration 0 went
// into iteration 1). One rank repeats: a second repeat could arrive after
// the first one's fatal refusal closed its connection, and the hub's
// recovery from that loss.
TEST(MultiRackTableTest, APushRepeatedAfterAClientTimeoutIsNeverCountedTwice) {
  Hubs hubs = StartHubs(2, false);
  std::vector<client::KeyId> k0, k1;
  auto w0 = ConnectWorker(hubs, 0, 0, &k0, 2s);
  auto w1 = ConnectWorker(hubs, 0, 1, &k1, 2s);
  ASSERT_TRUE(w0 && w1);
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  const std::vector<TablePush> rack0 = {MakePush(0, 0, 0, 0), MakePush(0, 1, 0, 0)};
  std::vector<float> o0(kRows * kDim), o1(kRows * kDim);
  const client::Ticket t0 = w0->PushPullRows(k0[0], rack0[0].ids, rack0[0].rows, all, o0);
  const client::Ticket t1 = w1->PushPullRows(k1[0], rack0[1].ids, rack0[1].rows, all, o1);
  const client::Error e0 = w0->Wait(t0);
  const client::Error e1 = w1->Wait(t1);
  // Rack 1 never pushes: the client's op_timeout.
  EXPECT_EQ(e0.code, client::ErrorCode::kTimeout) << e0.message;
  EXPECT_EQ(e1.code, client::ErrorCode::kTimeout) << e1.message;
  const client::Error again =
      w0->Wait(w0->PushPullRows(k0[0], rack0[0].ids, rack0[0].rows, all, o0));
  EXPECT_FALSE(again.ok()) << "a repeated push of iteration 0 was answered";
  EXPECT_NE(again.message.find("DUPLICATE_PUSH"), std::string::npos) << again.message;
}

// The home's new values of every touched row travel in one RACK_PARAMS: an
// update whose union of rows (each rack's sum fits a frame) would not is
// failed at the home before it is applied, naming the limit, and every
// hub's rows stay as they were (it was applied at the home and refused as
// MALFORMED by the other hub, which then stayed behind for good).
TEST(MultiRackTableTest, AnUpdateTooLargeForOneHubLinkFrameIsFailedBeforeItIsApplied) {
  Hubs hubs = StartHubs(2, false, "3000");
  constexpr uint64_t kBigRows = 20000;
  constexpr uint32_t kBigDim = 1024;
  std::vector<std::unique_ptr<Client>> w;
  std::vector<client::KeyId> ids;
  for (uint32_t rack = 0; rack < 2; ++rack) {
    for (uint32_t rank = 0; rank < kWorkers; ++rank) {
      std::vector<client::KeyId> keys;
      auto c = ConnectWorker(hubs, rack, rank, &keys, 30s);
      ASSERT_TRUE(c);
      client::KeyDecl decl;
      decl.name = "big";
      decl.rows = kBigRows;
      decl.dim = kBigDim;
      decl.optimizer = SpecOf(kTables[0]);
      client::KeyId id = 0;
      const client::Error d = c->DeclareKey(decl, &id);
      ASSERT_TRUE(d.ok()) << d.message;
      ids.push_back(id);
      w.push_back(std::move(c));
    }
  }
  // Each rack touches 9000 rows (36 MiB of sums), the union 18000 (72 MiB).
  std::vector<std::vector<uint64_t>> push_ids(4);
  std::vector<std::vector<float>> rows(4), outs(4, std::vector<float>(kBigDim));
  for (size_t i = 0; i < 4; ++i) {
    const uint64_t base = i < 2 ? 0 : 10000;
    for (uint64_t r = 0; r < 9000; ++r) push_ids[i].push_back(base + r);
    rows[i].assign(9000ull * kBigDim, 0.001f * static_cast<float>(i + 1));
  }
  const std::vector<uint64_t> want = {0};
  std::vector<client::Ticket> t;
  for (size_t i = 0; i < 4; ++i) {
    t.push_back(w[i]->PushPullRows(ids[i], push_ids[i], rows[i], want, outs[i]));
  }
  bool named = false;
  for (size_t i = 0; i < 4; ++i) {
    const client::Error e = w[i]->Wait(t[i]);
    EXPECT_FALSE(e.ok()) << "worker " << i << ": an update too large was applied";
    named = named || e.message.find("push fewer distinct rows at once") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no worker was told the update is too large";
  // Nothing was applied anywhere: rows 5 and 10005 are their initial zeros
  // on both racks' hubs.
  const std::vector<uint64_t> probe = {5, 10005};
  for (size_t i = 0; i < 4; i += 2) {
    std::vector<float> o(probe.size() * kBigDim, 1.0f);
    const client::Error e = w[i]->Wait(w[i]->PullRows(ids[i], probe, o));
    ASSERT_TRUE(e.ok()) << e.message;
    for (float v : o) ASSERT_EQ(v, 0.0f) << "rack " << i / 2 << " applied part of the update";
  }
}

}  // namespace
}  // namespace rackhub
