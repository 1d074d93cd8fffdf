// The client survives a hub restart and a lost peer (client.h, "Reconnect"
// and "Resynchronization"; docs/errors.md), clients in this process:
//   Memory: the hub runs in this process (in_process_hub.h), the clients'
//           lanes are in-memory links into it (rackhub/client/testing.h: the
//           production client, lanes included); a crash is Hub::Crash (every
//           link dropped, nothing sent or checkpointed), a restart a new Hub
//           on the same state directory, reached by the same dialer; the
//           lost peer is a client of a thread whose links are closed abruptly;
//   Tcp, Shm, Rdma: real rackhubd processes (killed with SIGKILL and
//           restarted on the same ports and state directory); a reconnect
//           dials the same transport again: a fresh shared-memory offer from
//           the restarted hub, a new RDMA connection to its listener. The
//           RDMA instances skip without a verbs device; tests/rdma/run.sh
//           runs them in a Soft-RoCE VM (CTest entry client_reconnect_rdma).
// Nothing here waits for time: where a test needs the hub to hold a push
// before it acts, it waits for the hub's rackhub_pushes_total to count it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "http_get.h"
#include "in_process_hub.h"
#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/rackhub_c.h"
#include "rackhub/client/testing.h"
#include "rdma_env.h"

namespace rackhub::client {
namespace {

using Clock = std::chrono::steady_clock;
using rackhub::testing::BinPath;
using rackhub::testing::CommandResult;
using rackhub::testing::DaemonProcess;
using rackhub::testing::InProcessHub;
using rackhub::testing::MakeTempDir;
using rackhub::testing::RunCommand;
using rackhub::testing::WriteFile;

constexpr char kTenant[] = "rc";
constexpr char kToken[] = "reconnect-test-token-0123456789abcdef";
constexpr uint64_t kElements = 5000;  // 5 chunks of 1024 over 2 lanes
constexpr double kChunks = 5;

std::string Describe(const CommandResult& r) {
  return "exit=" + std::to_string(r.exit_code) + "\n" + r.out + r.err;
}

// The sum of every sample of `name` on the hub's /metrics, or -1 when the
// hub does not answer.
double MetricSum(const std::string& address, const std::string& name) {
  const rackhub::testing::HttpResponse r = rackhub::testing::HttpGet(address, "/metrics");
  if (r.status != 200) return -1;
  double sum = 0;
  size_t at = 0;
  while (at < r.body.size()) {
    const size_t end = std::min(r.body.find('\n', at), r.body.size());
    const std::string line = r.body.substr(at, end - at);
    at = end + 1;
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// The parameter: the transport the clients use (and reconnect over).
enum class Link { kMemory, kTcp, kShm, kRdma };

class ClientReconnectTest : public ::testing::TestWithParam<Link> {
 protected:
  void SetUp() override {
    // No periodic checkpoints: a hub killed with SIGKILL comes back with
    // every key at version 0 (a rollback to 0); a graceful stop still writes
    // one (checkpoint.on_shutdown).
    std::vector<std::string> args = {"--lanes", "2", "--checkpoint-every-iterations", "0",
                                     "--checkpoint-every-seconds", "0"};
    if (in_memory()) {
      std::string why;
      memory_hub_ = InProcessHub::Start(args, &why);  // durable state in a temp dir
      ASSERT_TRUE(memory_hub_) << why;
    } else {
      if (GetParam() == Link::kRdma) {
        std::string ip, why;
        if (!rackhub::testing::HaveRdma(&ip, &why)) GTEST_SKIP() << why;
        // rdma_cm ports are not in the ready file: a fixed port per test
        // process, kept across restarts (DaemonProcess::Restart reuses args).
        rdma_hub_ = ip + ":" + std::to_string(23000 + (getpid() % 2000) * 4);
        args.insert(args.end(), {"--transport", "rdma", "--rdma-listen", rdma_hub_});
      }
      daemon_ = std::make_unique<DaemonProcess>(args);
      ASSERT_TRUE(daemon_->started());
    }
    token_dir_ = MakeTempDir();
    token_file_ = token_dir_ + "/token";
    WriteFile(token_file_, kToken);
    CreateTenant();
  }
  void TearDown() override {
    std::error_code ec;
    if (!token_dir_.empty()) std::filesystem::remove_all(token_dir_, ec);
  }

  // Creates the tenant with the fixed token unless the (durable) registry
  // brought it back.
  void CreateTenant() {
    const CommandResult r = RunCommand(
        {BinPath("rackhubctl"), "--admin", admin_address(), "tenant", "create", kTenant,
         "--workers", "2", "--chunk-bytes", "4KiB", "--tenant-token-file", token_file_});
    if (r.exit_code != 0) {
      ASSERT_NE(r.err.find("exist"), std::string::npos) << Describe(r);
    }
  }

  bool in_memory() const { return GetParam() == Link::kMemory; }
  // Of the hub that runs now (an in-process hub's ports change at a restart).
  std::string admin_address() const {
    return in_memory() ? memory_hub_->admin_address() : daemon_->admin_address();
  }
  std::string data_address() const {
    return in_memory() ? memory_hub_->data_address() : daemon_->data_address();
  }
  std::string metrics_address() const {
    return in_memory() ? memory_hub_->metrics_address() : daemon_->metrics_address();
  }
  std::string HubLog() const {
    return in_memory() ? "(in-process hub: its log is this test's stderr)" : daemon_->Log();
  }
  // A crash: SIGKILL of rackhubd, Hub::Crash in-process.
  void KillHub() {
    if (in_memory()) {
      memory_hub_->Kill();
    } else {
      EXPECT_EQ(daemon_->Kill(), 128 + 9);
    }
  }
  // The graceful stop: SIGTERM of rackhubd (exit 0), Hub::Stop in-process.
  void StopHub() {
    if (in_memory()) {
      memory_hub_->Stop();
    } else {
      EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
    }
  }
  // The hub again, on the same state directory.
  bool RestartHub() {
    if (!in_memory()) return daemon_->Restart();
    const Status s = memory_hub_->Restart();
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok();
  }

  // A client over the parameter's transport; `dial`, in-memory only, replaces
  // the hub's dialer (the lost peer's records its links).
  std::unique_ptr<Client> Connect(uint32_t rank,
                                  std::chrono::milliseconds op_timeout = std::chrono::seconds(20),
                                  bool reconnect = true,
                                  client::testing::LaneDialer dial = nullptr) {
    Options o;
    o.hub = data_address();
    o.tenant = kTenant;
    o.token = kToken;
    o.rank = rank;
    o.op_timeout = op_timeout;
    o.reconnect = reconnect;
    o.shm = shm() ? Shm::kOn : Shm::kOff;
    if (GetParam() == Link::kRdma) {
      o.transport = Transport::kRdma;
      o.rdma_hub = rdma_hub_;
    }
    Error e;
    auto c = in_memory() ? client::testing::ConnectThrough(
                               o, memory_hub_->link_io(),
                               dial ? std::move(dial) : memory_hub_->dialer(), &e)
                         : Client::Connect(o, &e);
    EXPECT_TRUE(c) << e.message;
    if (c) {
      EXPECT_STREQ(c->transport(), transport());
    }
    return c;
  }
  bool shm() const { return GetParam() == Link::kShm; }
  // The name Client::transport() gives the parameter's transport.
  const char* transport() const {
    switch (GetParam()) {
      case Link::kMemory: return "memory";
      case Link::kShm: return "shm";
      case Link::kRdma: return "rdma";
      case Link::kTcp: break;
    }
    return "tcp";
  }

  // Waits until the hub has counted `chunks` PUSH frames in all (its lanes
  // publish their counters as they go).
  bool HubCountedPushes(double chunks) {
    return WaitFor(
        [&] { return MetricSum(metrics_address(), "rackhub_pushes_total") >= chunks; },
        std::chrono::seconds(30));
  }

  static KeyId Declare(Client& c) {
    KeyDecl d;
    d.name = "w";
    d.elements = kElements;
    OptimizerSpec sgd;
    sgd.type = "sgd";
    sgd.learning_rate = 0.1;
    d.optimizer = sgd;
    KeyId id = 0;
    const Error e = c.DeclareKey(d, &id);
    EXPECT_TRUE(e.ok()) << e.message;
    return id;
  }

  // One iteration with both ranks; returns rank 0's parameters.
  static std::vector<float> Step(Client& a, Client& b, KeyId key, float g) {
    std::vector<float> ga(kElements, g), gb(kElements, 2 * g), oa(kElements), ob(kElements);
    const Ticket ta = a.PushPull(key, ga, oa);
    const Ticket tb = b.PushPull(key, gb, ob);
    const Error ea = a.Wait(ta);
    const Error eb = b.Wait(tb);
    EXPECT_TRUE(ea.ok()) << ea.message;
    EXPECT_TRUE(eb.ok()) << eb.message;
    EXPECT_EQ(oa, ob);
    return oa;
  }

  static bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return cond();
  }

  std::string token_dir_;
  std::string token_file_;
  std::string rdma_hub_;  // the hub's RDMA listener (RDMA instances)
  std::unique_ptr<DaemonProcess> daemon_;      // Tcp, Shm, Rdma
  std::unique_ptr<InProcessHub> memory_hub_;  // Memory
};

// kill -9 while rank 0's PushPull waits for rank 1: rank 0 reconnects and the
// PushPull completes with kRolledBack (the hub came back at an older version);
// idle rank 1 reconnects too and its next PushPull reports kRolledBack at
// once. After a Pull both continue from the hub's version.
TEST_P(ClientReconnectTest, HubKilledDuringPushPullRollsBack) {
  auto c0 = Connect(0);
  auto c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  const KeyId key = Declare(*c0);
  ASSERT_EQ(Declare(*c1), key);
  for (int i = 0; i < 3; ++i) Step(*c0, *c1, key, 0.5f + i);
  ASSERT_EQ(c0->GetKeyInfo(key)->next_iteration, 3u);

  std::vector<float> grad(kElements, 1.0f), out(kElements, -7.0f);
  const Ticket pending = c0->PushPull(key, grad, out);  // waits for rank 1
  ASSERT_TRUE(HubCountedPushes(7 * kChunks)) << "the hub never held rank 0's push";
  KillHub();
  ASSERT_TRUE(RestartHub());
  CreateTenant();

  const Error e = c0->Wait(pending);
  ASSERT_EQ(e.code, ErrorCode::kRolledBack) << e.message;
  const KeyInfo info = *c0->GetKeyInfo(key);
  EXPECT_LT(e.iteration, 3u);
  EXPECT_EQ(e.iteration, info.version);
  EXPECT_EQ(info.next_iteration, e.iteration);
  EXPECT_TRUE(info.resync_needed);
  EXPECT_EQ(e.message, "hub restarted: key 'w' rolled back to iteration " +
                           std::to_string(e.iteration) + " (was 3)");
  EXPECT_GE(c0->reconnects(), 1u);
  EXPECT_STREQ(c0->transport(), transport()) << "a reconnect keeps the transport";
  // Still marked: the next PushPull fails at once, nothing sent.
  EXPECT_EQ(c0->Wait(c0->PushPull(key, grad, out)).code, ErrorCode::kRolledBack);

  ASSERT_TRUE(WaitFor([&] { return c1->reconnects() >= 1; }, std::chrono::seconds(10)));
  std::vector<float> out1(kElements);
  const Error e1 = c1->Wait(c1->PushPull(key, grad, out1));
  ASSERT_EQ(e1.code, ErrorCode::kRolledBack) << e1.message;
  EXPECT_EQ(e1.iteration, e.iteration);

  // Pull resyncs; then the loop continues at the hub's version.
  std::vector<float> p0(kElements), p1(kElements);
  ASSERT_TRUE(c0->Wait(c0->Pull(key, p0)).ok());
  ASSERT_TRUE(c1->Wait(c1->Pull(key, p1)).ok());
  EXPECT_EQ(p0, p1);
  EXPECT_FALSE(c0->GetKeyInfo(key)->resync_needed);
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, e.iteration);
  Step(*c0, *c1, key, 0.25f);
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, e.iteration + 1);
  EXPECT_EQ(c1->GetKeyInfo(key)->next_iteration, e.iteration + 1);
}

// A graceful stop (SIGTERM: SHUTTING_DOWN) and restart loses nothing: the
// pending PushPull is not failed with SHUTTING_DOWN but re-sent after the
// reconnect; the hub wrote a checkpoint on its way down (checkpoint.on_shutdown)
// and resumed from it, so the iteration completes once rank 1 pushes too,
// with the values of a run that never stopped.
TEST_P(ClientReconnectTest, GracefulRestartLosesNothing) {
  auto c0 = Connect(0);
  auto c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  const KeyId key = Declare(*c0);
  ASSERT_EQ(Declare(*c1), key);
  const std::vector<float> after1 = Step(*c0, *c1, key, 1.0f);
  std::vector<float> grad(kElements, 1.0f), grad1(kElements, 3.0f), out(kElements), out1(kElements);
  const Ticket pending = c0->PushPull(key, grad, out);  // iteration 1, waits for rank 1
  ASSERT_TRUE(HubCountedPushes(3 * kChunks)) << "the hub never held rank 0's push";
  StopHub();
  ASSERT_TRUE(RestartHub());
  ASSERT_TRUE(WaitFor([&] { return c1->reconnects() >= 1; }, std::chrono::seconds(10)));
  const Ticket t1 = c1->PushPull(key, grad1, out1);
  const Error e = c0->Wait(pending);
  ASSERT_TRUE(e.ok()) << e.message << HubLog();
  ASSERT_TRUE(c1->Wait(t1).ok());
  EXPECT_EQ(out, out1);
  // SGD lr 0.1 on the mean: iteration 1's mean gradient is 2.
  for (size_t i = 0; i < kElements; i += 997) {
    EXPECT_FLOAT_EQ(out[i], after1[i] - 0.1f * 2.0f) << i;
  }
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, 2u);
  EXPECT_FALSE(c0->GetKeyInfo(key)->resync_needed);
}

// The hub never comes back: the pending ticket fails with kConnectionLost
// within its op_timeout (no hang), and the client is unusable afterwards.
TEST_P(ClientReconnectTest, HubNeverBackFailsWithinOpTimeout) {
  auto c0 = Connect(0, std::chrono::milliseconds(2000));
  auto c1 = Connect(1, std::chrono::milliseconds(2000));
  ASSERT_TRUE(c0 && c1);
  const KeyId key = Declare(*c0);
  std::vector<float> grad(kElements, 1.0f), out(kElements);
  const auto start = Clock::now();
  const Ticket pending = c0->PushPull(key, grad, out);
  ASSERT_TRUE(HubCountedPushes(kChunks)) << "the hub never held rank 0's push";
  KillHub();
  const Error e = c0->Wait(pending);
  const auto took = Clock::now() - start;
  EXPECT_EQ(e.code, ErrorCode::kConnectionLost) << e.message;
  EXPECT_NE(e.message.find("reconnecting failed"), std::string::npos) << e.message;
  EXPECT_LT(took, std::chrono::milliseconds(4000));
  EXPECT_EQ(c0->Wait(c0->PushPull(key, grad, out)).code, ErrorCode::kConnectionLost);
  // The idle client gives up op_timeout after the break.
  ASSERT_TRUE(WaitFor(
      [&] { return c1->Wait(c1->PushPull(key, grad, out)).code == ErrorCode::kConnectionLost; },
      std::chrono::seconds(5)));
}

// Options::reconnect = false: a broken connection is kConnectionLost at once.
TEST_P(ClientReconnectTest, ReconnectDisabledFailsAtOnce) {
  auto c0 = Connect(0, std::chrono::seconds(20), /*reconnect=*/false);
  auto c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  const KeyId key = Declare(*c0);
  std::vector<float> grad(kElements, 1.0f), out(kElements);
  const Ticket pending = c0->PushPull(key, grad, out);
  ASSERT_TRUE(HubCountedPushes(kChunks)) << "the hub never held rank 0's push";
  const auto start = Clock::now();
  KillHub();
  const Error e = c0->Wait(pending);
  EXPECT_EQ(e.code, ErrorCode::kConnectionLost) << e.message;
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1500));
  EXPECT_EQ(c0->reconnects(), 0u);
}

// A restart while idle, the hub back at the same version (nothing had been
// pushed): no rollback, the loop goes on.
TEST_P(ClientReconnectTest, RestartAtSameVersionContinues) {
  auto c0 = Connect(0);
  auto c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  const KeyId key = Declare(*c0);
  ASSERT_EQ(Declare(*c1), key);
  KillHub();
  ASSERT_TRUE(RestartHub());
  CreateTenant();
  ASSERT_TRUE(WaitFor([&] { return c0->reconnects() >= 1 && c1->reconnects() >= 1; },
                      std::chrono::seconds(10)));
  EXPECT_FALSE(c0->GetKeyInfo(key)->resync_needed);
  Step(*c0, *c1, key, 1.0f);
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, 1u);
}

// The C ABI: RACKHUB_ROLLED_BACK with the iteration, rackhub_reconnects, and
// RACKHUB_CONNECT_NO_RECONNECT. In-memory: this program's static copy of the
// C ABI (rackhub_c.cc), its connects (and reconnects) dialed in-memory.
TEST_P(ClientReconnectTest, CApiRolledBackAndNoReconnect) {
  std::atomic<int> memory_dials{0};
  std::optional<client::testing::ScopedLaneDialer> in_memory_connects;
  if (in_memory()) {
    in_memory_connects.emplace(
        memory_hub_->link_io(),
        [&memory_dials, dial = memory_hub_->dialer()](
            const net::FrameHeader& h, const std::string& payload, boost::asio::io_context& io,
            net::FrameHandler* handler) {
          ++memory_dials;
          return dial(h, payload, io, handler);
        });
  }
  rackhub_options o{};
  const std::string hub = data_address();
  o.hub = hub.c_str();
  o.tenant = kTenant;
  o.token = kToken;
  o.rank = 0;
  o.op_timeout_ms = 20000;
  char err[256] = "";
  rackhub_client* c = nullptr;
  ASSERT_EQ(rackhub_connect_ex(&o, 0, &c, err, sizeof err), RACKHUB_OK) << err;
  auto c1 = Connect(1);
  ASSERT_TRUE(c1);
  uint32_t key = 0;
  rackhub_optimizer sgd{};
  sgd.type = "sgd";
  sgd.learning_rate = 0.1;
  ASSERT_EQ(rackhub_declare_key(c, "w", kElements, RACKHUB_FP32, &sgd, RACKHUB_INIT_ZEROS, &key),
            RACKHUB_OK)
      << rackhub_last_error(c);
  ASSERT_EQ(Declare(*c1), key);
  std::vector<float> g(kElements, 1.0f), out(kElements), out1(kElements);
  for (int i = 0; i < 2; ++i) {
    const Ticket t1 = c1->PushPull(key, g, out1);
    ASSERT_EQ(rackhub_push_pull(c, key, g.data(), out.data(), kElements), RACKHUB_OK)
        << rackhub_last_error(c);
    ASSERT_TRUE(c1->Wait(t1).ok());
  }
  KillHub();
  ASSERT_TRUE(RestartHub());
  CreateTenant();
  ASSERT_EQ(rackhub_push_pull(c, key, g.data(), out.data(), kElements), RACKHUB_ROLLED_BACK)
      << rackhub_last_error(c);
  EXPECT_EQ(rackhub_last_error_iteration(c), 0u);  // no checkpoint: back at 0
  EXPECT_NE(std::string(rackhub_last_error(c)).find("rolled back to iteration 0 (was 2)"),
            std::string::npos)
      << rackhub_last_error(c);
  EXPECT_GE(rackhub_reconnects(c), 1u);
  EXPECT_EQ(rackhub_pull(c, key, out.data(), kElements), RACKHUB_OK) << rackhub_last_error(c);
  rackhub_close(c);

  // Reconnect off.
  c = nullptr;
  ASSERT_EQ(rackhub_connect_ex(&o, RACKHUB_CONNECT_NO_RECONNECT, &c, err, sizeof err), RACKHUB_OK)
      << err;
  KillHub();
  EXPECT_EQ(rackhub_push_pull(c, key, g.data(), out.data(), kElements), RACKHUB_CONNECTION_LOST)
      << rackhub_last_error(c);
  EXPECT_EQ(rackhub_reconnects(c), 0u);
  rackhub_close(c);
  if (in_memory()) {
    // 2 lanes: the first connect, at least one reconnect, the second connect.
    EXPECT_GE(memory_dials.load(), 6) << "the C ABI did not connect through the in-memory seam";
  }
}

// The peer of LostPeerThenReplacement in this process (the in-memory
// instance): rank 1 as a client of a thread of its own, over in-memory links
// it records. Kill is the in-memory stand-in for SIGKILL of a worker process
// (as ThreadRank::Kill, worker_ranks.h): its dials are refused from then on
// (a dead process does not reconnect) and every link it made is closed
// abruptly on the links' io thread, which the hub sees exactly as the kernel
// closing a killed process's sockets; then the thread, parked, ends and its
// broken client is destroyed.
class ThreadPeer {
 public:
  // `body(connect, hang)` runs on the thread; `connect` makes the peer's
  // client over `dial`, `hang` returns once Kill ran.
  using Connector = std::function<std::unique_ptr<Client>(client::testing::LaneDialer)>;
  ThreadPeer(InProcessHub& hub, Connector connect,
             std::function<void(const std::function<std::unique_ptr<Client>()>&,
                                const std::function<void()>&)>
                 body)
      : hub_(hub) {
    thread_ = std::thread([this, connect = std::move(connect), body = std::move(body)] {
      const auto dial = hub_.dialer();
      body(
          [&] {
            return connect([this, dial](const net::FrameHeader& h, const std::string& payload,
                                        boost::asio::io_context& io,
                                        net::FrameHandler* handler)
                               -> std::shared_ptr<net::Connection> {
              std::lock_guard lock(mu_);
              if (killed_) return nullptr;
              auto conn = dial(h, payload, io, handler);
              if (conn) conns_.push_back(conn);
              return conn;
            });
          },
          [this] { killed_future_.wait(); });
    });
  }
  ~ThreadPeer() {
    Kill();
    thread_.join();
  }
  void Kill() {
    std::vector<std::shared_ptr<net::Connection>> conns;
    {
      std::lock_guard lock(mu_);
      if (killed_) return;
      killed_ = true;
      conns = conns_;
    }
    std::promise<void> closed;
    boost::asio::post(hub_.link_io(), [&] {
      for (const auto& c : conns) c->Close("killed (test)");
      closed.set_value();
    });
    closed.get_future().wait();
    killed_promise_.set_value();
  }

 private:
  InProcessHub& hub_;
  std::mutex mu_;
  bool killed_ = false;                                   // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<net::Connection>> conns_;  // GUARDED_BY(mu_)
  std::promise<void> killed_promise_;
  std::shared_future<void> killed_future_ = killed_promise_.get_future().share();
  std::thread thread_;  // last: started once everything above exists
};

// A peer rank dies mid-PushPull (SIGKILL of a forked process; in-memory, a
// ThreadPeer killed): the survivor gets kServer/WORKER_LOST and the key needs
// a Pull; its next push waits for a replacement rank 1 (bounded by the
// straggler timeout); the replacement connects, pulls, pushes, and both
// continue at the same iteration.
TEST_P(ClientReconnectTest, LostPeerThenReplacement) {
  // The peer's life: as rank 1 it pushes two iterations, then hangs until
  // killed. Nonzero: where it failed.
  const auto peer_life = [](const std::function<std::unique_ptr<Client>()>& connect,
                            const std::function<void()>& hang) {
    auto c1 = connect();
    if (!c1) return 3;
    const KeyId key = Declare(*c1);
    std::vector<float> g(kElements, 2.0f), out(kElements);
    for (int i = 0; i < 2; ++i) {
      if (!c1->Wait(c1->PushPull(key, g, out)).ok()) return 4;
    }
    hang();
    return 0;
  };
  std::function<void()> kill_peer;
  std::unique_ptr<ThreadPeer> thread_peer;
  pid_t peer = -1;
  struct Reaper {
    pid_t pid = -1;
    ~Reaper() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper;
  if (in_memory()) {
    thread_peer = std::make_unique<ThreadPeer>(
        *memory_hub_,
        [this](client::testing::LaneDialer dial) {
          return Connect(1, std::chrono::seconds(20), true, std::move(dial));
        },
        [peer_life](const std::function<std::unique_ptr<Client>()>& connect,
                    const std::function<void()>& hang) {
          const int failed = peer_life(connect, hang);
          EXPECT_EQ(failed, 0) << "the peer failed (3: connect, 4: a PushPull)";
        });
    kill_peer = [&] { thread_peer->Kill(); };
  } else {
    // A child process (forked before this process starts threads).
    peer = fork();
    ASSERT_GE(peer, 0);
    if (peer == 0) {
      const int failed = peer_life([this] { return Connect(1); },
                                   [] {
                                     for (;;) pause();  // until the test SIGKILLs it
                                   });
      _exit(failed);
    }
    reaper.pid = peer;
    kill_peer = [peer] { ::kill(peer, SIGKILL); };
  }

  auto c0 = Connect(0);
  ASSERT_TRUE(c0);
  const KeyId key = Declare(*c0);
  std::vector<float> grad(kElements, 1.0f), out(kElements);
  for (int i = 0; i < 2; ++i) {
    const Error e = c0->Wait(c0->PushPull(key, grad, out));
    ASSERT_TRUE(e.ok()) << e.message;
  }
  const Ticket pending = c0->PushPull(key, grad, out);  // the peer never pushes this one
  ASSERT_TRUE(HubCountedPushes(5 * kChunks)) << "the hub never held rank 0's push";
  kill_peer();
  const Error e = c0->Wait(pending);
  ASSERT_EQ(e.code, ErrorCode::kServer) << e.message;
  EXPECT_EQ(e.wire, WireError::kWorkerLost) << e.message;
  EXPECT_TRUE(c0->GetKeyInfo(key)->resync_needed);
  EXPECT_EQ(c0->Wait(c0->PushPull(key, grad, out)).code, ErrorCode::kRolledBack);

  std::vector<float> p0(kElements), p1(kElements);
  ASSERT_TRUE(c0->Wait(c0->Pull(key, p0)).ok());
  EXPECT_FALSE(c0->GetKeyInfo(key)->resync_needed);
  const uint64_t it0 = c0->GetKeyInfo(key)->next_iteration;
  EXPECT_EQ(it0, 2u) << "the aborted iteration 2 is pushed again";
  // The survivor goes on at once; its push waits for the replacement.
  const Ticket waiting = c0->PushPull(key, grad, out);
  ASSERT_TRUE(HubCountedPushes(6 * kChunks)) << "the hub never held rank 0's push";
  auto c1b = Connect(1);
  ASSERT_TRUE(c1b);
  ASSERT_EQ(Declare(*c1b), key);
  ASSERT_TRUE(c1b->Wait(c1b->Pull(key, p1)).ok());
  EXPECT_EQ(p0, p1);
  EXPECT_EQ(c1b->GetKeyInfo(key)->next_iteration, it0);
  std::vector<float> g1(kElements, 2.0f), out1(kElements);
  const Ticket t1 = c1b->PushPull(key, g1, out1);
  const Error ew = c0->Wait(waiting);
  ASSERT_TRUE(ew.ok()) << ew.message;
  ASSERT_TRUE(c1b->Wait(t1).ok());
  EXPECT_EQ(out, out1);
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, it0 + 1);
  Step(*c0, *c1b, key, 1.0f);
  EXPECT_EQ(c0->GetKeyInfo(key)->next_iteration, it0 + 2);
  EXPECT_EQ(c1b->GetKeyInfo(key)->next_iteration, it0 + 2);
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientReconnectTest,
                         ::testing::Values(Link::kMemory, Link::kTcp, Link::kShm, Link::kRdma),
                         [](const ::testing::TestParamInfo<Link>& info) {
                           return std::string(info.param == Link::kMemory ? "Memory"
                                              : info.param == Link::kShm  ? "Shm"
                                              : info.param == Link::kRdma ? "Rdma"
                                                                          : "Tcp");
                         });

}  // namespace
}  // namespace rackhub::client
