// What a worker that does not read its replies can do to a real rackhubd
// over loopback TCP (issue 12; docs/architecture.md, "Reply bytes" and
// "Bounded send queues"):
//  - a reply still queued when an admin deletes its key or tenant carries
//    exactly the parameters it was sent for (every byte checked), never the
//    freed memory of a deleted chunk;
//  - 20,000 PULLs never read do not grow the hub by more than a bounded
//    amount (the hub stops reading the connection), a bystander tenant
//    trains bit for bit as it does alone meanwhile, and the memory comes back
//    once the flooder disconnects;
//  - a worker whose replies pile up past data.max_queued_bytes_per_connection
//    gets a fatal QUOTA_EXCEEDED and is closed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "raw_hub_test.h"
#include "wait.h"

namespace rackhub {
namespace {

namespace pb = rackhub::admin::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;
using testing::Floats;
using testing::kMiB;
using testing::RawHubTest;
using testing::RssBytes;
using testing::WaitForLog;
using testing::Worker;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ReplyQueueTest : public RawHubTest {
 protected:
  // A worker fills its connection with PULLs it does not read, pushes once
  // (the reply queues behind the PULLs' replies), `remove` deletes its key
  // or tenant, then it reads: every byte must be what the hub sent it for.
  void QueuedReplySurvives(const std::function<void()>& remove, bool tenant_deleted) {
    Start({"--lanes", "1"});
    constexpr uint32_t kElements = 8192;  // one 32 KiB chunk
    constexpr int kPulls = 400;           // ~13 MB of replies: far more than the sockets hold
    const std::string token = CreateTenant("victim", 1, 32768);
    const pb::Key key = CreateKey("victim", "w", kElements);
    Worker w(hub_->data_address(), 64 * 1024);
    w.Hello("victim", token, 0, 0);
    ASSERT_NE(w.handle(), 0u);
    FrameHeader pull;
    pull.opcode = Opcode::kPull;
    pull.tenant = w.handle();
    pull.key = key.id();
    for (int i = 0; i < kPulls; ++i) {
      pull.request_id = 1000 + static_cast<uint64_t>(i);
      w.Queue(pull);
    }
    std::vector<float> g(kElements);
    for (uint32_t i = 0; i < kElements; ++i) g[i] = 1.0f + static_cast<float>(i) * 0.25f;
    FrameHeader push;
    push.opcode = Opcode::kPush;
    push.tenant = w.handle();
    push.key = key.id();
    push.dtype = net::DType::kFp32;
    push.iteration = 0;
    push.request_id = 7;
    w.Queue(push, Floats(g));
    ASSERT_TRUE(w.Flush(10s));
    // The hub has the push (and queued its reply) once the update is done.
    const auto deadline = Clock::now() + 10s;
    while (Stats("victim").iterations_completed() < 1 && Clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(Stats("victim").iterations_completed(), 1u) << "the hub never took the push";
    remove();
    // Another tenant's parameters are allocated meanwhile (where the freed
    // ones were, if they were freed under the queued reply).
    const std::string other_token = CreateTenant("other", 1, 32768);
    const pb::Key other = CreateKey("other", "o", 4 * kElements);
    Worker o(hub_->data_address());
    o.Hello("other", other_token, 0, 0);
    for (uint32_t c = 0; c < 4; ++c) {
      FrameHeader h = push;
      h.tenant = o.handle();
      h.key = other.id();
      h.chunk = c;
      o.Send(h, Floats(std::vector<float>(kElements, -12345.0f)));
      ASSERT_TRUE(o.Receive().has_value());  // its chunk is allocated by now
    }

    // Now read everything: the PULLs' replies (version 0: zeros), then the
    // push's (version 1: exactly -g).
    std::string want_pull(kElements * sizeof(float), '\0');
    std::vector<float> minus_g(kElements);
    for (uint32_t i = 0; i < kElements; ++i) minus_g[i] = -g[i];
    const std::string want_push = Floats(minus_g);
    int pulls = 0;
    bool pushed = false;
    for (;;) {
      const auto f = w.Receive(2s);
      if (!f) break;
      if (f->h.opcode == Opcode::kError) {
        const net::ErrorBody e =
            net::DecodeErrorBody(std::as_bytes(std::span(f->payload.data(), f->payload.size())))
                .value_or(net::ErrorBody{WireError{}, "(no ERROR body)"});
        EXPECT_EQ(e.code, tenant_deleted ? WireError::kTenantGone : WireError::kUnknownKey)
            << e.text;
        continue;
      }
      ASSERT_EQ(f->h.opcode, Opcode::kParams) << testing::Describe(f);
      ASSERT_EQ(f->payload.size(), want_pull.size());
      const std::string& want = f->h.request_id == 7 ? want_push : want_pull;
      if (f->h.request_id == 7) {
        EXPECT_EQ(f->h.iteration, 1u);
        pushed = true;
      } else {
        EXPECT_EQ(f->h.iteration, 0u);
        ++pulls;
      }
      size_t bad = 0, first_bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (f->payload[i] != want[i] && bad++ == 0) first_bad = i;
      }
      ASSERT_EQ(bad, 0u) << "request " << f->h.request_id << ": " << bad
                         << " bytes are not the parameters sent, from byte " << first_bad
                         << " (freed memory sent?)";
    }
    EXPECT_TRUE(pushed) << "the push's reply never came";
    EXPECT_EQ(pulls, kPulls);
  }

};

TEST_F(ReplyQueueTest, QueuedReplyOutlivesKeyDelete) {
  QueuedReplySurvives([this] { DeleteKey("victim", "w"); }, false);
}

TEST_F(ReplyQueueTest, QueuedReplyOutlivesTenantDelete) {
  QueuedReplySurvives([this] { DeleteTenant("victim"); }, true);
}

// 20,000 PULLs of a 32 KiB chunk (820 MB of replies) sent and never read.
TEST_F(ReplyQueueTest, UnreadPullFloodIsBoundedAndHarmless) {
  Start({"--lanes", "2"});
  const auto reference = Train("reference", 6);
  ASSERT_EQ(reference.size(), 6u);
  const uint64_t baseline = RssBytes(hub_->pid());
  ASSERT_GT(baseline, 0u);

  const std::string token = CreateTenant("flood", 1, 32768);
  const pb::Key key = CreateKey("flood", "w", 8192);
  auto w = std::make_unique<Worker>(hub_->data_address(), 64 * 1024);
  w->Hello("flood", token, 0, 0);
  ASSERT_NE(w->handle(), 0u);
  FrameHeader pull;
  pull.opcode = Opcode::kPull;
  pull.tenant = w->handle();
  pull.key = key.id();
  for (int i = 0; i < 20000; ++i) {
    pull.request_id = static_cast<uint64_t>(i) + 1;
    w->Queue(pull);
  }
  // The hub's memory is sampled from the flood's start until the bystander
  // has trained and the flooder flushed again: its peak, whenever the hub
  // reaches it (no guess of when the hub has taken what it will take).
  std::atomic<bool> flooding{true};
  std::atomic<uint64_t> sampled{0};
  std::thread sampler([&] {
    while (flooding) {
      sampled = std::max<uint64_t>(sampled, RssBytes(hub_->pid()));
      std::this_thread::sleep_for(10ms);
    }
  });
  // Whatever the hub takes within 5 s (all of it, if it reads on).
  w->Flush(5s);

  // A bystander trains meanwhile, bit for bit as alone.
  const auto during = Train("bystander", 6);
  EXPECT_EQ(during, reference) << "the bystander's training changed under the flood";
  w->Flush(1s);
  flooding = false;
  sampler.join();
  const uint64_t peak = std::max<uint64_t>(sampled, RssBytes(hub_->pid()));
  std::printf("hub RSS: %.1f MiB before the flood, %.1f MiB during it; %zu bytes of PULLs unsent\n",
              static_cast<double>(baseline) / kMiB, static_cast<double>(peak) / kMiB,
              w->unsent());
  EXPECT_LT(peak, baseline + 100 * kMiB) << "20,000 unread PULLs grew the hub by "
                                         << (peak - baseline) / kMiB << " MiB";

  // The flooder leaves: its queue goes, with the memory.
  w.reset();
  uint64_t after = RssBytes(hub_->pid());
  for (auto deadline = Clock::now() + 10s; after > baseline + 20 * kMiB && Clock::now() < deadline;) {
    std::this_thread::sleep_for(100ms);
    after = RssBytes(hub_->pid());
  }
  std::printf("hub RSS: %.1f MiB after the flooder left\n", static_cast<double>(after) / kMiB);
  EXPECT_LT(after, baseline + 20 * kMiB) << "the flooder's memory stayed after it left";
  // And the hub serves on.
  EXPECT_EQ(Train("after", 6), reference);
}

// Replies a worker asked for (its pushes of a large key) pile up unread past
// the limit: the connection gets a fatal QUOTA_EXCEEDED and closes; the
// tenant's other worker sees WORKER_LOST, other tenants nothing.
TEST_F(ReplyQueueTest, RepliesPastTheLimitCloseTheConnection) {
  Start({"--lanes", "2", "--max-queued-bytes-per-connection", "2MiB"});
  const auto reference = Train("reference", 3);
  // Lane 0 holds the even chunks: 256 of them, 8 MiB of replies per worker.
  constexpr uint32_t kChunks = 256;
  const std::string token = CreateTenant("big", 2, 32768);
  const pb::Key key = CreateKey("big", "w", 2 * kChunks * 8192);
  Worker hoarder(hub_->data_address(), 64 * 1024);
  Worker reader(hub_->data_address());
  hoarder.Hello("big", token, 0, 0);
  reader.Hello("big", token, 1, 0);
  const std::string g = Floats(std::vector<float>(8192, 0.5f));
  for (uint32_t c = 0; c < kChunks; ++c) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = hoarder.handle();
    h.key = key.id();
    h.chunk = 2 * c;
    h.dtype = net::DType::kFp32;
    h.request_id = c + 1;
    hoarder.Queue(h, g);
  }
  ASSERT_TRUE(hoarder.Flush(10s));
  // The reader completes every update and reads its own replies (until the
  // hoarder is lost, which fails the update in progress with WORKER_LOST).
  for (uint32_t c = 0; c < kChunks; ++c) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = reader.handle();
    h.key = key.id();
    h.chunk = 2 * c;
    h.dtype = net::DType::kFp32;
    h.request_id = c + 1;
    reader.Send(h, g);
    const auto f = reader.Receive(5s);
    if (!f || f->h.opcode != Opcode::kParams) break;
  }
  // The hoarder's queue passed 2 MiB: what was not being written is dropped,
  // a fatal QUOTA_EXCEEDED follows, and the connection closes once that is
  // out (or 2 s later if the hoarder still does not read).
  bool quota = false;
  for (;;) {
    const auto f = hoarder.Receive(5s);
    if (!f) break;
    if (f->h.opcode == Opcode::kError) {
      const net::ErrorBody e =
          net::DecodeErrorBody(std::as_bytes(std::span(f->payload.data(), f->payload.size())))
              .value_or(net::ErrorBody{WireError{}, "(no ERROR body)"});
      const WireError code = e.code;
      const std::string& text = e.text;
      EXPECT_EQ(code, WireError::kQuotaExceeded) << text;
      EXPECT_NE(text.find("data.max_queued_bytes_per_connection"), std::string::npos) << text;
      EXPECT_TRUE(f->h.flags & net::kFlagFatal);
      quota = true;
    }
  }
  EXPECT_TRUE(hoarder.eof()) << "the hoarder's connection stayed open";
  if (!quota) std::printf("the hoarder was closed before it read its QUOTA_EXCEEDED\n");
  // The hub writes why it closed the connection once the socket is closed:
  // the hoarder can see EOF before that line is in the log.
  EXPECT_TRUE(WaitForLog(*hub_, "QUOTA_EXCEEDED: connection: "));
  EXPECT_TRUE(WaitForLog(*hub_, "more than data.max_queued_bytes_per_connection (2097152 bytes)"));
  EXPECT_EQ(Train("bystander", 3), reference);
}

}  // namespace
}  // namespace rackhub
