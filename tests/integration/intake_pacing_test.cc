// Workers in step on the hub's side (server/lanes/intake_pacer.h) against a
// real rackhubd over TCP: a worker that pushes a whole key while the other
// has not started is held (rackhub_intake_holds_total), and every reply is
// still exactly the reference sum; a worker that goes away while the other
// is held ends in WORKER_LOST answers for every push, never a hang, wherever
// the loss lands.
#include <atomic>
#include <random>
#include <thread>

#include "http_get.h"
#include "raw_hub_test.h"

namespace rackhub::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kChunkBytes = 32 << 10;
constexpr uint32_t kChunkFloats = kChunkBytes / sizeof(float);
constexpr uint32_t kChunks = 64;  // 2 MiB: far past the lead (4 chunks)

// Rank r's gradient of chunk c at iteration it: small integers and halves,
// so every sum is exact.
std::vector<float> Gradient(uint32_t r, uint32_t c, uint64_t it) {
  std::vector<float> g(kChunkFloats);
  for (uint32_t i = 0; i < kChunkFloats; ++i) {
    g[i] = static_cast<float>((i + 7 * c + 3 * it) % 13) * 0.5f + static_cast<float>(r);
  }
  return g;
}

void QueuePushes(Worker& w, uint32_t key, uint32_t r, uint64_t it, uint32_t from, uint32_t to) {
  for (uint32_t c = from; c < to; ++c) {
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.tenant = w.handle();
    h.key = key;
    h.chunk = c;
    h.dtype = net::DType::kFp32;
    h.iteration = it;
    h.request_id = it * kChunks + c + 1;
    w.Queue(h, Floats(Gradient(r, c, it)));
  }
}

class IntakePacingTest : public RawHubTest {
 protected:
  double Holds(const std::string& tenant) {
    const HttpResponse r = HttpGet(hub_->metrics_address(), "/metrics");
    const std::string name = "rackhub_intake_holds_total{tenant=\"" + tenant + "\"} ";
    const size_t at = r.body.find(name);
    return at == std::string::npos ? -1 : std::stod(r.body.substr(at + name.size()));
  }
  // Waits (at most 20 s) until the hub held a connection of `tenant`.
  bool WaitForHolds(const std::string& tenant, double at_least) {
    for (int i = 0; i < 400; ++i) {
      if (Holds(tenant) >= at_least) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
};

TEST_F(IntakePacingTest, AWorkerAheadIsHeldAndEverySumStaysExact) {
  Start({"--lanes", "1", "--no-pin-lanes", "--intake-lead-bytes", "64KiB"});
  const std::string token = CreateTenant("t", 2, kChunkBytes);
  const pb::Key key = CreateKey("t", "w", uint64_t{kChunks} * kChunkFloats);
  Worker r0(hub_->data_address()), r1(hub_->data_address());
  r0.Hello("t", token, 0, 0);
  r1.Hello("t", token, 1, 0);
  std::vector<std::vector<float>> params(kChunks, std::vector<float>(kChunkFloats, 0.0f));
  for (uint64_t it = 0; it < 3; ++it) {
    // Rank 1 sends the whole key; rank 0 only once the hub held rank 1.
    const double before = Holds("t");
    ASSERT_GE(before, 0) << "no rackhub_intake_holds_total on /metrics";
    QueuePushes(r1, key.id(), 1, it, 0, kChunks);
    std::atomic<bool> flushed{false};
    std::jthread ahead([&] { flushed = r1.Flush(30s); });
    ASSERT_TRUE(WaitForHolds("t", before + 1)) << "iteration " << it << ": rank 1 never held";
    QueuePushes(r0, key.id(), 0, it, 0, kChunks);
    ASSERT_TRUE(r0.Flush(30s));
    ahead.join();
    ASSERT_TRUE(flushed) << "the hub never read all of rank 1's pushes";
    // SGD, lr 1, sum: the parameters drop by g0 + g1 (exact in floats).
    for (uint32_t c = 0; c < kChunks; ++c) {
      const std::vector<float> g0 = Gradient(0, c, it), g1 = Gradient(1, c, it);
      for (uint32_t i = 0; i < kChunkFloats; ++i) params[c][i] -= g0[i] + g1[i];
    }
    for (Worker* w : {&r0, &r1}) {
      std::vector<bool> seen(kChunks, false);
      for (uint32_t n = 0; n < kChunks; ++n) {
        const auto f = w->Receive();
        ASSERT_TRUE(f && f->h.opcode == Opcode::kParams) << "iteration " << it << ": " << Describe(f);
        ASSERT_EQ(f->h.iteration, it + 1);
        ASSERT_LT(f->h.chunk, kChunks);
        EXPECT_FALSE(seen[f->h.chunk]) << "chunk " << f->h.chunk << " answered twice";
        seen[f->h.chunk] = true;
        EXPECT_TRUE(SameBits(AsFloats(f->payload), params[f->h.chunk]))
            << "iteration " << it << " chunk " << f->h.chunk << " is not the reference";
      }
    }
  }
  EXPECT_GE(Holds("t"), 3);
}

TEST_F(IntakePacingTest, AWorkerLostWhileTheOtherIsHeldEndsInAnswersNotAHang) {
  // A push of rank 1 read after the loss's recovery is counted again and
  // waits for rank 0: the straggler timeout (1 s) answers it.
  Start({"--lanes", "1", "--no-pin-lanes", "--intake-lead-bytes", "64KiB",
         "--straggler-timeout-ms", "1000"});
  std::mt19937 rng(std::random_device{}());
  // Where the loss lands: before rank 0 pushed anything, a few pushes in,
  // most of the key in, and random points.
  std::vector<uint32_t> points = {0, 3, 40};
  for (int i = 0; i < 3; ++i) points.push_back(rng() % kChunks);
  for (size_t round = 0; round < points.size(); ++round) {
    const uint32_t sent = points[round];
    SCOPED_TRACE("round " + std::to_string(round) + ": rank 0 lost after " +
                 std::to_string(sent) + " pushes");
    const std::string name = "t" + std::to_string(round);
    const std::string token = CreateTenant(name, 2, kChunkBytes);
    const pb::Key key = CreateKey(name, "w", uint64_t{kChunks} * kChunkFloats);
    Worker r1(hub_->data_address());
    r1.Hello(name, token, 1, 0);
    {
      Worker r0(hub_->data_address());
      r0.Hello(name, token, 0, 0);
      QueuePushes(r1, key.id(), 1, 0, 0, kChunks);
      std::atomic<bool> flushed{false};
      std::jthread ahead([&] { flushed = r1.Flush(30s); });
      ASSERT_TRUE(WaitForHolds(name, 1)) << "rank 1 never held";
      QueuePushes(r0, key.id(), 0, 0, 0, sent);
      ASSERT_TRUE(r0.Flush(30s));
      r0.Close();  // gone without BYE
      ahead.join();
      ASSERT_TRUE(flushed) << "the hub never read all of rank 1's pushes after rank 0 was lost";
    }
    // Every push of rank 1 is answered: PARAMS (the reference) for a chunk
    // both pushed before the loss was seen, a non-fatal ERROR otherwise
    // (WORKER_LOST: waiting at the loss, read during the recovery, or counted
    // after it and failed by the straggler timeout; BAD_ITERATION: read after
    // the recovery moved the key on). Every chunk rank 0 never pushed is an
    // ERROR.
    uint32_t errors = 0;
    for (uint32_t n = 0; n < kChunks; ++n) {
      const auto f = r1.Receive();
      ASSERT_TRUE(f.has_value()) << "push " << n << " of rank 1 was never answered";
      if (f->h.opcode == Opcode::kParams) {
        ASSERT_LT(f->h.chunk, sent) << "a chunk rank 0 never pushed was answered";
        std::vector<float> want = Gradient(0, f->h.chunk, 0);
        const std::vector<float> g1 = Gradient(1, f->h.chunk, 0);
        for (uint32_t i = 0; i < kChunkFloats; ++i) want[i] = -(want[i] + g1[i]);
        EXPECT_TRUE(SameBits(AsFloats(f->payload), want)) << "chunk " << f->h.chunk;
        continue;
      }
      ASSERT_EQ(f->h.opcode, Opcode::kError) << Describe(f);
      const Result<net::ErrorBody> e = net::DecodeErrorBody(
          std::as_bytes(std::span(f->payload.data(), f->payload.size())));
      ASSERT_TRUE(e.ok());
      EXPECT_EQ(f->h.flags & net::kFlagFatal, 0) << Describe(f);
      EXPECT_TRUE(e->code == WireError::kWorkerLost || e->code == WireError::kBadIteration)
          << Describe(f);
      ++errors;
    }
    EXPECT_GE(errors, kChunks - sent);
  }
}

}  // namespace
}  // namespace rackhub::testing
