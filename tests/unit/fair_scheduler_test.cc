// FairScheduler (server/lanes/fair_scheduler.h): the order in which a lane
// grants its worker connections' turns. Connections here are stand-ins that
// record their turns and ask again at once (a worker that always has frames
// waiting), driven by a real LaneGate on an io_context, as on a lane.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fair_scheduler.h"

namespace rackhub::server {
namespace {

struct Grant {
  uint32_t tenant;
  int conn;
  size_t bytes;
};

// A connection whose peer always has `batch` bytes of frames waiting (when
// `busy`): every turn it is granted is recorded, and it asks for the next.
class TurnTaker final : public net::Connection {
 public:
  TurnTaker(uint32_t tenant, int index, size_t batch, FairScheduler* scheduler,
            std::vector<Grant>* log)
      : batch_(batch), index_(index), scheduler_(scheduler), log_(log) {
    id_.tenant_handle = tenant;
  }
  const net::ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return open_; }
  void Start() override {}
  void SendShared(const net::FrameHeader&, std::span<const std::byte>,
                  std::shared_ptr<const void>) override {}
  void SendOwned(const net::FrameHeader&, std::string) override {}
  void SendError(net::WireError, const std::string&, uint64_t, bool) override {}
  void Close(const std::string&) override { open_ = false; }

  void Ask() {
    ASSERT_FALSE(waiting_) << "a connection asks at most once at a time";
    waiting_ = true;
    scheduler_->RequestTurn(shared_from_this(), batch_);
  }
  void DeliverTurn() override {
    ASSERT_TRUE(waiting_) << "a turn nobody asked for";
    waiting_ = false;
    if (!open_) return;
    log_->push_back({id_.tenant_handle, index_, batch_});
    if (busy) Ask();
  }

  bool busy = true;
  bool waiting() const { return waiting_; }

 private:
  net::ConnectionIdentity id_;
  size_t batch_;
  int index_;
  FairScheduler* scheduler_;
  std::vector<Grant>* log_;
  bool open_ = true;
  bool waiting_ = false;
};

class FairSchedulerTest : public ::testing::Test {
 protected:
  FairSchedulerTest() : gate_(io_), scheduler_(&gate_, [this](uint32_t t) { return weights_[t]; }) {}

  std::shared_ptr<TurnTaker> Add(uint32_t tenant, size_t batch) {
    auto c = std::make_shared<TurnTaker>(tenant, static_cast<int>(conns_.size()), batch,
                                         &scheduler_, &log_);
    conns_.push_back(c);
    return c;
  }
  // Runs the lane until `grants` turns were granted (or nothing is left).
  void RunGrants(size_t grants) {
    while (log_.size() < grants && io_.run_one() > 0) {
    }
  }
  std::map<uint32_t, size_t> BytesByTenant(size_t from = 0) const {
    std::map<uint32_t, size_t> bytes;
    for (size_t i = from; i < log_.size(); ++i) bytes[log_[i].tenant] += log_[i].bytes;
    return bytes;
  }
  void StopAll() {
    for (auto& c : conns_) c->busy = false;
  }

  boost::asio::io_context io_;
  LaneGate gate_;
  std::map<uint32_t, uint32_t> weights_{{1, 1}, {2, 1}, {3, 1}};
  FairScheduler scheduler_;
  std::vector<Grant> log_;
  std::vector<std::shared_ptr<TurnTaker>> conns_;
};

TEST_F(FairSchedulerTest, TenantsShareByWeightNotByConnectionCount) {
  weights_[1] = 1;
  weights_[2] = 3;
  // Tenant 1 has 8 busy connections, tenant 2 only 2: with arrival order
  // tenant 1 would get 80 % of the lane; by weight it gets 25 %.
  for (int i = 0; i < 8; ++i) Add(1, 32 * 1024)->Ask();
  for (int i = 0; i < 2; ++i) Add(2, 32 * 1024)->Ask();
  RunGrants(200);  // warm-up
  const size_t from = log_.size();
  RunGrants(from + 4000);
  auto bytes = BytesByTenant(from);
  const double share2 = static_cast<double>(bytes[2]) / (bytes[1] + bytes[2]);
  EXPECT_NEAR(share2, 0.75, 0.02) << bytes[1] << " vs " << bytes[2];
  // Within a tenant, its connections take turns in the order they asked.
  std::map<int, size_t> per_conn;
  for (size_t i = from; i < log_.size(); ++i) {
    if (log_[i].tenant == 1) ++per_conn[log_[i].conn];
  }
  ASSERT_EQ(per_conn.size(), 8u);
  for (auto& [conn, n] : per_conn) EXPECT_NEAR(n, per_conn.begin()->second, 1.0) << conn;
  StopAll();
  io_.run();
}

// Large weights keep their ratios (no rounding of 1000 / weight).
TEST_F(FairSchedulerTest, LargeWeightsKeepTheirRatio) {
  weights_[1] = 400;
  weights_[2] = 1000;
  Add(1, 32 * 1024)->Ask();
  Add(2, 32 * 1024)->Ask();
  RunGrants(7000);
  auto bytes = BytesByTenant(100);
  EXPECT_NEAR(static_cast<double>(bytes[2]) / bytes[1], 2.5, 0.02);
  StopAll();
  io_.run();
}

// A deleted tenant's connections still get the turns they asked for (and do
// nothing); then the scheduler forgets the tenant.
TEST_F(FairSchedulerTest, ADeletedTenantIsForgotten) {
  auto a = Add(1, 1000);
  auto gone = Add(2, 1 << 20);
  a->busy = gone->busy = false;
  a->Ask();
  gone->Ask();
  weights_[2] = 0;  // deleted meanwhile
  gone->Close("tenant deleted");
  io_.run();
  EXPECT_FALSE(gone->waiting());
  EXPECT_EQ(scheduler_.queued(), 0u);
  EXPECT_EQ(scheduler_.active_tenants(), 0u);
  // Tenant 1 keeps its finish tag (ahead of V: it would order its next
  // request); the deleted tenant is gone.
  EXPECT_EQ(scheduler_.tracked_tenants(), 1u);
}

TEST_F(FairSchedulerTest, BatchesOfDifferentSizesShareByBytes) {
  // Tenant 1 sends 1 MiB batches, tenant 2 4 KiB ones, one connection each
  // (so tenant 2 has one request queued at a time); equal weights.
  Add(1, 1 << 20)->Ask();
  Add(2, 4096)->Ask();
  RunGrants(100);
  const size_t from = log_.size();
  RunGrants(from + 20000);
  auto bytes = BytesByTenant(from);
  const double share1 = static_cast<double>(bytes[1]) / (bytes[1] + bytes[2]);
  EXPECT_NEAR(share1, 0.5, 0.05) << bytes[1] << " vs " << bytes[2];
  StopAll();
  io_.run();
}

TEST_F(FairSchedulerTest, AQuietTenantWaitsForAtMostOneBatchOfTheBusyOne) {
  for (int i = 0; i < 16; ++i) Add(1, 64 * 1024)->Ask();  // 1 MiB of work always waiting
  auto quiet = Add(2, 32 * 1024);
  quiet->busy = false;
  RunGrants(500);
  for (int round = 0; round < 50; ++round) {
    const size_t asked_at = log_.size();
    quiet->Ask();
    while (quiet->waiting() && io_.run_one() > 0) {
    }
    ASSERT_FALSE(quiet->waiting());
    size_t busy_bytes_before = 0;
    for (size_t i = asked_at; i + 1 < log_.size(); ++i) busy_bytes_before += log_[i].bytes;
    EXPECT_EQ(log_.back().tenant, 2u);
    // It waits for at most one batch of the busy tenant (the one whose start
    // tag is its own), not for the 1 MiB backlog of 16 connections.
    EXPECT_LE(busy_bytes_before, 64u * 1024) << "round " << round;
    RunGrants(log_.size() + 7);
  }
  StopAll();
  io_.run();
}

TEST_F(FairSchedulerTest, ALoneTenantIsNeverHeldBackAndOwesNothing) {
  auto a = Add(1, 4 << 20);  // far beyond its quantum
  a->Ask();
  RunGrants(10);
  EXPECT_EQ(log_.size(), 10u);
  // Alone it owed nothing: when a second tenant arrives, the first keeps an
  // equal share instead of paying back the 40 MiB it had alone.
  a->busy = false;
  io_.run();
  auto b = Add(2, 4 << 20);
  a->busy = true;
  a->Ask();
  b->Ask();
  const size_t from = log_.size();
  RunGrants(from + 10);
  auto bytes = BytesByTenant(from);
  EXPECT_EQ(bytes[1], bytes[2]);
  StopAll();
  io_.run();
}

// Virtual time is rebased before it could overflow (months of traffic):
// requests of 2^40 bytes pass the rebase point every few grants, and the
// shares stay exact across it.
TEST_F(FairSchedulerTest, SharesSurviveTheVirtualTimeRebase) {
  weights_[1] = 1;
  weights_[2] = 2;
  Add(1, size_t{1} << 40)->Ask();
  Add(2, size_t{1} << 40)->Ask();
  RunGrants(3000);
  auto bytes = BytesByTenant(300);
  EXPECT_NEAR(static_cast<double>(bytes[2]) / bytes[1], 2.0, 0.01);
  StopAll();
  io_.run();
}

TEST_F(FairSchedulerTest, ClearDropsTheTurnsAndClosedConnectionsGetNone) {
  auto a = Add(1, 1000);
  auto b = Add(2, 1000);
  a->busy = b->busy = false;
  a->Ask();
  b->Ask();
  EXPECT_EQ(scheduler_.queued(), 2u);
  EXPECT_EQ(scheduler_.active_tenants(), 2u);
  scheduler_.Clear();
  io_.run();
  EXPECT_TRUE(log_.empty());
  EXPECT_EQ(scheduler_.queued(), 0u);
  // A connection closed while it waits is granted its turn and does nothing.
  auto c = Add(3, 1000);
  c->busy = false;
  c->Ask();
  c->Close("test");
  io_.restart();
  io_.run();
  EXPECT_FALSE(c->waiting());
  EXPECT_TRUE(log_.empty());
}

TEST_F(FairSchedulerTest, NothingRunsAfterTheGateClosed) {
  auto a = Add(1, 1000);
  a->Ask();
  gate_.Close();
  io_.run();
  EXPECT_TRUE(log_.empty());
  scheduler_.Clear();  // what the lane does at shutdown: drops the connection
  EXPECT_EQ(a.use_count(), 2);  // conns_ and a
}

}  // namespace
}  // namespace rackhub::server
