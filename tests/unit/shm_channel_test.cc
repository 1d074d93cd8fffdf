// net/shm on its own: real channels over an abstract Unix socket and sealed
// memfds, both ends in this process (the hub end accepted here as the
// ShmAcceptor does), driven by one io_context thread. Frames of every size
// cross the ring in order, wrapping many times; a reply published to two
// workers of a tenant is copied once into the arena and referenced by both;
// a full arena falls back to copies; the arena is read-only for workers; a
// closed worker is seen by the hub after its last frames; in turns, one frame
// is delivered per grant; a worker's payload in a region it lent is read by
// the hub in place, and forged lend messages or references are violations.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rackhub/net/asio.h"
#include "rackhub/net/shm/arena.h"
#include "rackhub/net/shm/channel.h"
#include "rackhub/net/shm/lend.h"

namespace rackhub::net::shm {
namespace {

using namespace std::chrono_literals;

// Received frames of one end, readable from the test thread.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<FrameHeader, std::string>> frames;
  bool closed = false;
  std::string why;
  bool turns = false;        // deliver in turns (as the hub's lanes do)
  std::vector<size_t> asked;  // the bytes of each turn asked for

  Channel::Callbacks Callbacks() {
    Channel::Callbacks cb;
    if (turns) {
      cb.request_turn = [this](size_t bytes) {
        std::lock_guard lock(mu);
        asked.push_back(bytes);
        cv.notify_all();
      };
    }
    cb.on_frame = [this](const FrameHeader& h, std::span<const std::byte> p) {
      std::lock_guard lock(mu);
      frames.emplace_back(h, std::string(reinterpret_cast<const char*>(p.data()), p.size()));
      cv.notify_all();
    };
    cb.on_violation = [this](const std::string& t) { Closed("violation: " + t); };
    cb.on_closed = [this](const std::string& t) { Closed(t); };
    return cb;
  }
  void Closed(const std::string& t) {
    std::lock_guard lock(mu);
    closed = true;
    why = t;
    cv.notify_all();
  }
  bool WaitFrames(size_t n, std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return frames.size() >= n; });
  }
  bool WaitAsked(size_t n, std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return asked.size() >= n; });
  }
  size_t Frames() {
    std::lock_guard lock(mu);
    return frames.size();
  }
  bool WaitClosed(std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return closed; });
  }
};

class ShmChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = NewSocketName();
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name_.data(), name_.size());
    ASSERT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr),
                     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name_.size())),
              0);
    ASSERT_EQ(::listen(listener_, 8), 0);
    io_thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    boost::asio::post(io_, [this] {
      for (auto& c : channels_) {
        c->Detach();
        c->Close("test over");
      }
      channels_.clear();
      guard_.reset();
    });
    io_thread_.join();
    ::close(listener_);
  }

  // Connects a worker: returns {hub end, worker end}, both attached to io_.
  std::pair<std::shared_ptr<Channel>, std::shared_ptr<Channel>> Pair(
      uint32_t ring, std::shared_ptr<PublishArena> arena, Inbox* hub_in, Inbox* worker_in) {
    auto hub = std::async(std::launch::async, [&] {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      char hello[kHeaderBytes + 5];
      size_t got = 0;
      while (got < sizeof hello) {
        const ssize_t n = ::read(fd, hello + got, sizeof hello - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      return Channel::Accept(fd, ring, arena, "test worker", PollMode::kEvents);
    });
    Result<ConnectReply> worker =
        Channel::Connect(name_, "hello", PollMode::kEvents, std::chrono::steady_clock::now() + 5s);
    Result<std::shared_ptr<Channel>> hub_end = hub.get();
    EXPECT_TRUE(worker.ok()) << worker.status().message();
    EXPECT_TRUE(hub_end.ok()) << hub_end.status().message();
    if (!worker.ok() || !hub_end.ok() || !worker->channel) return {};
    std::shared_ptr<Channel> h = *hub_end, w = worker->channel;
    Run([&] {
      h->Attach(io_, hub_in->Callbacks());
      w->Attach(io_, worker_in->Callbacks());
      channels_.push_back(h);
      channels_.push_back(w);
    });
    return {h, w};
  }

  void Run(std::function<void()> fn) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().get();
  }

  static OutgoingFrame Frame(uint64_t request, std::string payload) {
    FrameHeader h;
    h.opcode = Opcode::kParams;
    h.request_id = request;
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    OutgoingFrame f;
    EncodeHeader(h, f.header);
    f.owned = std::move(payload);
    return f;
  }
  // A reply sharing `data` (owner keeps it), as the lane sends parameters.
  static OutgoingFrame Shared(uint64_t request, const std::shared_ptr<std::string>& data) {
    FrameHeader h;
    h.opcode = Opcode::kParams;
    h.request_id = request;
    h.payload_bytes = static_cast<uint32_t>(data->size());
    OutgoingFrame f;
    EncodeHeader(h, f.header);
    f.borrowed = std::as_bytes(std::span(data->data(), data->size()));
    f.owner = data;
    return f;
  }
  static std::string Pattern(size_t n, uint32_t seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7919) >> 3);
    return s;
  }

  std::string name_;
  int listener_ = -1;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_{
      boost::asio::make_work_guard(io_)};
  std::thread io_thread_;
  std::vector<std::shared_ptr<Channel>> channels_;  // io thread
};

TEST_F(ShmChannelTest, FramesOfEverySizeCrossTheRingInOrderBothWays) {
  Inbox hub_in, worker_in;
  auto hub_worker = Pair(kMinRingBytes, nullptr, &hub_in, &worker_in);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub && worker);
  // 64 KiB rings: 300 frames of up to ~15 KiB wrap each ring dozens of times
  // and fill it (the producer then sleeps until the consumer makes room).
  std::vector<std::string> sent;
  for (uint32_t i = 0; i < 300; ++i) sent.push_back(Pattern((i * 977) % 15000, i));
  Run([&] {
    for (uint32_t i = 0; i < sent.size(); ++i) {
      worker->Send(Frame(i, sent[i]));
      hub->Send(Frame(i, sent[i]));
    }
  });
  ASSERT_TRUE(hub_in.WaitFrames(sent.size()));
  ASSERT_TRUE(worker_in.WaitFrames(sent.size()));
  for (Inbox* in : {&hub_in, &worker_in}) {
    std::lock_guard lock(in->mu);
    for (uint32_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(in->frames[i].first.request_id, i);
      ASSERT_EQ(in->frames[i].second, sent[i]) << "frame " << i;
    }
  }
}

TEST_F(ShmChannelTest, ASharedReplyIsPublishedOnceForBothWorkers) {
  auto arena = PublishArena::Create(256 * 1024);
  ASSERT_TRUE(arena.ok());
  Inbox h1, w1, h2, w2;
  auto hub1_worker1 = Pair(kMinRingBytes, *arena, &h1, &w1);
  std::shared_ptr<Channel> hub1 = hub1_worker1.first, worker1 = hub1_worker1.second;
  auto hub2_worker2 = Pair(kMinRingBytes, *arena, &h2, &w2);
  std::shared_ptr<Channel> hub2 = hub2_worker2.first, worker2 = hub2_worker2.second;
  ASSERT_TRUE(hub1 && hub2);
  auto params = std::make_shared<std::string>(Pattern(32 * 1024, 1));
  Run([&] {
    hub1->Send(Shared(1, params));
    hub2->Send(Shared(1, params));
    EXPECT_EQ((*arena)->live(), 1u) << "the same bytes are published once";
  });
  ASSERT_TRUE(w1.WaitFrames(1));
  ASSERT_TRUE(w2.WaitFrames(1));
  EXPECT_EQ(w1.frames[0].second, *params);
  EXPECT_EQ(w2.frames[0].second, *params);
  Run([&] {
    EXPECT_EQ(worker1->references_received(), 1u);
    EXPECT_EQ(worker2->references_received(), 1u);
  });
  // Consumed by both: the next send releases the slot (and its owner).
  const std::weak_ptr<std::string> weak = params;
  params.reset();
  Run([&] {
    hub1->Send(Frame(2, "x"));
    hub2->Send(Frame(2, "x"));
  });
  ASSERT_TRUE(w1.WaitFrames(2));
  ASSERT_TRUE(w2.WaitFrames(2));
  Run([&] {
    hub1->Send(Frame(3, "y"));
    hub2->Send(Frame(3, "y"));
    EXPECT_EQ((*arena)->live(), 0u);
  });
  EXPECT_TRUE(weak.expired()) << "the arena still holds the parameters' owner";
}

TEST_F(ShmChannelTest, AFullArenaFallsBackToCopies) {
  auto arena = PublishArena::Create(64 * 1024);
  ASSERT_TRUE(arena.ok());
  Inbox h, w;
  auto hub_worker = Pair(1u << 20, *arena, &h, &w);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub);
  std::vector<std::shared_ptr<std::string>> chunks;
  for (uint32_t i = 0; i < 12; ++i) chunks.push_back(std::make_shared<std::string>(Pattern(16384, i)));
  // The worker reads nothing yet: at most 4 chunks fit the arena.
  Run([&] {
    worker->PauseDelivery(true);
    for (uint32_t i = 0; i < chunks.size(); ++i) hub->Send(Shared(i, chunks[i]));
    EXPECT_EQ((*arena)->live(), 4u);
    worker->PauseDelivery(false);
  });
  ASSERT_TRUE(w.WaitFrames(chunks.size()));
  for (uint32_t i = 0; i < chunks.size(); ++i) EXPECT_EQ(w.frames[i].second, *chunks[i]);
  Run([&] { EXPECT_EQ(worker->references_received(), 4u); });
}

TEST_F(ShmChannelTest, WorkersCannotWriteNorTruncateTheArena) {
  auto arena = PublishArena::Create(64 * 1024);
  ASSERT_TRUE(arena.ok());
  const int ro = (*arena)->ReadOnlyDescriptor();
  ASSERT_GE(ro, 0);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
  EXPECT_EQ(::ftruncate(ro, 0), -1);
  // Reopened read-write through /proc, it is still sealed against writes.
  const int rw = ::open(("/proc/self/fd/" + std::to_string(ro)).c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    EXPECT_EQ(::write(rw, "x", 1), -1);
    EXPECT_EQ(::ftruncate(rw, 0), -1);
    ::close(rw);
  }
  void* map = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, ro, 0);
  EXPECT_NE(map, MAP_FAILED);
  if (map != MAP_FAILED) ::munmap(map, 4096);
  ::close(ro);
}

TEST_F(ShmChannelTest, TheHubSeesAClosedWorkerAfterItsLastFrames) {
  Inbox h, w;
  auto hub_worker = Pair(kMinRingBytes, nullptr, &h, &w);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub);
  Run([&] {
    worker->Send(Frame(1, "last words"));
    worker->Close("bye");
  });
  ASSERT_TRUE(h.WaitClosed());
  std::lock_guard lock(h.mu);
  ASSERT_EQ(h.frames.size(), 1u) << "the frame written before the close is delivered first";
  EXPECT_EQ(h.frames[0].second, "last words");
  EXPECT_NE(h.why.find("closed"), std::string::npos) << h.why;
}

// The hub's lanes take frames in turns (the fair scheduler's order): the
// channel asks before each frame, with its record's bytes, and delivers
// exactly one per Grant(), pads (the ring wrapping) included for free; a
// worker that closes meanwhile still has its frames delivered, then the
// close is seen.
TEST_F(ShmChannelTest, InTurnsOneFrameIsDeliveredPerGrant) {
  Inbox h, w;
  h.turns = true;
  auto hub_worker = Pair(kMinRingBytes, nullptr, &h, &w);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub && worker);
  // 5 frames of 20 KB (3 fit the 64 KiB ring: it wraps, the worker waits
  // for room), then 2 of 100 bytes written just before the worker closes.
  std::vector<std::string> payloads;
  for (uint32_t i = 0; i < 7; ++i) payloads.push_back(Pattern(i < 5 ? 20000 : 100, i));
  Run([&] {
    for (uint64_t i = 0; i < 5; ++i) worker->Send(Frame(i, payloads[i]));
  });
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_TRUE(h.WaitAsked(i + 1)) << "turn " << i << " asked";
    std::this_thread::sleep_for(20ms);
    ASSERT_EQ(h.Frames(), i) << "nothing is delivered before the grant";
    {
      std::lock_guard lock(h.mu);
      EXPECT_EQ(h.asked[i], RecordBytes(payloads[i].size()));
      EXPECT_FALSE(h.closed) << "closed with frames undelivered: " << h.why;
    }
    if (i == 4) {
      Run([&] {
        worker->Send(Frame(5, payloads[5]));
        worker->Send(Frame(6, payloads[6]));
        worker->Close("done");
      });
      // A chance for the hub to see the EOF while a turn is asked (the path
      // under test); seen after the grant, the same checks hold.
      std::this_thread::sleep_for(20ms);
    }
    Run([&] { hub->Grant(); });
    ASSERT_TRUE(h.WaitFrames(i + 1));
  }
  ASSERT_TRUE(h.WaitClosed());
  std::lock_guard lock(h.mu);
  EXPECT_EQ(h.asked.size(), payloads.size()) << "one turn per frame, none for pads";
  for (size_t i = 0; i < payloads.size(); ++i) {
    EXPECT_EQ(h.frames[i].first.request_id, i);
    EXPECT_EQ(h.frames[i].second, payloads[i]);
  }
}


// A frame whose payload lies in a region the worker lent (shm/lend.h).
OutgoingFrame LentFrame(uint64_t request, std::span<const std::byte> payload,
                        std::function<void()> release) {
  FrameHeader h;
  h.opcode = Opcode::kPush;
  h.request_id = request;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  OutgoingFrame f;
  EncodeHeader(h, f.header);
  f.borrowed = payload;
  f.release = std::move(release);
  return f;
}

// Counts releases; the test waits for a number of them.
struct Releases {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  std::function<void()> One() {
    return [this] {
      std::lock_guard lock(mu);
      ++n;
      cv.notify_all();
    };
  }
  bool Wait(int want) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 5s, [&] { return n >= want; });
  }
};

TEST_F(ShmChannelTest, APayloadInALentRegionIsReadInPlace) {
  Inbox h, w;
  auto hub_worker = Pair(kMinRingBytes, nullptr, &h, &w);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub && worker);
  auto made = LendRegion::Create(300 * 1000);
  ASSERT_TRUE(made.ok()) << made.status().message();
  std::shared_ptr<LendRegion> region = *std::move(made);
  ASSERT_EQ(region->bytes().size(), 303104u) << "rounded up to 4 KiB";
  const std::span<std::byte> mem = region->bytes();
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<std::byte>((i * 131 + 7) >> 3);
  // Three payloads in the region (one at an odd offset, one larger than the
  // 64 KiB ring: a reference is 128 bytes whatever the payload), one too
  // small to be lent, one outside the region: all arrive, in order.
  const std::string outside = Pattern(9000, 3);
  const std::vector<std::pair<size_t, size_t>> slices = {
      {0, 64 * 1024}, {4097, 100000}, {8, 100}, {200000, 100000}};
  Releases released;
  Run([&] {
    for (size_t i = 0; i < slices.size(); ++i) {
      worker->Send(LentFrame(i, mem.subspan(slices[i].first, slices[i].second), released.One()));
    }
    worker->Send(LentFrame(slices.size(), std::as_bytes(std::span(outside)), released.One()));
  });
  ASSERT_TRUE(h.WaitFrames(slices.size() + 1)) << h.Frames() << " frames; closed " << h.closed
                                               << ": " << h.why;
  {
    std::lock_guard lock(h.mu);
    for (size_t i = 0; i < slices.size(); ++i) {
      EXPECT_EQ(h.frames[i].first.request_id, i);
      const auto want = mem.subspan(slices[i].first, slices[i].second);
      ASSERT_EQ(h.frames[i].second,
                std::string(reinterpret_cast<const char*>(want.data()), want.size()))
          << "frame " << i;
    }
    EXPECT_EQ(h.frames[slices.size()].second, outside);
  }
  // Every frame's buffer is released, the lent ones once the hub consumed
  // them (the hub rings the worker when it does).
  ASSERT_TRUE(released.Wait(static_cast<int>(slices.size()) + 1));
  Run([&] {
    EXPECT_EQ(worker->lent_sent(), 3u) << "the 100-byte payload is copied";
    EXPECT_EQ(hub->lent_received(), 3u);
    EXPECT_EQ(hub->lent_regions(), 1u) << "the descriptor went once";
  });
  // The worker lets the region go: its channel tells the hub on its next turn.
  const std::weak_ptr<LendRegion> weak = region;
  region.reset();
  EXPECT_TRUE(weak.expired()) << "the channel still holds the region after the hub consumed it";
  Run([&] { hub->Send(Frame(1, "wake the worker")); });
  ASSERT_TRUE(w.WaitFrames(1));  // its turn sent UNLEND
  // A frame from a new region: the hub reads the socket (UNLEND, then the new
  // LEND, in order) before it delivers the reference.
  auto next = LendRegion::Create(8192);
  ASSERT_TRUE(next.ok());
  Run([&] { worker->Send(LentFrame(99, (*next)->bytes(), nullptr)); });
  ASSERT_TRUE(h.WaitFrames(slices.size() + 2));
  Run([&] {
    EXPECT_EQ(hub->lent_regions(), 1u) << "the hub still maps a region the worker let go";
  });
  Run([&] { EXPECT_FALSE(h.closed) << h.why; });
}

// A lent payload larger than the ring goes as a 128-byte reference; when
// even that does not fit (the hub does not consume: 64 bytes left), the
// frame waits for room instead of being copied (which would not fit at all).
TEST_F(ShmChannelTest, ALentPayloadLargerThanTheRingWaitsForRoom) {
  Inbox h, w;
  auto hub_worker = Pair(kMinRingBytes, nullptr, &h, &w);
  std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
  ASSERT_TRUE(hub && worker);
  auto made = LendRegion::Create(200000);
  ASSERT_TRUE(made.ok());
  std::shared_ptr<LendRegion> region = *std::move(made);
  const std::span<std::byte> mem = region->bytes();
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<std::byte>(i * 7 + 1);
  const std::string filler = Pattern(kMinRingBytes - 128, 5);  // a record 64 bytes short of the ring
  ASSERT_EQ(RecordBytes(filler.size()), kMinRingBytes - 64);
  Releases released;
  Run([&] {
    hub->PauseDelivery(true);
    worker->Send(Frame(0, filler));
    worker->Send(LentFrame(1, mem.subspan(0, 150000), released.One()));
  });
  Run([&] { hub->PauseDelivery(false); });
  ASSERT_TRUE(h.WaitFrames(2)) << h.why;
  std::lock_guard lock(h.mu);
  EXPECT_FALSE(h.closed) << h.why;
  EXPECT_EQ(h.frames[0].second, filler);
  EXPECT_EQ(h.frames[1].second, std::string(reinterpret_cast<const char*>(mem.data()), 150000));
}

// A worker may send anything on its set-up socket and write anything into
// its ring: forged lend messages and references close the connection as
// violations naming the problem, and never make the hub read outside a
// mapping.
TEST_F(ShmChannelTest, ForgedLendMessagesAndReferencesAreViolations) {
  // A lent-region record (docs/wire-protocol.md, section 10): prefix "LREF"
  // and 128 bytes, the frame header, then the u64 offset and u32 region id.
  const auto reference = [](uint64_t offset, uint32_t id, uint32_t payload) {
    std::vector<std::byte> rec(128);
    const uint32_t kind = 0x4645524c, bytes = 128;
    std::memcpy(rec.data(), &kind, 4);
    std::memcpy(rec.data() + 4, &bytes, 4);
    FrameHeader h;
    h.opcode = Opcode::kPush;
    h.payload_bytes = payload;
    std::array<std::byte, kHeaderBytes> enc{};
    EncodeHeader(h, enc);
    std::memcpy(rec.data() + 24, enc.data(), kHeaderBytes);
    std::memcpy(rec.data() + 64, &offset, 8);
    std::memcpy(rec.data() + 72, &id, 4);
    return rec;
  };
  auto region = LendRegion::Create(8192);
  ASSERT_TRUE(region.ok());
  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 8192), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  struct Case {
    std::string name;
    std::function<void(Channel&)> forge;
    std::string expect;
  };
  const uint32_t id = (*region)->id();
  const int fd = (*region)->fd();
  const std::vector<Case> cases = {
      {"a reference to a region never lent",
       [&](Channel& c) { c.WriteRawForTesting(reference(0, 77, 4096), 128); }, "was not lent"},
      {"LEND of a pipe", [&](Channel& c) { c.SendLendMessageForTesting(1, 5, 8192, pipe_fds[0]); },
       "not a memfd"},
      {"LEND of an unsealed memfd",
       [&](Channel& c) { c.SendLendMessageForTesting(1, 5, 8192, unsealed); }, "sealed"},
      {"LEND of the wrong size",
       [&](Channel& c) { c.SendLendMessageForTesting(1, id, 4096, fd); }, "not a memfd of 4096"},
      {"LEND without a descriptor",
       [&](Channel& c) { c.SendLendMessageForTesting(1, 5, 8192, -1); }, "without its descriptor"},
      {"UNLEND of a region never lent",
       [&](Channel& c) { c.SendLendMessageForTesting(2, 9, 0, -1); }, "never lent"},
      {"a reference past the region's end",
       [&](Channel& c) {
         c.SendLendMessageForTesting(1, id, 8192, fd);
         c.WriteRawForTesting(reference(4096, id, 4097), 128);
       },
       "of the 8192-byte lent region"},
      {"a message that is not LEND or UNLEND",
       [&](Channel& c) { c.SendLendMessageForTesting(7, 1, 0, -1); }, "not LEND or UNLEND"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Inbox h, w;
    auto hub_worker = Pair(kMinRingBytes, nullptr, &h, &w);
    std::shared_ptr<Channel> hub = hub_worker.first, worker = hub_worker.second;
    ASSERT_TRUE(hub && worker);
    Run([&] { k.forge(*worker); });
    ASSERT_TRUE(h.WaitClosed());
    std::lock_guard lock(h.mu);
    EXPECT_NE(h.why.find("violation"), std::string::npos) << h.why;
    EXPECT_NE(h.why.find(k.expect), std::string::npos) << h.why;
    EXPECT_TRUE(h.frames.empty());
  }
  ::close(unsealed);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

}  // namespace
}  // namespace rackhub::net::shm
