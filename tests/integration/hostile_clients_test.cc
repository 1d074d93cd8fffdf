// Hostile and careless clients against a real rackhubd over loopback TCP
// (issue 12; docs/architecture.md, "Before HELLO" and "Fair share of a
// lane"). Each test checks that a victim tenant trains bit for bit as it
// does alone (RawHubTest::Train) while:
//  - 1,000 connections sit before HELLO: idle, half a header, or a HELLO
//    dribbled a byte at a time; past data.max_unauthenticated_connections
//    new ones are closed at once; the log says so a bounded number of times;
//  - the hub runs out of descriptors (a low RLIMIT_NOFILE): accepting is
//    retried without a busy loop or a log flood, and service resumes once
//    the abusers' connections time out;
//  - a worker of another tenant names the victim's handle or key ids.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "raw_hub_test.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;
using testing::RawHubTest;
using testing::Worker;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// CPU seconds (user + system) the process has used so far.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may contain spaces) start at ')'.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  std::vector<std::string> fields;
  while (rest >> field) fields.push_back(field);
  if (fields.size() < 13) return -1;
  // utime and stime: fields 14 and 15 of stat(5), here 11 and 12.
  return static_cast<double>(std::stoull(fields[11]) + std::stoull(fields[12])) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

size_t CountLines(const std::string& log, const std::string& text) {
  size_t n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// The HELLO frame `Worker::Hello` would send, as bytes.
std::string HelloBytes(const std::string& tenant, const std::string& token) {
  dpb::Hello hello;
  hello.set_tenant(tenant);
  hello.set_token(token);
  const std::string payload = hello.SerializeAsString();
  FrameHeader h;
  h.opcode = Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}

// Makes sure this process (and the daemons it starts) may open `n` files.
bool AllowFiles(rlim_t n) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_cur >= n) return true;
  if (r.rlim_max < n) return false;
  r.rlim_cur = n;
  return setrlimit(RLIMIT_NOFILE, &r) == 0;
}

// True if the hub closed `w`: EOF, after a fatal ERROR or none.
bool ClosedByHub(Worker& w, std::chrono::milliseconds timeout) {
  for (;;) {
    const auto f = w.Receive(timeout);
    if (!f) return w.eof();
    if (f->h.opcode != Opcode::kError || (f->h.flags & net::kFlagFatal) == 0) return false;
  }
}

class HostileClientsTest : public RawHubTest {
 protected:
  void TearDown() override {
    // A failure here is about what the hub did: show its log.
    if (HasFailure() && hub_) {
      const std::string log = hub_->Log();
      std::printf("---- rackhubd log (last 6000 bytes) ----\n%s\n",
                  log.substr(log.size() > 6000 ? log.size() - 6000 : 0).c_str());
    }
  }
};

TEST_F(HostileClientsTest, ConnectionsBeforeHelloDoNotDisturbATrainingTenant) {
  if (!AllowFiles(4096)) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below 4096";
  Start({"--lanes", "2", "--hello-timeout-ms", "3000", "--max-unauthenticated-connections",
         "1100"});
  const auto reference = Train("reference", 6);
  ASSERT_EQ(reference.size(), 6u);
  const std::string victim_token = CreateTenant("victim", 2, 4096);
  const std::string hello = HelloBytes("victim", victim_token);

  // 1,000 connections that never complete HELLO: 600 idle, 250 stopping
  // half way through a header, 150 dribbling a valid HELLO a byte per 100 ms
  // (3 s is not enough for any of them: the hello timeout closes them).
  std::vector<std::unique_ptr<Worker>> idle, half, slow;
  for (int i = 0; i < 600; ++i) idle.push_back(std::make_unique<Worker>(hub_->data_address()));
  for (int i = 0; i < 250; ++i) {
    half.push_back(std::make_unique<Worker>(hub_->data_address()));
    half.back()->QueueRaw(hello.substr(0, 20));
    ASSERT_TRUE(half.back()->Flush(1s));
  }
  for (int i = 0; i < 150; ++i) slow.push_back(std::make_unique<Worker>(hub_->data_address()));
  std::atomic<bool> stop{false};
  std::thread dribbler([&] {
    for (size_t byte = 0; byte < hello.size() && !stop; ++byte) {
      for (auto& w : slow) {
        w->QueueRaw(hello.substr(byte, 1));
        w->Flush(10ms);
      }
      std::this_thread::sleep_for(100ms);
    }
  });

  // The victim trains meanwhile (its own 4 connections are admitted: 1,004
  // are waiting at most, below the limit of 1,100).
  const auto during = TrainExisting("victim", victim_token, 6);
  EXPECT_EQ(during, reference) << "the victim's training changed under the pre-HELLO abuse";

  // Past the limit new connections are closed at once.
  std::vector<std::unique_ptr<Worker>> excess;
  for (int i = 0; i < 200; ++i) excess.push_back(std::make_unique<Worker>(hub_->data_address()));
  size_t closed_at_once = 0;
  for (auto& w : excess) {
    if (ClosedByHub(*w, 2s)) ++closed_at_once;
  }
  EXPECT_GE(closed_at_once, 90u) << "of 200 connections past the limit";

  // Every abuser is closed by the hello timeout; the hub serves new clients.
  stop = true;
  dribbler.join();
  std::this_thread::sleep_for(3500ms);
  size_t closed = 0;
  for (auto* group : {&idle, &half, &slow}) {
    for (auto& w : *group) {
      if (ClosedByHub(*w, 200ms)) ++closed;
    }
  }
  EXPECT_GE(closed, 999u) << "connections without HELLO left open after the hello timeout";
  idle.clear();
  half.clear();
  slow.clear();
  excess.clear();
  EXPECT_EQ(Train("after", 6), reference);

  // A bounded log: at most 20 refusals per 10 s plus the summaries, not one
  // line per abuser.
  const std::string log = hub_->Log();
  const size_t refusals = CountLines(log, "sent no HELLO") + CountLines(log, "refused connection") +
                          CountLines(log, "waiting for their first frame");
  std::printf("log lines about the 1,200 abusers: %zu\n", refusals);
  EXPECT_LE(refusals, 60u);
  EXPECT_GE(refusals, 1u);
}

TEST_F(HostileClientsTest, DescriptorExhaustionNeitherSpinsNorFloodsTheLog) {
  if (!AllowFiles(4096)) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below 4096";
  // The daemon inherits a limit of 256 descriptors (restored for this
  // process right after it started).
  rlimit saved{};
  getrlimit(RLIMIT_NOFILE, &saved);
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  Start({"--lanes", "2", "--hello-timeout-ms", "2000"});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  const auto reference = Train("reference", 3);
  ASSERT_EQ(reference.size(), 3u);

  // 400 idle connections: the hub accepts what its descriptors allow, the
  // rest wait in the listen backlog while accept fails with EMFILE.
  std::vector<std::unique_ptr<Worker>> abusers;
  for (int i = 0; i < 400; ++i) abusers.push_back(std::make_unique<Worker>(hub_->data_address()));
  std::this_thread::sleep_for(300ms);
  const double cpu_before = CpuSeconds(hub_->pid());
  std::this_thread::sleep_for(1500ms);
  const double cpu_used = CpuSeconds(hub_->pid()) - cpu_before;
  std::printf("hub CPU while out of descriptors: %.2f s in 1.5 s\n", cpu_used);
  EXPECT_LT(cpu_used, 0.5) << "the acceptor spins on EMFILE";

  // The abusers time out, the backlog drains, and service resumes by itself.
  abusers.clear();
  std::this_thread::sleep_for(2500ms);
  std::vector<std::string> after;
  for (auto deadline = Clock::now() + 20s; Clock::now() < deadline;) {
    after = Train("after" + std::to_string(after.size()), 3);
    if (after == reference) break;
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_EQ(after, reference) << "service did not resume after the descriptors came back";
  const std::string log = hub_->Log();
  const size_t accept_failures = CountLines(log, "accept failed");
  std::printf("'accept failed' log lines: %zu\n", accept_failures);
  EXPECT_GE(accept_failures, 1u) << "the hub never ran out of descriptors: the test proves nothing";
  EXPECT_LE(accept_failures, 40u);
  EXPECT_NE(log.find("Too many open files (RLIMIT_NOFILE"), std::string::npos) << log;
}

// A worker of tenant A puts tenant B's handle, or B's key ids, in its frame
// headers: refused, and B trains bit for bit as alone.
TEST_F(HostileClientsTest, AnotherTenantsHandleAndKeyIdsAreRefused) {
  Start({"--lanes", "2"});
  const auto reference = Train("reference", 4);
  const std::string victim_token = CreateTenant("victim", 2, 4096);
  const pb::Key victim_key = CreateKey("victim", "w", 4096);
  const std::string token = CreateTenant("mallory", 1, 4096);
  CreateKey("mallory", "own", 16);
  Worker m(hub_->data_address());
  const auto welcome = m.Hello("mallory", token, 0, 0);
  ASSERT_NE(welcome.tenant_handle(), 0u);
  // Victim's handle (found by counting) in the header of a PUSH to the
  // victim's key: fatal for the sender.
  std::vector<float> g(1024, 100.0f);
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.tenant = welcome.tenant_handle() - 1;
  h.key = victim_key.id();
  h.dtype = net::DType::kFp32;
  m.Send(h, testing::Floats(g));
  auto f = m.Receive();
  ASSERT_TRUE(f && f->h.opcode == Opcode::kError) << testing::Describe(f);
  EXPECT_NE(f->h.flags & net::kFlagFatal, 0);
  // Its own handle with the victim's key id: no such key of its own.
  Worker m2(hub_->data_address());
  m2.Hello("mallory", token, 0, 0);
  h.tenant = welcome.tenant_handle();
  // A refusal may be fatal: the hub then closes the connection and later
  // sends fail with a broken pipe, which is expected here.
  for (uint32_t id = 0; id < 4; ++id) {
    h.key = id;
    h.request_id = id + 1;
    m2.Queue(h, testing::Floats(g));
    if (!m2.Flush(std::chrono::seconds(10))) break;
  }
  size_t refused = 0;
  for (int i = 0; i < 4; ++i) {
    f = m2.Receive(2s);
    if (!f) break;
    if (f->h.opcode == Opcode::kError) ++refused;
    if (f->h.flags & net::kFlagFatal) break;
  }
  EXPECT_GE(refused, 1u);
  // The victim is untouched: it trains from zero exactly like the reference.
  EXPECT_EQ(TrainExisting("victim", victim_token, 4, true), reference);
}

}  // namespace
}  // namespace rackhub
